/* Loader: turns a uint8 dataset (in memory, or in a scratch file read a batch at a time, runs of
 * consecutive images in one read) into normalized float batches, shuffled and augmented as a
 * pure function of (seed, epoch, batch index), so resuming a run reproduces it exactly.
 * A background thread fills batch k+1 while the trainer uses batch k (double buffering);
 * if the thread cannot be started, batches are filled on the caller's thread instead. */
#include "data/data.h"
#include "base/base.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOADER_ABORT(msg) qt_panic(__FILE__, __LINE__, "data loader: %s", msg)
#define LOADER_CHECK(call)                          \
  do {                                              \
    if ((call) != 0) LOADER_ABORT(#call " failed"); \
  } while (0)

/* Domain constants keep the shuffle and augmentation streams independent for one seed. */
#define SHUFFLE_DOMAIN 0x53485546464c4555ull
#define AUGMENT_DOMAIN 0x4155474d454e5455ull

struct qt_loader {
  const qt_dataset *ds;
  qt_loader_config cfg;
  int64_t num_batches;
  size_t sample_size; /* h * w * c */
  int batch_capacity; /* min(batch_size, n): rows in each slot */
  float lut[4][256];  /* normalized value of each pixel value, per channel */
  int64_t *order;     /* (n) dataset index at each position of the epoch */

  /* Double buffer: batch b lives in slot b % 2. slot_batch[s] is the batch the slot holds,
   * or -1 while it is free; the worker writes only free slots, the trainer reads only filled
   * ones, and both hand slots over under mu. */
  float *slot_images[2];   /* (batch_capacity, h, w, c) */
  uint8_t *slot_raw[2];    /* dataset in a file: (batch_capacity, h, w, c) read from it */
  int32_t *slot_labels[2]; /* (batch_capacity) */
  int slot_count[2];       /* rows of this loader's shard of the batch */
  int slot_rows[2];        /* rows of the whole batch */
  int64_t slot_batch[2];

  int started; /* an epoch has been started */
  int epoch;
  int64_t next_batch; /* batch the trainer receives next */
  int held_slot;      /* slot returned by the last qt_loader_next, or -1 */
  int last_rows;      /* whole-batch rows of the last batch returned */

  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int thread_running;
  int stop; /* asks the worker to quit (under mu) */
};

/* ---------------------------------------------------------------- random numbers */

/* splitmix64: the state advances by the golden-ratio increment, the output is qt_mix64. */
static uint64_t rng_next(uint64_t *state) {
  uint64_t z = *state;
  *state += 0x9e3779b97f4a7c15ull;
  return qt_mix64(z);
}

/* Uniform in [0, bound) without modulo bias. */
static uint64_t rng_below(uint64_t *state, uint64_t bound) {
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = rng_next(state);
    if (r >= threshold) return r % bound;
  }
}

static uint64_t epoch_key(uint64_t seed, uint64_t domain, int epoch) {
  return qt_mix64(qt_mix64(seed ^ domain) ^ (uint64_t)(int64_t)epoch);
}

/* ---------------------------------------------------------------- batch filling */

static void compute_order(qt_loader *l) {
  const int64_t n = l->ds->n;
  for (int64_t i = 0; i < n; i++) l->order[i] = i;
  if (!l->cfg.shuffle) return;
  uint64_t state = epoch_key(l->cfg.seed, SHUFFLE_DOMAIN, l->epoch);
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)rng_below(&state, (uint64_t)i + 1);
    int64_t t = l->order[i];
    l->order[i] = l->order[j];
    l->order[j] = t;
  }
}

/* Writes one sample: pad with zero pixels, crop h x w at (dy, dx) of the padded image, then
 * mirror if flip; normalization goes through the per-channel lookup table. */
static void fill_sample(const qt_loader *l, float *dst, const uint8_t *src, int dy, int dx, int flip) {
  const int h = l->ds->h, w = l->ds->w, c = l->ds->c, pad = l->cfg.crop_pad;
  if (dy == pad && dx == pad && !flip) {
    if (c == 1) {
      const float *lut = l->lut[0];
      for (size_t p = 0; p < l->sample_size; p++) dst[p] = lut[src[p]];
    } else {
      for (size_t p = 0; p < l->sample_size; p += (size_t)c)
        for (int ch = 0; ch < c; ch++) dst[p + ch] = l->lut[ch][src[p + ch]];
    }
    return;
  }
  for (int y = 0; y < h; y++) {
    const int sy = y + dy - pad;
    for (int x = 0; x < w; x++) {
      const int sx = (flip ? w - 1 - x : x) + dx - pad;
      float *out = dst + ((size_t)y * w + x) * c;
      if (sy < 0 || sy >= h || sx < 0 || sx >= w) {
        for (int ch = 0; ch < c; ch++) out[ch] = l->lut[ch][0];
      } else {
        const uint8_t *in = src + ((size_t)sy * w + sx) * c;
        for (int ch = 0; ch < c; ch++) out[ch] = l->lut[ch][in[ch]];
      }
    }
  }
}

/* The rows [*first, *first + return) of a batch of `rows` that this loader's shard takes. */
static int64_t shard_rows(const qt_loader *l, int64_t rows, int64_t *first) {
  const int64_t K = l->cfg.shard_count > 1 ? l->cfg.shard_count : 1, k = K > 1 ? l->cfg.shard_index : 0;
  *first = rows * k / K;
  return rows * (k + 1) / K - *first;
}

/* Fills slot s with (this loader's shard of) batch b of the current epoch: a pure function of
 * (seed, epoch, b). */
static void fill_batch(qt_loader *l, int64_t b, int s) {
  const qt_dataset *ds = l->ds;
  int64_t rows = ds->n - b * l->cfg.batch_size;
  if (rows > l->cfg.batch_size) rows = l->cfg.batch_size;
  int64_t first;
  const int64_t count = shard_rows(l, rows, &first), start = b * l->cfg.batch_size + first;
  const int augment = l->cfg.crop_pad > 0 || l->cfg.flip;
  const uint64_t aug_key = epoch_key(l->cfg.seed, AUGMENT_DOMAIN, l->epoch);
  const uint8_t *run = NULL; /* images [run_first, run_end) of the dataset: consecutive ones read at once */
  int64_t run_first = 0, run_end = 0;
  for (int64_t i = 0; i < count; i++) {
    const int64_t pos = start + i;
    const int64_t idx = l->order[pos];
    if (idx < run_first || idx >= run_end) {
      int64_t len = 1;
      while (i + len < count && l->order[pos + len] == idx + len) len++;
      run = qt_dataset_images(ds, idx, len, l->slot_raw[s]);
      run_first = idx;
      run_end = idx + len;
    }
    int dy = l->cfg.crop_pad, dx = l->cfg.crop_pad, flip = 0;
    if (augment) {
      /* Always three draws in the same order, so enabling one augmentation leaves the
       * others' random numbers unchanged. */
      uint64_t state = qt_mix64(aug_key ^ (uint64_t)pos);
      uint64_t span = 2 * (uint64_t)l->cfg.crop_pad + 1;
      int ry = (int)rng_below(&state, span);
      int rx = (int)rng_below(&state, span);
      int rf = (int)(rng_next(&state) >> 63);
      if (l->cfg.crop_pad > 0) {
        dy = ry;
        dx = rx;
      }
      if (l->cfg.flip) flip = rf;
    }
    l->slot_labels[s][i] = ds->labels[idx];
    fill_sample(l, l->slot_images[s] + (size_t)i * l->sample_size, run + (size_t)(idx - run_first) * l->sample_size, dy,
                dx, flip);
  }
  l->slot_count[s] = (int)count;
  l->slot_rows[s] = (int)rows;
}

/* ---------------------------------------------------------------- prefetch thread */

static void *worker_main(void *arg) {
  qt_loader *l = arg;
  for (int64_t b = 0; b < l->num_batches; b++) {
    const int s = (int)(b % 2);
    pthread_mutex_lock(&l->mu);
    while (!l->stop && l->slot_batch[s] != -1) pthread_cond_wait(&l->cv, &l->mu);
    const int stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    if (stop) break;
    fill_batch(l, b, s);
    pthread_mutex_lock(&l->mu);
    l->slot_batch[s] = b;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
  }
  return NULL;
}

static void stop_worker(qt_loader *l) {
  if (!l->thread_running) return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  LOADER_CHECK(pthread_join(l->thread, NULL));
  l->thread_running = 0;
  l->stop = 0;
}

/* ---------------------------------------------------------------- public API */

qt_loader *qt_loader_create(const qt_dataset *ds, const qt_loader_config *cfg, char *err) {
  if (!ds || !cfg) {
    qt_err(err, "data loader: expected a dataset and a configuration, found NULL");
    return NULL;
  }
  if (ds->n <= 0 || (!ds->images && !ds->in_file) || !ds->labels || ds->h <= 0 || ds->w <= 0 || ds->c < 1 ||
      ds->c > 4) {
    qt_err(err, "data loader: expected a loaded dataset with n > 0 and 1 <= c <= 4, found n=%lld h=%d w=%d c=%d",
           (long long)ds->n, ds->h, ds->w, ds->c);
    return NULL;
  }
  if (cfg->batch_size <= 0) {
    qt_err(err, "data loader: expected batch_size > 0, found %d", cfg->batch_size);
    return NULL;
  }
  if (cfg->drop_last && ds->n < cfg->batch_size) {
    qt_err(err, "data loader: batch_size %d with drop_last leaves no batch of a dataset of %lld samples",
           cfg->batch_size, (long long)ds->n);
    return NULL;
  }
  if (cfg->shard_count < 0 ||
      (cfg->shard_count > 1 && (cfg->shard_index < 0 || cfg->shard_index >= cfg->shard_count))) {
    qt_err(err, "data loader: expected shard 0 <= index < count, found shard %d of %d", cfg->shard_index,
           cfg->shard_count);
    return NULL;
  }
  if (cfg->shard_count > 1) {
    /* every shard of every batch needs a row: the full batches and a last partial one */
    const int64_t last = cfg->drop_last ? 0 : ds->n % cfg->batch_size;
    const int64_t smallest = ds->n < cfg->batch_size ? ds->n : last > 0 ? last : cfg->batch_size;
    if (smallest < cfg->shard_count) {
      qt_err(err,
             "data loader: a batch of %lld of the %lld samples (batch_size %d) cannot give each of %d processes a "
             "sample; use a batch size and a sample count whose last batch has at least %d",
             (long long)smallest, (long long)ds->n, cfg->batch_size, cfg->shard_count, cfg->shard_count);
      return NULL;
    }
  }
  const int min_side = ds->h < ds->w ? ds->h : ds->w;
  if (cfg->crop_pad < 0 || cfg->crop_pad > min_side) {
    qt_err(err, "data loader: expected 0 <= crop_pad <= %d (the smaller image side), found %d", min_side,
           cfg->crop_pad);
    return NULL;
  }
  for (int ch = 0; ch < ds->c; ch++) {
    if (!isfinite(cfg->mean[ch]) || !isfinite(cfg->std[ch]) || cfg->std[ch] == 0.0f) {
      qt_err(err, "data loader: channel %d: expected a finite mean and a finite non-zero std, found mean %g std %g", ch,
             (double)cfg->mean[ch], (double)cfg->std[ch]);
      return NULL;
    }
  }

  qt_loader *l = calloc(1, sizeof *l);
  if (!l) {
    qt_err(err, "data loader: out of memory");
    return NULL;
  }
  l->ds = ds;
  l->cfg = *cfg;
  l->num_batches = cfg->drop_last ? ds->n / cfg->batch_size : (ds->n + cfg->batch_size - 1) / cfg->batch_size;
  l->sample_size = (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
  l->batch_capacity = ds->n < cfg->batch_size ? (int)ds->n : cfg->batch_size;
  l->held_slot = -1;
  l->slot_batch[0] = l->slot_batch[1] = -1;
  for (int ch = 0; ch < ds->c; ch++)
    for (int p = 0; p < 256; p++) l->lut[ch][p] = ((float)p / 255.0f - cfg->mean[ch]) / cfg->std[ch];
  l->order = malloc((size_t)ds->n * sizeof *l->order);
  for (int s = 0; s < 2; s++) {
    l->slot_images[s] = malloc((size_t)l->batch_capacity * l->sample_size * sizeof(float));
    l->slot_labels[s] = malloc((size_t)l->batch_capacity * sizeof(int32_t));
    if (ds->in_file) l->slot_raw[s] = malloc((size_t)l->batch_capacity * l->sample_size);
  }
  if (!l->order || !l->slot_images[0] || !l->slot_images[1] || !l->slot_labels[0] || !l->slot_labels[1] ||
      (ds->in_file && (!l->slot_raw[0] || !l->slot_raw[1]))) {
    qt_err(err, "data loader: out of memory for batches of %d x %zu", l->batch_capacity, l->sample_size);
    for (int s = 0; s < 2; s++) {
      QT_FREE_ALL(l->slot_images[s], l->slot_labels[s], l->slot_raw[s]);
    }
    free(l->order);
    free(l);
    return NULL;
  }
  LOADER_CHECK(pthread_mutex_init(&l->mu, NULL));
  LOADER_CHECK(pthread_cond_init(&l->cv, NULL));
  return l;
}

void qt_loader_start_epoch(qt_loader *l, int epoch) {
  if (!l) LOADER_ABORT("qt_loader_start_epoch: NULL loader");
  stop_worker(l);
  l->epoch = epoch;
  l->started = 1;
  l->next_batch = 0;
  l->held_slot = -1;
  l->slot_batch[0] = l->slot_batch[1] = -1;
  compute_order(l);
  if (l->num_batches > 0 && pthread_create(&l->thread, NULL, worker_main, l) == 0) l->thread_running = 1;
}

int qt_loader_next(qt_loader *l, const float **images, const int32_t **labels) {
  if (!l) LOADER_ABORT("qt_loader_next: NULL loader");
  if (!l->started) LOADER_ABORT("qt_loader_next called before qt_loader_start_epoch");
  if (l->held_slot >= 0) {
    pthread_mutex_lock(&l->mu);
    l->slot_batch[l->held_slot] = -1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    l->held_slot = -1;
  }
  if (l->next_batch >= l->num_batches) {
    if (images) *images = NULL;
    if (labels) *labels = NULL;
    return 0;
  }
  const int64_t b = l->next_batch;
  const int s = (int)(b % 2);
  if (l->thread_running) {
    pthread_mutex_lock(&l->mu);
    while (l->slot_batch[s] != b) pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
  } else {
    fill_batch(l, b, s); /* no worker thread: fill on the caller's thread */
    l->slot_batch[s] = b;
  }
  l->held_slot = s;
  l->next_batch = b + 1;
  l->last_rows = l->slot_rows[s];
  if (images) *images = l->slot_images[s];
  if (labels) *labels = l->slot_labels[s];
  return l->slot_count[s];
}

int64_t qt_loader_num_batches(const qt_loader *l) { return l ? l->num_batches : 0; }

int qt_loader_batch_rows(const qt_loader *l) { return l ? l->last_rows : 0; }

int qt_loader_shard_first(const qt_loader *l) {
  int64_t first = 0;
  if (l) shard_rows(l, l->last_rows, &first);
  return (int)first;
}

void qt_loader_free(qt_loader *l) {
  if (!l) return;
  stop_worker(l);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  for (int s = 0; s < 2; s++) {
    QT_FREE_ALL(l->slot_images[s], l->slot_labels[s], l->slot_raw[s]);
  }
  free(l->order);
  free(l);
}
