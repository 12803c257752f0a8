/* The Quantizer for oneDNN's description in tests (header only; programs that include it link
 * the backend library): qt_quantizer with qt_backend_desc_onednn_cpu(isa), its settings, and a
 * PTQ-prepared graph from it. */
#ifndef QT_TEST_QUANTIZER_UTIL_H
#define QT_TEST_QUANTIZER_UTIL_H

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

/* g prepared (PTQ or QAT) as the oneDNN quantizer annotates it with settings qc (QT_ISA_AUTO);
 * aborts on an error. g is not consumed. */
static inline qt_graph *qt_test_prepare_onednn(const qt_graph *g, const qt_quantizer_config *qc, qt_prepare_mode mode) {
  char err[QT_ERR_LEN];
  qt_annotations a;
  QT_ASSERT(qt_test_quantizer_onednn(g, qc, QT_ISA_AUTO, &a, err) == 0, "%s", err);
  qt_graph *p = qt_prepare(g, &a, mode, err);
  QT_ASSERT(p, "%s", err);
  qt_annotations_free(&a);
  return p;
}

/* g prepared for PTQ with the oneDNN quantizer's default settings. */
static inline qt_graph *qt_test_prepare_ptq_onednn(const qt_graph *g) {
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  return qt_test_prepare_onednn(g, &qc, QT_PREPARE_PTQ);
}

#endif
