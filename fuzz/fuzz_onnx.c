/* Fuzz target: the ONNX importer (onnx/onnx_import.h qt_onnx_import), behind it protobuf-c's
 * unpack and the bounded wire walk before it (onnx/wire.h).
 *
 * Input: an ONNX file. It is written to a scratch file and imported with the data shape
 * 28 x 28 x 1 (dynamic input dims resolve to it). The import either returns a finalized graph
 * or refuses with a message naming the file. */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "onnx/onnx_import.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4 << 20) return 0;
  const char *path = qt_fuzz_path(0, "model.onnx");
  qt_fuzz_write_file(path, data, size);
  const int hwc[3] = {28, 28, 1};
  char err[QT_ERR_LEN] = "";
  qt_onnx_info info;
  qt_graph *g = qt_onnx_import(path, hwc, &info, err);
  if (!g) {
    QT_ASSERT(err[0] && strstr(err, path), "fuzz onnx: a refusal without a message naming the file: '%s'", err);
    return 0;
  }
  QT_ASSERT(g->finalized, "fuzz onnx: an imported graph that is not finalized");
  qt_graph_free(g);
  return 0;
}
