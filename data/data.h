/* Data: datasets of uint8 NHWC images with int32 labels (IDX, HDF5 or an image folder), held
 * in memory or moved to a scratch file read a batch at a time, and a loader that turns them
 * into normalized, optionally shuffled and augmented float batches, prepared one batch ahead on
 * a background thread.
 *
 * Everything the loader produces is a pure function of (seed, epoch, batch index), so a
 * resumed training run sees exactly the batches an uninterrupted one would have seen. */
#ifndef QT_DATA_H
#define QT_DATA_H

#include <stdint.h>

#include "base/base.h"

/* ---------------------------------------------------------------- datasets */

/* The most classes a dataset may have: a label is in [0, QT_DATA_MAX_CLASSES). */
#define QT_DATA_MAX_CLASSES 65536

typedef struct {
  int64_t n;
  int h, w, c;        /* images (n, h, w, c) uint8, NHWC; 1 <= c <= 4 */
  int num_classes;    /* max label + 1, or the folder class count */
  uint8_t *images;    /* (n, h, w, c), or NULL when in_file */
  int32_t *labels;    /* (n), each in [0, num_classes) */
  char **class_names; /* NULL except for image folders (num_classes names) */
  /* in_file (qt_dataset_to_file): image i is the image-sized record at byte
   * file_offset + i * h * w * c of the open, unlinked file fd. Read them with qt_dataset_images. */
  int in_file, fd;
  int64_t file_offset;
} qt_dataset;

/* All loaders: on success fill *ds (which must not hold data) and return 0; on failure leave
 * *ds zeroed, write "data: <file>: <expected>, <found>" into err (QT_ERR_LEN bytes, may be
 * NULL) and return -1. Buffers come from malloc; release them with qt_dataset_free. */

/* MNIST IDX files (gzip'd or raw, detected from the content). Images: magic 0x00000803,
 * dims (n, h, w); labels: magic 0x00000801, dim (n). c = 1. */
int qt_dataset_load_idx(qt_dataset *ds, const char *images_path, const char *labels_path, char *err);

/* HDF5 file with dataset "images" (uint8, (N,H,W,C) or (N,H,W)) and "labels" (any integer
 * type, (N) or (N,1), values in [0, INT32_MAX]). */
int qt_dataset_load_hdf5(qt_dataset *ds, const char *path, char *err);

/* root/<class>/<file>.png|.jpg|.jpeg (extension case-insensitive; other files and names
 * starting with '.' are ignored). Classes and files are sorted by name (byte order);
 * label = class index. Each file must hold PNG or JPEG data (checked by its signature: other
 * formats stb_image knows are refused, whatever the name). Images are decoded with `channels`
 * channels (1..4; 1 = gray, 3 = RGB), hold at least one pixel and must all share the size of
 * the first one. */
int qt_dataset_load_folder(qt_dataset *ds, const char *root, int channels, char *err);

/* Keeps the first n samples (n <= 0 or n >= ds->n: all). num_classes is unchanged. */
void qt_dataset_limit(qt_dataset *ds, int64_t n);
/* Image folders: a label is the index of its class folder in sorted order, so the test split
 * must have the training split's class folders, name for name. 0 when the class folders of
 * train_root are exactly test's class names; else -1 with err naming the first class missing
 * from either side. */
int qt_dataset_folder_classes_match(const char *train_root, const qt_dataset *test, const char *test_root, char *err);
/* The index of the first label >= classes, or -1 when every label is below it. */
int64_t qt_dataset_label_at_least(const qt_dataset *ds, int classes);

/* Moves the images to a new scratch file in directory `dir`, unlinked at once (nothing is left
 * behind once the process ends), and frees their memory: the file's pages live in the page
 * cache, which the kernel may write back and evict, instead of in this process. Nothing to do
 * when already in a file or empty. Returns 0, or -1 with err naming dir and the system error
 * (the dataset is then unchanged). */
int qt_dataset_to_file(qt_dataset *ds, const char *dir, char *err);

/* Images [i, i + count) of ds (0 <= i, i + count <= n), contiguous: a pointer into memory or,
 * in_file, buf (count * h * w * c bytes) read from the file. A failed read of the scratch file
 * (an I/O error) aborts naming it. */
const uint8_t *qt_dataset_images(const qt_dataset *ds, int64_t i, int64_t count, uint8_t *buf);

/* Samples [first, first + count) of ds as a dataset sharing ds's buffers (or file): nothing is
 * copied, and it must not be freed; ds must outlive it. */
qt_dataset qt_dataset_view(const qt_dataset *ds, int64_t first, int64_t count);

/* Frees every buffer (closing the scratch file) and zeroes *ds; safe on a zeroed dataset. */
void qt_dataset_free(qt_dataset *ds);

/* ---------------------------------------------------------------- loader */

typedef struct {
  int batch_size; /* > 0 */
  int shuffle;    /* permute the samples every epoch */
  uint64_t seed;
  int drop_last;         /* drop a final partial batch */
  float mean[4], std[4]; /* per channel: x = (pixel/255 - mean) / std; std != 0 */
  int crop_pad;          /* > 0: pad with zero pixels by crop_pad, crop back to h x w at a
                            random offset (0 <= crop_pad <= min(h, w)) */
  int flip;              /* random horizontal flip, p = 0.5 (after the crop) */
  /* Data-parallel training: shard_count > 1 processes share every batch, and this loader gives
   * its process only shard shard_index of it: rows [B*k/K, B*(k+1)/K) of each batch of B (same
   * order, same augmentation as the whole batch's rows). Each batch must hold at least one row per
   * shard. 0 or 1: whole batches. */
  int shard_count, shard_index;
} qt_loader_config;

typedef struct qt_loader qt_loader; /* opaque */

/* The loader keeps a pointer to ds (no copy): ds must outlive it and stay unchanged.
 * Returns NULL and writes err on a bad configuration or out of memory. */
qt_loader *qt_loader_create(const qt_dataset *ds, const qt_loader_config *cfg, char *err);

/* Begins epoch `epoch` (any value; order and augmentation depend only on seed and epoch)
 * and starts preparing its first batches. A previous epoch still running is stopped. */
void qt_loader_start_epoch(qt_loader *l, int epoch);

/* Next batch of the current epoch: returns its size B (0 once the epoch is done) and sets
 * *images to (B, h, w, c) normalized floats and *labels to (B). The pointers stay valid
 * until the next call to qt_loader_next, qt_loader_start_epoch or qt_loader_free.
 * Calling it before any qt_loader_start_epoch aborts (programming error). */
int qt_loader_next(qt_loader *l, const float **images, const int32_t **labels);

/* Batches per epoch: n / batch_size, rounded up unless drop_last. */
int64_t qt_loader_num_batches(const qt_loader *l);
/* Rows of the whole batch the last qt_loader_next returned a shard of (its own size without
 * shards); 0 before the first. */
int qt_loader_batch_rows(const qt_loader *l);
/* The row of that whole batch that the last batch's first row is: this loader's shard's offset
 * (0 without shards, and before the first). */
int qt_loader_shard_first(const qt_loader *l);

/* Stops the background thread (if any) and frees the loader; NULL is fine. */
void qt_loader_free(qt_loader *l);

#endif
