/* LR schedules: agreement with PyTorch 1.13 schedulers (tests/ref/optim.h5: CosineAnnealingLR,
 * StepLR, LinearLR, LambdaLR warmup + CosineAnnealingLR in a SequentialLR) at every step, to
 * |got - want| <= 1e-9 + 1e-6*|want| (PyTorch updates recursively in double, we use closed
 * forms), plus exact values at the boundary steps of each kind and the checks' messages. */
#include "optim/optim.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_ref(const char *path, const char *name, qt_lr_kind kind) {
  char ds[128];
  int64_t shape[8];
  int ndim;
  snprintf(ds, sizeof ds, "lr/%s/params", name);
  float *p = qt_test_load_f32(path, ds, shape, &ndim); /* base, min, total, warmup, step_size, gamma */
  snprintf(ds, sizeof ds, "lr/%s/values", name);
  float *want = qt_test_load_f32(path, ds, shape, &ndim);
  const int64_t n = qt_test_numel(shape, ndim);
  qt_lr_schedule s = {.kind = kind,
                      .base_lr = p[0],
                      .min_lr = p[1],
                      .total_steps = (int64_t)p[2],
                      .warmup_steps = (int64_t)p[3],
                      .step_size = (int64_t)p[4],
                      .gamma = p[5]};
  QT_CHECK(qt_lr_schedule_check(&s, NULL) == 0);
  float *got = malloc((size_t)n * sizeof *got);
  for (int64_t i = 0; i < n; i++) got[i] = qt_lr_at(&s, i);
  snprintf(ds, sizeof ds, "lr schedule %s vs torch", name);
  qt_test_close(ds, got, want, n, 1e-9f, 1e-6f);
  free(p);
  free(want);
  free(got);
}

#define EXPECT(s, step, value)                                                       \
  do {                                                                               \
    float got_ = qt_lr_at((s), (step));                                              \
    float want_ = (float)(value);                                                    \
    if (!(fabsf(got_ - want_) <= 1e-7f * fabsf(want_) + 1e-12f))                     \
      qt_test_fail("%s:%d: %s at step %lld: got %.9g want %.9g", __FILE__, __LINE__, \
                   qt_lr_kind_name((s)->kind), (long long)(step), got_, want_);      \
  } while (0)

static void check_error(qt_lr_schedule s, const char *field) {
  char err[QT_ERR_LEN] = "";
  QT_CHECK(qt_lr_schedule_check(&s, err) == -1);
  if (!strstr(err, field)) qt_test_fail("schedule error '%s' does not name '%s'", err, field);
}

int main(void) {
  const char *path = qt_test_path("tests/ref/optim.h5");
  check_ref(path, "cosine", QT_LR_COSINE);
  check_ref(path, "cosine_min", QT_LR_COSINE);
  check_ref(path, "step", QT_LR_STEP);
  check_ref(path, "linear", QT_LR_LINEAR);
  check_ref(path, "warmup_cosine", QT_LR_COSINE);

  /* Constant, with and without warmup. */
  qt_lr_schedule c = {.kind = QT_LR_CONSTANT, .base_lr = 0.1f};
  EXPECT(&c, 0, 0.1f);
  EXPECT(&c, 1000000, 0.1f);
  c.warmup_steps = 4;
  EXPECT(&c, 0, 0.1 * 1 / 4);
  EXPECT(&c, 2, 0.1f * 3 / 4.0);
  EXPECT(&c, 3, 0.1f);
  EXPECT(&c, 4, 0.1f);

  /* Step: drops at multiples of step_size after the warmup. */
  qt_lr_schedule st = {.kind = QT_LR_STEP, .base_lr = 0.1f, .step_size = 3, .gamma = 0.1f, .warmup_steps = 2};
  EXPECT(&st, 0, 0.1f / 2.0);
  EXPECT(&st, 1, 0.1f);
  EXPECT(&st, 2, 0.1f);                               /* t = 0 */
  EXPECT(&st, 4, 0.1f);                               /* t = 2, last step before the drop */
  EXPECT(&st, 5, 0.1f * (double)0.1f);                /* t = 3 */
  EXPECT(&st, 8, 0.1f * (double)0.1f * (double)0.1f); /* t = 6 */

  /* Cosine: base at the end of warmup, the midpoint, min at and after total_steps. */
  qt_lr_schedule cs = {
      .kind = QT_LR_COSINE, .base_lr = 0.05f, .min_lr = 0.01f, .total_steps = 110, .warmup_steps = 10};
  EXPECT(&cs, 0, 0.05f / 10.0);
  EXPECT(&cs, 9, 0.05f);
  EXPECT(&cs, 10, 0.05f);
  EXPECT(&cs, 60, (0.05f + (double)0.01f) / 2);
  EXPECT(&cs, 109, 0.01f + (0.05f - (double)0.01f) * (1 + cos(3.14159265358979323846 * 99 / 100)) / 2);
  EXPECT(&cs, 110, 0.01f);
  EXPECT(&cs, 1000, 0.01f);
  cs.warmup_steps = 0;
  cs.min_lr = 0;
  EXPECT(&cs, 0, 0.05f);
  EXPECT(&cs, 55, 0.05f / 2.0);
  EXPECT(&cs, 110, 0.0f);

  /* Linear: straight line from base to min. */
  qt_lr_schedule li = {.kind = QT_LR_LINEAR, .base_lr = 0.2f, .min_lr = 0.0f, .total_steps = 100};
  EXPECT(&li, 0, 0.2f);
  EXPECT(&li, 25, 0.2f * 0.75);
  EXPECT(&li, 99, 0.2f * 0.01);
  EXPECT(&li, 100, 0.0f);
  EXPECT(&li, 150, 0.0f);

  /* A schedule the check rejects (cosine ending inside the warmup) still has defined values. */
  qt_lr_schedule dg = {.kind = QT_LR_COSINE, .base_lr = 0.1f, .min_lr = 0.01f, .total_steps = 3, .warmup_steps = 5};
  EXPECT(&dg, 4, 0.1f);
  EXPECT(&dg, 5, 0.01f);
  EXPECT(&dg, 50, 0.01f);

  /* Checks name the field. */
  check_error((qt_lr_schedule){.kind = QT_LR_COSINE, .base_lr = 0.1f, .total_steps = 5, .warmup_steps = 5},
              "total_steps");
  check_error((qt_lr_schedule){.kind = QT_LR_LINEAR, .base_lr = 0.1f, .total_steps = 0}, "total_steps");
  check_error((qt_lr_schedule){.kind = QT_LR_STEP, .base_lr = 0.1f, .step_size = 0, .gamma = 0.5f},
              "step_size");
  check_error((qt_lr_schedule){.kind = QT_LR_STEP, .base_lr = 0.1f, .step_size = 2, .gamma = -1}, "gamma");
  check_error((qt_lr_schedule){.kind = QT_LR_CONSTANT, .base_lr = -0.1f}, "base_lr");
  check_error((qt_lr_schedule){.kind = QT_LR_CONSTANT, .base_lr = INFINITY}, "base_lr");
  check_error((qt_lr_schedule){.kind = QT_LR_CONSTANT, .base_lr = 0.1f, .warmup_steps = -1}, "warmup_steps");
  check_error((qt_lr_schedule){.kind = QT_LR_COSINE, .base_lr = 0.1f, .min_lr = -1, .total_steps = 9},
              "min_lr");
  check_error((qt_lr_schedule){.kind = QT_LR_COUNT, .base_lr = 0.1f}, "kind");

  /* Names round-trip. */
  QT_CHECK_NAMES(qt_lr_kind, QT_LR_COUNT, qt_lr_kind_name, qt_lr_kind_parse);
  qt_lr_kind unused;
  QT_CHECK(qt_lr_kind_parse("cosin", &unused) == -1);
  QT_CHECK(strcmp(qt_lr_kind_name(QT_LR_COSINE), "cosine") == 0);
  return qt_test_finish();
}
