/* XNNPACK's description (qt_backend_desc_xnnpack) and the Quantizer derived from it: signed
 * affine (qs8) activations, per-channel symmetric conv weights (qc8), per-tensor linear weights
 * (qs8 fully connected), 2..8 bits in int8; its models pass the check against it; a model
 * quantized for oneDNN (u8 activations, per-channel linear weights, float biases) checked
 * against XNNPACK lists every violation by node, and the XNNPACK model checked against oneDNN is refused too
 * (signed activations). The name resolver takes onednn, xnnpack and description files. */
#include <stdio.h>
#include <string.h>

#include "tests/backend_check/bcheck_util.h"

static void check_annotations(const char *model) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_graph *g = qt_model_build(model, err);
  QT_ASSERT(g, "%s", err);
  for (int wb = 2; wb <= 8; wb += 2) {
    qt_quantizer_config qc = qt_test_quantizer_config(wb, 8 - (wb == 2 ? 4 : 0));
    qt_annotations a;
    if (qt_quantizer(g, &d, &qc, &a, err)) {
      qt_test_fail("%s W%d: quantizer for xnnpack: %s", model, wb, err);
      continue;
    }
    for (int v = 0; v < a.n_values; v++) {
      if (!a.act[v]) continue;
      const qt_qspec *s = &a.act_spec[v];
      if (!s->is_signed || s->symmetric || s->per_channel || s->qmin >= 0)
        qt_test_fail("%s: activation %s: want signed affine per-tensor, got signed %d symmetric %d per_channel %d "
                     "[%d, %d]", model, g->values[v].name, s->is_signed, s->symmetric, s->per_channel, s->qmin, s->qmax);
    }
    int convs = 0, linears = 0;
    for (int i = 0; i < a.n_nodes; i++) {
      if (!a.weight[i]) continue;
      const qt_qspec *s = &a.weight_spec[i];
      const int is_linear = g->nodes[i].op == QT_OP_LINEAR;
      convs += !is_linear;
      linears += is_linear;
      int lo, hi;
      qt_qrange(wb, 1, &lo, &hi);
      if (!s->is_signed || !s->symmetric || s->per_channel != !is_linear || s->bits != wb || s->qmin != lo)
        qt_test_fail("%s W%d: weights of %s: want signed symmetric %s %d-bit, got per_channel %d %d-bit [%d, %d]",
                     model, wb, g->nodes[i].name, is_linear ? "per-tensor" : "per-channel", wb, s->per_channel,
                     s->bits, s->qmin, s->qmax);
    }
    if (!convs || !linears) qt_test_fail("%s: %d conv and %d linear layers quantized", model, convs, linears);
    qt_annotations_free(&a);
  }
  qt_graph_free(g);
}

static void check_models(const char *model) {
  qt_backend_desc x, o;
  qt_backend_desc_xnnpack(&x);
  qt_backend_desc_onednn_cpu(&o, QT_ISA_VNNI);
  char path[256];
  snprintf(path, sizeof path, "test_backend_check_xnnpack_%s.h5", model);
  /* quantized for XNNPACK: no violations against it */
  qt_graph *gx = ptq_model(model, &x, 8, 8, 1, path);
  qt_backend_check_result r = bcheck_run(gx, &x);
  if (r.n) {
    qt_test_fail("%s quantized for xnnpack: %d violations against xnnpack", model, r.n);
    qt_backend_check_print(&r, stderr);
  }
  qt_backend_check_result_free(&r);
  /* against oneDNN: every quantize is signed */
  r = bcheck_run(gx, &o);
  int quantizes = 0;
  for (int i = 0; i < gx->n_nodes; i++) quantizes += gx->nodes[i].op == QT_OP_QUANTIZE;
  if (r.count[QT_VIOLATION_SIGN] != quantizes)
    qt_test_fail("%s quantized for xnnpack, checked against onednn: %d sign violations, want %d", model,
                 r.count[QT_VIOLATION_SIGN], quantizes);
  qt_backend_check_result_free(&r);
  qt_graph_free(gx);

  /* quantized for oneDNN (VNNI: 8-bit weights): against XNNPACK, every quantize [sign], every
   * linear [granularity] and every layer's float bias [bias], named */
  qt_graph *go = ptq_model(model, NULL, 8, 8, 1, path);
  r = bcheck_run(go, &x);
  int want_sign = 0, want_gran = 0, want_bias = 0;
  for (int i = 0; i < go->n_nodes; i++) {
    const qt_node *n = &go->nodes[i];
    if (n->op == QT_OP_QUANTIZE) {
      want_sign++;
      if (!violations(&r, QT_VIOLATION_SIGN, n->name, "xnnpack takes signed activations only"))
        qt_test_fail("%s (onednn) vs xnnpack: no sign violation named %s", model, n->name);
    }
    if (n->op == QT_OP_LINEAR && n->wq && n->wq->channels > 1) {
      want_gran++;
      if (!violations(&r, QT_VIOLATION_GRANULARITY, n->name, "one weight scale per linear"))
        qt_test_fail("%s (onednn) vs xnnpack: no granularity violation named %s", model, n->name);
    }
    if (n->wq && n->param[QT_P_BIAS] >= 0) {
      want_bias++;
      if (!violations(&r, QT_VIOLATION_BIAS, n->name, "float bias; xnnpack adds the bias as int32"))
        qt_test_fail("%s (onednn) vs xnnpack: no bias violation named %s", model, n->name);
    }
  }
  if (r.n != want_sign + want_gran + want_bias || !want_gran || !want_bias)
    qt_test_fail("%s (onednn) vs xnnpack: %d violations, want %d sign + %d granularity + %d bias", model, r.n,
                 want_sign, want_gran, want_bias);
  if (getenv("QT_TEST_VERBOSE")) qt_backend_check_print(&r, stderr);
  qt_backend_check_result_free(&r);
  qt_graph_free(go);
  remove(path);
}

static void check_names(void) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  QT_CHECK(qt_backend_desc_named(&d, "xnnpack", QT_ISA_AUTO, err) == 0 && d.xnnpack_runtime &&
           strcmp(d.name, "xnnpack") == 0);
  QT_CHECK(qt_backend_desc_named(&d, "onednn", QT_ISA_NO_VNNI, err) == 0 && d.onednn_runtime && d.pair_sum_int16);
  QT_CHECK(qt_backend_desc_named(&d, "onednn_cpu", QT_ISA_VNNI, err) == 0 && d.onednn_runtime && !d.pair_sum_int16);
  QT_CHECK(qt_backend_desc_named(&d, "xnnpack", QT_ISA_VNNI, err) == -1 && strstr(err, "onednn"));
  QT_CHECK(qt_backend_desc_named(&d, qt_test_path("experiments/accel_fictional.ini"), QT_ISA_AUTO, err) == 0 &&
           !d.onednn_runtime && !d.xnnpack_runtime);
  QT_CHECK(qt_backend_desc_named(&d, "no_such_backend.ini", QT_ISA_AUTO, err) == -1 &&
           strstr(err, "no_such_backend.ini"));
  /* the description's printout names the per-tensor linear weights */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  qt_backend_desc_xnnpack(&d);
  qt_backend_desc_print(&d, f);
  fclose(f);
  if (!strstr(text, "per-tensor only: linear") || !strstr(text, "backend xnnpack"))
    qt_test_fail("xnnpack description printout:\n%s", text);
  free(text);
}

int main(void) {
  check_names();
  check_annotations("fashion_cnn");
  check_annotations("res_cnn");
  check_models("fashion_cnn");
  check_models("res_cnn");
  return qt_test_finish();
}
