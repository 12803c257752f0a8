/* The Quantizer for oneDNN's description in tests (header only; programs that include it link
 * the backend library): qt_quantizer with qt_backend_desc_onednn_cpu(isa), its settings, and a
 * PTQ-prepared graph from it; a graph read back from its Q/DQ file. */
#ifndef QT_TEST_QUANTIZER_UTIL_H
#define QT_TEST_QUANTIZER_UTIL_H

#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "qat/qat.h"

static inline int qt_test_quantizer_onednn(const qt_graph *g, const qt_quantizer_config *qc, qt_isa_choice isa,
                                           qt_annotations *a, char *err) {
  qt_backend_desc d;
  qt_backend_desc_onednn_cpu(&d, isa);
  return qt_quantizer(g, &d, qc, a, err);
}

/* The default quantizer settings with wbits-bit weights and abits-bit activations. */
static inline qt_quantizer_config qt_test_quantizer_config(int wbits, int abits) {
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qc.weight_bits = wbits;
  qc.activation_bits = abits;
  return qc;
}

/* g prepared (PTQ or QAT) as the oneDNN quantizer annotates it for `isa` with settings qc; aborts
 * on an error. g is not consumed. */
static inline qt_graph *qt_test_prepare_onednn_isa(const qt_graph *g, const qt_quantizer_config *qc,
                                                   qt_prepare_mode mode, qt_isa_choice isa) {
  char err[QT_ERR_LEN];
  qt_annotations a;
  QT_ASSERT(qt_test_quantizer_onednn(g, qc, isa, &a, err) == 0, "%s", err);
  qt_graph *p = qt_prepare(g, &a, mode, err);
  QT_ASSERT(p, "%s", err);
  qt_annotations_free(&a);
  return p;
}

/* The same for this CPU's ISA (QT_ISA_AUTO). */
static inline qt_graph *qt_test_prepare_onednn(const qt_graph *g, const qt_quantizer_config *qc, qt_prepare_mode mode) {
  return qt_test_prepare_onednn_isa(g, qc, mode, QT_ISA_AUTO);
}

/* PTQ calibration of the prepared p on the n images x (NHWC, p's input shape) as one batch, its
 * observers then frozen; p is left in QT_MODE_TRAIN (as qt_stage_calibrate leaves it). Aborts when
 * the forward fails. */
static inline void qt_test_calibrate(qt_graph *p, const float *x, int64_t n) {
  const qt_value *in = &p->values[p->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_ctx *ctx = qt_ctx_create();
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  QT_ASSERT(qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x)), "calibration: %s", p->error);
  qt_set_observers(p, 0);
  qt_graph_set_mode(p, QT_MODE_TRAIN);
  qt_ctx_free(ctx);
}

/* g prepared for PTQ with the oneDNN quantizer's default settings. */
static inline qt_graph *qt_test_prepare_ptq_onednn(const qt_graph *g) {
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  return qt_test_prepare_onednn(g, &qc, QT_PREPARE_PTQ);
}

/* g written to a temporary file by qt_qdq_save and read back by qt_qdq_load (the file is removed):
 * what a deployment tool reads, and a copy of g that shares nothing with it. Aborts on an error. */
static inline qt_graph *qt_test_qdq_reload(const qt_graph *g) {
  char err[QT_ERR_LEN], path[] = "/tmp/qt_test_qdq_XXXXXX";
  const int fd = mkstemp(path);
  QT_ASSERT(fd >= 0, "mkstemp");
  close(fd);
  QT_ASSERT(qt_qdq_save(path, g, err) == 0, "%s", err);
  qt_graph *l = qt_qdq_load(path, err);
  QT_ASSERT(l, "%s", err);
  unlink(path);
  return l;
}

#endif
