/* The real Fashion-MNIST (Debian package dataset-fashion-mnist): shapes, balanced classes,
 * load time, and one shuffled, flipped epoch through the loader whose normalized pixels have
 * mean ~0 and std ~1 with the reference mean 0.2860 / std 0.3530. Exit 77 (skip) if absent. */
#include "data/data.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define DIR "/usr/share/datasets/fashion-mnist/"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_split(const char *images, const char *labels, int64_t n, int per_class, qt_dataset *ds) {
  char err[QT_ERR_LEN];
  double t0 = now();
  if (qt_dataset_load_idx(ds, images, labels, err) != 0) { qt_test_fail("%s", err); return; }
  double secs = now() - t0;
  if (secs > 10.0) qt_test_fail("%s: load took %.2f s (expected well under 10 s)", images, secs);
  QT_CHECK(ds->n == n && ds->h == 28 && ds->w == 28 && ds->c == 1 && ds->num_classes == 10);
  int64_t counts[10] = {0};
  for (int64_t i = 0; i < ds->n; i++) counts[ds->labels[i]]++;
  for (int k = 0; k < 10; k++)
    if (counts[k] != per_class) qt_test_fail("%s: class %d has %lld samples, expected %d", labels, k, (long long)counts[k], per_class);
}

int main(void) {
  if (access(DIR "train-images-idx3-ubyte.gz", R_OK) != 0) return 77;
  qt_dataset train, test;
  check_split(DIR "train-images-idx3-ubyte.gz", DIR "train-labels-idx1-ubyte.gz", 60000, 6000, &train);
  check_split(DIR "t10k-images-idx3-ubyte.gz", DIR "t10k-labels-idx1-ubyte.gz", 10000, 1000, &test);
  qt_dataset_free(&test);
  if (qt_test_failures()) return qt_test_finish();

  qt_loader_config cfg = {.batch_size = 128, .shuffle = 1, .seed = 1, .flip = 1,
                          .mean = {0.2860f}, .std = {0.3530f}};
  char err[QT_ERR_LEN];
  qt_loader *l = qt_loader_create(&train, &cfg, err);
  if (!l) { qt_test_fail("%s", err); return qt_test_finish(); }
  QT_CHECK(qt_loader_num_batches(l) == 469);
  double t0 = now(), sum = 0.0, sumsq = 0.0;
  int64_t count = 0, batches = 0;
  const float *img;
  const int32_t *lab;
  int b;
  qt_loader_start_epoch(l, 0);
  while ((b = qt_loader_next(l, &img, &lab)) > 0) {
    for (int64_t i = 0; i < (int64_t)b * 784; i++) { sum += img[i]; sumsq += (double)img[i] * img[i]; }
    count += (int64_t)b * 784;
    batches++;
  }
  double secs = now() - t0;
  QT_CHECK(batches == 469 && count == 60000LL * 784);
  double mean = sum / (double)count, std = sqrt(sumsq / (double)count - mean * mean);
  if (fabs(mean) > 0.01 || fabs(std - 1.0) > 0.01) qt_test_fail("normalized pixels: mean %.4f std %.4f, expected ~0 and ~1", mean, std);
  if (secs > 10.0) qt_test_fail("one epoch through the loader took %.2f s", secs);
  qt_loader_free(l);
  qt_dataset_free(&train);
  return qt_test_finish();
}
