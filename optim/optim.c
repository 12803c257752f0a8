/* SGD and AdamW over one flat parameter slab, with PyTorch 1.13's update order and float32
 * rounding, bit for bit (tests/optim/test_optim_ref): each PyTorch tensor op is one float
 * operation here; where PyTorch's AVX2 kernels fuse a multiply-add (add with alpha, addcmul)
 * we use fmaf; Python-side scalars (1 - lr*wd, the bias corrections) are computed in double
 * and rounded to float once, as PyTorch does when it hands a Python number to a float kernel.
 * (fmaf is a single instruction with -march=native on FMA hardware, a libm call otherwise.) */
#include "optim/optim.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct qt_optim {
  qt_optim_config cfg;
  int64_t n;
  int64_t steps;
  int n_state;
  float *state;         /* (n_state, n), one slab */
  const uint8_t *decay; /* (n) or NULL = all decay; borrowed */
};

QT_DEFINE_NAMES(qt_optim_kind, QT_OPTIM_COUNT, qt_optim_kind_name, qt_optim_kind_parse, "sgd", "adamw")

int qt_optim_config_check(const qt_optim_config *cfg, char *err) {
  if ((unsigned)cfg->kind >= QT_OPTIM_COUNT)
    return qt_err(err, "optim: kind: expected sgd or adamw, found %d", (int)cfg->kind);
  if (!(cfg->weight_decay >= 0 && isfinite(cfg->weight_decay)))
    return qt_err(err, "optim: weight_decay: expected a finite number >= 0, found %g", cfg->weight_decay);
  if (cfg->kind == QT_OPTIM_SGD) {
    if (!(cfg->momentum >= 0 && isfinite(cfg->momentum)))
      return qt_err(err, "optim: momentum: expected a finite number >= 0, found %g", cfg->momentum);
    if (!isfinite(cfg->dampening))
      return qt_err(err, "optim: dampening: expected a finite number, found %g", cfg->dampening);
    if (cfg->nesterov && !(cfg->momentum > 0 && cfg->dampening == 0))
      return qt_err(err, "optim: nesterov: expected momentum > 0 and dampening 0, found momentum %g, dampening %g",
                    cfg->momentum, cfg->dampening);
  } else {
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1))
      return qt_err(err, "optim: beta1: expected a number in [0, 1), found %g", cfg->beta1);
    if (!(cfg->beta2 >= 0 && cfg->beta2 < 1))
      return qt_err(err, "optim: beta2: expected a number in [0, 1), found %g", cfg->beta2);
    if (!(cfg->eps >= 0 && isfinite(cfg->eps)))
      return qt_err(err, "optim: eps: expected a finite number >= 0, found %g", cfg->eps);
  }
  return 0;
}

qt_optim *qt_optim_create(const qt_optim_config *cfg, int64_t n) {
  char err[QT_ERR_LEN];
  QT_ASSERT(qt_optim_config_check(cfg, err) == 0, "qt_optim_create: %s", err);
  QT_ASSERT(n >= 1, "qt_optim_create: %lld parameters (want >= 1)", (long long)n);
  qt_optim *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->cfg = *cfg;
  o->n = n;
  o->n_state = cfg->kind == QT_OPTIM_ADAMW ? 2 : cfg->momentum != 0 ? 1 : 0;
  if (o->n_state) {
    o->state = calloc((size_t)o->n_state * (size_t)n, sizeof(float));
    if (!o->state) {
      free(o);
      return NULL;
    }
  }
  return o;
}

void qt_optim_free(qt_optim *o) {
  if (!o) return;
  free(o->state);
  free(o);
}

void qt_optim_set_decay_mask(qt_optim *o, const uint8_t *mask) { o->decay = mask; }
int qt_optim_state_count(const qt_optim *o) { return o->n_state; }
int64_t qt_optim_numel(const qt_optim *o) { return o->n; }
int64_t qt_optim_steps(const qt_optim *o) { return o->steps; }

void qt_optim_set_steps(qt_optim *o, int64_t steps) {
  QT_ASSERT(steps >= 0, "qt_optim_set_steps: %lld (want >= 0)", (long long)steps);
  o->steps = steps;
}

float *qt_optim_state(qt_optim *o, int i, const char **name) {
  static const char *const sgd_names[] = {"momentum_buffer"};
  static const char *const adamw_names[] = {"exp_avg", "exp_avg_sq"};
  QT_ASSERT(i >= 0 && i < o->n_state, "qt_optim_state: index %d of %d state slabs (%s)", i, o->n_state,
            qt_optim_kind_name(o->cfg.kind));
  if (name) *name = o->cfg.kind == QT_OPTIM_ADAMW ? adamw_names[i] : sgd_names[i];
  return o->state + (int64_t)i * o->n;
}

/* Parallel loops pay off only on large slabs. */
#define QT_OPTIM_OMP_MIN 16384

/* The steps sum p * 0 over the parameters they write: 0 while every p is finite, NaN once one is
 * not (Inf * 0 and NaN * 0 are NaN), one fused multiply-add per element in the loop that is
 * there anyway. Only then are the non-finite ones counted. */
static int64_t non_finite(const float *params, int64_t n, float nf) {
  if (nf == 0.0f) return 0;
  int64_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : bad) if (n >= QT_OPTIM_OMP_MIN)
  for (int64_t i = 0; i < n; i++) bad += !isfinite(params[i]);
  return bad;
}

/* torch.optim.SGD._single_tensor_sgd, per element:
 *   d = g + wd*p;  buf = first step ? d : momentum*buf + (1-dampening)*d;
 *   d = nesterov ? d + momentum*buf : buf;  p -= lr*d */
static int64_t sgd_step(qt_optim *o, float *params, const float *grads, float lr) {
  const int64_t n = o->n;
  const float wd = o->cfg.weight_decay, momentum = o->cfg.momentum;
  const float damp = (float)(1.0 - (double)o->cfg.dampening);
  const int nesterov = o->cfg.nesterov, first = o->steps == 0;
  const uint8_t *decay = o->decay;
  float *buf = o->state; /* (n) or NULL without momentum */
  float nf = 0;
  if (buf && !first && !nesterov) {
    /* the usual step, written so that it vectorizes: the same operations per element as the
     * loop below, the decay mask a select instead of a branch */
    const int all = wd != 0 && !decay, masked = wd != 0 && decay;
#pragma omp parallel for simd schedule(static) reduction(+ : nf) if (n >= QT_OPTIM_OMP_MIN)
    for (int64_t i = 0; i < n; i++) {
      float d = grads[i];
      const float dw = fmaf(params[i], wd, d);
      if (all) d = dw;
      if (masked) d = decay[i] ? dw : d;
      const float b = fmaf(d, damp, buf[i] * momentum);
      buf[i] = b;
      const float p = fmaf(b, -lr, params[i]);
      params[i] = p;
      nf = fmaf(p, 0.0f, nf);
    }
    return non_finite(params, n, nf);
  }
#pragma omp parallel for schedule(static) reduction(+ : nf) if (n >= QT_OPTIM_OMP_MIN)
  for (int64_t i = 0; i < n; i++) {
    float d = grads[i];
    if (wd != 0 && (!decay || decay[i])) d = fmaf(params[i], wd, d);
    if (buf) {
      buf[i] = first ? d : fmaf(d, damp, buf[i] * momentum);
      d = nesterov ? fmaf(buf[i], momentum, d) : buf[i];
    }
    params[i] = fmaf(d, -lr, params[i]);
    nf = fmaf(params[i], 0.0f, nf);
  }
  return non_finite(params, n, nf);
}

/* torch.optim.AdamW._single_tensor_adamw (amsgrad off), step t counted from 1:
 *   p *= 1 - lr*wd;  m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g;
 *   p += (-lr/(1-beta1^t)) * m / (sqrt(v)/sqrt(1-beta2^t) + eps) */
static int64_t adamw_step(qt_optim *o, float *params, const float *grads, float lr) {
  const int64_t n = o->n;
  const double t = (double)(o->steps + 1);
  const float beta1 = o->cfg.beta1, beta2 = o->cfg.beta2, eps = o->cfg.eps;
  const float one_minus_beta1 = (float)(1.0 - (double)beta1);
  const float one_minus_beta2 = (float)(1.0 - (double)beta2);
  const float shrink = (float)(1.0 - (double)lr * (double)o->cfg.weight_decay);
  const int decoupled = o->cfg.weight_decay != 0;
  const float neg_step_size = (float)-((double)lr / (1.0 - pow((double)beta1, t)));
  const float bias_correction2_sqrt = (float)sqrt(1.0 - pow((double)beta2, t));
  const uint8_t *decay = o->decay;
  float *exp_avg = o->state, *exp_avg_sq = o->state + n; /* (n) each */
  /* a select for the decay mask instead of a branch, so the loop vectorizes (with sqrtf an
   * instruction: optim/CMakeLists.txt): per element the same operations in the same order */
  const int all = decoupled && !decay, masked = decoupled && decay;
  float nf = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : nf) if (n >= QT_OPTIM_OMP_MIN)
  for (int64_t i = 0; i < n; i++) {
    const float g = grads[i];
    float p = params[i];
    const float ps = p * shrink;
    if (all) p = ps;
    if (masked) p = decay[i] ? ps : p;
    const float m = fmaf(g, one_minus_beta1, exp_avg[i] * beta1);
    const float v = fmaf(one_minus_beta2 * g, g, exp_avg_sq[i] * beta2);
    const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    const float q = p + neg_step_size * m / denom;
    params[i] = q;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    nf = fmaf(q, 0.0f, nf);
  }
  return non_finite(params, n, nf);
}

int64_t qt_optim_step(qt_optim *o, float *params, const float *grads, float lr) {
  int64_t bad = 0;
  switch (o->cfg.kind) {
    case QT_OPTIM_SGD: bad = sgd_step(o, params, grads, lr); break;
    case QT_OPTIM_ADAMW: bad = adamw_step(o, params, grads, lr); break;
    default: qt_panic(__FILE__, __LINE__, "qt_optim_step: optimizer kind %d has no step", (int)o->cfg.kind);
  }
  o->steps++;
  return bad;
}
