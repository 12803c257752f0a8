/* Synchronized observers under mpirun (2 or more processes). Every process makes the whole batches
 * (seeded) and runs a one-process observer on them itself; then it observes only its slice,
 * synchronized with the others, and compares.
 *
 * 1. Observers (qt_observer_update_sync): min-max, moving average (per tensor and per channel) and
 *    histogram, over three batches split unevenly (process r's slice grows with r; one batch
 *    leaves process 0's slice empty), the third batch outside the range of the first two (the
 *    histogram grows): the state (min, max, histogram counts and range) and the qparams are the
 *    one-process observer's bit for bit, on every process. A NaN in one process's slice is the
 *    same error on every process, naming that process.
 * 2. QAT (FashionCNN prepared W4A8, per-channel weights, moving-average activation observers):
 *    three training-mode steps on slices of a batch of 32, observers and fake quant on, SyncBN:
 *    every process holds the same qparams and observer state bit for bit (checksums compared),
 *    and the scales are within 1e-2 of the one-process steps' (zero points within 1). Not closer:
 *    the observers see SyncBN's outputs, which differ from one process's by float reordering, and
 *    fake quant turns a few of those differences into a neighbouring bin (test_sync_bn), whose
 *    effect reaches the later layers' ranges: measured 7.7e-4 at fc2's output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "qat/qat.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/dist_util.h"
#include "tests/common/testutil.h"

static int R, me, verbose;
static const qt_batch_sync *sync;

/* ---- 1. observers ----------------------------------------------------------------------------- */
#define OUTER 40
#define C 3
#define INNER 5

/* The rows [first, first + n) of OUTER that process `me` holds in batch b. */
static void slice(int b, int *first, int *n) {
  /* weights: process r gets (r + 1 + b) parts, process 0 none in batch 1 */
  int w[64], total = 0;
  for (int r = 0; r < R; r++) total += w[r] = (b == 1 && r == 0) ? 0 : r + 1 + b;
  int at = 0;
  for (int r = 0; r < R; r++) {
    const int k = r == R - 1 ? OUTER - at : OUTER * w[r] / total;
    if (r == me) {
      *first = at;
      *n = k;
    }
    at += k;
  }
}

static void same_state(const char *what, const qt_observer *a, const qt_observer *b) {
  int bad = a->initialized != b->initialized || memcmp(a->min, b->min, (size_t)a->channels * sizeof(float)) ||
            memcmp(a->max, b->max, (size_t)a->channels * sizeof(float));
  if (a->kind == QT_OBSERVER_HISTOGRAM)
    bad |= memcmp(&a->hist_min, &b->hist_min, sizeof(float)) || memcmp(&a->hist_max, &b->hist_max, sizeof(float)) ||
           memcmp(a->hist, b->hist, (size_t)a->bins * sizeof(int64_t));
  float sa[C], sb[C];
  int32_t za[C], zb[C];
  char err[QT_ERR_LEN];
  QT_CHECK(qt_observer_qparams(a, -8, 7, 0, sa, za, err) == 0);
  QT_CHECK(qt_observer_qparams(b, -8, 7, 0, sb, zb, err) == 0);
  bad |= memcmp(sa, sb, (size_t)a->channels * sizeof(float)) || memcmp(za, zb, (size_t)a->channels * sizeof(int32_t));
  if (bad)
    qt_test_fail("process %d: %s: the synchronized observer differs from the one-process observer (min %g vs %g, "
                 "max %g vs %g, scale %g vs %g)",
                 me, what, (double)b->min[0], (double)a->min[0], (double)b->max[0], (double)a->max[0], (double)sb[0],
                 (double)sa[0]);
}

static void observers(qt_observer_kind kind, int channels) {
  char err[QT_ERR_LEN], what[96];
  snprintf(what, sizeof what, "%s observer, %d channel(s)", qt_observer_kind_name(kind), channels);
  qt_observer one, mine;
  memset(&one, 0, sizeof one);
  memset(&mine, 0, sizeof mine);
  QT_ASSERT(qt_observer_init(&one, kind, channels, err) == 0 && qt_observer_init(&mine, kind, channels, err) == 0,
            "%s", err);
  const int64_t per = (int64_t)C * INNER; /* floats per row */
  for (int b = 0; b < 3; b++) {
    float *x = qt_test_uniform(OUTER * per, 20 + (uint64_t)b);
    for (int64_t i = 0; i < OUTER * per; i++) x[i] = x[i] * (1.0f + (float)b) + (b == 2 ? 3.0f : 0.0f);
    /* the whole batch, viewed (rows, channels, inner) for per-channel observers */
    const int64_t inner_view = channels == 1 ? per : INNER;
    QT_ASSERT(qt_observer_update(&one, x, OUTER, inner_view, err) == 0, "%s", err);
    int first, n;
    slice(b, &first, &n);
    QT_ASSERT(qt_observer_update_sync(&mine, x + first * per, n, inner_view, sync, err) == 0, "%s", err);
    free(x);
  }
  same_state(what, &one, &mine);
  /* a NaN in the last process's slice: the same error everywhere */
  float *x = qt_test_uniform(OUTER * per, 30);
  int first, n;
  slice(0, &first, &n);
  if (me == R - 1) x[first * per + 2] = NAN;
  const int rc = qt_observer_update_sync(&mine, x + first * per, n, channels == 1 ? per : INNER, sync, err);
  char want[64];
  snprintf(want, sizeof want, "input of process %d holds NaN at element 2", R - 1);
  if (rc == 0 || !strstr(err, want)) qt_test_fail("process %d: %s: a NaN on process %d gave: %s", me, what, R - 1, rc ? err : "no error");
  free(x);
  qt_observer_free(&one);
  qt_observer_free(&mine);
}

/* ---- 2. QAT steps ----------------------------------------------------------------------------- */
#define BATCH 32

static uint64_t qstate_hash(uint64_t h, const qt_qstate *q) {
  if (!q) return h;
  h = qt_dist_hash(h, q->scale, (size_t)q->channels * sizeof(float));
  h = qt_dist_hash(h, q->zero_point, (size_t)q->channels * sizeof(int32_t));
  h = qt_dist_hash(h, q->obs.min, (size_t)q->obs.channels * sizeof(float));
  return qt_dist_hash(h, q->obs.max, (size_t)q->obs.channels * sizeof(float));
}

static qt_graph *prepared(const qt_graph *fp32) {
  qt_quantizer_config qc = qt_test_quantizer_config(4, 8);
  qt_graph *p = qt_test_prepare_onednn(fp32, &qc, QT_PREPARE_QAT);
  qt_graph_set_mode(p, QT_MODE_TRAIN);
  return p;
}

static void qat_steps(void) {
  char err[QT_ERR_LEN];
  qt_graph *fp32 = qt_model_build("fashion_cnn", err);
  QT_ASSERT(fp32, "%s", err);
  qt_graph *ref = prepared(fp32), *dist = prepared(fp32);
  float *images = qt_test_zeros(BATCH * 784);
  const int first = BATCH * me / R, n = BATCH * (me + 1) / R - first;
  qt_ctx *ctx = qt_ctx_create(), *sctx = qt_ctx_create();
  qt_ctx_set_batch_sync(sctx, sync);
  qt_ctx_set_grad(ctx, 0);
  qt_ctx_set_grad(sctx, 0);
  for (int s = 0; s < 3; s++) {
    qt_test_fill_uniform(images, BATCH * 784, -0.8f, 2.0f + (float)s, 90 + (uint64_t)s);
    const int64_t whole[4] = {BATCH, 28, 28, 1}, part[4] = {n, 28, 28, 1};
    qt_ctx_reset(ctx);
    qt_ctx_reset(sctx);
    QT_ASSERT(qt_graph_forward(ref, ctx, qt_tensor_wrap(ctx, QT_F32, 4, whole, images)), "%s", ref->error);
    QT_ASSERT(qt_graph_forward(dist, sctx, qt_tensor_wrap(sctx, QT_F32, 4, part, images + first * 784)), "%s",
              dist->error);
  }
  int points = 0;
  uint64_t h = QT_DIST_HASH_INIT;
  double worst = 0;
  for (int i = 0; i < ref->n_nodes; i++) {
    const qt_qstate *a = ref->nodes[i].q, *b = dist->nodes[i].q;
    if (!a || ref->nodes[i].op != QT_OP_FAKE_QUANT) continue;
    points++;
    h = qstate_hash(h, b);
    if (!b->calibrated) qt_test_fail("%s: no qparams after three synchronized steps", ref->nodes[i].name);
    for (int c = 0; c < a->channels; c++) {
      const double rel = fabs((double)b->scale[c] - (double)a->scale[c]) / fabs((double)a->scale[c]);
      worst = rel > worst || isnan(rel) ? rel : worst;
      if (!(rel <= 1e-2) || abs(b->zero_point[c] - a->zero_point[c]) > 1)
        qt_test_fail("%s: scale %.9g zero point %d, one process: %.9g %d", ref->nodes[i].name, (double)b->scale[c],
                     b->zero_point[c], (double)a->scale[c], a->zero_point[c]);
    }
  }
  if (verbose && me == 0) printf("QAT: %d activation quantization points, largest scale difference %.3g\n", points, worst);
  if (points < 4) qt_test_fail("the QAT-prepared FashionCNN has %d activation quantization points, want 4 or more", points);
  uint64_t *all = malloc((size_t)R * sizeof *all);
  QT_ASSERT(all, "out of memory");
  qt_dist_allgather(&h, sizeof h, all);
  for (int r = 1; r < R; r++)
    if (all[r] != all[0]) qt_test_fail("the qparams or observers of process %d differ from process 0's", r);
  free(all);
  qt_ctx_free(ctx);
  qt_ctx_free(sctx);
  free(images);
  qt_graph_free(ref);
  qt_graph_free(dist);
  qt_graph_free(fp32);
}

int main(int argc, char **argv) {
  if (qt_test_dist_begin(&argc, &argv, "test_sync_observers", 64)) return 1;
  R = qt_dist_size();
  me = qt_dist_rank();
  verbose = getenv("QT_TEST_VERBOSE") != NULL;
  sync = qt_dist_batch_sync();
  observers(QT_OBSERVER_MINMAX, 1);
  observers(QT_OBSERVER_MINMAX, C);
  observers(QT_OBSERVER_MOVING_AVERAGE, 1);
  observers(QT_OBSERVER_MOVING_AVERAGE, C);
  observers(QT_OBSERVER_HISTOGRAM, 1);
  qat_steps();
  return qt_test_dist_finish();
}
