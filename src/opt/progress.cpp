// Result statistics and progress output. Lines never exceed 80 columns: a
// terminal wraps longer ones, and then '\r' returns only to the wrapped part,
// so a redrawn bar would scroll one line per update (seen in ggml's first
// version). Plain ASCII only, so columns equal bytes.
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "kiln/opt.h"

namespace kiln {

// ---------------------------------------------------------------------------
// Result

void Result::add(double batch_loss, int64_t batch_size, int64_t correct) {
  n_samples += batch_size;
  ++n_batches;
  loss_sum += batch_loss * double(batch_size);
  loss_sq_sum += batch_loss * batch_loss * double(batch_size);
  if (correct >= 0) n_correct = (n_correct < 0 ? 0 : n_correct) + correct;
}

double Result::loss() const { return n_samples > 0 ? loss_sum / double(n_samples) : NAN; }

double Result::loss_unc() const {
  if (n_batches < 2 || n_samples < 1) return NAN;
  const double w = double(n_samples), mean = loss_sum / w;
  const double var = std::max(0.0, loss_sq_sum / w - mean * mean);  // of the batch losses
  return std::sqrt(var / double(n_batches - 1));
}

double Result::accuracy() const {
  return n_correct >= 0 && n_samples > 0 ? double(n_correct) / double(n_samples) : NAN;
}

double Result::accuracy_unc() const {
  const double p = accuracy();
  return std::isnan(p) ? NAN : std::sqrt(p * (1 - p) / double(n_samples));
}

// ---------------------------------------------------------------------------
// Formatting

namespace {

std::string printf_str(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// "0.0652+-0.0120", or "0.0652" without an uncertainty.
std::string loss_str(const Result& r) {
  if (std::isnan(r.loss_unc())) return printf_str("%.4f", r.loss());
  return printf_str("%.4f+-%.4f", r.loss(), r.loss_unc());
}

std::string acc_str(const Result& r) {
  return printf_str("%.2f+-%.2f%%", 100 * r.accuracy(), 100 * r.accuracy_unc());
}

std::string clip(std::string s, size_t width) {
  if (s.size() > width) s.resize(width);
  return s;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  const int64_t t = int64_t(seconds + 0.5);
  const int64_t h = t / 3600, m = t / 60 % 60, s = t % 60;
  if (h > 0) return printf_str("%d:%02d:%02d", int(h), int(m), int(s));
  return printf_str("%d:%02d", int(m), int(s));
}

std::string format_result(const Result& r) {
  if (r.n_batches == 0) return "loss -";
  std::string s = "loss " + loss_str(r);
  if (r.has_accuracy()) s.append(" acc ").append(acc_str(r));
  return s;
}

std::string epoch_line(const EpochResult& e, int64_t epochs) {
  const int w = epochs > 0 ? int(std::to_string(epochs).size()) : 1;
  std::string s = printf_str("[%*lld/%lld] train ", w, (long long)(e.epoch + 1), (long long)epochs);
  s += loss_str(e.train);
  if (e.train.has_accuracy()) s.append(" ").append(acc_str(e.train));
  if (e.val.n_batches > 0) {
    s.append(" val ").append(loss_str(e.val));
    if (e.val.has_accuracy()) s.append(" ").append(acc_str(e.val));
  }
  s += printf_str(" %.1fs", e.seconds);
  return clip(s, 80);
}

// ---------------------------------------------------------------------------
// ProgressBar

ProgressBar::ProgressBar(std::string label, int64_t total, bool tty)
    : label_(std::move(label)), total_(total), tty_(tty) {
  start_ = last_ = std::chrono::steady_clock::now();
}

bool ProgressBar::stderr_is_tty() { return isatty(STDERR_FILENO) != 0; }

std::string ProgressBar::line(int64_t done, const Result& r, double elapsed_s, int width) const {
  const int digits = int(std::to_string(total_).size());
  const std::string count = printf_str("%*lld/%lld", digits, (long long)done, (long long)total_);
  const double eta = done > 0 ? elapsed_s * double(total_ - done) / double(done) : NAN;
  const std::string times =
      format_duration(elapsed_s) + " eta " + (done > 0 ? format_duration(eta) : "--:--");
  const std::string rest = count + " " + format_result(r) + " " + times;
  // label [bar] rest: the bar takes what is left (omitted below 5 columns).
  const int bar = width - int(label_.size()) - int(rest.size()) - 4;
  std::string s = label_ + " ";
  if (bar >= 5) {
    const double f = total_ > 0 ? std::min(1.0, double(done) / double(total_)) : 1.0;
    const int full = int(f * bar);
    s += '[';
    s.append(size_t(full), '=');
    if (full < bar) {
      s += '>';
      s.append(size_t(bar - full - 1), ' ');
    }
    s += "] ";
  }
  return clip(s + rest, size_t(width));
}

void ProgressBar::update(int64_t done, const Result& r) {
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100) && done < total_) return;
  last_ = now;
  const double el = std::chrono::duration<double>(now - start_).count();
  // \x1b[K clears what a longer previous line left behind.
  std::fprintf(stderr, "\r%s\x1b[K", line(done, r, el).c_str());
  std::fflush(stderr);
}

void ProgressBar::finish(int64_t done, const Result& r) {
  if (!tty_) return;
  const double el =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "\r%s\x1b[K\n", line(done, r, el).c_str());
  std::fflush(stderr);
}

}  // namespace kiln
