/* A test tool: the imported model's fp32 eval-mode forward on given inputs, for comparisons with
 * ONNX Runtime on the same file (tests/ort/test_ort_torch2.py).
 * Usage: onnx_forward MODEL.onnx IN.f32 N OUT.f32
 * IN.f32: N images as raw float32, NHWC, of the model's input shape (dynamic dims: 28x28x1);
 * OUT.f32: the N rows of logits as raw float32. Exit 0, or 1 with a message. */
#include <stdio.h>
#include <stdlib.h>

#include "onnx/onnx_import.h"

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: onnx_forward MODEL.onnx IN.f32 N OUT.f32\n");
    return 1;
  }
  char err[QT_ERR_LEN];
  const int hwc[3] = {28, 28, 1};
  qt_graph *g = qt_onnx_import(argv[1], hwc, NULL, err);
  if (!g) {
    fprintf(stderr, "onnx_forward: %s\n", err);
    return 1;
  }
  const qt_value *in = &g->values[g->input];
  const int64_t n = atoll(argv[3]), per = in->shape[0] * in->shape[1] * in->shape[2];
  float *x = malloc((size_t)(n * per) * sizeof(float));
  FILE *f = fopen(argv[2], "rb");
  if (n < 1 || !x || !f || fread(x, sizeof(float), (size_t)(n * per), f) != (size_t)(n * per)) {
    fprintf(stderr, "onnx_forward: cannot read %lld images of %lld values from %s\n", (long long)n, (long long)per,
            argv[2]);
    return 1;
  }
  fclose(f);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_graph_set_training(g, 0);
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  if (!y) {
    fprintf(stderr, "onnx_forward: %s\n", g->error);
    return 1;
  }
  f = fopen(argv[4], "wb");
  if (!f || fwrite(qt_f32(y), sizeof(float), (size_t)qt_tensor_numel(y), f) != (size_t)qt_tensor_numel(y) || fclose(f)) {
    fprintf(stderr, "onnx_forward: cannot write %s\n", argv[4]);
    return 1;
  }
  qt_ctx_free(ctx);
  qt_graph_free(g);
  free(x);
  return 0;
}
