/* Per-node SQNR (qt_analysis_node_sqnr) on a case with a known answer.
 *
 * fp32 graph: input (1x1x1) -> flatten -> fc (linear 1 -> 1, weight 0.11, bias 0). Four images
 * with pixels 2, 13, 26, 90, normalized with mean 0 and std 1/255, so x = pixel.
 * Fake-quant graph: the onednn quantizer + PTQ prepare, then the qparams are set by hand:
 *   - flatten.fq (the linear's input): scale 1, zero point 0, u8 [0, 255]: x is reproduced;
 *   - fc weight: scale 0.025, s8: 0.11 / 0.025 = 4.4 -> 4 -> 0.1;
 *   - fc.fq (output): scale 0.5, zero point 0, u4 [0, 15].
 * fp32 fc: y = 0.11 p = 0.22, 1.43, 2.86, 9.9. Fake quant: 0.1 p = 0.2, 1.3, 2.6, 9.0 ->
 * round(y/0.5) = 0, 3, 5, 18 -> clamped to 15 -> 0, 1.5, 2.5, 7.5.
 * SQNR(fc) = 10 log10(sum y^2 / sum (y - y_q)^2) = 10 log10(108.2829 / 5.9429) = 12.6055 dB.
 * The images go in batches of 3 and 1, so the sums must accumulate across batches.
 * The fake-quant graph compared with itself (fake quant off as the reference) gives the same.
 * Also: model bytes = weight at its bits (rounded up to bytes) + 4 per bias element. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "tests/common/testutil.h"
#include "train/analysis.h"
#include "tests/common/quantizer_util.h"

static void set_q(qt_qstate *q, float scale, int qmin, int qmax) {
  for (int c = 0; c < q->channels; c++) {
    q->scale[c] = scale;
    q->zero_point[c] = 0;
  }
  q->spec.qmin = qmin;
  q->spec.qmax = qmax;
  q->calibrated = 1;
  q->observe = 0;
  q->fake_quant = 1;
}

int main(void) {
  char err[QT_ERR_LEN] = "";
  qt_graph *g = qt_graph_create("tiny");
  int x = qt_graph_input(g, "input", 1, 1, 1);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 1, 1);
  if (qt_graph_finalize(g, x, err)) qt_test_fail("finalize: %s", err);
  qt_graph_tensor_data(g, qt_graph_find_tensor(g, "fc.weight"))[0] = 0.11f;
  qt_graph_tensor_data(g, qt_graph_find_tensor(g, "fc.bias"))[0] = 0.0f;

  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qt_annotations ann;
  /* the VNNI Quantizer on any CPU: 8-bit weights (the analysis runs no int8 kernel) */
  if (qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &ann, err)) qt_test_fail("quantizer: %s", err);
  qt_graph *p = qt_prepare(g, &ann, QT_PREPARE_PTQ, err);
  qt_annotations_free(&ann);
  if (!p) {
    qt_test_fail("prepare: %s", err);
    return qt_test_finish();
  }
  int in_fq = qt_graph_find_node(p, "flatten.fq"), out_fq = qt_graph_find_node(p, "fc.fq"), fc = qt_graph_find_node(p, "fc");
  QT_CHECK(in_fq >= 0 && out_fq >= 0 && fc >= 0);
  if (in_fq < 0 || out_fq < 0 || fc < 0) return qt_test_finish();
  QT_CHECK(p->nodes[fc].wq != NULL);
  set_q(p->nodes[in_fq].q, 1.0f, 0, 255);
  set_q(p->nodes[fc].wq, 0.025f, -128, 127);
  set_q(p->nodes[out_fq].q, 0.5f, 0, 15);

  uint8_t pixels[4] = {2, 13, 26, 90};
  int32_t labels[4] = {0, 0, 0, 0};
  qt_dataset ds = {.n = 4, .h = 1, .w = 1, .c = 1, .num_classes = 1, .images = pixels, .labels = labels};
  qt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = 3;
  for (int c = 0; c < 4; c++) {
    lc.mean[c] = 0.0f;
    lc.std[c] = 1.0f / 255.0f;
  }
  qt_ctx *ctx = qt_ctx_create();
  qt_node_sqnr *rows = NULL;
  int n = 0;
  if (qt_analysis_node_sqnr(g, p, ctx, &ds, &lc, 0, &rows, &n, err)) qt_test_fail("node sqnr: %s", err);

  /* by hand, in double */
  double signal = 0, noise = 0;
  const double yq[4] = {0, 1.5, 2.5, 7.5};
  for (int i = 0; i < 4; i++) {
    double y = 0.11 * pixels[i];
    signal += y * y;
    noise += (y - yq[i]) * (y - yq[i]);
  }
  const double want = 10.0 * log10(signal / noise);
  if (fabs(want - 12.6055) > 1e-3) qt_test_fail("hand computation %.6f dB, expected 12.6055", want);

  int seen_fc = 0, seen_in = 0;
  for (int i = 0; i < n; i++) {
    const qt_node_sqnr *r = &rows[i];
    double db = qt_sqnr_sum_db(&r->sqnr);
    if (r->sqnr.n != 4) qt_test_fail("%s: %lld elements compared, want 4", r->node, (long long)r->sqnr.n);
    if (strcmp(r->node, "fc") == 0) {
      seen_fc = 1;
      QT_CHECK(r->act_quantized && r->weight_bits == 8 && strcmp(r->ref, "fc") == 0);
      if (!(fabs(db - want) < 1e-4)) qt_test_fail("fc: SQNR %.6f dB, want %.6f dB", db, want);
      if (!(fabs(r->sqnr.signal - signal) < 1e-4 && fabs(r->sqnr.noise - noise) < 1e-4))
        qt_test_fail("fc: sums %.6f / %.6f, want %.6f / %.6f", r->sqnr.signal, r->sqnr.noise, signal, noise);
    } else if (strcmp(r->node, "input") == 0 || strcmp(r->node, "flatten") == 0) {
      seen_in++;
      /* integers reproduced: exact up to float rounding of the normalization */
      if (!(db > 100.0)) qt_test_fail("%s: SQNR %.3f dB, want > 100 (x is reproduced)", r->node, db);
    }
  }
  QT_CHECK(seen_fc == 1 && seen_in == 2);
  QT_CHECK(n == 3);

  /* The same graph as its own reference (QAT debugging): the pass with fake quant off is the
   * fp32 fc, so fc has the same known answer; fake quant is on again afterwards. */
  free(rows);
  rows = NULL;
  if (qt_analysis_node_sqnr(p, p, ctx, &ds, &lc, 0, &rows, &n, err)) qt_test_fail("node sqnr (same graph): %s", err);
  int seen = 0;
  for (int i = 0; i < n; i++)
    if (strcmp(rows[i].node, "fc") == 0) {
      seen = 1;
      double db = qt_sqnr_sum_db(&rows[i].sqnr);
      if (!(fabs(db - want) < 1e-4)) qt_test_fail("fc (same graph): SQNR %.6f dB, want %.6f dB", db, want);
    }
  QT_CHECK(seen && p->nodes[out_fq].q->fake_quant && p->nodes[fc].wq->fake_quant && p->nodes[in_fq].q->fake_quant);

  /* Model size: fp32: 4 (weight) + 4 (bias); 8-bit weight: 1 + 4. */
  QT_CHECK(qt_analysis_model_bytes(g) == 8);
  QT_CHECK(qt_analysis_model_bytes(p) == 5);

  free(rows);
  qt_ctx_free(ctx);
  qt_graph_free(p);
  qt_graph_free(g);
  return qt_test_finish();
}
