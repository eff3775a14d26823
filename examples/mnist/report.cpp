#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace mnist {

namespace {

const char* kHeader =
    "epoch,train_loss,train_loss_unc,train_acc,train_acc_unc,val_loss,val_loss_unc,val_acc,val_acc_"
    "unc,seconds";

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// One panel: x = epoch, two series (train, val) of y with a linear axis.
struct Panel {
  double x0, y0, w, h;  // pixel box of the plot area
  double ymin, ymax;
  int64_t emax;
  double px(double epoch) const {
    return x0 + w * (epoch - 1) / double(std::max<int64_t>(emax - 1, 1));
  }
  double py(double y) const { return y0 + h - h * (y - ymin) / (ymax - ymin); }
};

void axes(std::ostringstream& os, const Panel& p, const std::string& label, const char* tick_fmt) {
  os << "<rect x='" << p.x0 << "' y='" << p.y0 << "' width='" << p.w << "' height='" << p.h
     << "' fill='none' stroke='#444'/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = p.ymin + (p.ymax - p.ymin) * i / 4;
    os << "<line x1='" << p.x0 << "' x2='" << p.x0 + p.w << "' y1='" << p.py(y) << "' y2='"
       << p.py(y) << "' stroke='#ddd'/>\n<text x='" << p.x0 - 6 << "' y='" << p.py(y) + 4
       << "' text-anchor='end' font-size='11'>" << fmt(tick_fmt, y) << "</text>\n";
  }
  const int64_t step = std::max<int64_t>(1, p.emax / 6);
  for (int64_t e = 1; e <= p.emax; e += step)
    os << "<text x='" << p.px(double(e)) << "' y='" << p.y0 + p.h + 16
       << "' text-anchor='middle' font-size='11'>" << e << "</text>\n";
  os << "<text x='" << p.x0 + p.w / 2 << "' y='" << p.y0 - 8
     << "' text-anchor='middle' font-size='13'>" << label << "</text>\n<text x='" << p.x0 + p.w / 2
     << "' y='" << p.y0 + p.h + 32 << "' text-anchor='middle' font-size='11'>epoch</text>\n";
}

void series(std::ostringstream& os, const Panel& p, const std::vector<EpochRow>& rows,
            double EpochRow::*y, const char* color) {
  std::string pts;
  for (const EpochRow& r : rows) {
    const double v = r.*y;
    if (!std::isfinite(v)) continue;
    pts += fmt("%.1f", p.px(double(r.epoch))) + "," +
           fmt("%.1f", p.py(std::clamp(v, p.ymin, p.ymax))) + " ";
  }
  if (!pts.empty())
    os << "<polyline fill='none' stroke='" << color << "' stroke-width='2' points='" << pts
       << "'/>\n";
}

void range_of(const std::vector<EpochRow>& rows, double EpochRow::*a, double EpochRow::*b,
              double& lo, double& hi) {
  lo = INFINITY;
  hi = -INFINITY;
  for (const EpochRow& r : rows)
    for (double v : {r.*a, r.*b})
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(lo <= hi)) lo = 0, hi = 1;
  const double pad = std::max((hi - lo) * 0.05, 1e-6);
  lo -= pad;
  hi += pad;
}

}  // namespace

std::string sibling(const std::string& model_path, const std::string& ext) {
  const size_t slash = model_path.find_last_of('/');
  const size_t dot = model_path.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (has_ext ? model_path.substr(0, dot) : model_path) + ext;
}

std::vector<EpochRow> read_csv(const std::string& path) {
  std::vector<EpochRow> rows;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) return rows;
  while (std::getline(in, line)) {
    EpochRow r;
    long long e = 0;
    if (std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &e, &r.train_loss,
                    &r.train_loss_unc, &r.train_acc, &r.train_acc_unc, &r.val_loss, &r.val_loss_unc,
                    &r.val_acc, &r.val_acc_unc, &r.seconds) != 10)
      break;
    r.epoch = e;
    rows.push_back(r);
  }
  return rows;
}

void write_csv(const std::string& path, const std::vector<EpochRow>& rows) {
  std::ofstream out(path);
  out << kHeader << "\n";
  for (const EpochRow& r : rows) {
    out << r.epoch;
    for (double v : {r.train_loss, r.train_loss_unc, r.train_acc, r.train_acc_unc, r.val_loss,
                     r.val_loss_unc, r.val_acc, r.val_acc_unc})
      out << "," << fmt("%.6g", v);
    out << "," << fmt("%.3f", r.seconds) << "\n";
  }
  if (!out) kiln::fail("mnist", "cannot write ", path);
}

void write_svg(const std::string& path, const std::vector<EpochRow>& rows,
               const std::string& title) {
  std::ostringstream os;
  const int W = 820, H = 340;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
     << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n"
     << "<text x='" << W / 2 << "' y='20' text-anchor='middle' font-size='15'>" << title
     << "</text>\n";
  int64_t emax = 1;
  for (const EpochRow& r : rows) emax = std::max(emax, r.epoch);
  double lo, hi;
  range_of(rows, &EpochRow::train_loss, &EpochRow::val_loss, lo, hi);
  Panel loss{70, 50, 310, 230, std::max(0.0, lo), hi, emax};
  axes(os, loss, "loss", "%.3f");
  series(os, loss, rows, &EpochRow::train_loss, "#1f77b4");
  series(os, loss, rows, &EpochRow::val_loss, "#d62728");
  range_of(rows, &EpochRow::train_acc, &EpochRow::val_acc, lo, hi);
  Panel acc{480, 50, 310, 230, lo, std::min(100.0, hi), emax};
  axes(os, acc, "accuracy (%)", "%.1f");
  series(os, acc, rows, &EpochRow::train_acc, "#1f77b4");
  series(os, acc, rows, &EpochRow::val_acc, "#d62728");
  os << "<text x='" << W - 150 << "' y='" << H - 8
     << "' font-size='12' fill='#1f77b4'>train</text>\n"
     << "<text x='" << W - 100 << "' y='" << H - 8
     << "' font-size='12' fill='#d62728'>validation</text>\n</svg>\n";
  std::ofstream out(path);
  out << os.str();
  if (!out) kiln::fail("mnist", "cannot write ", path);
}

}  // namespace mnist
