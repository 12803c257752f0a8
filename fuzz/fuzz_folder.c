/* Fuzz target: the image-folder reader (data/data.h qt_dataset_load_folder) and, through it, the
 * stb_image decoders a hostile .png/.jpg reaches (stb picks the decoder from the bytes, not the
 * extension).
 *
 * Input: one byte choosing the channels to decode to (1 + b % 4), then up to 6 files separated
 * by QT_FUZZ_SEP. Each file starts with a header byte h: class folder c<h & 3>, extension
 * (h >> 2) & 3 of .png .jpg .jpeg .PNG, and kind (h >> 4) & 3: a regular file, a hidden file
 * (ignored), a .txt file (ignored), or a folder named like an image (ignored). The tree is
 * written under a scratch folder and removed after each run. On success the dataset must be
 * well formed, hold one image per regular image file and one class per class folder, with the
 * class names sorted. */
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz/fuzz_data_check.h"
#include "fuzz/fuzz_util.h"

#define MAX_FILES 6

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 20) return 0;
  const int channels = 1 + data[0] % 4;
  const uint8_t *part[MAX_FILES];
  size_t len[MAX_FILES];
  const int n = qt_fuzz_split(data + 1, size - 1, part, len, MAX_FILES);
  const char *root = qt_fuzz_path(0, "folder");
  QT_ASSERT(mkdir(root, 0700) == 0, "fuzz: cannot create %s", root);

  static const char *const ext[4] = {".png", ".jpg", ".jpeg", ".PNG"};
  char paths[2 * MAX_FILES][600];
  int is_dir[2 * MAX_FILES], n_paths = 0, class_used[4] = {0}, images = 0, classes = 0;
  for (int i = 0; i < n; i++) {
    if (len[i] == 0) continue;
    const int h = part[i][0], cls = h & 3, kind = (h >> 4) & 3;
    if (!class_used[cls]) {
      snprintf(paths[n_paths], sizeof paths[0], "%s/c%d", root, cls);
      QT_ASSERT(mkdir(paths[n_paths], 0700) == 0, "fuzz: cannot create %s", paths[n_paths]);
      is_dir[n_paths++] = 1;
      class_used[cls] = 1;
    }
    char *p = paths[n_paths];
    if (kind == 1)
      snprintf(p, sizeof paths[0], "%s/c%d/.f%d%s", root, cls, i, ext[(h >> 2) & 3]);
    else if (kind == 2)
      snprintf(p, sizeof paths[0], "%s/c%d/f%d.txt", root, cls, i);
    else
      snprintf(p, sizeof paths[0], "%s/c%d/f%d%s", root, cls, i, ext[(h >> 2) & 3]);
    if (kind == 3) {
      QT_ASSERT(mkdir(p, 0700) == 0, "fuzz: cannot create %s", p);
    } else {
      qt_fuzz_write_file(p, part[i] + 1, len[i] - 1);
      if (kind == 0) images++;
    }
    is_dir[n_paths++] = kind == 3;
  }
  for (int c = 0; c < 4; c++) classes += class_used[c];

  qt_dataset ds = {0};
  char err[QT_ERR_LEN] = "";
  const int rc = qt_dataset_load_folder(&ds, root, channels, err);
  if (rc == 0) {
    QT_ASSERT(ds.n == images && ds.num_classes == classes && ds.c == channels,
              "loaded %lld images of %d classes, %d channels; the tree holds %d images of %d classes, asked %d",
              (long long)ds.n, ds.num_classes, ds.c, images, classes, channels);
    QT_ASSERT(ds.class_names, "no class names");
    for (int c = 1; c < ds.num_classes; c++)
      QT_ASSERT(strcmp(ds.class_names[c - 1], ds.class_names[c]) < 0, "class names not sorted");
  }
  qt_fuzz_check_dataset(&ds, rc, err);

  for (int i = n_paths - 1; i >= 0; i--)
    QT_ASSERT((is_dir[i] ? rmdir(paths[i]) : unlink(paths[i])) == 0, "fuzz: cannot remove %s", paths[i]);
  QT_ASSERT(rmdir(root) == 0, "fuzz: cannot remove %s", root);
  return 0;
}
