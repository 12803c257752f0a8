/* The HDF5 checksum fix-ups of the fuzz targets (fuzz_util.h) compute exactly HDF5's checksums:
 * run on the committed HDF5 seeds (written by HDF5 itself) they rewrite every checksum they
 * know (superblock, object headers, Fletcher-32 chunks) without changing a byte, and they write
 * some on the Q/DQ files and the QAT checkpoints. After a tensor byte is changed and the
 * checksums fixed, HDF5 reads the file again (so mutations reach the readers). */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "fuzz/fuzz_util.h"
#include "tests/common/testutil.h"

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  QT_ASSERT(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*n);
  QT_ASSERT(b && fread(b, 1, *n, f) == *n, "cannot read %s", path);
  fclose(f);
  return b;
}

/* Fixes the file unchanged; returns the number of checksums written. */
static int fixes_nothing(const char *rel) {
  size_t n;
  unsigned char *a = read_file(qt_test_path(rel), &n), *b = malloc(n);
  memcpy(b, a, n);
  const int written = qt_fuzz_h5_fix_checksums(b, n);
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) {
      qt_test_fail("%s: byte %zu changed from 0x%02x to 0x%02x (a checksum HDF5 computes differently)", rel, i, a[i],
                   b[i]);
      break;
    }
  free(a);
  free(b);
  return written;
}

/* Adds 1 to the first float of dataset `name` in a copy of the file, fixes the checksums and
 * reads the dataset back with HDF5: it must read, with the new value. */
static void mutation_reads(const char *rel, const char *name) {
  size_t n;
  unsigned char *b = read_file(qt_test_path(rel), &n);
  hid_t f = H5Fopen(qt_test_path(rel), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  haddr_t at = HADDR_UNDEF;
  hsize_t offset[4] = {0};
  unsigned mask = 0;
  hsize_t size = 0;
  QT_ASSERT(d >= 0 && H5Dget_chunk_info_by_coord(d, offset, &mask, &at, &size) >= 0, "%s: %s", rel, name);
  H5Dclose(d);
  H5Fclose(f);
  float v;
  memcpy(&v, b + at, 4);
  v += 1.0f;
  memcpy(b + at, &v, 4);
  QT_CHECK(qt_fuzz_h5_fix_checksums(b, n) > 0);
  const char *path = "fuzz_checksums_case.h5";
  FILE *o = fopen(path, "wb");
  QT_ASSERT(o && fwrite(b, 1, n, o) == n && fclose(o) == 0, "writing %s", path);
  free(b);
  f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  d = f >= 0 ? H5Dopen2(f, name, H5P_DEFAULT) : -1;
  hid_t sp = d >= 0 ? H5Dget_space(d) : -1;
  const hssize_t count = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : 0;
  float *all = malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
  if (d < 0 || count <= 0 || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) < 0)
    qt_test_fail("%s: %s does not read after a changed value and fixed checksums", rel, name);
  else if (all[0] != v)
    qt_test_fail("%s: %s[0] reads %g, want %g", rel, name, all[0], v);
  free(all);
  if (sp >= 0) H5Sclose(sp);
  if (d >= 0) H5Dclose(d);
  if (f >= 0) H5Fclose(f);
  remove(path);
}

int main(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  static const char *const qdq[] = {"tiny_ptq_w8a8.h5", "tiny_qat_prepared.h5", "all_ops_ptq_w4a8.h5",
                                    "all_ops_ptq_overrides.h5", "all_ops_qat_prepared.h5"};
  static const char *const ckpt[] = {"qat_start.h5", "qat_trained.h5", "qat_frozen.h5", "fp32_sgd.h5"};
  static const char *const data[] = {"chunked_gzip_fletcher.h5", "latest_format.h5", "nhw_int64.h5"};
  char rel[256];
  for (size_t i = 0; i < sizeof qdq / sizeof *qdq; i++) {
    snprintf(rel, sizeof rel, "fuzz/corpus/qdq/%s", qdq[i]);
    if (fixes_nothing(rel) < 20) qt_test_fail("%s: fewer than 20 checksums found", rel);
  }
  for (size_t i = 0; i < sizeof ckpt / sizeof *ckpt; i++) {
    snprintf(rel, sizeof rel, "fuzz/corpus/checkpoint/%s", ckpt[i]);
    const int w = fixes_nothing(rel);
    if (i < 3 && w < 10) qt_test_fail("%s: fewer than 10 Fletcher-32 chunks found", rel);
  }
  for (size_t i = 0; i < sizeof data / sizeof *data; i++) {
    snprintf(rel, sizeof rel, "fuzz/corpus/hdf5/%s", data[i]);
    fixes_nothing(rel);
  }
  mutation_reads("fuzz/corpus/qdq/tiny_ptq_w8a8.h5", "/tensors/fc.bias");
  mutation_reads("fuzz/corpus/checkpoint/qat_trained.h5", "/quant/activation/relu1.fq/scale");
  return qt_test_finish();
}
