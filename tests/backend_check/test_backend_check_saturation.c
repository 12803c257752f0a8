/* The check pass and the int16 pair-sum saturation of x86 without VNNI (docs/design.md: no VNNI), from the
 * Q/DQ file alone: FashionCNN with full-range 8-bit weights is flagged on a forced non-VNNI
 * ISA (every integer layer, with the bound and the remedy), not with VNNI forced, and not when
 * the weights are 7-bit or the activations 7-bit. The bound's edges on a single layer: with
 * u8 activations up to 255, integer weights up to |64| pass (2 * 255 * 64 = 32640) and |65|
 * fail (33150), on either sign; activations up to 128 with |128| weights fail (32768). */
#include "tests/backend_check/bcheck_util.h"

static qt_backend_check_result check(const qt_graph *g, qt_isa_choice isa) {
  qt_backend_desc d;
  qt_backend_desc_onednn_cpu(&d, isa);
  return bcheck_run(g, &d);
}

/* The check of g on isa must find no violation; `what` names the case in the failure. */
static void expect_clean(const char *what, const qt_graph *g, qt_isa_choice isa) {
  qt_backend_check_result r = check(g, isa);
  if (r.n) {
    qt_test_fail("%s: %d violations, want none", what, r.n);
    qt_backend_check_print(&r, stderr);
  }
  qt_backend_check_result_free(&r);
}

static void fashion_cnn(void) {
  /* full-range 8-bit weights: what the onednn quantizer makes for a VNNI CPU */
  qt_graph *g = ptq_model("fashion_cnn", NULL, 8, 8, 1, "sat_w8a8.h5");
  qt_backend_check_result r = check(g, QT_ISA_NO_VNNI);
  const char *layers[] = {"conv1", "conv2", "fc1", "fc2"};
  for (int i = 0; i < 4; i++)
    if (violations(&r, QT_VIOLATION_SATURATION, layers[i], "> 32767") != 1 ||
        violations(&r, QT_VIOLATION_SATURATION, layers[i], "[-64, 63]") != 1)
      qt_test_fail("W8A8 on no-VNNI: %s not flagged for saturation with the bound and the remedy", layers[i]);
  if (r.n != 4) {
    qt_test_fail("W8A8 on no-VNNI: %d violations, want 4 (one per integer layer)", r.n);
    qt_backend_check_print(&r, stderr);
  }
  qt_backend_check_result_free(&r);
  expect_clean("W8A8 with VNNI forced", g, QT_ISA_VNNI);
  r = check(g, QT_ISA_AUTO); /* this machine: flagged exactly when oneDNN reports no VNNI */
  if ((r.n == 4) != !qt_cpu_has_vnni() || (r.n != 0 && r.n != 4))
    qt_test_fail("W8A8 with the ISA read from oneDNN (vnni %d): %d violations", qt_cpu_has_vnni(), r.n);
  qt_backend_check_result_free(&r);
  qt_graph_free(g);

  /* Quantizations that cannot saturate on no-VNNI. */
  const struct {
    const char *what, *path;
    int wbits, abits, has_vnni;
  } clean[] = {
      {"7-bit weights on no-VNNI", "sat_w7a8.h5", 8, 8, 0}, /* the onednn quantizer for a non-VNNI CPU */
      /* 7-bit activations [0, 127]: 2 * 127 * 128 = 32512 */
      {"8-bit weights with 7-bit activations on no-VNNI", "sat_w8a7.h5", 8, 7, 1},
      {"4-bit weights on no-VNNI", "sat_w4a8.h5", 4, 8, 1}, /* always exact */
  };
  for (int k = 0; k < 3; k++) {
    g = ptq_model("fashion_cnn", NULL, clean[k].wbits, clean[k].abits, clean[k].has_vnni, clean[k].path);
    expect_clean(clean[k].what, g, QT_ISA_NO_VNNI);
    qt_graph_free(g);
  }
}

/* input 2x2x4 -> q/dq [0, a_max] -> flatten -> linear 3 with one weight w (others 0) -> q/dq */
static void edge(int a_max, int w, int want_flag) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("edge");
  int x = qt_graph_input(g, "input", 2, 2, 4);
  x = qdq(g, "input.fq", x, 0, a_max, 0.01f, 0);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 3, 1);
  x = qdq(g, "fc.fq", x, 0, 255, 0.05f, 10);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  int_weights(g, "fc", 0.01f, 0, 1);
  g->nodes[qt_graph_find_node(g, "fc")].wq->qweight[7] = w;
  QT_ASSERT(qt_qdq_save("sat_edge.h5", g, err) == 0, "%s", err);
  qt_graph_free(g);
  g = qt_qdq_load("sat_edge.h5", err);
  QT_ASSERT(g, "%s", err);
  qt_backend_check_result r = check(g, QT_ISA_NO_VNNI);
  char want[64];
  snprintf(want, sizeof want, "2 * %d * %d = %d", a_max, abs(w), 2 * a_max * abs(w));
  const int flagged = violations(&r, QT_VIOLATION_SATURATION, "fc", want);
  if (flagged != want_flag || r.n != want_flag) {
    qt_test_fail("activations [0, %d], weight %d: %d saturation violations ('%s'), want %d", a_max, w, flagged, want,
                 want_flag);
    qt_backend_check_print(&r, stderr);
  }
  qt_backend_check_result_free(&r);
  qt_graph_free(g);
}

int main(void) {
  fashion_cnn();
  edge(255, 64, 0);
  edge(255, -64, 0);
  edge(255, 65, 1);
  edge(255, -65, 1);
  edge(255, -128, 1);
  edge(127, -128, 0);
  edge(128, -128, 1); /* 32768: one past int16 */
  edge(128, 127, 0);  /* 32512 */
  return qt_test_finish();
}
