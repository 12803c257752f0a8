/* The training stage: optimizer, LR schedule and loader of a run, one epoch at a time, with the
 * freeze schedules, the NaN stop and the progress bar; and evaluation (qt_evaluate).
 *
 * Data parallel (dist/dist.h, more than one process): train.batch_size stays the global batch;
 * every process trains on its contiguous slice of the same shuffled batch (the loader's shards),
 * seeds its backward with (its rows / the batch's rows), so that the sum of the processes'
 * gradients is the gradient of the whole batch's mean loss, and sums the gradient slab across
 * the processes (dist.h's fixed-order sum) before the identical optimizer step on every process:
 * with dist.bucket_mb > 0, in buckets of the slab, each posted from the backward's hook as soon as
 * every tape entry that writes it has run, so that the sum overlaps the rest of the backward (the
 * same bits as one sum after it).
 * Batch norm in training mode computes the whole batch's statistics (the ctx's batch sync).
 * After every epoch the processes compare a checksum of their parameters, buffers and optimizer
 * state: any drift is an error. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/dist.h"
#include "base/base.h"
#include "train/pipeline.h"

/* A bucket of the gradient slab and the tape entry after whose backward its gradients are final
 * (INT64_MAX: nothing writes them this step). */
typedef struct {
  int64_t ready;
  int index; /* the bucket's place in the slab */
} grad_bucket;

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
  int rank, size;    /* this process and the job's (dist.h); size 1: alone */
  qt_step_hook hook; /* after every step (benchmarks), or NULL */
  void *hook_user;
  /* Data parallel with dist.bucket_mb > 0: the gradient slab cut into n_buckets buckets, bucket
   * b the floats [bucket_at[b], bucket_at[b + 1]), each summed (qt_dist_sum_begin) as soon as the
   * backward has written all of it. */
  int n_buckets, next_bucket; /* by_ready[next_bucket ..] are not posted yet */
  int64_t *bucket_at;         /* n_buckets + 1 */
  grad_bucket *by_ready;      /* this step's buckets, latest tape entry first */
};

/* ---- the job's processes --------------------------------------------------------------------- */
/* A quantization point's training state: qparams, flags and observer. */
static uint64_t hash_qstate(uint64_t h, const qt_qstate *q) {
  if (!q) return h;
  const int flags[4] = {q->observe, q->fake_quant, q->calibrated, q->obs.initialized};
  h = qt_dist_hash(h, flags, sizeof flags);
  h = qt_dist_hash(h, q->scale, (size_t)q->channels * sizeof *q->scale);
  h = qt_dist_hash(h, q->zero_point, (size_t)q->channels * sizeof *q->zero_point);
  h = qt_dist_hash(h, q->obs.min, (size_t)q->obs.channels * sizeof *q->obs.min);
  h = qt_dist_hash(h, q->obs.max, (size_t)q->obs.channels * sizeof *q->obs.max);
  if (q->obs.hist) {
    h = qt_dist_hash(h, q->obs.hist, (size_t)q->obs.bins * sizeof *q->obs.hist);
    h = qt_dist_hash(h, &q->obs.hist_min, sizeof q->obs.hist_min);
    h = qt_dist_hash(h, &q->obs.hist_max, sizeof q->obs.hist_max);
  }
  return h;
}

/* Whether every process holds the same parameters, buffers, quantization state (qparams,
 * observers, BN freeze flags) and optimizer state (bit for bit, as the fixed-order reductions
 * and the synchronized statistics promise); -1 with st naming the first process that drifted. */
static int check_replicas(qt_trainer *t, int epoch, qt_status *st) {
  const qt_graph *g = t->g;
  uint64_t h = qt_dist_hash(QT_DIST_HASH_INIT, g->params, (size_t)g->n_params * sizeof(float));
  h = qt_dist_hash(h, g->buffers, (size_t)g->n_buffers * sizeof(float));
  for (int i = 0; i < g->n_nodes; i++) {
    h = hash_qstate(hash_qstate(h, g->nodes[i].q), g->nodes[i].wq);
    h = qt_dist_hash(h, &g->nodes[i].bn_frozen, sizeof g->nodes[i].bn_frozen);
  }
  for (int i = 0; i < qt_optim_state_count(t->opt); i++)
    h = qt_dist_hash(h, qt_optim_state(t->opt, i, NULL), (size_t)qt_optim_numel(t->opt) * sizeof(float));
  const int64_t steps = qt_optim_steps(t->opt);
  h = qt_dist_hash(h, &steps, sizeof steps);
  uint64_t theirs = 0, zeros = 0;
  const int bad = qt_dist_first_differing(h, &theirs, &zeros);
  if (bad < 0) return 0;
  return qt_status_set(st, QT_STATUS_RUNTIME,
                       "after epoch %d the parameters, buffers, quantization or optimizer state of process %d differ "
                       "from process 0's (checksums %016llx and %016llx): the data-parallel replicas drifted apart",
                       epoch, bad, (unsigned long long)theirs, (unsigned long long)zeros);
}

/* ---- gradient buckets ------------------------------------------------------------------------ */
/* Cuts the gradient slab into buckets of at most cap floats at parameter boundaries (as PyTorch's
 * DDP does), so that a bucket waits only for its own parameters; a parameter longer than cap is
 * cut into pieces of cap (the last piece may share a bucket with the next parameters). The cuts
 * depend on the slab's layout alone, the same on every process. */
static void buckets_cut(qt_trainer *t, int64_t cap) {
  const qt_graph *g = t->g;
  int64_t *at = malloc(((size_t)(g->n_params / cap) + (size_t)g->n_tensors + 2) * sizeof *at);
  QT_ASSERT(at, "out of memory for the gradient buckets");
  int n = 0;
  int64_t start = 0, begin = -1; /* the open bucket's first float; the previous parameter's */
  at[0] = 0;
  for (int i = 0; i <= g->n_tensors; i++) {
    if (i < g->n_tensors && g->tensors[i].is_buffer) continue;
    const int64_t end = i < g->n_tensors ? g->tensors[i].offset : g->n_params;
    if (begin >= 0) { /* the previous parameter's region [begin, end), its padding included */
      QT_ASSERT(end >= begin, "gradient buckets: parameter %d at %lld, after one at %lld", i, (long long)end,
                (long long)begin);
      if (end - start > cap && begin > start) at[++n] = start = begin;
      while (end - start > cap) at[++n] = start += cap;
    }
    begin = end;
  }
  at[++n] = g->n_params;
  t->n_buckets = n;
  t->bucket_at = at;
  t->by_ready = malloc((size_t)n * sizeof *t->by_ready);
  QT_ASSERT(t->by_ready, "out of memory for %d gradient buckets", n);
}

/* Latest entry first: the backward reaches them first. Then slab order, so that every process,
 * whose tape is the same, posts the same buckets in the same order. */
static int bucket_cmp(const void *a, const void *b) {
  const grad_bucket *x = a, *y = b;
  if (x->ready != y->ready) return x->ready > y->ready ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

/* After the forward: when each bucket's gradients are final. The writers of a parameter's gradient
 * are tape entries recorded after the forward made its tensor (qt_param.tape_at): once the
 * backward has run entry tape_at, they all have. */
static void buckets_plan(qt_trainer *t) {
  const qt_graph *g = t->g;
  const int64_t *at = t->bucket_at;
  for (int b = 0; b < t->n_buckets; b++) t->by_ready[b] = (grad_bucket){INT64_MAX, b};
  for (int i = 0; i < g->n_tensors; i++) {
    const qt_param *p = &g->tensors[i];
    if (p->is_buffer || p->tape_at < 0) continue;
    int lo = 0, hi = t->n_buckets - 1; /* the bucket holding the parameter's first float */
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (at[mid] <= p->offset)
        lo = mid;
      else
        hi = mid - 1;
    }
    for (int b = lo; b < t->n_buckets && at[b] < p->offset + p->numel; b++)
      if (p->tape_at < t->by_ready[b].ready) t->by_ready[b].ready = p->tape_at;
  }
  qsort(t->by_ready, (size_t)t->n_buckets, sizeof *t->by_ready, bucket_cmp);
  t->next_bucket = 0;
}

/* Posts the buckets whose gradients are final once the entries from `entry` on have run. */
static void buckets_post(qt_trainer *t, int64_t entry) {
  while (t->next_bucket < t->n_buckets && t->by_ready[t->next_bucket].ready >= entry) {
    const int b = t->by_ready[t->next_bucket++].index;
    qt_dist_sum_begin(t->g->grads + t->bucket_at[b], t->bucket_at[b + 1] - t->bucket_at[b]);
  }
}

/* The backward hook (autograd.h): after each tape entry, post what became final and let the
 * posted sums move (Open MPI moves data only inside MPI calls). */
static void on_backward_entry(void *user, size_t entry) {
  buckets_post(user, (int64_t)entry);
  qt_dist_sum_progress();
}

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
  t->rank = qt_dist_rank();
  t->size = qt_dist_size();
  t->progress = t->rank == 0 ? progress_mode(o->output.progress) : 0;
  qt_optim_config oc;
  if (optim_config(&o->train, &oc, st->msg)) goto input_error;
  qt_loader_config lc = qt_stage_loader_config(o, QT_LOADER_TRAIN); /* this process's shards */
  t->loader = qt_loader_create(train, &lc, st->msg);
  if (!t->loader) goto input_error;
  t->nb = qt_loader_num_batches(t->loader);
  if (lr_schedule(o, t->nb, &t->sched, st->msg)) goto input_error;
  t->opt = qt_optim_create(&oc, g->n_params);
  if (t->size > 1 && o->dist.bucket_mb > 0 && g->n_params > 0) {
    const int64_t cap = (int64_t)(o->dist.bucket_mb * (1 << 20) / sizeof(float));
    buckets_cut(t, cap > 1 ? cap : 1);
  }
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
  QT_FREE_ALL(t->bucket_at, t->by_ready, t);
}

qt_optim *qt_trainer_optim(qt_trainer *t) { return t->opt; }
int64_t qt_trainer_batches(const qt_trainer *t) { return t->nb; }
int64_t qt_trainer_step(const qt_trainer *t) { return t->step; }
void qt_trainer_set_step(qt_trainer *t, int64_t step) { t->step = step; }
void qt_trainer_set_step_hook(qt_trainer *t, qt_step_hook fn, void *user) {
  t->hook = fn;
  t->hook_user = user;
}

/* ---- one epoch ------------------------------------------------------------------------------- */
/* The freeze schedules, in (fractional) epochs, checked before every step. */
static void apply_schedules(qt_trainer *t, int epoch, int64_t b) {
  const qt_quant_options *q = &t->o->quant;
  if (q->mode == QT_QUANT_NONE) return;
  const double at = epoch + (double)b / (double)t->nb;
  if (q->freeze_observers_after > 0 && at >= q->freeze_observers_after) qt_set_observers(t->g, 0);
  if (q->freeze_bn_after > 0 && at >= q->freeze_bn_after) qt_freeze_bn(t->g, 1);
}

/* One step's loss and correct count over the whole batch. Alone: this process's. Data parallel:
 * every process's (mean loss, rows, correct) gathered, summed in rank order; *bad_rank gets the
 * first process whose loss is not finite (-1: none), so that every process stops together. */
static void batch_totals(const qt_trainer *t, float lv, int B, int64_t correct_b, double *loss_sum, int64_t *correct,
                         int64_t *rows, int *bad_rank, double *bad_loss) {
  *bad_rank = -1;
  *bad_loss = lv;
  if (t->size == 1) {
    if (!isfinite(lv)) *bad_rank = 0;
    *loss_sum = (double)lv * B;
    *correct = correct_b;
    *rows = B;
    return;
  }
  double mine[3] = {lv, B, (double)correct_b};
  double *all = malloc(3 * (size_t)t->size * sizeof *all);
  QT_ASSERT(all, "out of memory");
  qt_dist_allgather(mine, sizeof mine, all);
  *loss_sum = 0;
  *correct = *rows = 0;
  for (int r = 0; r < t->size; r++) {
    if (!isfinite(all[3 * r]) && *bad_rank < 0) {
      *bad_rank = r;
      *bad_loss = all[3 * r];
    }
    *loss_sum += all[3 * r] * all[3 * r + 1];
    *rows += (int64_t)all[3 * r + 1];
    *correct += (int64_t)all[3 * r + 2];
  }
  free(all);
}

/* The random stream of step `step` (dropout's masks): a function of the run's seed and the step
 * alone, so that a resumed run draws what an uninterrupted one would. */
#define DROPOUT_DOMAIN 0x44524f504f555421ull
static uint64_t step_seed(int seed, int64_t step) {
  return qt_mix64(qt_mix64((uint64_t)(int64_t)seed ^ DROPOUT_DOMAIN) ^ (uint64_t)step);
}

/* "training diverged: <what> at epoch, batch (step, lr); <done>", the last checkpoint named. */
static int diverged(const qt_trainer *t, qt_status *st, const char *what, int epoch, int64_t b, float lr,
                    const char *done) {
  if (t->progress == 2) fputc('\n', stderr);
  char ckpt[QT_OPT_STR + 32];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint.h5", t->o->output.dir);
  return qt_status_set(st, QT_STATUS_RUNTIME,
                       "training diverged: %s at epoch %d, batch %lld (step %lld, lr %g); %s. The last good "
                       "checkpoint (%s) is kept; try a lower train.lr",
                       what, epoch + 1, (long long)b + 1, (long long)t->step, (double)lr, done,
                       access(ckpt, F_OK) == 0 ? ckpt : "none written yet");
}

/* "parameter <name>[i] is NaN after the update (n of the model's parameters are not finite)":
 * the first of the n non-finite parameters the optimizer counted. */
static void first_bad_param(const qt_graph *g, int64_t n, char *out, size_t len) {
  for (int k = 0; k < g->n_tensors; k++) {
    const qt_param *p = &g->tensors[k];
    if (p->is_buffer) continue;
    const float *v = g->params + p->offset;
    for (int64_t i = 0; i < p->numel; i++)
      if (!isfinite(v[i])) {
        snprintf(out, len, "parameter %s[%lld] is %s after the update (%lld of the model's parameters are not finite)",
                 p->name, (long long)i, isnan(v[i]) ? "NaN" : "Inf", (long long)n);
        return;
      }
  }
  snprintf(out, len, "%lld parameters are not finite after the update", (long long)n);
}

static int epoch_steps(qt_trainer *t, qt_ctx *ctx, int epoch, qt_epoch_stats *out, qt_status *st) {
  qt_graph *g = t->g;
  qt_loader_start_epoch(t->loader, epoch);
  double t0 = qt_now_seconds(), loss_sum = 0;
  int64_t correct = 0, seen = 0, b = 0;
  float lr = 0;
  const float *images;
  const int32_t *labels;
  int B;
  /* With a profile on ctx (autograd.h) the step's phases are timed here, the ops by the ops. */
  qt_profile *prof = qt_ctx_profile(ctx);
  double t_step = 0, t_phase = 0;
  for (;;) {
    if (prof) t_step = qt_now_seconds();
    if ((B = qt_loader_next(t->loader, &images, &labels)) <= 0) break;
    if (prof) qt_profile_add_phase(prof, QT_PROFILE_DATA, qt_now_seconds() - t_step);
    apply_schedules(t, epoch, b);
    qt_ctx_reset(ctx);
    qt_ctx_set_grad(ctx, 1);
    /* a process's rows are rows shard_first.. of the whole batch: the masks of one process's */
    qt_ctx_set_random(ctx, step_seed(t->o->train.seed, t->step), qt_loader_shard_first(t->loader));
    int64_t shape[4] = {B, t->train->h, t->train->w, t->train->c};
    qt_tensor *logits = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images));
    if (!logits)
      return qt_status_set(st, QT_STATUS_RUNTIME, "epoch %d, batch %lld: %s", epoch + 1, (long long)b + 1, g->error);
    float *probs;
    qt_tensor *loss = qt_cross_entropy(ctx, logits, labels, &probs);
    float lv = qt_f32(loss)[0];
    const int C = (int)logits->shape[1];
    int64_t correct_b = 0, rows, correct_all;
    for (int i = 0; i < B; i++) correct_b += qt_argmax(probs + (size_t)i * C, C) == labels[i];
    double loss_b, bad_loss;
    int bad_rank;
    batch_totals(t, lv, B, correct_b, &loss_b, &correct_all, &rows, &bad_rank, &bad_loss);
    if (bad_rank >= 0) {
      char what[64], where[48] = "";
      if (t->size > 1) snprintf(where, sizeof where, " on process %d of %d", bad_rank, t->size);
      snprintf(what, sizeof what, "loss is %s%s", isnan(bad_loss) ? "NaN" : "Inf", where);
      return diverged(t, st, what, epoch, b, lr, "stopped without updating");
    }
    if (prof) t_phase = qt_now_seconds();
    qt_graph_zero_grad(g);
    if (prof) qt_profile_add_phase(prof, QT_PROFILE_ZERO_GRAD, qt_now_seconds() - t_phase);
    if (t->size == 1) {
      qt_backward(ctx, loss);
    } else if (t->n_buckets > 0) {
      /* the buckets are summed during the backward; grad_sum is the wait left after it */
      buckets_plan(t);
      qt_backward_seeded(ctx, loss, (float)B / (float)qt_loader_batch_rows(t->loader));
      if (prof) t_phase = qt_now_seconds();
      buckets_post(t, 0);
      qt_dist_sum_wait_all();
      if (prof) qt_profile_add_phase(prof, QT_PROFILE_GRAD_SUM, qt_now_seconds() - t_phase);
    } else {
      qt_backward_seeded(ctx, loss, (float)B / (float)qt_loader_batch_rows(t->loader));
      if (prof) t_phase = qt_now_seconds();
      qt_dist_sum_f32(g->grads, g->n_params);
      if (prof) qt_profile_add_phase(prof, QT_PROFILE_GRAD_SUM, qt_now_seconds() - t_phase);
    }
    lr = qt_lr_at(&t->sched, t->step);
    if (prof) t_phase = qt_now_seconds();
    const int64_t bad_params = qt_optim_step(t->opt, g->params, g->grads, lr);
    if (prof) qt_profile_add_phase(prof, QT_PROFILE_OPTIMIZER, qt_now_seconds() - t_phase);
    if (bad_params) { /* the same on every process: they hold the same parameters */
      char what[4 * QT_NAME_LEN];
      first_bad_param(g, bad_params, what, sizeof what);
      return diverged(t, st, what, epoch, b, lr, "stopped; the model in memory is not saved");
    }
    t->step++;
    b++;
    qt_fault_point("training_step"); /* QT_FAULT=training_step:k: a crash after k steps (tests) */
    qt_dist_watchdog_beat();
    loss_sum += loss_b;
    correct += correct_all;
    seen += rows;
    const double el = qt_now_seconds() - t0;
    progress_draw(t, epoch + 1, b, loss_sum / (double)seen, (double)correct / (double)seen, (double)seen / el, el, 0);
    if (prof) qt_profile_add_phase(prof, QT_PROFILE_STEP, qt_now_seconds() - t_step);
    if (t->hook && t->hook(t->hook_user, b - 1, B)) break;
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

int qt_trainer_epoch(qt_trainer *t, qt_ctx *ctx, int epoch, qt_epoch_stats *out, qt_status *st) {
  memset(out, 0, sizeof *out);
  qt_graph_set_mode(t->g, QT_MODE_TRAIN);
  const qt_batch_sync *was = qt_ctx_batch_sync(ctx);
  if (t->size > 1) qt_ctx_set_batch_sync(ctx, qt_dist_batch_sync());
  /* a step reads no gradient but the parameters' after backward: intermediate ones go back to
   * the arena as soon as they are used, so the step spans less memory (autograd.h) */
  qt_ctx_set_backward_frees(ctx, 1);
  qt_ctx_set_conv_winograd(ctx, t->o->train.conv_algorithm == QT_CONV_WINOGRAD);
  if (t->n_buckets > 0) qt_ctx_set_backward_hook(ctx, on_backward_entry, t);
  int rc = epoch_steps(t, ctx, epoch, out, st);
  qt_ctx_set_backward_hook(ctx, NULL, NULL);
  qt_ctx_set_backward_frees(ctx, 0);
  qt_ctx_set_conv_winograd(ctx, 0);
  qt_ops_release_scratch(); /* the training steps' convolution buffers, not needed until the next epoch */
  qt_ctx_set_batch_sync(ctx, was);
  qt_ctx_set_random(ctx, 0, 0);
  if (!rc && t->size > 1) rc = check_replicas(t, epoch + 1, st);
  return rc;
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
    qt_dist_watchdog_beat(); /* an evaluation longer than the watchdog's limit is progress too */
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

int qt_evaluate_distributed(qt_graph *g, qt_ctx *ctx, const qt_dataset *ds, const qt_loader_config *lc,
                            qt_eval_result *out, char *err) {
  const int R = qt_dist_size(), k = qt_dist_rank();
  if (R == 1) return qt_evaluate(g, ctx, ds, lc, out, err);
  /* this process's contiguous range of the samples, as a view (nothing copied) */
  const int64_t first = ds->n * k / R, count = ds->n * (k + 1) / R - first;
  const qt_dataset part = qt_dataset_view(ds, first, count);
  qt_eval_result mine;
  memset(&mine, 0, sizeof mine);
  const double t0 = qt_now_seconds();
  if (count > 0 && qt_evaluate(g, ctx, &part, lc, &mine, err)) return -1;
  double sums[3] = {mine.loss * (double)mine.n, mine.accuracy * (double)mine.n, (double)mine.n};
  qt_dist_sum_f64(sums, 3);
  memset(out, 0, sizeof *out);
  out->n = (int64_t)sums[2];
  out->accuracy = out->n ? nearbyint(sums[1]) / (double)out->n : 0;
  out->loss = out->n ? sums[0] / (double)out->n : 0;
  out->seconds = qt_now_seconds() - t0;
  return 0;
}
