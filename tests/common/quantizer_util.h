/* The Quantizer for oneDNN's description in tests (header only; programs that include it link
 * the backend library): qt_quantizer with qt_backend_desc_onednn_cpu(isa). */
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

#endif
