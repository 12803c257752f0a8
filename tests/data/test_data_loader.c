/* Loader: each epoch covers every sample once, the order is a pure function of (seed, epoch),
 * normalization matches (p/255 - mean)/std, drop_last drops the partial batch, flip/crop
 * produce mirrored/shifted copies of the sample, reproducibly, and the shards of a batch
 * (data-parallel training) are its rows in order. */
#include "data/data.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 37, H = 5, W = 4, C = 2, S = H * W * C };

static const float MEAN[2] = {0.25f, 0.5f}, STD[2] = {0.5f, 0.2f};

/* Sample i has label i; pixels are non-zero and vary so that shifts are identifiable. */
static void make_dataset(qt_dataset *ds) {
  memset(ds, 0, sizeof *ds);
  ds->n = N; ds->h = H; ds->w = W; ds->c = C; ds->num_classes = N;
  ds->images = malloc(N * S);
  ds->labels = malloc(N * sizeof *ds->labels);
  for (int i = 0; i < N; i++) {
    ds->labels[i] = i;
    for (int p = 0; p < S; p++) ds->images[i * S + p] = (uint8_t)((i * 31 + p * 17 + (p * p) % 13) % 255 + 1);
  }
}

static qt_loader_config base_config(void) {
  qt_loader_config cfg = {.batch_size = 8, .shuffle = 1, .seed = 42};
  for (int ch = 0; ch < 4; ch++) { cfg.mean[ch] = ch < 2 ? MEAN[ch] : 0.0f; cfg.std[ch] = ch < 2 ? STD[ch] : 1.0f; }
  return cfg;
}

/* A loader of cfg over ds, which must make want_batches batches an epoch (a failed check
 * otherwise; NULL when it cannot be created). */
static qt_loader *loader_of(const qt_dataset *ds, const qt_loader_config *cfg, int64_t want_batches) {
  char err[QT_ERR_LEN];
  qt_loader *l = qt_loader_create(ds, cfg, err);
  if (!l) qt_test_fail("loader of batch %d: %s", cfg->batch_size, err);
  else if (qt_loader_num_batches(l) != want_batches)
    qt_test_fail("loader of batch %d: %lld batches, want %lld", cfg->batch_size, (long long)qt_loader_num_batches(l),
                 (long long)want_batches);
  return l;
}

static double normalize(int pixel, int ch) {
  return ((double)pixel / 255.0 - MEAN[ch]) / STD[ch];
}

/* Expected value at (y, x, ch) of sample i after padding by pad, cropping at (dy, dx) in the
 * padded image and mirroring if flip. */
static double expected(const qt_dataset *ds, int i, int y, int x, int ch, int pad, int dy, int dx, int flip) {
  int sy = y + dy - pad, sx = (flip ? W - 1 - x : x) + dx - pad;
  if (sy < 0 || sy >= H || sx < 0 || sx >= W) return normalize(0, ch);
  return normalize(ds->images[i * S + (sy * W + sx) * C + ch], ch);
}

static int matches(const qt_dataset *ds, const float *img, int i, int pad, int dy, int dx, int flip) {
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++)
      for (int ch = 0; ch < C; ch++)
        if (fabs(img[(y * W + x) * C + ch] - expected(ds, i, y, x, ch, pad, dy, dx, flip)) > 1e-5) return 0;
  return 1;
}

/* Runs one epoch, storing labels in order (up to N) and all image floats; returns samples. */
static int run_epoch(qt_loader *l, int epoch, int32_t *order, float *pixels, int *batches) {
  const float *img;
  const int32_t *lab;
  int total = 0, b, nb = 0;
  qt_loader_start_epoch(l, epoch);
  while ((b = qt_loader_next(l, &img, &lab)) > 0) {
    if (total + b > N) { qt_test_fail("epoch %d: more than %d samples", epoch, N); return total; }
    memcpy(order + total, lab, (size_t)b * sizeof *lab);
    if (pixels) memcpy(pixels + (size_t)total * S, img, (size_t)b * S * sizeof *img);
    total += b;
    nb++;
  }
  QT_CHECK(qt_loader_next(l, &img, &lab) == 0);   /* stays done */
  if (batches) *batches = nb;
  return total;
}

static void check_permutation(const int32_t *order, int count, const char *what) {
  int seen[N] = {0};
  for (int i = 0; i < count; i++) {
    if (order[i] < 0 || order[i] >= N || seen[order[i]]++) { qt_test_fail("%s: sample %d repeated or invalid", what, order[i]); return; }
  }
}

int main(void) {
  qt_dataset ds;
  make_dataset(&ds);
  char err[QT_ERR_LEN] = "";
  qt_loader_config cfg = base_config();
  static int32_t o0[N], o1[N], o0b[N], o1b[N], tmp[N];
  static float p0[N * S], p0b[N * S];
  int nb = 0;

  /* Coverage, normalization, determinism, epoch-to-epoch differences. */
  qt_loader *a = qt_loader_create(&ds, &cfg, err);
  qt_loader *b = qt_loader_create(&ds, &cfg, err);
  if (!a || !b) { qt_test_fail("create: %s", err); return qt_test_finish(); }
  QT_CHECK(qt_loader_num_batches(a) == 5);
  QT_CHECK(run_epoch(a, 0, o0, p0, &nb) == N && nb == 5);
  check_permutation(o0, N, "epoch 0");
  for (int i = 0; i < N; i++)
    if (!matches(&ds, p0 + (size_t)i * S, o0[i], 0, 0, 0, 0)) { qt_test_fail("epoch 0 position %d: image is not normalized sample %d", i, o0[i]); break; }
  {
    int identity = 1;
    for (int i = 0; i < N; i++) identity &= o0[i] == i;
    QT_CHECK(!identity);
  }
  QT_CHECK(run_epoch(a, 1, o1, NULL, NULL) == N);
  check_permutation(o1, N, "epoch 1");
  QT_CHECK(memcmp(o0, o1, sizeof o0) != 0);
  /* A second loader, visiting epochs in another order, reproduces them exactly. */
  QT_CHECK(run_epoch(b, 1, o1b, NULL, NULL) == N);
  QT_CHECK(run_epoch(b, 0, o0b, p0b, NULL) == N);
  QT_CHECK(memcmp(o0, o0b, sizeof o0) == 0 && memcmp(o1, o1b, sizeof o1) == 0);
  QT_CHECK(memcmp(p0, p0b, sizeof p0) == 0);
  /* Restarting mid-epoch joins the prefetch thread and starts over. */
  {
    const float *img;
    const int32_t *lab;
    qt_loader_start_epoch(a, 0);
    QT_CHECK(qt_loader_next(a, &img, &lab) == 8);
    QT_CHECK(qt_loader_next(a, &img, &lab) == 8);
    QT_CHECK(run_epoch(a, 0, tmp, NULL, NULL) == N && memcmp(tmp, o0, sizeof o0) == 0);
    qt_loader_start_epoch(a, 5);
    QT_CHECK(qt_loader_next(a, &img, &lab) == 8);
  }
  qt_loader_free(a);   /* mid-epoch */
  qt_loader_free(b);
  qt_loader_free(NULL);

  /* Another seed gives another order; shuffle = 0 gives the dataset order. */
  cfg.seed = 43;
  a = qt_loader_create(&ds, &cfg, err);
  QT_CHECK(a && run_epoch(a, 0, tmp, NULL, NULL) == N && memcmp(tmp, o0, sizeof o0) != 0);
  qt_loader_free(a);
  cfg.shuffle = 0;
  a = qt_loader_create(&ds, &cfg, err);
  QT_CHECK(a && run_epoch(a, 3, tmp, NULL, NULL) == N);
  for (int i = 0; i < N; i++) QT_CHECK(tmp[i] == i);
  qt_loader_free(a);

  /* drop_last: 4 full batches of 8, no repeats. */
  cfg = base_config();
  cfg.drop_last = 1;
  a = loader_of(&ds, &cfg, 4);
  if (a) {
    QT_CHECK(run_epoch(a, 0, tmp, NULL, &nb) == 32 && nb == 4);
    check_permutation(tmp, 32, "drop_last");
    qt_loader_free(a);
  }
  /* A batch larger than the dataset without drop_last: one batch of N. */
  cfg = base_config();
  cfg.batch_size = 100;
  a = loader_of(&ds, &cfg, 1);
  if (a) {
    QT_CHECK(run_epoch(a, 0, tmp, NULL, &nb) == N && nb == 1);
    qt_loader_free(a);
  }

  /* Flip and crop: every output is the sample shifted by (dy, dx) in [0, 2 pad] of the
   * zero-padded image and possibly mirrored; both mirrors and several shifts occur; two
   * loaders agree bit for bit; another epoch draws differently. */
  for (int mode = 0; mode < 3; mode++) {
    cfg = base_config();
    cfg.flip = mode != 1;
    cfg.crop_pad = mode == 0 ? 0 : 2;
    qt_loader *x = qt_loader_create(&ds, &cfg, err), *y = qt_loader_create(&ds, &cfg, err);
    if (!x || !y) { qt_test_fail("augment create: %s", err); break; }
    int pad = cfg.crop_pad, flips = 0, shifts[5][5] = {{0}}, distinct_shifts = 0;
    run_epoch(x, 7, o0, p0, NULL);
    run_epoch(y, 7, o0b, p0b, NULL);
    QT_CHECK(memcmp(o0, o0b, sizeof o0) == 0 && memcmp(p0, p0b, sizeof p0) == 0);
    for (int i = 0; i < N; i++) {
      int found = 0;
      for (int f = 0; f <= cfg.flip && !found; f++)
        for (int dy = 0; dy <= 2 * pad && !found; dy++)
          for (int dx = 0; dx <= 2 * pad && !found; dx++)
            if (matches(&ds, p0 + (size_t)i * S, o0[i], pad, dy, dx, f)) {
              found = 1;
              flips += f;
              if (!shifts[dy][dx]++) distinct_shifts++;
            }
      if (!found) qt_test_fail("mode %d: position %d is no flip/crop of sample %d", mode, i, o0[i]);
    }
    if (cfg.flip) QT_CHECK(flips > 0 && flips < N);
    if (pad) QT_CHECK(distinct_shifts >= 5);
    run_epoch(x, 8, o1, p0b, NULL);
    /* Same samples, different draws: compare per sample. */
    int differ = 0;
    for (int i = 0; i < N; i++)
      for (int j = 0; j < N; j++)
        if (o1[j] == o0[i] && memcmp(p0 + (size_t)i * S, p0b + (size_t)j * S, S * sizeof(float)) != 0) differ++;
    QT_CHECK(differ > 0);
    qt_loader_free(x);
    qt_loader_free(y);
  }

  /* Shards (data-parallel training): shard k of 3 of every batch, for the 3 shards in order, is
   * the whole batch, images (cropped and flipped) and labels; each shard knows the batch's rows.
   * N = 37 in batches of 8 leaves a last batch of 5 (shards of 1, 2 and 2 rows). */
  {
    qt_loader_config whole = base_config();
    whole.crop_pad = 1;
    whole.flip = 1;
    qt_loader *w = loader_of(&ds, &whole, 5), *sh[3];
    for (int k = 0; k < 3; k++) {
      qt_loader_config c = whole;
      c.shard_count = 3;
      c.shard_index = k;
      sh[k] = loader_of(&ds, &c, 5);
    }
    for (int e = 0; e < 3 && w && sh[0] && sh[1] && sh[2]; e += 2) {
      qt_loader_start_epoch(w, e);
      for (int k = 0; k < 3; k++) qt_loader_start_epoch(sh[k], e);
      for (int bi = 0; bi < 5; bi++) {
        const float *wi, *si;
        const int32_t *wl, *sl;
        const int B = qt_loader_next(w, &wi, &wl);
        int at = 0;
        for (int k = 0; k < 3; k++) {
          const int n = qt_loader_next(sh[k], &si, &sl), want = B * (k + 1) / 3 - B * k / 3;
          if (n != want || qt_loader_batch_rows(sh[k]) != B || memcmp(sl, wl + at, (size_t)n * sizeof *sl) != 0 ||
              memcmp(si, wi + (size_t)at * S, (size_t)n * S * sizeof *si) != 0) {
            qt_test_fail("epoch %d batch %d: shard %d of 3 (%d rows, want %d of %d) is not its rows of the batch", e,
                         bi, k, n, want, B);
            break;
          }
          at += n;
        }
      }
      for (int k = 0; k < 3; k++) QT_CHECK(qt_loader_next(sh[k], NULL, NULL) == 0);
    }
    qt_loader_free(w);
    for (int k = 0; k < 3; k++) qt_loader_free(sh[k]);
  }

  /* Bad configurations. */
  struct { const char *what; qt_loader_config cfg; } bad[7];
  for (int i = 0; i < 7; i++) bad[i].cfg = base_config();
  bad[5].what = "6 shards of a last batch of 5"; bad[5].cfg.shard_count = 6;
  bad[6].what = "shard 3 of 3"; bad[6].cfg.shard_count = 3; bad[6].cfg.shard_index = 3;
  bad[0].what = "batch_size 0"; bad[0].cfg.batch_size = 0;
  bad[1].what = "std 0"; bad[1].cfg.std[1] = 0.0f;
  bad[2].what = "crop_pad -1"; bad[2].cfg.crop_pad = -1;
  bad[3].what = "drop_last with batch > n"; bad[3].cfg.drop_last = 1; bad[3].cfg.batch_size = N + 1;
  bad[4].what = "crop_pad > side"; bad[4].cfg.crop_pad = W + 1;
  for (int i = 0; i < 7; i++) {
    err[0] = 0;
    qt_loader *l = qt_loader_create(&ds, &bad[i].cfg, err);
    if (l || !err[0]) qt_test_fail("%s: expected NULL and a message", bad[i].what);
    qt_loader_free(l);
  }
  qt_dataset empty = {0};
  QT_CHECK(qt_loader_create(&empty, &cfg, err) == NULL);

  qt_dataset_free(&ds);
  return qt_test_finish();
}
