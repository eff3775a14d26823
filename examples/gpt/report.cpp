#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace gpt {

std::string sibling(const std::string& model_path, const std::string& ext) {
  return std::filesystem::path(model_path).replace_extension(ext).string();
}

std::vector<Row> read_csv(const std::string& path) {
  std::vector<Row> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    Row r;
    long long it = 0;
    if (std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lf", &it, &r.train_loss, &r.val_loss, &r.lr,
                    &r.seconds) == 5) {
      r.iter = it;
      rows.push_back(r);
    }
  }
  return rows;
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream out(path);
  out << "iter,train_loss,val_loss,lr,seconds\n";
  char b[160];
  for (const Row& r : rows) {
    std::snprintf(b, sizeof b, "%lld,%.5f,%.5f,%.6g,%.2f\n", (long long)r.iter, r.train_loss,
                  r.val_loss, r.lr, r.seconds);
    out << b;
  }
  if (!out) kiln::fail("gpt", "cannot write ", path);
}

void write_svg(const std::string& path, const std::vector<Row>& rows, const std::string& title) {
  const double x0 = 60, y0 = 40, w = 560, h = 300;
  double ymin = INFINITY, ymax = -INFINITY;
  int64_t imax = 1;
  for (const Row& r : rows) {
    for (double v : {r.train_loss, r.val_loss})
      if (std::isfinite(v)) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
    imax = std::max(imax, r.iter);
  }
  if (!(ymin < ymax)) ymin = 0, ymax = std::isfinite(ymax) ? ymax + 1 : 1;
  auto px = [&](double it) { return x0 + w * it / double(imax); };
  auto py = [&](double y) { return y0 + h - h * (y - ymin) / (ymax - ymin); };
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='660' height='400' "
        "font-family='sans-serif'>\n"
     << "<rect width='100%' height='100%' fill='white'/>\n<text x='330' y='22' "
        "text-anchor='middle' font-size='14'>"
     << title << "</text>\n<rect x='" << x0 << "' y='" << y0 << "' width='" << w << "' height='"
     << h << "' fill='none' stroke='#444'/>\n";
  char b[64];
  for (int i = 0; i <= 4; ++i) {
    const double y = ymin + (ymax - ymin) * i / 4;
    std::snprintf(b, sizeof b, "%.2f", y);
    os << "<text x='" << x0 - 6 << "' y='" << py(y) + 4 << "' text-anchor='end' font-size='11'>"
       << b << "</text>\n";
  }
  os << "<text x='" << x0 + w / 2 << "' y='" << y0 + h + 30
     << "' text-anchor='middle' font-size='11'>iteration (max " << imax << ")</text>\n";
  const struct {
    double Row::*y;
    const char *color, *name;
  } lines[] = {{&Row::train_loss, "#1f77b4", "train loss"},
               {&Row::val_loss, "#d62728", "validation loss"}};
  int k = 0;
  for (const auto& l : lines) {
    std::string pts;
    for (const Row& r : rows) {
      if (!std::isfinite(r.*l.y)) continue;
      std::snprintf(b, sizeof b, "%.1f,%.1f ", px(double(r.iter)), py(r.*l.y));
      pts += b;
    }
    os << "<polyline fill='none' stroke='" << l.color << "' stroke-width='2' points='" << pts
       << "'/>\n"
       << "<text x='" << x0 + w - 10 << "' y='" << y0 + 20 + 16 * k++
       << "' text-anchor='end' font-size='12' fill='" << l.color << "'>" << l.name << "</text>\n";
  }
  os << "</svg>\n";
  std::ofstream out(path);
  out << os.str();
  if (!out) kiln::fail("gpt", "cannot write ", path);
}

}  // namespace gpt
