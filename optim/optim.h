/* Optimizers and learning-rate schedules.
 *
 * An optimizer updates ONE flat float array holding every parameter of the model (the
 * parameter slab) from the gradient slab of the same layout, and owns its state slabs
 * (momentum, Adam moments), so a checkpoint saves each of them in one write.
 * Numerics follow PyTorch 1.13 torch.optim.SGD and torch.optim.AdamW (foreach=False), pinned
 * by tests/optim against tests/ref/optim.h5.
 *
 * LR schedules are pure functions of the optimizer step index: training asks for
 * qt_lr_at(schedule, step) before each step, and a resumed run continues exactly. */
#ifndef QT_OPTIM_H
#define QT_OPTIM_H

#include <stdint.h>

#include "base/base.h"

/* ---------------------------------------------------------------- optimizers */

typedef enum { QT_OPTIM_SGD, QT_OPTIM_ADAMW, QT_OPTIM_COUNT } qt_optim_kind;

typedef struct {
  qt_optim_kind kind;
  /* SGD (torch.optim.SGD): momentum 0 = plain SGD; nesterov needs momentum > 0 and
   * dampening == 0. weight_decay is added to the gradient (L2). */
  float momentum;
  float dampening;
  int nesterov;
  /* SGD: L2 added to the gradient. AdamW: decoupled, p *= 1 - lr * weight_decay. */
  float weight_decay;
  /* AdamW (torch.optim.AdamW; PyTorch defaults 0.9, 0.999, 1e-8, weight_decay 1e-2). */
  float beta1, beta2, eps;
} qt_optim_config;

typedef struct qt_optim qt_optim; /* opaque */

/* Returns 0 when cfg is usable, else -1 with "optim: <field>: expected ..., found ..." in err
 * (QT_ERR_LEN bytes, may be NULL). Same rules as PyTorch's constructor checks: momentum,
 * dampening, weight_decay >= 0; nesterov needs momentum > 0 and dampening == 0; betas in
 * [0, 1); eps >= 0; all finite. */
int qt_optim_config_check(const qt_optim_config *cfg, char *err);

/* An optimizer for a slab of n >= 1 parameters; state slabs are zeroed and the step counter is
 * 0. An invalid cfg aborts (check it first with qt_optim_config_check); returns NULL only when
 * memory runs out. */
qt_optim *qt_optim_create(const qt_optim_config *cfg, int64_t n);
void qt_optim_free(qt_optim *o);

/* One update of params (n) from grads (n) at learning rate lr (parallel over n with OpenMP;
 * elementwise, so the result does not depend on the thread count). Increments the step
 * counter. Returns how many parameters are not finite after the update (counted in the same
 * pass, so a diverging run is caught at the step that diverged even where the loss stays finite):
 * 0 normally; the caller decides what a non-zero count means (the trainer stops). */
int64_t qt_optim_step(qt_optim *o, float *params, const float *grads, float lr);

/* Elements whose mask byte is 0 get no weight decay (biases, BatchNorm parameters); NULL (the
 * default, as in PyTorch) decays everything. The optimizer keeps the pointer, not a copy: the
 * n-byte mask must outlive it or be replaced. */
void qt_optim_set_decay_mask(qt_optim *o, const uint8_t *mask);

/* State slabs, for checkpoints. SGD with momentum: 1 ("momentum_buffer"); AdamW: 2
 * ("exp_avg", "exp_avg_sq"); SGD without momentum: 0. Each holds qt_optim_numel floats and
 * may be written to restore a checkpoint. i out of range aborts. name may be NULL. */
int qt_optim_state_count(const qt_optim *o);
float *qt_optim_state(qt_optim *o, int i, const char **name);
int64_t qt_optim_numel(const qt_optim *o);

/* Number of steps taken. SGD initializes its momentum buffer from the gradient when this is
 * 0; AdamW uses it for bias correction. Restore it together with the state slabs. */
int64_t qt_optim_steps(const qt_optim *o);
void qt_optim_set_steps(qt_optim *o, int64_t steps);

/* "sgd", "adamw". parse returns 0, or -1 for an unknown name. */
const char *qt_optim_kind_name(qt_optim_kind k);
int qt_optim_kind_parse(const char *name, qt_optim_kind *out);

/* ---------------------------------------------------------------- LR schedules */

typedef enum { QT_LR_CONSTANT, QT_LR_STEP, QT_LR_COSINE, QT_LR_LINEAR, QT_LR_COUNT } qt_lr_kind;

/* Every kind starts with an optional linear warmup: for step < warmup_steps,
 * lr = base_lr * (step + 1) / warmup_steps. Afterwards, with t = step - warmup_steps and
 * T = total_steps - warmup_steps:
 *   CONSTANT  base_lr
 *   STEP      base_lr * gamma^floor(t / step_size)                          (torch StepLR)
 *   COSINE    min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2, min_lr once t >= T
 *             (torch CosineAnnealingLR with T_max = T, eta_min = min_lr, without its restart)
 *   LINEAR    min_lr + (base_lr - min_lr) * (1 - t / T), min_lr once t >= T
 *             (torch LinearLR(start_factor=1, end_factor=min_lr/base_lr, total_iters=T)) */
typedef struct {
  qt_lr_kind kind;
  float base_lr;
  float min_lr;         /* COSINE, LINEAR */
  int64_t total_steps;  /* COSINE, LINEAR: warmup included */
  int64_t warmup_steps; /* 0 = none */
  int64_t step_size;    /* STEP */
  float gamma;          /* STEP */
} qt_lr_schedule;

/* Returns 0 when s is usable, else -1 with "lr schedule: <field>: expected ..., found ..." in
 * err: finite base_lr >= 0 and min_lr >= 0; warmup_steps >= 0; COSINE/LINEAR need
 * total_steps > warmup_steps; STEP needs step_size >= 1 and gamma >= 0. */
int qt_lr_schedule_check(const qt_lr_schedule *s, char *err);

/* The learning rate for optimizer step `step` (0-based). A negative step, an unknown kind, a
 * negative warmup or a STEP schedule with step_size < 1 aborts; COSINE and LINEAR with
 * total_steps <= warmup_steps give min_lr after the warmup. */
float qt_lr_at(const qt_lr_schedule *s, int64_t step);

/* "constant", "step", "cosine", "linear". parse returns 0, or -1 for an unknown name. */
const char *qt_lr_kind_name(qt_lr_kind k);
int qt_lr_kind_parse(const char *name, qt_lr_kind *out);

#endif
