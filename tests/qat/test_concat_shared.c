/* Shared qparams for concat: a backend description with concat_shared (XNNPACK's; oneDNN's with
 * the flag set here) ties a concat's inputs to one point, and the concat's output shares it.
 * - A fire module (SqueezeNet: two conv -> relu branches concatenated): the later branch's point
 *   is tied to the earlier one's; the tied fake quant uses the leader's state, so under PTQ with
 *   min-max observers its scale is the larger of the two branches' untied scales, bit for bit;
 *   under QAT with LSQ the two share one learned scale. Convert gives both quantize nodes the same
 *   qparams, the check passes, and XNNPACK and oneDNN run the concat as a copy in int8, within 1
 *   LSB of the Q/DQ graph.
 * - A ShuffleNet unit (a channel slice of a point, concatenated with a branch): the branch is tied
 *   to the point the slice shares.
 * - Not tied: inputs sharing two different points (the concat keeps its own output point and
 *   XNNPACK runs it as a fallback, naming the grids); onednn_cpu's default description (its
 *   concat requantizes each input).
 * - A bilinear resize for XNNPACK (resize_tied): its output tied to its input's point, run by
 *   XNNPACK's s8 resize; a nearest one shares its input's point, the next conv's int32 bias on
 *   that grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

enum { N = 16 };
enum model { FIRE, SHUFFLE, TWO_POINTS };

/* fire: input -> conv0 -> relu0 -> {e1: 1x1 conv -> relu, e3: 3x3 conv -> relu} -> concat;
 * shuffle: input -> conv0 -> relu0 -> {slice [0, 4), slice [4, 8) -> conv -> relu} -> concat;
 * two points: input -> conv0 -> relu0 -> pool_a, conv1 -> relu1 -> pool_b -> concat (each max
 * pool shares its own point). Then a max pool, a conv, the global average pool and a linear. */
static qt_graph *build(enum model m) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create(m == FIRE ? "fire" : m == SHUFFLE ? "shuffle" : "two_points");
  const int x = qt_graph_input(g, "input", 28, 28, 1);
  const int s = qt_graph_relu(g, "relu0", qt_graph_conv2d(g, "conv0", x, 8, 3, 2, 1, 1, 1));
  int in[2];
  if (m == FIRE) {
    in[0] = qt_graph_relu(g, "e1.relu", qt_graph_conv2d(g, "e1", s, 6, 1, 1, 0, 1, 1));
    in[1] = qt_graph_relu(g, "e3.relu", qt_graph_conv2d(g, "e3", s, 6, 3, 1, 1, 1, 1));
  } else if (m == SHUFFLE) {
    in[0] = qt_graph_channel_slice(g, "x1", s, 0, 4);
    const int b = qt_graph_channel_slice(g, "x2", s, 4, 8);
    in[1] = qt_graph_relu(g, "b.relu", qt_graph_conv2d(g, "b", b, 4, 1, 1, 0, 1, 1));
  } else {
    in[0] = qt_graph_max_pool2d(g, "pool_a", s, 3, 1, 1);
    const int t = qt_graph_relu(g, "relu1", qt_graph_conv2d(g, "conv1", s, 8, 3, 1, 1, 1, 1));
    in[1] = qt_graph_max_pool2d(g, "pool_b", t, 3, 1, 1);
  }
  int y = qt_graph_concat(g, "cat", in, 2);
  y = qt_graph_max_pool2d(g, "pool", y, 2, 2, 0);
  y = qt_graph_relu(g, "head.relu", qt_graph_conv2d(g, "head", y, 8, 3, 1, 1, 1, 1));
  y = qt_graph_linear(g, "fc", qt_graph_flatten(g, "flatten", qt_graph_global_avg_pool(g, "gap", y)), 10, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  qt_graph_init_params(g, 7);
  if (m == FIRE) { /* the 3x3 branch's outputs several times the 1x1's */
    float *w = qt_graph_tensor_data(g, g->nodes[qt_graph_find_node(g, "e3")].param[QT_P_WEIGHT]);
    for (int64_t i = 0; i < g->tensors[g->nodes[qt_graph_find_node(g, "e3")].param[QT_P_WEIGHT]].numel; i++)
      w[i] *= 4.0f;
  }
  return g;
}

static int value_of(const qt_graph *g, const char *node) { return g->nodes[qt_graph_find_node(g, node)].output; }

/* The prepared graph of g for desc d, calibrated or trained. */
static qt_graph *prepared(const qt_graph *g, const qt_backend_desc *d, qt_prepare_mode mode, int lsq,
                          qt_annotations *a) {
  char err[QT_ERR_LEN];
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qc.activation_observer = mode == QT_PREPARE_PTQ ? QT_OBSERVER_MINMAX : QT_OBSERVER_MOVING_AVERAGE;
  qc.learnable_scale = lsq;
  QT_ASSERT(qt_quantizer(g, d, &qc, a, err) == 0, "quantizer: %s", err);
  qt_graph *p = qt_prepare(g, a, mode, err);
  QT_ASSERT(p, "prepare: %s", err);
  qt_test_exercise(p, mode, N);
  return p;
}

/* Converts p, checks it, and runs it on d's device: node `node` an int8 partition (whose detail
 * holds `copy`) or a fallback whose reason holds `fallback`; the device within 1 LSB of the Q/DQ
 * graph. */
static void deploy(const char *what, qt_graph *p, const qt_backend_desc *d, const char *node, const char *copy,
                   const char *fallback) {
  char err[QT_ERR_LEN];
  qt_graph *c = qt_convert(p, err);
  QT_ASSERT(c, "%s: convert: %s", what, err);
  float *x = qt_test_images(N, 7);
  qt_check_report r;
  QT_ASSERT(qt_check(p, c, x, N, &r, err) == 0, "%s: check: %s", what, err);
  if (!r.ok) qt_test_fail("%s: the check failed:\n%s", what, r.reason);
  qt_device *m = qt_device_open(c, d, err);
  QT_ASSERT(m, "%s: %s", what, err);
  const char *reason = NULL;
  const int on = qt_device_node_on_backend(m, node, &reason);
  int copies = 0;
  for (int k = 0; k < qt_device_partition_count(m); k++) {
    const char *nodes, *detail;
    if (qt_device_partition(m, k, &nodes, &detail) == QT_PART_INT8 && strstr(nodes, node))
      copies += strstr(detail, copy) != NULL;
  }
  if (fallback ? on != 0 || !reason || !strstr(reason, fallback) : on != 1 || copies != 1) {
    qt_test_fail("%s: %s on the backend: %d, its partitions %d (%s)", what, node, on, copies, reason ? reason : "");
    qt_device_report(m, stderr);
  }
  if (!fallback && qt_device_count(m, QT_PART_FALLBACK) != 0) {
    qt_test_fail("%s: %d fallback partitions (want 0)", what, qt_device_count(m, QT_PART_FALLBACK));
    qt_device_report(m, stderr);
  }
  qt_test_device_near_qdq(what, m, c, x, N);
  qt_device_free(m);
  qt_graph_free(c);
  free(x);
}

/* The fake quant node at value name's point in prepared graph p. */
static const qt_node *fq_at(const qt_graph *p, const char *value) {
  char name[QT_NAME_LEN];
  snprintf(name, sizeof name, "%s.fq", value);
  const int i = qt_graph_find_node(p, name);
  QT_ASSERT(i >= 0 && p->nodes[i].op == QT_OP_FAKE_QUANT, "no fake quant %s", name);
  return &p->nodes[i];
}

static void fire(void) {
  qt_graph *g = build(FIRE);
  const int e1 = value_of(g, "e1.relu"), e3 = value_of(g, "e3.relu"), cat = value_of(g, "cat");
  qt_backend_desc onednn, shared, xnn;
  qt_backend_desc_onednn_cpu(&onednn, QT_ISA_VNNI);
  shared = onednn;
  shared.concat_shared = 1;
  qt_backend_desc_xnnpack(&xnn);
  /* untied (onednn_cpu's default): each branch its own point, the concat its own */
  qt_annotations a;
  qt_graph *p = prepared(g, &onednn, QT_PREPARE_PTQ, 0, &a);
  QT_CHECK(a.act[e1] && a.act[e3] && a.act[cat] && a.tie[e3] < 0);
  const float s1 = fq_at(p, "e1.relu")->q->scale[0], s3 = fq_at(p, "e3.relu")->q->scale[0];
  QT_CHECK(s3 > 2.0f * s1); /* the branches' ranges differ */
  deploy("fire, untied, oneDNN", p, &onednn, "cat", "requantized by a table", NULL);
  qt_annotations_free(&a);
  qt_graph_free(p);
  /* tied, PTQ with min-max observers: the leader's observer saw both branches */
  p = prepared(g, &shared, QT_PREPARE_PTQ, 0, &a);
  if (!a.act[e1] || !a.act[e3] || a.tie[e3] != e1 || a.tie[e1] >= 0 || a.act[cat] || a.share[cat] != e1)
    qt_test_fail("fire, tied: e1 point %d tie %d, e3 point %d tie %d, cat point %d share %d", a.act[e1], a.tie[e1],
                 a.act[e3], a.tie[e3], a.act[cat], a.share[cat]);
  const qt_node *f1 = fq_at(p, "e1.relu"), *f3 = fq_at(p, "e3.relu");
  if (f3->q != f1->q || !f3->q_tied || f1->q_tied || f1->q->scale[0] != fmaxf(s1, s3))
    qt_test_fail("fire, tied: the e3 fake quant's state is %s e1's (tied flag %d); scale %.9g, want %.9g",
                 f3->q == f1->q ? "" : "not", f3->q_tied, f1->q->scale[0], fmaxf(s1, s3));
  deploy("fire, tied, PTQ, oneDNN", p, &shared, "cat", "a copy, same qparams", NULL);
  qt_annotations_free(&a);
  qt_graph_free(p);
  /* tied, QAT with LSQ: one learned scale */
  p = prepared(g, &shared, QT_PREPARE_QAT, 1, &a);
  f1 = fq_at(p, "e1.relu");
  f3 = fq_at(p, "e3.relu");
  QT_CHECK(f3->q == f1->q && f1->q->scale_param >= 0 && qt_graph_find_node(p, "e3.relu.fq") >= 0);
  char name[QT_NAME_LEN];
  snprintf(name, sizeof name, "e3.relu.fq.scale");
  for (int t = 0; t < p->n_tensors; t++)
    if (strcmp(p->tensors[t].name, name) == 0) qt_test_fail("fire, LSQ: the tied point has a scale of its own");
  deploy("fire, tied, QAT LSQ, oneDNN", p, &shared, "cat", "a copy, same qparams", NULL);
  qt_annotations_free(&a);
  qt_graph_free(p);
  /* XNNPACK's Quantizer ties them; its device copies (no fallback anywhere) */
  p = prepared(g, &xnn, QT_PREPARE_QAT, 0, &a);
  QT_CHECK(a.tie[e3] == e1 && a.share[cat] == e1);
  deploy("fire, XNNPACK, QAT", p, &xnn, "cat", "copies, same qparams", NULL);
  qt_annotations_free(&a);
  qt_graph_free(p);
  qt_graph_free(g);
}

static void shuffle(void) {
  qt_graph *g = build(SHUFFLE);
  qt_backend_desc xnn;
  qt_backend_desc_xnnpack(&xnn);
  qt_annotations a;
  qt_graph *p = prepared(g, &xnn, QT_PREPARE_PTQ, 0, &a);
  const int r0 = value_of(g, "relu0"), b = value_of(g, "b.relu"), x1 = value_of(g, "x1"), cat = value_of(g, "cat");
  if (!a.act[r0] || a.tie[b] != r0 || a.share[x1] != r0 || a.share[cat] != r0 || a.act[cat])
    qt_test_fail("shuffle: b tie %d (want relu0 %d), x1 share %d, cat point %d share %d", a.tie[b], r0, a.share[x1],
                 a.act[cat], a.share[cat]);
  QT_CHECK(fq_at(p, "b.relu")->q == fq_at(p, "relu0")->q);
  deploy("shuffle, XNNPACK, PTQ", p, &xnn, "cat", "copies, same qparams", NULL);
  qt_annotations_free(&a);
  qt_graph_free(p);
  qt_graph_free(g);
}

static void two_points(void) {
  qt_graph *g = build(TWO_POINTS);
  qt_backend_desc xnn;
  qt_backend_desc_xnnpack(&xnn);
  qt_annotations a;
  qt_graph *p = prepared(g, &xnn, QT_PREPARE_PTQ, 0, &a);
  const int pa = value_of(g, "pool_a"), pb = value_of(g, "pool_b"), cat = value_of(g, "cat");
  QT_CHECK(a.share[pa] >= 0 && a.share[pb] >= 0 && a.tie[pa] < 0 && a.tie[pb] < 0 && a.act[cat] && a.share[cat] < 0);
  deploy("two points, XNNPACK", p, &xnn, "cat", "", "inputs on different grids");
  qt_annotations_free(&a);
  qt_graph_free(p);
  qt_graph_free(g);
}

/* A bilinear resize for XNNPACK (resize_tied): its output point tied to its input's (relu0's),
 * one fake quant state; XNNPACK's s8 resize runs it in int8, within 1 LSB of the Q/DQ graph.
 * onednn_cpu's description leaves it untied (a fallback between its own quantize points). A
 * nearest resize shares its input's point, and the conv after it takes its int32 bias on that
 * grid (qt_graph_quant_source walks through the resize). */
static void resize(int mode) {
  char err[QT_ERR_LEN];
  const int bilinear = mode == QT_RESIZE_BILINEAR;
  qt_graph *g = qt_graph_create("resize");
  const int x = qt_graph_input(g, "input", 28, 28, 1);
  const int r0 = qt_graph_relu(g, "relu0", qt_graph_conv2d(g, "conv0", x, 8, 3, 2, 1, 1, 1));
  int y = qt_graph_resize(g, "up", r0, mode);
  y = qt_graph_relu(g, "head.relu", qt_graph_conv2d(g, "head", y, 8, 3, 2, 1, 1, 1));
  y = qt_graph_linear(g, "fc", qt_graph_flatten(g, "flatten", qt_graph_global_avg_pool(g, "gap", y)), 10, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  qt_graph_init_params(g, 7);
  const int up = value_of(g, "up");
  qt_backend_desc xnn, onednn;
  qt_backend_desc_xnnpack(&xnn);
  qt_backend_desc_onednn_cpu(&onednn, QT_ISA_VNNI);
  qt_annotations a;
  for (int qat = 0; qat < 2; qat++) {
    char what[64];
    snprintf(what, sizeof what, "resize %s, XNNPACK, %s", bilinear ? "bilinear" : "nearest", qat ? "QAT" : "PTQ");
    qt_graph *p = prepared(g, &xnn, qat ? QT_PREPARE_QAT : QT_PREPARE_PTQ, 0, &a);
    if (bilinear ? !a.act[up] || a.tie[up] != r0 : a.act[up] || a.share[up] != r0)
      qt_test_fail("%s: up point %d tie %d share %d, want relu0 %d", what, a.act[up], a.tie[up], a.share[up], r0);
    if (bilinear) QT_CHECK(fq_at(p, "up")->q == fq_at(p, "relu0")->q && fq_at(p, "up")->q_tied);
    deploy(what, p, &xnn, "up", bilinear ? "resize (bilinear, x2) s8" : "resize (nearest, x2) on int8", NULL);
    qt_annotations_free(&a);
    qt_graph_free(p);
  }
  qt_graph *p = prepared(g, &onednn, QT_PREPARE_PTQ, 0, &a);
  QT_CHECK(bilinear ? a.act[up] && a.tie[up] < 0 : a.share[up] == r0);
  qt_annotations_free(&a);
  qt_graph_free(p);
  qt_graph_free(g);
}

int main(void) {
  fire();
  shuffle();
  two_points();
  resize(QT_RESIZE_BILINEAR);
  resize(QT_RESIZE_NEAREST);
  return qt_test_finish();
}
