/* Fuzz target: the HDF5 dataset reader (data/data.h qt_dataset_load_hdf5).
 *
 * Input: an HDF5 file (checksums recomputed first, fuzz_util.h). The loader must load a
 * well-formed dataset (labels inside the class count, fuzz_data_check.h) or refuse with a
 * message, and close every HDF5 object it opened. */
#include <stdlib.h>

#include "fuzz/fuzz_data_check.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  qt_fuzz_h5_init();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20) return 0;
  uint8_t *buf = malloc(size ? size : 1);
  QT_ASSERT(buf, "out of memory");
  memcpy(buf, data, size);
  qt_fuzz_h5_fix_checksums(buf, size);
  const char *path = qt_fuzz_path(0, "data.h5");
  qt_fuzz_write_file(path, buf, size);
  free(buf);
  qt_dataset ds = {0};
  char err[QT_ERR_LEN] = "";
  const int rc = qt_dataset_load_hdf5(&ds, path, err);
  qt_fuzz_h5_expect_closed("qt_dataset_load_hdf5");
  qt_fuzz_check_dataset(&ds, rc, err);
  return 0;
}
