/* IDX loading: raw and gzip'd files load byte for byte; every corruption is an error whose
 * message names the offending file, and the dataset is left zeroed. */
#include "data/data.h"
#include "tests/common/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

enum { N = 5, H = 4, W = 3 };

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* Writes an IDX file: magic, dims, then `len` data bytes, raw or gzip'd. */
static void write_idx(const char *path, uint32_t magic, const uint32_t *dims, int ndims,
                      const uint8_t *data, size_t len, int gz) {
  uint8_t header[16];
  put_be32(header, magic);
  for (int i = 0; i < ndims; i++) put_be32(header + 4 + 4 * i, dims[i]);
  size_t hlen = 4 + 4 * (size_t)ndims;
  if (gz) {
    gzFile f = gzopen(path, "wb");
    if (!f || gzwrite(f, header, (unsigned)hlen) != (int)hlen ||
        (len && gzwrite(f, data, (unsigned)len) != (int)len) || gzclose(f) != Z_OK) {
      fprintf(stderr, "cannot write %s\n", path);
      exit(1);
    }
  } else {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(header, 1, hlen, f) != hlen || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
      fprintf(stderr, "cannot write %s\n", path);
      exit(1);
    }
  }
}

static long file_size(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fclose(f);
  return n;
}

/* Keeps the first `keep` bytes of src in dst. */
static void write_prefix(const char *src, const char *dst, long keep) {
  FILE *in = fopen(src, "rb");
  uint8_t *buf = malloc((size_t)keep);
  if (!in || fread(buf, 1, (size_t)keep, in) != (size_t)keep) { fprintf(stderr, "cannot read %s\n", src); exit(1); }
  fclose(in);
  FILE *out = fopen(dst, "wb");
  if (!out || fwrite(buf, 1, (size_t)keep, out) != (size_t)keep || fclose(out) != 0) { fprintf(stderr, "cannot write %s\n", dst); exit(1); }
  free(buf);
}

static uint8_t images[N * H * W];
static const uint8_t labels[N] = {3, 0, 9, 1, 3};

static void check_loaded(const qt_dataset *ds, const char *what) {
  if (ds->n != N || ds->h != H || ds->w != W || ds->c != 1 || ds->num_classes != 10 || ds->class_names) {
    qt_test_fail("%s: shape n=%lld h=%d w=%d c=%d classes=%d, expected %d %d %d 1 10", what,
                 (long long)ds->n, ds->h, ds->w, ds->c, ds->num_classes, N, H, W);
    return;
  }
  for (int i = 0; i < N * H * W; i++)
    if (ds->images[i] != images[i]) { qt_test_fail("%s: image byte %d = %d, expected %d", what, i, ds->images[i], images[i]); break; }
  for (int i = 0; i < N; i++)
    if (ds->labels[i] != labels[i]) { qt_test_fail("%s: label %d = %d, expected %d", what, i, ds->labels[i], labels[i]); break; }
}

/* Loads a pair that must fail with a message naming `bad_path` and containing `needle`. */
static void expect_error(const char *images_path, const char *labels_path, const char *bad_path, const char *needle) {
  qt_dataset ds;
  memset(&ds, 0xab, sizeof ds);
  char err[QT_ERR_LEN] = "";
  int rc = qt_dataset_load_idx(&ds, images_path, labels_path, err);
  if (rc != -1) { qt_test_fail("load(%s, %s): expected failure, got %d", images_path, labels_path, rc); if (rc == 0) qt_dataset_free(&ds); return; }
  if (!strstr(err, bad_path)) qt_test_fail("load(%s, %s): message does not name %s: %s", images_path, labels_path, bad_path, err);
  if (needle && !strstr(err, needle)) qt_test_fail("load(%s, %s): message lacks \"%s\": %s", images_path, labels_path, needle, err);
  if (ds.n != 0 || ds.images || ds.labels || ds.class_names) qt_test_fail("load(%s, %s): dataset not zeroed after failure", images_path, labels_path);
}

int main(void) {
  for (int i = 0; i < N * H * W; i++) images[i] = (uint8_t)(i * 37 + 11);
  const uint32_t idims[3] = {N, H, W}, ldims[1] = {N}, ldims_short[1] = {N - 1};
  write_idx("idx-images-raw", 0x803, idims, 3, images, sizeof images, 0);
  write_idx("idx-labels-raw", 0x801, ldims, 1, labels, N, 0);
  write_idx("idx-images.gz", 0x803, idims, 3, images, sizeof images, 1);
  write_idx("idx-labels.gz", 0x801, ldims, 1, labels, N, 1);

  qt_dataset ds;
  char err[QT_ERR_LEN] = "";
  if (qt_dataset_load_idx(&ds, "idx-images-raw", "idx-labels-raw", err) != 0) qt_test_fail("raw: %s", err);
  else { check_loaded(&ds, "raw"); qt_dataset_free(&ds); }
  if (qt_dataset_load_idx(&ds, "idx-images.gz", "idx-labels.gz", err) != 0) qt_test_fail("gz: %s", err);
  else { check_loaded(&ds, "gz"); qt_dataset_free(&ds); }
  if (qt_dataset_load_idx(&ds, "idx-images.gz", "idx-labels-raw", err) != 0) qt_test_fail("gz+raw: %s", err);
  else {
    check_loaded(&ds, "gz+raw");
    qt_dataset_limit(&ds, 2);
    QT_CHECK(ds.n == 2 && ds.num_classes == 10);
    QT_CHECK(memcmp(ds.images, images, 2 * H * W) == 0 && ds.labels[1] == labels[1]);
    qt_dataset_limit(&ds, 0);
    QT_CHECK(ds.n == 2);
    qt_dataset_free(&ds);
    QT_CHECK(ds.n == 0 && ds.images == NULL);
    qt_dataset_free(&ds);   /* twice is harmless */
  }

  /* Wrong magic, and a labels file given as images. */
  write_idx("idx-bad-magic", 0x804, idims, 3, images, sizeof images, 0);
  expect_error("idx-bad-magic", "idx-labels-raw", "idx-bad-magic", "magic");
  expect_error("idx-labels-raw", "idx-labels-raw", "idx-labels-raw", "0x00000803");
  expect_error("idx-images-raw", "idx-images-raw", "idx-images-raw", "0x00000801");

  /* Truncated image data, raw and gzip'd (a complete gzip stream of too few bytes). */
  write_idx("idx-trunc-raw", 0x803, idims, 3, images, sizeof images - 7, 0);
  expect_error("idx-trunc-raw", "idx-labels-raw", "idx-trunc-raw", "truncated");
  write_idx("idx-trunc.gz", 0x803, idims, 3, images, 2 * H * W, 1);
  expect_error("idx-trunc.gz", "idx-labels.gz", "idx-trunc.gz", "expected 60 image bytes, got 24");
  write_idx("idx-labels-trunc", 0x801, ldims, 1, labels, N - 2, 0);
  expect_error("idx-images-raw", "idx-labels-trunc", "idx-labels-trunc", "truncated");
  write_prefix("idx-images-raw", "idx-header-cut", 10);
  expect_error("idx-header-cut", "idx-labels-raw", "idx-header-cut", "truncated");

  /* Trailing bytes after the data. */
  write_idx("idx-images-long", 0x803, idims, 3, images, sizeof images, 0);
  {
    FILE *f = fopen("idx-images-long", "ab");
    fputc(0, f);
    fclose(f);
  }
  expect_error("idx-images-long", "idx-labels-raw", "idx-images-long", "end");

  /* Label count differs from image count. */
  write_idx("idx-labels-short", 0x801, ldims_short, 1, labels, N - 1, 0);
  expect_error("idx-images-raw", "idx-labels-short", "idx-labels-short", "count");

  /* Zero dimensions. */
  const uint32_t zero_dims[3] = {N, 0, W};
  write_idx("idx-zero-dim", 0x803, zero_dims, 3, NULL, 0, 0);
  expect_error("idx-zero-dim", "idx-labels-raw", "idx-zero-dim", "dimensions");

  /* Missing files. */
  expect_error("idx-no-such-file", "idx-labels-raw", "idx-no-such-file", "No such file");
  expect_error("idx-images-raw", "idx-no-such-labels", "idx-no-such-labels", "No such file");

  /* A gzip file cut in half, and one missing only its 8-byte trailer (CRC and length). Use
   * incompressible bytes so half the file is well inside the image data. */
  {
    enum { BN = 64, BH = 28, BW = 28 };
    uint8_t *big = malloc(BN * BH * BW), big_labels[BN];
    uint64_t s = 12345;
    for (int i = 0; i < BN * BH * BW; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; big[i] = (uint8_t)(s >> 56); }
    for (int i = 0; i < BN; i++) big_labels[i] = (uint8_t)(i % 10);
    const uint32_t bdims[3] = {BN, BH, BW}, bl[1] = {BN};
    write_idx("idx-big.gz", 0x803, bdims, 3, big, BN * BH * BW, 1);
    write_idx("idx-big-labels.gz", 0x801, bl, 1, big_labels, BN, 1);
    if (qt_dataset_load_idx(&ds, "idx-big.gz", "idx-big-labels.gz", err) != 0) qt_test_fail("big: %s", err);
    else {
      QT_CHECK(ds.n == BN && memcmp(ds.images, big, BN * BH * BW) == 0);
      qt_dataset_free(&ds);
    }
    long size = file_size("idx-big.gz");
    write_prefix("idx-big.gz", "idx-half.gz", size / 2);
    expect_error("idx-half.gz", "idx-big-labels.gz", "idx-half.gz", "truncated");
    write_prefix("idx-big.gz", "idx-no-trailer.gz", size - 8);
    expect_error("idx-no-trailer.gz", "idx-big-labels.gz", "idx-no-trailer.gz", NULL);
    /* Flip one byte in the middle of the compressed data: the CRC or the inflater must notice. */
    write_prefix("idx-big.gz", "idx-flipped.gz", size);
    {
      FILE *f = fopen("idx-flipped.gz", "r+b");
      fseek(f, size / 2, SEEK_SET);
      int c = fgetc(f);
      fseek(f, size / 2, SEEK_SET);
      fputc(c ^ 0x55, f);
      fclose(f);
    }
    expect_error("idx-flipped.gz", "idx-big-labels.gz", "idx-flipped.gz", NULL);
    free(big);
  }

  /* err may be NULL. */
  QT_CHECK(qt_dataset_load_idx(&ds, "idx-no-such-file", "idx-labels-raw", NULL) == -1);
  return qt_test_finish();
}
