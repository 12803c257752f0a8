/* The Quantizer for oneDNN's description in tests (header only; programs that include it link
 * the backend library): qt_quantizer with qt_backend_desc_onednn_cpu(isa), its settings, and a
 * PTQ-prepared graph from it; a graph read back from its Q/DQ file. */
#ifndef QT_TEST_QUANTIZER_UTIL_H
#define QT_TEST_QUANTIZER_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "qat/qat.h"
#include "tests/common/testutil.h"

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

/* n images of 28 x 28 x 1 uniform in [-0.8, 2) from seed (qt_test_fill_uniform); the caller frees. */
static inline float *qt_test_images(int n, uint64_t seed) {
  float *x = malloc(sizeof(float) * (size_t)n * 784);
  QT_ASSERT(x, "out of memory");
  qt_test_fill_uniform(x, (int64_t)n * 784, -0.8f, 2.0f, seed);
  return x;
}

/* Calibrates (PTQ) or trains 4 SGD steps at lr 0.01 (QAT, cross-entropy with labels i % 10) the
 * prepared p (a 28 x 28 x 1 input) on 4 batches of n qt_test_images, seeds 100 to 103. */
static inline void qt_test_exercise(qt_graph *p, qt_prepare_mode mode, int n) {
  qt_ctx *ctx = qt_ctx_create();
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)n);
  QT_ASSERT(labels, "out of memory");
  for (int i = 0; i < n; i++) labels[i] = i % 10;
  const int64_t shape[4] = {n, 28, 28, 1};
  for (int s = 0; s < 4; s++) {
    float *x = qt_test_images(n, 100 + (uint64_t)s);
    qt_ctx_reset(ctx);
    qt_graph_set_mode(p, QT_MODE_TRAIN);
    qt_ctx_set_grad(ctx, mode == QT_PREPARE_QAT);
    qt_tensor *out = qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
    if (!out) qt_test_fail("forward of prepared %s: %s", p->name, p->error);
    if (out && mode == QT_PREPARE_QAT) {
      qt_tensor *loss = qt_cross_entropy(ctx, out, labels, NULL);
      qt_graph_zero_grad(p);
      qt_backward(ctx, loss);
      for (int64_t i = 0; i < p->n_params; i++) p->params[i] -= 0.01f * p->grads[i];
    }
    free(x);
  }
  free(labels);
  qt_ctx_free(ctx);
}

/* Runs the Q/DQ graph c on device m for the n images x (NHWC, c's input shape) and fails `what` at
 * every output more than 1 LSB (the final dequantize's scale) from c's own float forward in eval
 * mode. Aborts when either run fails. */
static inline void qt_test_device_near_qdq(const char *what, qt_device *m, qt_graph *c, float *x, int n) {
  char err[QT_ERR_LEN];
  const int64_t on = qt_device_output_numel(m) * n;
  float *got = malloc((size_t)on * sizeof *got);
  QT_ASSERT(got, "out of memory");
  QT_ASSERT(qt_device_run(m, got, x, n, err) == 0, "%s: %s", what, err);
  const qt_value *in = &c->values[c->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_ctx *ctx = qt_ctx_create();
  qt_graph_set_mode(c, QT_MODE_EVAL);
  qt_tensor *y = qt_graph_forward(c, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  QT_ASSERT(y && qt_tensor_numel(y) == on, "%s: %s", what, c->error);
  const float lsb = c->nodes[c->values[c->output].producer].q->scale[0];
  for (int64_t k = 0; k < on; k++)
    if (fabsf(got[k] - qt_f32(y)[k]) > 1.0001f * lsb)
      qt_test_fail("%s: output %lld: device %g, Q/DQ %g (LSB %g)", what, (long long)k, got[k], qt_f32(y)[k], lsb);
  qt_ctx_free(ctx);
  free(got);
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
