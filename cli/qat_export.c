/* qat_export MODEL_QDQ.h5 OUT.onnx [--int32-bias] [--quiet]: writes a Q/DQ graph (qat_train's model_qdq.h5) as a
 * standard QDQ ONNX model (onnx/onnx_export.h, docs/onnx_export.md) that onnx.checker accepts and
 * ONNX Runtime runs. Exit 0: written; 1: the file could not be written; 2: bad input (an
 * unreadable or non-Q/DQ model file, a prepared graph such as model_trained.h5, a graph the
 * export cannot express, a bad option). */
#include <stdio.h>
#include <string.h>

#include "onnx/onnx_export.h"
#include "qat/qat.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: qat_export MODEL_QDQ.h5 OUT.onnx [--int32-bias] [--quiet]\n"
          "  Writes the Q/DQ graph MODEL_QDQ.h5 (qat_train's model_qdq.h5) as a QDQ ONNX model (IR 8, opset 13):\n"
          "  QuantizeLinear/DequantizeLinear at every quantization point, integer weights through\n"
          "  DequantizeLinear, fp32 biases, input NCHW [batch, C, H, W] named 'input', output 'logits'.\n"
          "  --int32-bias  biases as int32 at scale s_x * s_w (rounded: a small change of the model) where a\n"
          "                layer has integer weights and a dequantized input, so that ONNX Runtime fuses the\n"
          "                layer into its integer kernels (QLinearConv, QGemm); default: fp32 biases, exactly\n"
          "                the Q/DQ graph\n"
          "  --quiet       print nothing on success\n"
          "Exit status: 0 written, 1 the file could not be written, 2 bad input.\n");
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    usage(stdout);
    return 0;
  }
  const char *paths[2] = {NULL, NULL};
  int n_paths = 0, quiet = 0;
  qt_onnx_export_options opt = {0};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quiet") == 0) {
      quiet = 1;
    } else if (strcmp(argv[i], "--int32-bias") == 0) {
      opt.int32_bias = 1;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "qat_export: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else if (n_paths < 2) {
      paths[n_paths++] = argv[i];
    } else {
      fprintf(stderr, "qat_export: unexpected argument '%s' (takes MODEL_QDQ.h5 and OUT.onnx)\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (n_paths != 2) {
    usage(stderr);
    return 2;
  }
  if (qt_same_file(paths[0], paths[1])) {
    fprintf(stderr, "qat_export: %s and %s are the same file; the export would replace its input\n", paths[0],
            paths[1]);
    return 2;
  }
  char err[QT_ERR_LEN];
  qt_graph *g = qt_qdq_load(paths[0], err);
  if (!g) {
    fprintf(stderr, "qat_export: %s\n", err);
    return 2;
  }
  qt_onnx_export_info info;
  const int rc = qt_onnx_export_qdq_opt(g, paths[1], &opt, &info, err);
  qt_graph_free(g);
  if (rc) {
    fprintf(stderr, "qat_export: %s\n", err);
    return info.io_error ? 1 : 2;
  }
  if (!quiet)
    printf(
        "qat_export: %s -> %s: %d ONNX nodes (opset %lld, IR %lld), %d QuantizeLinear, %d DequantizeLinear, "
        "%d integer weights, %d fp32 weights, %d fp32 biases, %d int32 biases, %d range Clips, %d relu6 as Relu, "
        "%d permuted linear weights, %lld bytes\n",
        paths[0], paths[1], info.nodes, (long long)info.opset, (long long)info.ir_version, info.quantize,
        info.dequantize, info.int_weights, info.float_weights, info.float_biases, info.int32_biases, info.clips,
        info.relu6_as_relu, info.permuted, (long long)info.bytes);
  return 0;
}
