/* Bucketed sums (qt_dist_sum_begin, qt_dist_sum_progress, qt_dist_sum_wait_all) under mpirun with
 * 2 or more processes: a slab summed in buckets holds, bit for bit, what one qt_dist_sum_f32 of the
 * whole slab gives, on every process, whatever the cuts: buckets of 1 element, of sizes that do not
 * divide the slab (through the small path and through the segmented one), one larger than the slab
 * and than a round of 2^22 elements, irregular cuts posted out of slab order with progress calls
 * and other (blocking) collectives in between, as the trainer's backward does. Every process's
 * values are a function of its rank and grow with it, so the order of the additions shows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "tests/common/dist_util.h"
#include "tests/common/testutil.h"

static int R, me;

static float *values(int64_t n) {
  float *x = malloc((size_t)n * sizeof *x);
  QT_ASSERT(x, "out of memory");
  qt_test_fill_uniform(x, n, -1.0f, 1.0f, 2000 + (uint64_t)me);
  for (int64_t i = 0; i < n; i++) x[i] *= 1.0f + 1000.0f * (float)me;
  return x;
}

/* got against the blocking sum want (n), and the same bits on every process. */
static void same_bits(const char *what, const float *got, const float *want, int64_t n) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof *got) != 0) {
      bad++;
      if (first < 0) first = i;
    }
  if (bad)
    qt_test_fail("process %d: %s: %lld of %lld elements differ from qt_dist_sum_f32 of the slab (first at %lld: %.9g vs "
                 "%.9g)",
                 me, what, (long long)bad, (long long)n, (long long)first, (double)got[first], (double)want[first]);
  const uint64_t h = qt_dist_hash(QT_DIST_HASH_INIT, got, (size_t)n * sizeof *got);
  uint64_t *all = malloc((size_t)R * sizeof *all);
  QT_ASSERT(all, "out of memory");
  qt_dist_allgather(&h, sizeof h, all);
  for (int r = 1; r < R; r++)
    if (all[r] != all[0]) qt_test_fail("%s: process %d's result differs from process 0's", what, r);
  free(all);
}

/* A slab of n summed in buckets of `size` elements (the last shorter), in slab order, with a
 * progress call after each. */
static void even_buckets(int64_t n, int64_t size) {
  float *x = values(n), *want = malloc((size_t)n * sizeof *want);
  QT_ASSERT(want, "out of memory");
  memcpy(want, x, (size_t)n * sizeof *x);
  qt_dist_sum_f32(want, n);
  for (int64_t at = 0; at < n; at += size) {
    qt_dist_sum_begin(x + at, n - at < size ? n - at : size);
    qt_dist_sum_progress();
  }
  qt_dist_sum_wait_all();
  char what[96];
  snprintf(what, sizeof what, "a slab of %lld in buckets of %lld", (long long)n, (long long)size);
  same_bits(what, x, want, n);
  free(x);
  free(want);
}

/* Irregular cuts (the same on every process), posted last bucket first, with progress calls and a
 * blocking sum and an all-gather between the posts; the blocking ones must give their own results. */
static void irregular_buckets(int64_t n) {
  float *x = values(n), *want = malloc((size_t)n * sizeof *want);
  QT_ASSERT(want, "out of memory");
  memcpy(want, x, (size_t)n * sizeof *x);
  qt_dist_sum_f32(want, n);
  int64_t cuts[64];
  int k = 0;
  uint64_t s = 12345;
  cuts[k++] = n;
  while (cuts[k - 1] > 0 && k < 63) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t len = 1 + (int64_t)((s >> 33) % (uint64_t)(n / 8)); /* 1 .. n/8: small and segmented */
    cuts[k] = cuts[k - 1] > len ? cuts[k - 1] - len : 0;
    k++;
  }
  if (cuts[k - 1] > 0) cuts[k++] = 0;
  for (int i = 0; i + 1 < k; i++) {
    qt_dist_sum_begin(x + cuts[i + 1], cuts[i] - cuts[i + 1]);
    qt_dist_sum_progress();
    double d[3] = {me, 0.5 * me, 1};
    qt_dist_sum_f64(d, 3);
    if (d[0] != R * (R - 1) / 2.0 || d[2] != R)
      qt_test_fail("process %d: a blocking sum between buckets gave (%g, %g, %g)", me, d[0], d[1], d[2]);
    int32_t mine = 3 * me + i, got[64];
    if (R <= 64) {
      qt_dist_allgather(&mine, sizeof mine, got);
      for (int r = 0; r < R; r++)
        if (got[r] != 3 * r + i) qt_test_fail("process %d: an all-gather between buckets gave %d from %d", me, got[r], r);
    }
    qt_dist_sum_progress();
  }
  qt_dist_sum_wait_all();
  char what[96];
  snprintf(what, sizeof what, "a slab of %lld in %d irregular buckets, last first", (long long)n, k - 1);
  same_bits(what, x, want, n);
  free(x);
  free(want);
}

int main(int argc, char **argv) {
  if (qt_test_dist_begin(&argc, &argv, "test_dist_buckets", 64)) return 1;
  R = qt_dist_size();
  me = qt_dist_rank();
  const int64_t small_f32 = (int64_t)(QT_DIST_SMALL_SUM_BYTES / sizeof(float) / (size_t)R);
  even_buckets(257, 1);                       /* one element each */
  even_buckets(300007, 1000);                 /* small path, the last bucket 7 */
  even_buckets(300007, small_f32 + 1);        /* segmented, not a divisor */
  even_buckets(300007, 300007 + 99);          /* larger than the slab: one bucket */
  even_buckets(((int64_t)1 << 22) + 7, (int64_t)1 << 23); /* one bucket of more than a round */
  irregular_buckets(200003);
  qt_dist_sum_wait_all(); /* nothing posted: returns at once */
  return qt_test_dist_finish();
}
