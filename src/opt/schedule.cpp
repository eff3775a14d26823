// Ready-made learning-rate schedules (kiln::schedule).
#include <algorithm>
#include <cmath>

#include "kiln/opt.h"

namespace kiln::schedule {

ScheduleFn constant(OptimizerParams p) {
  return [p](const StepInfo&) { return p; };
}

ScheduleFn step_decay(OptimizerParams p, int64_t every_epochs, float gamma) {
  if (every_epochs <= 0)
    fail("schedule", "step_decay: every_epochs must be positive, got ", every_epochs);
  return [p, every_epochs, gamma](const StepInfo& s) {
    OptimizerParams q = p;
    const double f = std::pow(double(gamma), double(s.epoch / every_epochs));
    q.adamw.lr = float(p.adamw.lr * f);
    q.sgd.lr = float(p.sgd.lr * f);
    return q;
  };
}

ScheduleFn cosine(OptimizerParams p, int64_t warmup_steps, float min_lr, int64_t total_steps) {
  if (warmup_steps < 0) fail("schedule", "cosine: warmup_steps must be >= 0, got ", warmup_steps);
  return [p, warmup_steps, min_lr, total_steps](const StepInfo& s) {
    const int64_t total = total_steps > 0 ? total_steps : s.total_steps();
    auto lr_at = [&](double base) {
      // Warm-up: step 0 gets base/warmup (not 0: a zero step would be wasted).
      if (s.step < warmup_steps) return base * double(s.step + 1) / double(warmup_steps);
      if (total <= warmup_steps) return base;  // length unknown: stay at the peak
      const double t = std::min(1.0, double(s.step - warmup_steps) / double(total - warmup_steps));
      return min_lr + (base - min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
    };
    OptimizerParams q = p;
    q.adamw.lr = float(lr_at(p.adamw.lr));
    q.sgd.lr = float(lr_at(p.sgd.lr));
    return q;
  };
}

}  // namespace kiln::schedule
