/* Datasets moved to a scratch file (qt_dataset_to_file): the loader gives bit for bit the
 * batches it gives from memory (shuffled, augmented, sharded, in order, views and limits), the
 * file leaves no name behind and is closed by qt_dataset_free, and a directory that cannot take
 * it is an error naming the directory, with the dataset left in memory. */
#include "data/data.h"
#include "tests/common/testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 53, H = 6, W = 5, C = 3, S = H * W * C };

static void make_dataset(qt_dataset *ds) {
  memset(ds, 0, sizeof *ds);
  ds->n = N; ds->h = H; ds->w = W; ds->c = C; ds->num_classes = 7;
  ds->images = malloc(N * S);
  ds->labels = malloc(N * sizeof *ds->labels);
  QT_ASSERT(ds->images && ds->labels, "out of memory");
  for (int i = 0; i < N; i++) {
    ds->labels[i] = (i * 5) % 7;
    for (int p = 0; p < S; p++) ds->images[i * S + p] = (uint8_t)((i * 37 + p * 11 + (p * p) % 7) % 256);
  }
}

/* Two epochs of `a` and `b` (same configuration, two datasets) agree bit for bit: batch sizes,
 * labels and images. Returns the number of batches compared. */
static int same_batches(const qt_dataset *a, const qt_dataset *b, const qt_loader_config *cfg, const char *what) {
  char err[QT_ERR_LEN];
  qt_loader *la = qt_loader_create(a, cfg, err), *lb = la ? qt_loader_create(b, cfg, err) : NULL;
  if (!la || !lb) {
    qt_test_fail("%s: create: %s", what, err);
    qt_loader_free(la);
    return 0;
  }
  const size_t sample = (size_t)a->h * a->w * a->c;
  int batches = 0;
  for (int e = 0; e < 2; e++) {
    qt_loader_start_epoch(la, e);
    qt_loader_start_epoch(lb, e);
    for (;;) {
      const float *ia, *ib;
      const int32_t *ya, *yb;
      const int na = qt_loader_next(la, &ia, &ya), nb = qt_loader_next(lb, &ib, &yb);
      if (na != nb) { qt_test_fail("%s: epoch %d batch %d: %d rows in memory, %d from the file", what, e, batches, na, nb); break; }
      if (na == 0) break;
      if (memcmp(ya, yb, (size_t)na * sizeof *ya) != 0 || memcmp(ia, ib, (size_t)na * sample * sizeof *ia) != 0) {
        qt_test_fail("%s: epoch %d batch %d differs between memory and file", what, e, batches);
        break;
      }
      batches++;
    }
  }
  qt_loader_free(la);
  qt_loader_free(lb);
  return batches;
}

static qt_loader_config config(int batch, int shuffle) {
  qt_loader_config c = {.batch_size = batch, .shuffle = shuffle, .seed = 7};
  for (int ch = 0; ch < 4; ch++) { c.mean[ch] = 0.3f + 0.1f * (float)ch; c.std[ch] = 0.25f; }
  return c;
}

static int entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n;
}

int main(void) {
  char dir[] = "/tmp/qt_test_data_file_XXXXXX", err[QT_ERR_LEN] = "";
  if (!mkdtemp(dir)) { qt_test_fail("mkdtemp failed"); return qt_test_finish(); }
  qt_dataset mem, file;
  make_dataset(&mem);
  make_dataset(&file);

  /* A directory that cannot take the file: an error naming it; the images stay in memory. */
  QT_CHECK(qt_dataset_to_file(&file, "/no_such_dir_for_qt", err) == -1);
  if (!strstr(err, "/no_such_dir_for_qt")) qt_test_fail("error does not name the directory: %s", err);
  QT_CHECK(!file.in_file && file.images && memcmp(file.images, mem.images, N * S) == 0);

  QT_CHECK(qt_dataset_to_file(&file, dir, err) == 0);
  QT_CHECK(file.in_file && file.images == NULL && file.n == N && file.labels);
  QT_CHECK(entries(dir) == 0); /* unlinked: nothing left in the directory */
  QT_CHECK(qt_dataset_to_file(&file, dir, err) == 0 && file.in_file); /* already there: nothing to do */

  /* Reading back: single images, runs and the whole set. */
  {
    static uint8_t buf[N * S];
    QT_CHECK(memcmp(qt_dataset_images(&file, 0, N, buf), mem.images, N * S) == 0);
    QT_CHECK(memcmp(qt_dataset_images(&file, 17, 1, buf), mem.images + 17 * S, S) == 0);
    QT_CHECK(memcmp(qt_dataset_images(&file, N - 5, 5, buf), mem.images + (N - 5) * S, 5 * S) == 0);
    QT_CHECK(qt_dataset_images(&mem, 9, 3, buf) == mem.images + 9 * S); /* in memory: no copy */
  }

  /* Loaders: shuffled with augmentation, in order (runs of consecutive images per read), batch
   * larger than the data, shards of a data-parallel batch. */
  qt_loader_config c = config(8, 1);
  c.crop_pad = 2;
  c.flip = 1;
  QT_CHECK(same_batches(&mem, &file, &c, "shuffled, crop and flip") == 14);
  c = config(16, 0);
  QT_CHECK(same_batches(&mem, &file, &c, "in order") == 8);
  c = config(100, 0);
  QT_CHECK(same_batches(&mem, &file, &c, "one batch") == 2);
  for (int k = 0; k < 3; k++) {
    c = config(12, 1);
    c.shard_count = 3;
    c.shard_index = k;
    QT_CHECK(same_batches(&mem, &file, &c, "shard") == 10);
  }

  /* Views (the evaluation's share of a process) and limits. */
  {
    const qt_dataset vm = qt_dataset_view(&mem, 11, 30), vf = qt_dataset_view(&file, 11, 30);
    QT_CHECK(vf.in_file && vf.n == 30 && vf.labels == file.labels + 11);
    c = config(7, 0);
    QT_CHECK(same_batches(&vm, &vf, &c, "view [11, 41)") == 10);
    c = config(7, 1);
    QT_CHECK(same_batches(&vm, &vf, &c, "view [11, 41), shuffled") == 10);
    const qt_dataset wm = qt_dataset_view(&vm, 29, 1), wf = qt_dataset_view(&vf, 29, 1);
    QT_CHECK(same_batches(&wm, &wf, &c, "view of a view") == 2);
    uint8_t one[S];
    QT_CHECK(memcmp(qt_dataset_images(&wf, 0, 1, one), mem.images + 40 * S, S) == 0);
  }
  qt_dataset_limit(&mem, 20);
  qt_dataset_limit(&file, 20);
  QT_CHECK(file.n == 20);
  c = config(6, 1);
  QT_CHECK(same_batches(&mem, &file, &c, "limit 20") == 8);

  /* qt_dataset_free closes the file. */
  const int fd = file.fd;
  QT_CHECK(fcntl(fd, F_GETFD) != -1);
  qt_dataset_free(&file);
  QT_CHECK(fcntl(fd, F_GETFD) == -1 && !file.in_file && file.n == 0);
  qt_dataset_free(&mem);
  QT_CHECK(rmdir(dir) == 0);
  return qt_test_finish();
}
