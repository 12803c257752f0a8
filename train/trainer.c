/* The training stage: optimizer, LR schedule and loader of a run, one epoch at a time, with the
 * freeze schedules, the NaN stop and the progress bar; and evaluation (qt_evaluate). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/pipeline.h"

struct qt_trainer {
  const qt_options *o;
  qt_graph *g;
  const qt_dataset *train;
  qt_optim *opt;
  qt_lr_schedule sched;
  qt_loader *loader;
  int64_t nb, step;
  int progress; /* 0 none, 1 lines, 2 bar */
  double last_draw;
};

/* ---- progress -------------------------------------------------------------------------------- */
static void fmt_eta(char *buf, size_t n, double s) {
  if (!(s >= 0) || s > 360000) s = 0;
  int t = (int)(s + 0.5);
  snprintf(buf, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
}

static void progress_draw(qt_trainer *t, int epoch, int64_t b, double loss, double acc, double ips, double elapsed,
                          int final) {
  if (t->progress != 2) return;
  double now = qt_now_seconds();
  if (!final && now - t->last_draw < 0.2) return;
  t->last_draw = now;
  const int64_t nb = t->nb;
  int width = 24, filled = nb ? (int)(width * b / nb) : width;
  char bar[32], eta[32];
  for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
  bar[width] = 0;
  fmt_eta(eta, sizeof eta, b ? elapsed / (double)b * (double)(nb - b) : 0);
  fprintf(stderr, "\repoch %d/%d [%s] %3d%% %lld/%lld loss %.4f acc %5.2f%% %6.0f img/s ETA %s ", epoch,
          t->o->train.epochs, bar, nb ? (int)(100 * b / nb) : 100, (long long)b, (long long)nb, loss, 100 * acc, ips,
          eta);
  if (final) fputc('\n', stderr);
  fflush(stderr);
}

static int progress_mode(qt_progress p) {
  switch (p) {
    case QT_PROGRESS_NONE: return 0;
    case QT_PROGRESS_LINES: return 1;
    case QT_PROGRESS_BAR: return 2;
    default: return isatty(2) ? 2 : 1;
  }
}

/* ---- setup ----------------------------------------------------------------------------------- */
static int optim_config(const qt_train_options *tr, qt_optim_config *oc, char *err) {
  memset(oc, 0, sizeof *oc);
  oc->kind = tr->optimizer;
  oc->momentum = oc->kind == QT_OPTIM_ADAMW ? 0.0f : (float)tr->momentum;
  oc->nesterov = tr->nesterov;
  oc->weight_decay = (float)tr->weight_decay;
  oc->beta1 = (float)tr->beta1;
  oc->beta2 = (float)tr->beta2;
  oc->eps = (float)tr->adam_eps;
  return qt_optim_config_check(oc, err);
}

static int lr_schedule(const qt_options *o, int64_t nb, qt_lr_schedule *s, char *err) {
  const qt_train_options *tr = &o->train;
  const int epochs = o->quant.mode == QT_QUANT_PTQ ? 0 : tr->epochs;
  memset(s, 0, sizeof *s);
  s->kind = tr->schedule;
  s->base_lr = (float)tr->lr;
  s->min_lr = (float)tr->min_lr;
  s->total_steps = nb * (epochs > 0 ? epochs : 1);
  s->warmup_steps = (int64_t)llround(tr->warmup_epochs * (double)nb);
  s->step_size = (int64_t)llround(tr->step_epochs * (double)nb);
  if (s->step_size < 1) s->step_size = 1;
  s->gamma = (float)tr->gamma;
  if (epochs > 0 && s->warmup_steps >= s->total_steps)
    return qt_err(err, "train.warmup_epochs = %g covers the whole run of %d epochs", tr->warmup_epochs, epochs);
  return qt_lr_schedule_check(s, err);
}

qt_trainer *qt_trainer_create(const qt_options *o, qt_graph *g, const qt_dataset *train, qt_status *st) {
  qt_trainer *t = calloc(1, sizeof *t);
  QT_ASSERT(t, "out of memory");
  t->o = o;
  t->g = g;
  t->train = train;
  t->progress = progress_mode(o->output.progress);
  qt_optim_config oc;
  if (optim_config(&o->train, &oc, st->msg)) goto input_error;
  qt_loader_config lc = qt_stage_loader_config(o, QT_LOADER_TRAIN);
  t->loader = qt_loader_create(train, &lc, st->msg);
  if (!t->loader) goto input_error;
  t->nb = qt_loader_num_batches(t->loader);
  if (lr_schedule(o, t->nb, &t->sched, st->msg)) goto input_error;
  t->opt = qt_optim_create(&oc, g->n_params);
  return t;
input_error:
  qt_status_fail(st, QT_STATUS_INPUT);
  qt_trainer_free(t);
  return NULL;
}

void qt_trainer_free(qt_trainer *t) {
  if (!t) return;
  qt_loader_free(t->loader);
  if (t->opt) qt_optim_free(t->opt);
  free(t);
}

qt_optim *qt_trainer_optim(qt_trainer *t) { return t->opt; }
int64_t qt_trainer_batches(const qt_trainer *t) { return t->nb; }
int64_t qt_trainer_step(const qt_trainer *t) { return t->step; }
void qt_trainer_set_step(qt_trainer *t, int64_t step) { t->step = step; }

/* ---- one epoch ------------------------------------------------------------------------------- */
/* The freeze schedules, in (fractional) epochs, checked before every step. */
static void apply_schedules(qt_trainer *t, int epoch, int64_t b) {
  const qt_quant_options *q = &t->o->quant;
  if (q->mode == QT_QUANT_NONE) return;
  const double at = epoch + (double)b / (double)t->nb;
  if (q->freeze_observers_after > 0 && at >= q->freeze_observers_after) qt_set_observers(t->g, 0);
  if (q->freeze_bn_after > 0 && at >= q->freeze_bn_after) qt_freeze_bn(t->g, 1);
}

int qt_trainer_epoch(qt_trainer *t, qt_ctx *ctx, int epoch, qt_epoch_stats *out, qt_status *st) {
  qt_graph *g = t->g;
  memset(out, 0, sizeof *out);
  qt_graph_set_mode(g, QT_MODE_TRAIN);
  qt_loader_start_epoch(t->loader, epoch);
  double t0 = qt_now_seconds(), loss_sum = 0;
  int64_t correct = 0, seen = 0, b = 0;
  float lr = 0;
  const float *images;
  const int32_t *labels;
  int B;
  while ((B = qt_loader_next(t->loader, &images, &labels)) > 0) {
    apply_schedules(t, epoch, b);
    qt_ctx_reset(ctx);
    qt_ctx_set_grad(ctx, 1);
    int64_t shape[4] = {B, t->train->h, t->train->w, t->train->c};
    qt_tensor *logits = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images));
    if (!logits)
      return qt_status_set(st, QT_STATUS_RUNTIME, "epoch %d, batch %lld: %s", epoch + 1, (long long)b + 1, g->error);
    float *probs;
    qt_tensor *loss = qt_cross_entropy(ctx, logits, labels, &probs);
    float lv = qt_f32(loss)[0];
    if (!isfinite(lv)) {
      if (t->progress == 2) fputc('\n', stderr);
      char ckpt[QT_OPT_STR + 32];
      snprintf(ckpt, sizeof ckpt, "%s/checkpoint.h5", t->o->output.dir);
      return qt_status_set(st, QT_STATUS_RUNTIME,
                           "training diverged: loss is %s at epoch %d, batch %lld (step %lld, lr %g); stopped without "
                           "updating. The last good checkpoint (%s) is kept; try a lower train.lr",
                           isnan(lv) ? "NaN" : "Inf", epoch + 1, (long long)b + 1, (long long)t->step, (double)lr,
                           access(ckpt, F_OK) == 0 ? ckpt : "none written yet");
    }
    qt_graph_zero_grad(g);
    qt_backward(ctx, loss);
    lr = qt_lr_at(&t->sched, t->step);
    qt_optim_step(t->opt, g->params, g->grads, lr);
    t->step++;
    b++;
    loss_sum += (double)lv * B;
    const int C = (int)logits->shape[1];
    for (int i = 0; i < B; i++) correct += qt_argmax(probs + (size_t)i * C, C) == labels[i];
    seen += B;
    const double el = qt_now_seconds() - t0;
    progress_draw(t, epoch + 1, b, loss_sum / (double)seen, (double)correct / (double)seen, (double)seen / el, el, 0);
  }
  const double secs = qt_now_seconds() - t0;
  out->epoch = epoch + 1;
  out->lr = lr;
  out->train_loss = seen ? loss_sum / (double)seen : 0;
  out->train_acc = seen ? (double)correct / (double)seen : 0;
  out->images_per_s = seen / secs;
  out->seconds = secs;
  out->images = seen;
  progress_draw(t, epoch + 1, b, out->train_loss, out->train_acc, out->images_per_s, secs, 1);
  return 0;
}

/* ---- evaluation ------------------------------------------------------------------------------ */
int qt_evaluate(qt_graph *g, qt_ctx *shared, const qt_dataset *ds, const qt_loader_config *lc, qt_eval_result *out,
                char *err) {
  memset(out, 0, sizeof *out);
  int rc = 0;
  qt_loader *l = qt_loader_create(ds, lc, err);
  if (!l) return -1;
  qt_ctx *ctx = shared ? shared : qt_ctx_create();
  int grad = qt_ctx_grad_enabled(ctx);
  qt_ctx_set_grad(ctx, 0);
  /* eval mode for the duration; fake quant and observers as the caller set them */
  int *was = malloc((size_t)g->n_nodes * sizeof *was);
  QT_ASSERT(was, "out of memory");
  for (int i = 0; i < g->n_nodes; i++) was[i] = g->nodes[i].training;
  qt_graph_set_training(g, 0);
  double t0 = qt_now_seconds(), loss_sum = 0;
  int64_t correct = 0, n = 0;
  qt_loader_start_epoch(l, 0);
  const float *images;
  const int32_t *labels;
  int B;
  while ((B = qt_loader_next(l, &images, &labels)) > 0) {
    qt_ctx_reset(ctx);
    int64_t shape[4] = {B, ds->h, ds->w, ds->c};
    qt_tensor *logits = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images));
    if (!logits) {
      rc = qt_err(err, "evaluating: %s", g->error);
      break;
    }
    float *probs;
    const int C = (int)logits->shape[1];
    qt_tensor *loss = qt_cross_entropy(ctx, logits, labels, &probs);
    loss_sum += (double)qt_f32(loss)[0] * B;
    for (int i = 0; i < B; i++) correct += qt_argmax(probs + (size_t)i * C, C) == labels[i];
    n += B;
  }
  out->seconds = qt_now_seconds() - t0;
  out->n = n;
  out->accuracy = n ? (double)correct / (double)n : 0;
  out->loss = n ? loss_sum / (double)n : 0;
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, grad);
  if (!shared) qt_ctx_free(ctx);
  qt_loader_free(l);
  for (int i = 0; i < g->n_nodes; i++) g->nodes[i].training = was[i];
  free(was);
  return rc;
}
