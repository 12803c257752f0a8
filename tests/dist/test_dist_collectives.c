/* The job's collectives (dist/dist.h) under mpirun with 2 or more processes: the fixed-order sums
 * of float and double buffers give, bit for bit, the sum over the processes' values in rank order
 * in double (rounded once), on every process, for buffers shorter than the process count, of odd
 * lengths and of several rounds, through the small path (one all-gather) and the segmented one;
 * all-gather in rank order; broadcast from a rank other than 0.
 * Every process's values are a function of its rank, so each can compute the expected result. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "tests/common/dist_util.h"
#include "tests/common/testutil.h"

/* Process r's values: uniform in [-1, 1) times a scale that grows with r, so that the order of
 * the additions shows in the rounding. */
static void values(float *x, int64_t n, int r) {
  qt_test_fill_uniform(x, n, -1.0f, 1.0f, 1000 + (uint64_t)r);
  for (int64_t i = 0; i < n; i++) x[i] *= 1.0f + 1000.0f * (float)r;
}

static void check_sums(int64_t n, int R, int me) {
  float *x = malloc((size_t)n * sizeof *x), *v = malloc((size_t)n * sizeof *v), *want = malloc((size_t)n * sizeof *want);
  double *xd = malloc((size_t)n * sizeof *xd), *wantd = malloc((size_t)n * sizeof *wantd), *acc = calloc((size_t)n, sizeof *acc);
  QT_ASSERT(x && v && want && xd && wantd && acc, "out of memory");
  for (int r = 0; r < R; r++) {
    values(v, n, r);
    for (int64_t i = 0; i < n; i++) acc[i] += (double)v[i];
    if (r == me) memcpy(x, v, (size_t)n * sizeof *x);
  }
  for (int64_t i = 0; i < n; i++) {
    want[i] = (float)acc[i];
    wantd[i] = acc[i];
    xd[i] = (double)x[i];
  }
  qt_dist_sum_f32(x, n);
  qt_dist_sum_f64(xd, n);
  int64_t bad = 0, badd = 0;
  for (int64_t i = 0; i < n; i++) {
    bad += memcmp(&x[i], &want[i], sizeof *x) != 0;
    badd += memcmp(&xd[i], &wantd[i], sizeof *xd) != 0;
  }
  if (bad || badd)
    qt_test_fail("process %d: sum of %lld elements over %d processes: %lld float and %lld double elements differ from "
                 "the rank-order double sum (first: %.9g vs %.9g)",
                 me, (long long)n, R, (long long)bad, (long long)badd, (double)x[0], (double)want[0]);
  /* the same bits on every process */
  const uint64_t h = qt_dist_hash(qt_dist_hash(QT_DIST_HASH_INIT, x, (size_t)n * sizeof *x), xd, (size_t)n * sizeof *xd);
  uint64_t *all = malloc((size_t)R * sizeof *all);
  QT_ASSERT(all, "out of memory");
  qt_dist_allgather(&h, sizeof h, all);
  for (int r = 1; r < R; r++)
    if (all[r] != all[0]) qt_test_fail("sum of %lld elements: process %d's result differs from process 0's", (long long)n, r);
  free(all);
  free(x);
  free(v);
  free(want);
  free(xd);
  free(wantd);
  free(acc);
}

int main(int argc, char **argv) {
  if (qt_test_dist_begin(&argc, &argv, "test_dist_collectives", 0)) return 1;
  const int R = qt_dist_size(), me = qt_dist_rank();
  /* shorter than the process count, odd, larger than one round of 2^22 elements (dist.c); the
   * first three take the small path (one all-gather: every copy totals at most
   * QT_DIST_SMALL_SUM_BYTES), the largest float one that fits and the next take one path each,
   * the last the segmented path in two rounds: every one must give the rank-order sum */
  const int64_t small_f32 = (int64_t)(QT_DIST_SMALL_SUM_BYTES / sizeof(float) / (size_t)R);
  const int64_t sizes[] = {1, 3, 1001, small_f32, small_f32 + 1, ((int64_t)1 << 22) + 7};
  const int64_t small_before = qt_dist_small_sums();
  /* with 2 processes: the float and double sums of 1, 3 and 1001 elements, the float one of small_f32 */
  int64_t small_want = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    check_sums(sizes[i], R, me);
    small_want += ((size_t)sizes[i] * sizeof(float) * (size_t)R <= QT_DIST_SMALL_SUM_BYTES) +
                  ((size_t)sizes[i] * sizeof(double) * (size_t)R <= QT_DIST_SMALL_SUM_BYTES);
  }
  if (qt_dist_small_sums() - small_before != small_want || (R == 2 && small_want != 7))
    qt_test_fail("%lld sums took the small path, want %lld", (long long)(qt_dist_small_sums() - small_before),
                 (long long)small_want);

  int32_t mine[2] = {me, 7 * me + 1}, *got = malloc(2 * sizeof(int32_t) * (size_t)R);
  QT_ASSERT(got, "out of memory");
  qt_dist_allgather(mine, sizeof mine, got);
  for (int r = 0; r < R; r++)
    if (got[2 * r] != r || got[2 * r + 1] != 7 * r + 1)
      qt_test_fail("all-gather: slot %d holds (%d, %d), want (%d, %d)", r, got[2 * r], got[2 * r + 1], r, 7 * r + 1);
  free(got);

  double b[3] = {me, me + 0.5, -me};
  qt_dist_broadcast(b, sizeof b, R - 1);
  if (b[0] != R - 1 || b[1] != R - 0.5 || b[2] != -(R - 1))
    qt_test_fail("process %d: broadcast from %d gave (%g, %g, %g)", me, R - 1, b[0], b[1], b[2]);
  qt_dist_barrier();

  /* the verdict of every process, so that all exit with the same status */
  return qt_test_dist_finish();
}
