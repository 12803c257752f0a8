/* HDF5 loading: (N,H,W,C) and (N,H,W) uint8 images with labels of any integer type load
 * exactly; a missing dataset, a wrong rank or dtype, mismatched N, negative labels or a file
 * that is not HDF5 is an error naming the file. */
#include "data/data.h"
#include "tests/common/testutil.h"

#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 6, H = 3, W = 2, C = 3 };

static uint8_t images[N * H * W * C];

/* Creates `path` holding "images" (rank irank, dims idims, uint8 unless float_images) and,
 * when lrank > 0, "labels" of type ltype. */
static void write_file(const char *path, int irank, const hsize_t *idims, int float_images,
                       int lrank, const hsize_t *ldims, hid_t ltype, const void *labels) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) { fprintf(stderr, "cannot create %s\n", path); exit(1); }
  herr_t rc;
  if (float_images) {
    hsize_t n = 1;
    for (int i = 0; i < irank; i++) n *= idims[i];
    float *fl = calloc(n, sizeof *fl);
    rc = H5LTmake_dataset(f, "images", irank, idims, H5T_NATIVE_FLOAT, fl);
    free(fl);
  } else {
    rc = H5LTmake_dataset(f, "images", irank, idims, H5T_NATIVE_UINT8, images);
  }
  if (rc < 0 || (lrank > 0 && H5LTmake_dataset(f, "labels", lrank, ldims, ltype, labels) < 0)) {
    fprintf(stderr, "cannot write datasets in %s\n", path);
    exit(1);
  }
  H5Fclose(f);
}

/* images (n, 28, 28) uint8 and labels (n) int64, chunked and never written: a file of a few
 * kilobytes declaring n images (loaded by allocating them first: 2.35 GB of RSS for 3 million). */
static void write_declared_only(const char *path, hsize_t n) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t idims[3] = {n, 28, 28}, ichunk[3] = {64, 28, 28}, ldims[1] = {n}, lchunk[1] = {1024};
  hid_t is = H5Screate_simple(3, idims, NULL), ls = H5Screate_simple(1, ldims, NULL);
  hid_t ip = H5Pcreate(H5P_DATASET_CREATE), lp = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(ip, 3, ichunk);
  H5Pset_chunk(lp, 1, lchunk);
  hid_t di = H5Dcreate2(f, "images", H5T_NATIVE_UINT8, is, H5P_DEFAULT, ip, H5P_DEFAULT);
  hid_t dl = H5Dcreate2(f, "labels", H5T_NATIVE_INT64, ls, H5P_DEFAULT, lp, H5P_DEFAULT);
  QT_ASSERT(f >= 0 && di >= 0 && dl >= 0, "cannot write %s", path);
  H5Dclose(di);
  H5Dclose(dl);
  H5Pclose(ip);
  H5Pclose(lp);
  H5Sclose(is);
  H5Sclose(ls);
  H5Fclose(f);
}

static void expect_error(const char *path, const char *needle) {
  qt_dataset ds;
  memset(&ds, 0xab, sizeof ds);
  char err[QT_ERR_LEN] = "";
  int rc = qt_dataset_load_hdf5(&ds, path, err);
  if (rc != -1) { qt_test_fail("%s: expected failure, got %d", path, rc); if (rc == 0) qt_dataset_free(&ds); return; }
  if (!strstr(err, path)) qt_test_fail("%s: message does not name the file: %s", path, err);
  if (needle && !strstr(err, needle)) qt_test_fail("%s: message lacks \"%s\": %s", path, needle, err);
  if (ds.n != 0 || ds.images || ds.labels) qt_test_fail("%s: dataset not zeroed after failure", path);
}

int main(void) {
  for (int i = 0; i < N * H * W * C; i++) images[i] = (uint8_t)(255 - i * 7);
  const int64_t labels64[N] = {4, 0, 2, 4, 1, 0};
  const uint8_t labels8[N] = {1, 1, 0, 7, 1, 2};
  const int32_t labels_neg[N] = {1, 1, -3, 0, 1, 2};
  const hsize_t dims4[4] = {N, H, W, C}, dims3[3] = {N, H, W * C}, dims2[2] = {N, H * W * C};
  const hsize_t ldims[1] = {N}, ldims_col[2] = {N, 1}, ldims_short[1] = {N - 1};
  char err[QT_ERR_LEN] = "";
  qt_dataset ds;

  /* NHWC uint8 with int64 labels. */
  write_file("h5-nhwc.h5", 4, dims4, 0, 1, ldims, H5T_NATIVE_INT64, labels64);
  if (qt_dataset_load_hdf5(&ds, "h5-nhwc.h5", err) != 0) qt_test_fail("nhwc: %s", err);
  else {
    QT_CHECK(ds.n == N && ds.h == H && ds.w == W && ds.c == C && ds.num_classes == 5 && !ds.class_names);
    QT_CHECK(memcmp(ds.images, images, sizeof images) == 0);
    for (int i = 0; i < N; i++) QT_CHECK(ds.labels[i] == labels64[i]);
    qt_dataset_free(&ds);
  }

  /* (N,H,W) with uint8 labels of shape (N,1): c = 1. */
  write_file("h5-nhw.h5", 3, dims3, 0, 2, ldims_col, H5T_NATIVE_UINT8, labels8);
  if (qt_dataset_load_hdf5(&ds, "h5-nhw.h5", err) != 0) qt_test_fail("nhw: %s", err);
  else {
    QT_CHECK(ds.n == N && ds.h == H && ds.w == W * C && ds.c == 1 && ds.num_classes == 8);
    QT_CHECK(memcmp(ds.images, images, sizeof images) == 0);
    for (int i = 0; i < N; i++) QT_CHECK(ds.labels[i] == labels8[i]);
    qt_dataset_free(&ds);
  }

  write_file("h5-no-labels.h5", 4, dims4, 0, 0, NULL, 0, NULL);
  expect_error("h5-no-labels.h5", "missing dataset \"labels\"");
  write_file("h5-rank2.h5", 2, dims2, 0, 1, ldims, H5T_NATIVE_INT64, labels64);
  expect_error("h5-rank2.h5", "found rank 2");
  write_file("h5-n-mismatch.h5", 4, dims4, 0, 1, ldims_short, H5T_NATIVE_INT64, labels64);
  expect_error("h5-n-mismatch.h5", "has 5 entries but \"images\" has 6");
  write_file("h5-float-images.h5", 4, dims4, 1, 1, ldims, H5T_NATIVE_INT64, labels64);
  expect_error("h5-float-images.h5", "expected uint8, found 32-bit float");
  write_file("h5-float-labels.h5", 4, dims4, 0, 1, ldims, H5T_NATIVE_FLOAT, (float[N]){0});
  expect_error("h5-float-labels.h5", "expected an integer type");
  write_file("h5-negative.h5", 4, dims4, 0, 1, ldims, H5T_NATIVE_INT32, labels_neg);
  expect_error("h5-negative.h5", "found -3");
  /* 2^31-1 once overflowed the class count (max label + 1) and aborted in cross-entropy. */
  write_file("h5-huge-label.h5", 4, dims4, 0, 1, ldims, H5T_NATIVE_INT64, (int64_t[N]){1, 2, 2147483647, 0, 1, 2});
  expect_error("h5-huge-label.h5", "\"labels\"[2]: expected a label in [0, 65535] (at most 65536 classes), found 2147483647");

  /* Missing "images". */
  {
    hid_t f = H5Fcreate("h5-no-images.h5", H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5LTmake_dataset(f, "labels", 1, ldims, H5T_NATIVE_INT64, labels64);
    H5Fclose(f);
  }
  expect_error("h5-no-images.h5", "missing dataset \"images\"");

  /* Not an HDF5 file, and no file at all. */
  {
    FILE *f = fopen("h5-not-hdf5.h5", "wb");
    fputs("this is plain text, not HDF5\n", f);
    fclose(f);
  }
  expect_error("h5-not-hdf5.h5", "HDF5");
  expect_error("h5-no-such-file.h5", "No such file");
  /* A few kilobytes declaring 3 million images: refused before anything is allocated for them. */
  write_declared_only("h5-declared.h5", 3000000);
  expect_error("h5-declared.h5", "dataset 'images' declares shape (3000000, 28, 28) (2352000000 bytes) but stores 0 bytes");
  return qt_test_finish();
}
