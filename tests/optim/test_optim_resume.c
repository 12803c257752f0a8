/* Optimizer bookkeeping: a run interrupted after 2 steps and resumed from copied state slabs
 * and step counter continues bit-identically; state slab counts and names; config checks
 * name the offending field; kind names parse back. Uses a slab large enough for OpenMP. */
#include "optim/optim.h"
#include "tests/common/testutil.h"

#include <stdlib.h>
#include <string.h>

#define N 50000 /* above the optimizer's OpenMP threshold */
#define STEPS 5
#define SPLIT 2

static void run(const qt_optim_config *cfg, float *params, const float *grads, const uint8_t *mask,
                int split) {
  qt_optim *o = qt_optim_create(cfg, N);
  qt_optim_set_decay_mask(o, mask);
  for (int s = 0; s < STEPS; s++) {
    if (s == split) { /* "checkpoint": copy everything into a fresh optimizer */
      qt_optim *r = qt_optim_create(cfg, N);
      qt_optim_set_decay_mask(r, mask);
      for (int i = 0; i < qt_optim_state_count(o); i++)
        memcpy(qt_optim_state(r, i, NULL), qt_optim_state(o, i, NULL), N * sizeof(float));
      qt_optim_set_steps(r, qt_optim_steps(o));
      qt_optim_free(o);
      o = r;
    }
    qt_optim_step(o, params, grads + (int64_t)s * N, 0.01f * (float)(STEPS - s));
  }
  QT_CHECK(qt_optim_steps(o) == STEPS);
  qt_optim_free(o);
}

static void check_resume(const char *what, const qt_optim_config *cfg, const float *params0,
                         const float *grads, const uint8_t *mask) {
  float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
  memcpy(a, params0, N * sizeof(float));
  memcpy(b, params0, N * sizeof(float));
  run(cfg, a, grads, mask, -1);
  run(cfg, b, grads, mask, SPLIT);
  qt_test_close(what, b, a, N, 0, 0);
  free(a);
  free(b);
}

static void check_config_error(qt_optim_config cfg, const char *field) {
  char err[QT_ERR_LEN] = "";
  QT_CHECK(qt_optim_config_check(&cfg, err) == -1);
  if (!strstr(err, field)) qt_test_fail("config error '%s' does not name '%s'", err, field);
}

int main(void) {
  float *params0 = malloc(N * sizeof(float)), *grads = malloc((size_t)STEPS * N * sizeof(float));
  uint8_t *mask = malloc(N);
  qt_test_fill_uniform(params0, N, -1, 1, 1);
  qt_test_fill_uniform(grads, (int64_t)STEPS * N, -0.5f, 0.5f, 2);
  for (int i = 0; i < N; i++) mask[i] = i % 5 != 0;

  const qt_optim_config sgd = {.kind = QT_OPTIM_SGD, .momentum = 0.9f, .weight_decay = 5e-4f};
  const qt_optim_config nesterov = {
      .kind = QT_OPTIM_SGD, .momentum = 0.9f, .nesterov = 1, .weight_decay = 5e-4f};
  const qt_optim_config plain = {.kind = QT_OPTIM_SGD, .weight_decay = 5e-4f};
  const qt_optim_config adamw = {
      .kind = QT_OPTIM_ADAMW, .weight_decay = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  check_resume("sgd momentum resumed", &sgd, params0, grads, NULL);
  check_resume("sgd nesterov resumed (masked)", &nesterov, params0, grads, mask);
  check_resume("sgd plain resumed", &plain, params0, grads, NULL);
  check_resume("adamw resumed", &adamw, params0, grads, NULL);
  check_resume("adamw resumed (masked)", &adamw, params0, grads, mask);

  /* State slabs: count and names. */
  const struct {
    const qt_optim_config *cfg;
    int count;
    const char *names[2];
  } slabs[] = {{&sgd, 1, {"momentum_buffer"}}, {&plain, 0, {0}}, {&adamw, 2, {"exp_avg", "exp_avg_sq"}}};
  for (int k = 0; k < 3; k++) {
    qt_optim *o = qt_optim_create(slabs[k].cfg, 7);
    QT_CHECK(qt_optim_numel(o) == 7);
    QT_CHECK(qt_optim_steps(o) == 0);
    QT_CHECK(qt_optim_state_count(o) == slabs[k].count);
    for (int i = 0; i < qt_optim_state_count(o); i++) {
      const char *name = NULL;
      float *s = qt_optim_state(o, i, &name);
      QT_CHECK(name && strcmp(name, slabs[k].names[i]) == 0);
      for (int j = 0; j < 7; j++) QT_CHECK(s[j] == 0);
    }
    qt_optim_free(o);
  }

  /* A masked-out element with zero gradient does not move; a decayed one shrinks. */
  {
    float p[2] = {1, 1}, g[2] = {0, 0};
    uint8_t m[2] = {0, 1};
    qt_optim *o = qt_optim_create(&adamw, 2);
    qt_optim_set_decay_mask(o, m);
    qt_optim_step(o, p, g, 0.1f);
    QT_CHECK(p[0] == 1.0f);
    QT_CHECK(p[1] == (float)(1.0 - 0.1f * (double)1e-2f));
    qt_optim_free(o);
  }

  /* Config checks name the field. */
  qt_optim_config bad = sgd;
  bad.momentum = -0.1f;
  check_config_error(bad, "momentum");
  bad = sgd;
  bad.weight_decay = -1;
  check_config_error(bad, "weight_decay");
  bad = sgd;
  bad.nesterov = 1;
  bad.dampening = 0.1f;
  check_config_error(bad, "nesterov");
  bad = plain;
  bad.nesterov = 1;
  check_config_error(bad, "nesterov");
  bad = adamw;
  bad.beta1 = 1.0f;
  check_config_error(bad, "beta1");
  bad = adamw;
  bad.beta2 = -0.5f;
  check_config_error(bad, "beta2");
  bad = adamw;
  bad.eps = -1e-8f;
  check_config_error(bad, "eps");
  bad = adamw;
  bad.kind = QT_OPTIM_COUNT;
  check_config_error(bad, "kind");
  QT_CHECK(qt_optim_config_check(&sgd, NULL) == 0 && qt_optim_config_check(&adamw, NULL) == 0);

  /* Names round-trip. */
  QT_CHECK_NAMES(qt_optim_kind, QT_OPTIM_COUNT, qt_optim_kind_name, qt_optim_kind_parse);
  qt_optim_kind unused;
  QT_CHECK(qt_optim_kind_parse("adam", &unused) == -1);
  QT_CHECK(strcmp(qt_optim_kind_name(QT_OPTIM_ADAMW), "adamw") == 0);

  free(params0);
  free(grads);
  free(mask);
  return qt_test_finish();
}
