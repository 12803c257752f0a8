/* Fuzz target: the ONNX importer (onnx/onnx_import.h qt_onnx_import), behind it protobuf-c's
 * unpack and the bounded wire walk before it (onnx/wire.h).
 *
 * Input: an ONNX file. It is written as model.onnx in a scratch directory of its own, next to a
 * side file ext_data.bin (4 KB of a fixed pattern), so that external-data references
 * ("location": "ext_data.bin", offsets, lengths) reach the reader, and imported with the data
 * shape 28 x 28 x 1 (dynamic input dims resolve to it). The import either returns a finalized
 * graph or refuses with a message naming the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz/fuzz_util.h"
#include "onnx/onnx_import.h"

static char dir[4096], model[4200], side[4200];

static void remove_dir(void) {
  unlink(model);
  unlink(side);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(dir, sizeof dir, "%s", qt_fuzz_path(0, "onnx.d"));
  QT_ASSERT(mkdir(dir, 0700) == 0, "fuzz onnx: cannot make %s", dir);
  atexit(remove_dir);
  snprintf(model, sizeof model, "%s/model.onnx", dir);
  snprintf(side, sizeof side, "%s/ext_data.bin", dir);
  uint8_t pattern[4096];
  for (size_t i = 0; i < sizeof pattern; i++) pattern[i] = (uint8_t)(i * 37 + 11);
  qt_fuzz_write_file(side, pattern, sizeof pattern);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4 << 20) return 0;
  qt_fuzz_write_file(model, data, size);
  const int hwc[3] = {28, 28, 1};
  char err[QT_ERR_LEN] = "";
  qt_onnx_info info;
  qt_graph *g = qt_onnx_import(model, hwc, &info, err);
  if (!g) {
    QT_ASSERT(err[0] && strstr(err, model), "fuzz onnx: a refusal without a message naming the file: '%s'", err);
    return 0;
  }
  QT_ASSERT(g->finalized, "fuzz onnx: an imported graph that is not finalized");
  qt_graph_free(g);
  return 0;
}
