/* Fuzz target: the IDX reader (data/data.h qt_dataset_load_idx), gzip'd or raw.
 *
 * Input: the images file, QT_FUZZ_SEP, the labels file (without a separator both files get the
 * whole input). Each is written to a scratch file; the loader must either load a well-formed
 * dataset (fuzz_data_check.h) or refuse with a message. */
#include "fuzz/fuzz_data_check.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20) return 0;
  const uint8_t *part[2];
  size_t len[2];
  if (qt_fuzz_split(data, size, part, len, 2) == 1) {
    part[1] = part[0];
    len[1] = len[0];
  }
  const char *images = qt_fuzz_path(0, "images.idx"), *labels = qt_fuzz_path(1, "labels.idx");
  qt_fuzz_write_file(images, part[0], len[0]);
  qt_fuzz_write_file(labels, part[1], len[1]);
  qt_dataset ds = {0};
  char err[QT_ERR_LEN] = "";
  const int rc = qt_dataset_load_idx(&ds, images, labels, err);
  qt_fuzz_check_dataset(&ds, rc, err);
  return 0;
}
