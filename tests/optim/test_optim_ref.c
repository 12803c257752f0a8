/* SGD (momentum, nesterov, plain, dampening, decay mask) and AdamW (with and without decay
 * mask) follow PyTorch 1.13 for 5 steps with a different lr each step: parameters after every
 * step and the final state slabs, from tests/ref/optim.h5.
 * Tolerance: |got - want| <= 1e-9 + 3e-7*|want| (about 2 float ulps). With fmaf where
 * PyTorch's AVX2 kernels fuse, the results were bit-identical when the reference was made;
 * the slack covers libm's pow/sqrt in the double-precision bias corrections.
 * Then the slab's vectorized, threaded loops against the element-by-element statement of the
 * same update (below) on a large random slab, bit for bit: SGD with momentum after its first step
 * and AdamW, each with and without a decay mask. */
#include "optim/optim.h"
#include "tests/common/testutil.h"

#include <math.h>
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

/* AdamW per element as PyTorch states it (optim.c's loop before it was vectorized), and SGD's
 * momentum step after the first; shrink etc. as optim.c forms them. */
static void adamw_scalar(float *params, float *m1, float *m2, const float *grads, const uint8_t *decay, int64_t n,
                         float lr, const qt_optim_config *c, int64_t step) {
  const double t = (double)(step + 1);
  const float omb1 = (float)(1.0 - (double)c->beta1), omb2 = (float)(1.0 - (double)c->beta2);
  const float shrink = (float)(1.0 - (double)lr * (double)c->weight_decay);
  const float neg_step = (float)-((double)lr / (1.0 - pow((double)c->beta1, t)));
  const float bc2 = (float)sqrt(1.0 - pow((double)c->beta2, t));
  for (int64_t i = 0; i < n; i++) {
    float p = params[i];
    if (c->weight_decay != 0 && (!decay || decay[i])) p = p * shrink;
    const float m = fmaf(grads[i], omb1, m1[i] * c->beta1);
    const float v = fmaf(omb2 * grads[i], grads[i], m2[i] * c->beta2);
    params[i] = p + neg_step * m / (sqrtf(v) / bc2 + c->eps);
    m1[i] = m;
    m2[i] = v;
  }
}

static void sgd_scalar(float *params, float *buf, const float *grads, const uint8_t *decay, int64_t n, float lr,
                       const qt_optim_config *c, int first) {
  const float damp = (float)(1.0 - (double)c->dampening);
  for (int64_t i = 0; i < n; i++) {
    float d = grads[i];
    if (c->weight_decay != 0 && (!decay || decay[i])) d = fmaf(params[i], c->weight_decay, d);
    buf[i] = first ? d : fmaf(d, damp, buf[i] * c->momentum);
    params[i] = fmaf(buf[i], -lr, params[i]);
  }
}

static void check_vectorized(void) {
  const int64_t n = 100003; /* threads, vector tails */
  float *p0 = qt_test_uniform_range(n, -1.0f, 1.0f, 11), *g = qt_test_uniform_range(3 * n, -0.5f, 0.5f, 12);
  uint8_t *mask = malloc((size_t)n);
  for (int64_t i = 0; i < n; i++) mask[i] = (uint8_t)(i % 3 != 0);
  for (int i = 0; i < n; i += 97) g[i] = 0.0f; /* zero gradients: v may stay 0 */
  const qt_optim_config cfgs[2] = {
      {.kind = QT_OPTIM_SGD, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 5e-4f},
      {.kind = QT_OPTIM_ADAMW, .weight_decay = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f}};
  for (int k = 0; k < 2; k++)
    for (int masked = 0; masked <= 1; masked++) {
      qt_optim *o = qt_optim_create(&cfgs[k], n);
      QT_CHECK(o != NULL);
      if (masked) qt_optim_set_decay_mask(o, mask);
      float *p = malloc((size_t)n * 4), *r = malloc((size_t)n * 4), *s1 = calloc((size_t)n, 4), *s2 = calloc((size_t)n, 4);
      memcpy(p, p0, (size_t)n * 4);
      memcpy(r, p0, (size_t)n * 4);
      for (int step = 0; step < 3; step++) {
        const float lr = 0.01f * (float)(step + 1);
        qt_optim_step(o, p, g + step * n, lr);
        if (k == 0)
          sgd_scalar(r, s1, g + step * n, masked ? mask : NULL, n, lr, &cfgs[k], step == 0);
        else
          adamw_scalar(r, s1, s2, g + step * n, masked ? mask : NULL, n, lr, &cfgs[k], step);
        char what[128];
        snprintf(what, sizeof what, "%s%s vectorized: params after step %d", k ? "adamw" : "sgd_momentum",
                 masked ? " (masked)" : "", step);
        if (memcmp(p, r, (size_t)n * 4) != 0) qt_test_close(what, p, r, n, 0.0f, 0.0f);
        QT_CHECK(memcmp(p, r, (size_t)n * 4) == 0);
      }
      QT_CHECK(memcmp(qt_optim_state(o, 0, NULL), s1, (size_t)n * 4) == 0);
      if (k == 1) QT_CHECK(memcmp(qt_optim_state(o, 1, NULL), s2, (size_t)n * 4) == 0);
      qt_optim_free(o);
      free(p), free(r), free(s1), free(s2);
    }
  free(p0), free(g), free(mask);
}

int main(void) {
  check_vectorized();
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
