/* Learning-rate schedules as closed forms of the step index (computed in double), so any
 * step can be evaluated directly and a resumed run needs no scheduler state. PyTorch's
 * schedulers update recursively; tests/optim checks both agree to float precision. */
#include "optim/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QT_PI 3.14159265358979323846 /* math.pi; M_PI is not ISO C */

QT_DEFINE_NAMES(qt_lr_kind, QT_LR_COUNT, qt_lr_kind_name, qt_lr_kind_parse, "constant", "step", "cosine", "linear")

int qt_lr_schedule_check(const qt_lr_schedule *s, char *err) {
  if ((unsigned)s->kind >= QT_LR_COUNT)
    return qt_err(err, "lr schedule: kind: expected constant, step, cosine or linear, found %d", (int)s->kind);
  if (!(s->base_lr >= 0 && isfinite(s->base_lr)))
    return qt_err(err, "lr schedule: base_lr: expected a finite number >= 0, found %g", s->base_lr);
  if (s->warmup_steps < 0)
    return qt_err(err, "lr schedule: warmup_steps: expected >= 0, found %lld", (long long)s->warmup_steps);
  switch (s->kind) {
    case QT_LR_COSINE:
    case QT_LR_LINEAR:
      if (!(s->min_lr >= 0 && isfinite(s->min_lr)))
        return qt_err(err, "lr schedule: min_lr: expected a finite number >= 0, found %g", s->min_lr);
      if (s->total_steps <= s->warmup_steps)
        return qt_err(err, "lr schedule: total_steps: expected more than warmup_steps (%lld) for %s, found %lld",
                      (long long)s->warmup_steps, qt_lr_kind_name(s->kind), (long long)s->total_steps);
      break;
    case QT_LR_STEP:
      if (s->step_size < 1)
        return qt_err(err, "lr schedule: step_size: expected >= 1, found %lld", (long long)s->step_size);
      if (!(s->gamma >= 0 && isfinite(s->gamma)))
        return qt_err(err, "lr schedule: gamma: expected a finite number >= 0, found %g", s->gamma);
      break;
    default: break;
  }
  return 0;
}

float qt_lr_at(const qt_lr_schedule *s, int64_t step) {
  /* Only what makes the formulas meaningless aborts; a schedule qt_lr_schedule_check rejects
   * for being useless (e.g. cosine with total_steps <= warmup_steps: min_lr right after the
   * warmup) still gets a defined value. */
  if ((unsigned)s->kind >= QT_LR_COUNT || step < 0 || s->warmup_steps < 0 ||
      (s->kind == QT_LR_STEP && s->step_size < 1)) {
    qt_panic(__FILE__, __LINE__, "qt_lr_at(kind %d, step %lld, warmup_steps %lld, step_size %lld)", (int)s->kind,
             (long long)step, (long long)s->warmup_steps, (long long)s->step_size);
  }
  const double base = s->base_lr, lo = s->min_lr;
  if (step < s->warmup_steps) return (float)(base * (double)(step + 1) / (double)s->warmup_steps);
  const int64_t t = step - s->warmup_steps;
  const int64_t T = s->total_steps - s->warmup_steps;
  switch (s->kind) {
    case QT_LR_CONSTANT: return s->base_lr;
    case QT_LR_STEP: return (float)(base * pow((double)s->gamma, (double)(t / s->step_size)));
    case QT_LR_COSINE:
      if (t >= T) return s->min_lr;
      return (float)(lo + (base - lo) * (1.0 + cos(QT_PI * (double)t / (double)T)) / 2.0);
    case QT_LR_LINEAR:
      if (t >= T) return s->min_lr;
      return (float)(lo + (base - lo) * (1.0 - (double)t / (double)T));
    default: break;
  }
  qt_panic(__FILE__, __LINE__, "qt_lr_at: kind %d", (int)s->kind); /* unreachable: checked above */
}
