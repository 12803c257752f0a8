/* Image folders: classes and files load in sorted order with exact pixels (PNG), gray
 * conversion, case-insensitive extensions; a corrupt file, mixed sizes or an empty class
 * folder is an error naming the path. A test split's class folders must be the training
 * split's, name for name (labels are sorted-class indices). */
#include "data/data.h"
#include "tests/common/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <stb_image_write.h>

enum { H = 2, W = 3 };

static void make_dir(const char *path) {
  if (mkdir(path, 0755) != 0) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
      fprintf(stderr, "cannot create %s\n", path);
      exit(1);
    }
  }
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

/* RGB test image number k (w x h): every pixel different. */
static void make_rgb(uint8_t *rgb, int k, int w, int h) {
  for (int i = 0; i < w * h * 3; i++) rgb[i] = (uint8_t)(k * 40 + i * 9 + 5);
}

static void write_png(const char *path, int k, int w, int h) {
  uint8_t rgb[64 * 64 * 3];
  make_rgb(rgb, k, w, h);
  if (!stbi_write_png(path, w, h, 3, rgb, w * 3)) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
}

typedef struct {
  uint8_t bytes[4096];
  size_t n;
} jpeg_buf;

static void jpeg_append(void *ctx, void *data, int size) {
  jpeg_buf *b = ctx;
  if (b->n + (size_t)size <= sizeof b->bytes) memcpy(b->bytes + b->n, data, (size_t)size);
  b->n += (size_t)size;
}

/* A valid 8x8 colour JPEG (stb_image_write: DQT 0 and 1, DHT DC/AC 0 and 1, one baseline scan)
 * with the table byte of its first segment of marker m set to v: for SOS, component 2's
 * DC/AC table ids; for DQT, the first table's id. Written to path. */
static void write_jpeg_patched(const char *path, uint8_t m, uint8_t v) {
  uint8_t px[8 * 8 * 3];
  make_rgb(px, 1, 8, 8);
  jpeg_buf b = {.n = 0};
  if (!stbi_write_jpg_to_func(jpeg_append, &b, 8, 8, 3, px, 90) || b.n > sizeof b.bytes)
    qt_test_fail("cannot write jpeg");
  size_t at = 0;
  for (size_t i = 2; i + 1 < b.n && !at; i++)
    if (b.bytes[i] == 0xff && b.bytes[i + 1] == m) at = i;
  if (!at) qt_test_fail("jpeg: no marker %02x", m);
  b.bytes[at + (m == 0xda ? 8 : 4)] = v; /* SOS: FF DA len(2) Ns C1 T1 C2 T2; DQT: FF DB len(2) PqTq */
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b.bytes, 1, b.n, f) != b.n || fclose(f) != 0) qt_test_fail("cannot write %s", path);
}

static void expect_error(const char *root, int channels, const char *names, const char *needle) {
  qt_dataset ds;
  memset(&ds, 0xab, sizeof ds);
  char err[QT_ERR_LEN] = "";
  int rc = qt_dataset_load_folder(&ds, root, channels, err);
  if (rc != -1) {
    qt_test_fail("%s: expected failure, got %d", root, rc);
    if (rc == 0) qt_dataset_free(&ds);
    return;
  }
  if (!strstr(err, names)) qt_test_fail("%s: message does not name %s: %s", root, names, err);
  if (needle && !strstr(err, needle)) qt_test_fail("%s: message lacks \"%s\": %s", root, needle, err);
  if (ds.n != 0 || ds.images || ds.labels || ds.class_names) qt_test_fail("%s: dataset not zeroed after failure", root);
}

int main(void) {
  /* Expected order: classes "Bird" < "cat" < "dog" (byte order), files sorted inside. */
  make_dir("folder-ok");
  make_dir("folder-ok/dog");
  make_dir("folder-ok/cat");
  make_dir("folder-ok/Bird");
  write_png("folder-ok/dog/b.png", 4, W, H);
  write_png("folder-ok/dog/a.PNG", 3, W, H);
  write_png("folder-ok/cat/x.png", 2, W, H);
  write_png("folder-ok/Bird/z1.png", 0, W, H);
  write_png("folder-ok/Bird/z2.png", 1, W, H);
  write_text("folder-ok/cat/notes.txt", "not an image");
  write_text("folder-ok/.hidden.png", "ignored");
  make_dir("folder-ok/.cache");
  write_text("folder-ok/README", "a file next to the class folders is ignored");
  const char *class_names[3] = {"Bird", "cat", "dog"};
  const int want_k[5] = {0, 1, 2, 3, 4}, want_label[5] = {0, 0, 1, 2, 2};

  qt_dataset ds;
  char err[QT_ERR_LEN] = "";
  uint8_t rgb[H * W * 3];
  if (qt_dataset_load_folder(&ds, "folder-ok", 3, err) != 0)
    qt_test_fail("rgb: %s", err);
  else {
    QT_CHECK(ds.n == 5 && ds.h == H && ds.w == W && ds.c == 3 && ds.num_classes == 3 && ds.class_names);
    for (int k = 0; ds.class_names && k < 3 && k < ds.num_classes; k++)
      if (strcmp(ds.class_names[k], class_names[k]) != 0)
        qt_test_fail("class %d is %s, expected %s", k, ds.class_names[k], class_names[k]);
    for (int i = 0; i < 5 && i < ds.n; i++) {
      make_rgb(rgb, want_k[i], W, H);
      if (memcmp(ds.images + (size_t)i * H * W * 3, rgb, sizeof rgb) != 0)
        qt_test_fail("rgb: image %d pixels differ", i);
      if (ds.labels[i] != want_label[i])
        qt_test_fail("rgb: label %d = %d, expected %d", i, ds.labels[i], want_label[i]);
    }
    qt_dataset_free(&ds);
  }

  /* Class lists of two splits: the same names match; one missing or extra is named. */
  make_dir("folder-split");
  make_dir("folder-split/cat");
  make_dir("folder-split/dog");
  make_dir("folder-split/emu");
  write_png("folder-split/cat/a.png", 0, W, H);
  write_png("folder-split/dog/a.png", 1, W, H);
  write_png("folder-split/emu/a.png", 2, W, H);
  if (qt_dataset_load_folder(&ds, "folder-split", 3, err) != 0)
    qt_test_fail("split: %s", err);
  else {
    QT_CHECK(qt_dataset_folder_classes_match("folder-ok", &ds, "folder-split", err) == -1);
    if (!strstr(err,
                "class folder 'Bird' of the training folder folder-ok is missing from the test folder folder-split"))
      qt_test_fail("missing class: %s", err);
    QT_CHECK(qt_dataset_folder_classes_match("folder-split", &ds, "folder-split", err) == 0);
    qt_dataset_free(&ds);
  }
  if (qt_dataset_load_folder(&ds, "folder-ok", 3, err) != 0)
    qt_test_fail("split: %s", err);
  else {
    QT_CHECK(qt_dataset_folder_classes_match("folder-split", &ds, "folder-ok", err) == -1);
    if (!strstr(err, "class folder 'Bird' of the test folder folder-ok is not in the training folder folder-split"))
      qt_test_fail("extra class: %s", err);
    QT_CHECK(qt_dataset_folder_classes_match("no-such-folder", &ds, "folder-ok", err) == -1 &&
             strstr(err, "no-such-folder"));
    qt_dataset_free(&ds);
  }

  /* Gray: stb_image's luma, (77 r + 150 g + 29 b) >> 8. */
  if (qt_dataset_load_folder(&ds, "folder-ok", 1, err) != 0)
    qt_test_fail("gray: %s", err);
  else {
    QT_CHECK(ds.n == 5 && ds.c == 1);
    for (int i = 0; i < 5 && i < ds.n; i++) {
      make_rgb(rgb, want_k[i], W, H);
      for (int p = 0; p < H * W; p++) {
        int y = (rgb[3 * p] * 77 + rgb[3 * p + 1] * 150 + rgb[3 * p + 2] * 29) >> 8;
        if (ds.images[i * H * W + p] != y) {
          qt_test_fail("gray: image %d pixel %d = %d, expected %d", i, p, ds.images[i * H * W + p], y);
          break;
        }
      }
    }
    qt_dataset_free(&ds);
  }

  /* JPEG with an upper-case extension: lossy, so compare a flat image within a tolerance. */
  make_dir("folder-jpg");
  make_dir("folder-jpg/only");
  {
    uint8_t flat[8 * 8 * 3];
    for (int i = 0; i < 8 * 8 * 3; i++) flat[i] = (uint8_t)(i % 3 == 0 ? 200 : i % 3 == 1 ? 100 : 50);
    if (!stbi_write_jpg("folder-jpg/only/pic.JPEG", 8, 8, 3, flat, 100)) qt_test_fail("cannot write jpeg");
    if (!stbi_write_jpg("folder-jpg/only/pic2.jpg", 8, 8, 3, flat, 100)) qt_test_fail("cannot write jpeg");
    if (qt_dataset_load_folder(&ds, "folder-jpg", 3, err) != 0)
      qt_test_fail("jpeg: %s", err);
    else {
      QT_CHECK(ds.n == 2 && ds.h == 8 && ds.w == 8 && ds.num_classes == 1 && strcmp(ds.class_names[0], "only") == 0);
      int maxdiff = 0;
      for (int i = 0; i < 8 * 8 * 3; i++) {
        int d = abs((int)ds.images[i] - (int)flat[i]);
        if (d > maxdiff) maxdiff = d;
      }
      if (maxdiff > 8) qt_test_fail("jpeg: max pixel difference %d > 8", maxdiff);
      qt_dataset_free(&ds);
    }
  }

  /* A corrupt file: the error names it and gives stb_image's reason. */
  make_dir("folder-corrupt");
  make_dir("folder-corrupt/a");
  make_dir("folder-corrupt/b");
  write_png("folder-corrupt/a/1.png", 0, W, H);
  write_png("folder-corrupt/b/1.png", 1, W, H);
  write_text("folder-corrupt/b/2.png", "definitely not a PNG");
  write_png("folder-corrupt/b/3.png", 2, W, H);
  expect_error("folder-corrupt", 3, "folder-corrupt/b/2.png", "cannot decode");
  /* ... also when it is the first file. */
  make_dir("folder-corrupt-first");
  make_dir("folder-corrupt-first/a");
  write_text("folder-corrupt-first/a/0.jpg", "");
  write_png("folder-corrupt-first/a/1.png", 0, W, H);
  expect_error("folder-corrupt-first", 1, "folder-corrupt-first/a/0.jpg", "cannot decode");

  /* JPEG tables stb_image 2.27 would read undefined (its decoder state is not cleared): a scan
   * using an AC table no DHT defined, a component whose quantization table no DQT defined. The
   * unpatched file loads. */
  make_dir("folder-jpeg-tables");
  make_dir("folder-jpeg-tables/a");
  write_jpeg_patched("folder-jpeg-tables/a/1.jpg", 0xda, 0x11);
  if (qt_dataset_load_folder(&ds, "folder-jpeg-tables", 3, err) != 0)
    qt_test_fail("jpeg tables: %s", err);
  else
    qt_dataset_free(&ds);
  write_jpeg_patched("folder-jpeg-tables/a/1.jpg", 0xda, 0x13);
  expect_error("folder-jpeg-tables", 3, "folder-jpeg-tables/a/1.jpg",
               "a scan uses a Huffman table that was not defined");
  write_jpeg_patched("folder-jpeg-tables/a/1.jpg", 0xda, 0x21);
  expect_error("folder-jpeg-tables", 3, "folder-jpeg-tables/a/1.jpg",
               "a scan uses a Huffman table that was not defined");
  write_jpeg_patched("folder-jpeg-tables/a/1.jpg", 0xdb, 0x02);
  expect_error("folder-jpeg-tables", 3, "folder-jpeg-tables/a/1.jpg", "quantization table was not defined");

  /* Mixed sizes: the first file that differs is named. */
  make_dir("folder-mixed");
  make_dir("folder-mixed/a");
  make_dir("folder-mixed/b");
  write_png("folder-mixed/a/1.png", 0, W, H);
  write_png("folder-mixed/a/2.png", 1, W, H);
  write_png("folder-mixed/b/1.png", 2, W + 1, H);
  write_png("folder-mixed/b/2.png", 3, W, H + 2);
  expect_error("folder-mixed", 3, "folder-mixed/b/1.png", "found 4x2");

  /* An empty class folder, no class folders, a missing root, bad channels. */
  make_dir("folder-empty-class");
  make_dir("folder-empty-class/a");
  make_dir("folder-empty-class/b");
  write_png("folder-empty-class/a/1.png", 0, W, H);
  write_text("folder-empty-class/b/readme.txt", "no images here");
  expect_error("folder-empty-class", 3, "folder-empty-class/b", "found none");
  make_dir("folder-no-classes");
  expect_error("folder-no-classes", 3, "folder-no-classes", "found none");
  expect_error("folder-no-such-root", 3, "folder-no-such-root", "No such file");
  expect_error("folder-ok", 0, "folder-ok", "channels");
  return qt_test_finish();
}
