/* SGD (momentum, nesterov, plain, dampening, decay mask) and AdamW (with and without decay
 * mask) follow PyTorch 1.13 for 5 steps with a different lr each step: parameters after every
 * step and the final state slabs, from tests/ref/optim.h5.
 * Tolerance: |got - want| <= 1e-9 + 3e-7*|want| (about 2 float ulps). With fmaf where
 * PyTorch's AVX2 kernels fuse, the results were bit-identical when the reference was made;
 * the slack covers libm's pow/sqrt in the double-precision bias corrections. */
#include "optim/optim.h"
#include "tests/common/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 1e-9f
#define RTOL 3e-7f

static const char *const cases[] = {"sgd_momentum",        "sgd_nesterov", "sgd_plain",   "sgd_dampening",
                                    "sgd_momentum_masked", "adamw",        "adamw_masked"};

static float *load(const char *path, const char *group, const char *name, int64_t *numel) {
  char full[256];
  int64_t shape[8];
  int ndim;
  snprintf(full, sizeof full, "%s%s%s", group ? group : "", group ? "/" : "", name);
  float *x = qt_test_load_f32(path, full, shape, &ndim);
  if (numel) *numel = qt_test_numel(shape, ndim);
  return x;
}

int main(void) {
  const char *path = qt_test_path("tests/ref/optim.h5");
  int64_t n, ng;
  float *params0 = load(path, NULL, "params0", &n);
  float *grads = load(path, NULL, "grads", &ng); /* (steps, n) */
  const int64_t steps = ng / n;
  float *params = malloc((size_t)n * sizeof *params);
  uint8_t *mask = malloc((size_t)n);

  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *name = cases[c];
    float *hp = load(path, name, "hparams", NULL);
    float *lr = load(path, name, "lr", NULL);       /* (steps) */
    float *maskf = load(path, name, "mask", NULL);  /* (n) */
    float *want = load(path, name, "params", NULL); /* (steps, n) */
    qt_optim_config cfg = {.kind = hp[0] != 0 ? QT_OPTIM_SGD : QT_OPTIM_ADAMW,
                           .momentum = hp[1],
                           .dampening = hp[2],
                           .nesterov = hp[3] != 0,
                           .weight_decay = hp[4],
                           .beta1 = hp[5],
                           .beta2 = hp[6],
                           .eps = hp[7]};
    qt_optim *o = qt_optim_create(&cfg, n);
    QT_CHECK(o != NULL);
    if (hp[8] != 0) {
      for (int64_t i = 0; i < n; i++) mask[i] = maskf[i] != 0;
      qt_optim_set_decay_mask(o, mask);
    }
    memcpy(params, params0, (size_t)n * sizeof *params);
    for (int64_t s = 0; s < steps; s++) {
      char what[128];
      qt_optim_step(o, params, grads + s * n, lr[s]);
      snprintf(what, sizeof what, "%s: params after step %lld", name, (long long)s);
      qt_test_close(what, params, want + s * n, n, ATOL, RTOL);
    }
    QT_CHECK(qt_optim_steps(o) == steps);

    const int expect_states = cfg.kind == QT_OPTIM_ADAMW ? 2 : cfg.momentum != 0 ? 1 : 0;
    QT_CHECK(qt_optim_state_count(o) == expect_states);
    for (int i = 0; i < qt_optim_state_count(o); i++) {
      const char *state_name = NULL;
      float *got = qt_optim_state(o, i, &state_name);
      float *ref = load(path, name, state_name, NULL);
      char what[128];
      snprintf(what, sizeof what, "%s: %s after step %lld", name, state_name, (long long)steps - 1);
      qt_test_close(what, got, ref, n, ATOL, RTOL);
      free(ref);
    }
    qt_optim_free(o);
    free(hp);
    free(lr);
    free(maskf);
    free(want);
  }
  free(params0);
  free(grads);
  free(params);
  free(mask);
  return qt_test_finish();
}
