/* Datasets: read MNIST IDX files (gzip'd or raw), HDF5 files and class-per-folder image trees
 * into one uint8 NHWC buffer plus int32 labels. Every bad input is reported with the file,
 * what was expected and what was found; a failed load leaves the dataset zeroed. The images
 * can then move to an unlinked scratch file (qt_dataset_to_file) read a batch at a time. */
#include "data/data.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "base/h5.h"
#include <stb_image.h>
#include <zlib.h>

/* Largest image buffer we agree to allocate from a file header (16 GiB): a corrupt header
 * then fails with a message instead of exhausting memory. */
#define MAX_IMAGE_BYTES ((uint64_t)1 << 34)

void qt_dataset_free(qt_dataset *ds) {
  if (!ds) return;
  if (ds->in_file) close(ds->fd);
  free(ds->images);
  free(ds->labels);
  if (ds->class_names) {
    for (int i = 0; i < ds->num_classes; i++) free(ds->class_names[i]);
    free(ds->class_names);
  }
  memset(ds, 0, sizeof *ds);
}

void qt_dataset_limit(qt_dataset *ds, int64_t n) {
  if (n <= 0 || n >= ds->n) return;
  size_t image_bytes = (size_t)n * (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
  /* Shrinking realloc may move or fail; on failure the larger block is still valid. A scratch
   * file keeps its records past n, unread. */
  uint8_t *images = ds->in_file ? NULL : realloc(ds->images, image_bytes);
  if (images) ds->images = images;
  int32_t *labels = realloc(ds->labels, (size_t)n * sizeof *labels);
  if (labels) ds->labels = labels;
  ds->n = n;
}

int qt_dataset_to_file(qt_dataset *ds, const char *dir, char *err) {
  if (ds->in_file || ds->n <= 0) return 0;
  const size_t bytes = (size_t)ds->n * (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
  char path[4096];
  if (snprintf(path, sizeof path, "%s/qt-images-XXXXXX", dir[0] ? dir : ".") >= (int)sizeof path)
    return qt_err(err, "data: scratch directory '%s': path too long", dir);
  const int fd = mkstemp(path);
  if (fd < 0) return qt_err(err, "data: cannot create a scratch file in '%s': %s", dir, strerror(errno));
  unlink(path); /* the open descriptor keeps the file; nothing of it outlives the process */
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = write(fd, ds->images + done, bytes - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;
      close(fd);
      return qt_err(err, "data: cannot write %zu bytes of images to a scratch file in '%s': %s", bytes, dir,
                    strerror(e));
    }
    done += (size_t)w;
  }
  free(ds->images);
  ds->images = NULL;
  ds->in_file = 1;
  ds->fd = fd;
  ds->file_offset = 0;
  return 0;
}

const uint8_t *qt_dataset_images(const qt_dataset *ds, int64_t i, int64_t count, uint8_t *buf) {
  const size_t sample = (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
  QT_ASSERT(i >= 0 && count >= 0 && i + count <= ds->n, "images [%lld, %lld) of a dataset of %lld", (long long)i,
            (long long)(i + count), (long long)ds->n);
  if (!ds->in_file) return ds->images + (size_t)i * sample;
  const size_t bytes = (size_t)count * sample;
  const off_t at = (off_t)ds->file_offset + (off_t)((size_t)i * sample);
  for (size_t done = 0; done < bytes;) {
    const ssize_t r = pread(ds->fd, buf + done, bytes - done, at + (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      qt_panic(__FILE__, __LINE__, "data: reading images %lld..%lld back from their scratch file failed: %s",
               (long long)i, (long long)(i + count - 1), r < 0 ? strerror(errno) : "the file is shorter than written");
    done += (size_t)r;
  }
  return buf;
}

qt_dataset qt_dataset_view(const qt_dataset *ds, int64_t first, int64_t count) {
  QT_ASSERT(first >= 0 && count >= 0 && first + count <= ds->n, "view [%lld, %lld) of a dataset of %lld",
            (long long)first, (long long)(first + count), (long long)ds->n);
  const size_t sample = (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
  qt_dataset v = *ds;
  v.n = count;
  v.labels = ds->labels + first;
  if (ds->in_file)
    v.file_offset = ds->file_offset + (int64_t)((size_t)first * sample);
  else
    v.images = ds->images + (size_t)first * sample;
  return v;
}

int64_t qt_dataset_label_at_least(const qt_dataset *ds, int classes) {
  for (int64_t i = 0; i < ds->n; i++)
    if (ds->labels[i] >= classes) return i;
  return -1;
}

/* Sets num_classes to max label + 1; labels must already be >= 0. */
static void set_num_classes(qt_dataset *ds) {
  int32_t max = -1;
  for (int64_t i = 0; i < ds->n; i++)
    if (ds->labels[i] > max) max = ds->labels[i];
  ds->num_classes = max + 1;
}

/* ================================================================ IDX */

/* gzread reads gzip'd and raw files alike, so one path serves both. */
typedef struct {
  gzFile f;
  const char *path;
  char *err;
} idx_file;

static int idx_open(idx_file *f, const char *path, char *err) {
  f->path = path;
  f->err = err;
  errno = 0;
  f->f = gzopen(path, "rb");
  if (!f->f) {
    qt_err(err, "data: %s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    return -1;
  }
  gzbuffer(f->f, 1 << 17);
  return 0;
}

static void idx_close(idx_file *f) {
  if (f->f) gzclose(f->f);
  f->f = NULL;
}

/* zlib's message without the "path: " prefix gzerror puts in front of it. */
static const char *gz_message(idx_file *f, int *code) {
  const char *msg = gzerror(f->f, code);
  size_t len = strlen(f->path);
  if (strncmp(msg, f->path, len) == 0 && msg[len] == ':' && msg[len + 1] == ' ') msg += len + 2;
  return msg;
}

/* Reads exactly len bytes of `what`; a short read is "truncated", a zlib error "corrupt". */
static int idx_read(idx_file *f, void *buf, uint64_t len, const char *what) {
  uint8_t *p = buf;
  uint64_t done = 0;
  while (done < len) {
    uint64_t chunk = len - done;
    if (chunk > (1u << 24)) chunk = 1u << 24;
    int r = gzread(f->f, p + done, (unsigned)chunk);
    if (r < 0) {
      int code;
      const char *msg = gz_message(f, &code);
      qt_err(f->err, "data: %s: corrupt compressed data (%s) while reading %" PRIu64 " %s bytes", f->path, msg, len,
             what);
      return -1;
    }
    if (r == 0) break;
    done += (uint64_t)r;
  }
  if (done < len) {
    int code;
    const char *msg = gz_message(f, &code);
    if (code != Z_OK && code != Z_STREAM_END)
      qt_err(f->err, "data: %s: truncated: expected %" PRIu64 " %s bytes, got %" PRIu64 " (%s)", f->path, len, what,
             done, msg);
    else
      qt_err(f->err, "data: %s: truncated: expected %" PRIu64 " %s bytes, got %" PRIu64, f->path, len, what, done);
    return -1;
  }
  return 0;
}

/* The data must end the file: trailing bytes mean the header does not describe the file, and
 * reading on is what makes zlib verify the gzip trailer (CRC and length). */
static int idx_expect_end(idx_file *f, uint64_t data_bytes) {
  uint8_t extra;
  int r = gzread(f->f, &extra, 1);
  if (r < 0) {
    int code;
    const char *msg = gz_message(f, &code);
    qt_err(f->err, "data: %s: corrupt compressed data (%s) at the end of the stream", f->path, msg);
    return -1;
  }
  if (r == 0) {
    /* zlib reports a stream cut short (e.g. a missing CRC trailer) as a soft Z_BUF_ERROR. */
    int code;
    const char *msg = gz_message(f, &code);
    if (code != Z_OK) {
      qt_err(f->err,
             "data: %s: truncated: the compressed stream ends early (%s) after %" PRIu64 " bytes of header and data",
             f->path, msg, data_bytes);
      return -1;
    }
  }
  if (r > 0) {
    qt_err(f->err, "data: %s: expected the file to end after %" PRIu64 " bytes of header and data, found more", f->path,
           data_bytes);
    return -1;
  }
  return 0;
}

static uint32_t read_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads magic and ndims dimensions; the magic 0x000008NN means unsigned bytes, NN dims. */
static int idx_header(idx_file *f, int ndims, uint32_t *dims) {
  uint8_t buf[4 * 4];
  const uint32_t want = 0x00000800u | (uint32_t)ndims;
  const char *kind =
      ndims == 3 ? "IDX images: unsigned bytes, 3 dimensions" : "IDX labels: unsigned bytes, 1 dimension";
  if (idx_read(f, buf, 4, "magic number") != 0) return -1;
  uint32_t magic = read_be32(buf);
  if (magic != want) {
    const char *hint = "";
    if (magic == 0x00000801u)
      hint = " (an IDX labels file)";
    else if (magic == 0x00000803u)
      hint = " (an IDX images file)";
    else if ((magic & 0xffff0000u) != 0)
      hint = " (not an IDX file)";
    qt_err(f->err, "data: %s: bad magic number: expected 0x%08x (%s), found 0x%08x%s", f->path, want, kind, magic,
           hint);
    return -1;
  }
  if (idx_read(f, buf, 4 * (uint64_t)ndims, "header") != 0) return -1;
  for (int i = 0; i < ndims; i++) dims[i] = read_be32(buf + 4 * i);
  return 0;
}

int qt_dataset_load_idx(qt_dataset *ds, const char *images_path, const char *labels_path, char *err) {
  qt_dataset out = {0};
  idx_file fi = {0}, fl = {0};
  uint8_t *raw_labels = NULL;
  uint32_t idims[3], ldims[1];

  if (idx_open(&fi, images_path, err) != 0) goto fail;
  if (idx_header(&fi, 3, idims) != 0) goto fail;
  if (idims[0] == 0 || idims[1] == 0 || idims[2] == 0) {
    qt_err(err, "data: %s: expected non-zero dimensions, found (%u, %u, %u)", images_path, idims[0], idims[1],
           idims[2]);
    goto fail;
  }
  uint64_t image_bytes = (uint64_t)idims[0] * idims[1] * idims[2];
  if (idims[1] > 65535 || idims[2] > 65535 || image_bytes > MAX_IMAGE_BYTES) {
    qt_err(err, "data: %s: implausible dimensions (%u, %u, %u) in the header", images_path, idims[0], idims[1],
           idims[2]);
    goto fail;
  }

  if (idx_open(&fl, labels_path, err) != 0) goto fail;
  if (idx_header(&fl, 1, ldims) != 0) goto fail;
  if (ldims[0] != idims[0]) {
    qt_err(err, "data: %s: label count %u does not match image count %u in %s", labels_path, ldims[0], idims[0],
           images_path);
    goto fail;
  }

  out.n = idims[0];
  out.h = (int)idims[1];
  out.w = (int)idims[2];
  out.c = 1;
  out.images = malloc((size_t)image_bytes);
  out.labels = malloc((size_t)out.n * sizeof *out.labels);
  raw_labels = malloc((size_t)out.n);
  if (!out.images || !out.labels || !raw_labels) {
    qt_err(err, "data: %s: out of memory for %" PRIu64 " image bytes", images_path, image_bytes);
    goto fail;
  }
  if (idx_read(&fi, out.images, image_bytes, "image") != 0) goto fail;
  if (idx_expect_end(&fi, 16 + image_bytes) != 0) goto fail;
  if (idx_read(&fl, raw_labels, (uint64_t)out.n, "label") != 0) goto fail;
  if (idx_expect_end(&fl, 8 + (uint64_t)out.n) != 0) goto fail;
  idx_close(&fi);
  idx_close(&fl);

  /* IDX labels are unsigned bytes, so 0 <= label < 256 holds by construction. */
  for (int64_t i = 0; i < out.n; i++) out.labels[i] = raw_labels[i];
  free(raw_labels);
  set_num_classes(&out);
  *ds = out;
  return 0;

fail:
  idx_close(&fi);
  idx_close(&fl);
  free(raw_labels);
  qt_dataset_free(&out);
  memset(ds, 0, sizeof *ds);
  return -1;
}

/* ================================================================ HDF5 */

/* Opens dataset `name`, returning its id, type and simple-extent dims (rank <= 8). */
static hid_t open_h5_dataset(hid_t file, const char *path, const char *name, const char *expected, hid_t *type,
                             hsize_t *dims, int *rank, char *err) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) {
    qt_err(err, "data: %s: missing dataset \"%s\" (expected %s)", path, name, expected);
    return -1;
  }
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  if (d < 0) {
    qt_err(err, "data: %s: \"%s\" is not a readable dataset (expected %s)", path, name, expected);
    return -1;
  }
  hid_t space = H5Dget_space(d);
  *rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
  if (*rank < 0 || *rank > 8) {
    qt_err(err, "data: %s: dataset \"%s\": expected %s, found an unreadable or rank > 8 dataspace", path, name,
           expected);
    if (space >= 0) H5Sclose(space);
    H5Dclose(d);
    return -1;
  }
  if (*rank > 0) H5Sget_simple_extent_dims(space, dims, NULL);
  H5Sclose(space);
  *type = H5Dget_type(d);
  return d;
}

/* The file, when it exists and is HDF5 (else -1 with err). */
static hid_t open_hdf5_file(const char *path, char *err) {
  FILE *probe = fopen(path, "rb");
  if (!probe) return qt_err(err, "data: %s: cannot open: %s", path, strerror(errno)), -1;
  fclose(probe);
  if (H5Fis_hdf5(path) <= 0) return qt_err(err, "data: %s: expected an HDF5 file, found no HDF5 signature", path), -1;
  const hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) qt_err(err, "data: %s: cannot open as HDF5 (corrupt or unsupported file)", path);
  return file;
}

/* "images": uint8 (N,H,W,C) or (N,H,W) of a plausible size; *channels and *bytes, or -1. */
static int check_images(hid_t timg, const hsize_t *idims, int irank, const char *path, hsize_t *channels,
                        uint64_t *bytes, char *err) {
  char tbuf[64], dbuf[160];
  if (H5Tget_class(timg) != H5T_INTEGER || H5Tget_size(timg) != 1 || H5Tget_sign(timg) != H5T_SGN_NONE) {
    qt_h5_type_str(timg, tbuf, sizeof tbuf);
    return qt_err(err, "data: %s: dataset \"images\": expected uint8, found %s", path, tbuf);
  }
  qt_h5_dims_str(irank, idims, dbuf, sizeof dbuf);
  if (irank != 3 && irank != 4)
    return qt_err(err, "data: %s: dataset \"images\": expected rank 3 (N,H,W) or 4 (N,H,W,C), found rank %d %s", path,
                  irank, dbuf);
  *channels = irank == 4 ? idims[3] : 1;
  if (idims[0] == 0 || idims[1] == 0 || idims[2] == 0 || *channels < 1 || *channels > 4 || idims[1] > 65535 ||
      idims[2] > 65535)
    return qt_err(err, "data: %s: dataset \"images\": expected N, H, W > 0 and 1 <= C <= 4, found %s", path, dbuf);
  *bytes = (uint64_t)idims[0] * idims[1] * idims[2] * *channels;
  if (idims[0] > MAX_IMAGE_BYTES || *bytes > MAX_IMAGE_BYTES)
    return qt_err(err, "data: %s: dataset \"images\": implausibly large shape %s", path, dbuf);
  return 0;
}

/* "labels": integers of shape (N) or (N, 1), as many as the images, or -1. */
static int check_labels(hid_t tlab, const hsize_t *ldims, int lrank, hsize_t n_images, const char *path, char *err) {
  char tbuf[64], dbuf[160];
  if (H5Tget_class(tlab) != H5T_INTEGER) {
    qt_h5_type_str(tlab, tbuf, sizeof tbuf);
    return qt_err(err, "data: %s: dataset \"labels\": expected an integer type, found %s", path, tbuf);
  }
  qt_h5_dims_str(lrank, ldims, dbuf, sizeof dbuf);
  if (!(lrank == 1 || (lrank == 2 && ldims[1] == 1)))
    return qt_err(err, "data: %s: dataset \"labels\": expected rank 1 (N), found rank %d %s", path, lrank, dbuf);
  if (ldims[0] != n_images)
    return qt_err(err, "data: %s: dataset \"labels\" has %llu entries but \"images\" has %llu", path,
                  (unsigned long long)ldims[0], (unsigned long long)n_images);
  return 0;
}

/* Reads the checked datasets into out (images allocated; labels range-checked), or -1. */
static int read_hdf5_data(qt_dataset *out, hid_t dimg, hid_t dlab, hid_t tlab, const hsize_t *idims, int irank,
                          const hsize_t *ldims, int lrank, uint64_t image_bytes, const char *path, char *err) {
  char dbuf[160], msg[QT_ERR_LEN];
  qt_h5_dims_str(irank, idims, dbuf, sizeof dbuf);
  if (qt_h5_check_stored(dimg, NULL, path, "images", dbuf, (hsize_t)image_bytes, msg))
    return qt_err(err, "data: %s", msg);
  qt_h5_dims_str(lrank, ldims, dbuf, sizeof dbuf);
  if (qt_h5_check_stored(dlab, NULL, path, "labels", dbuf, (hsize_t)ldims[0] * H5Tget_size(tlab), msg))
    return qt_err(err, "data: %s", msg);
  out->n = (int64_t)idims[0];
  out->images = malloc((size_t)image_bytes);
  out->labels = malloc((size_t)out->n * sizeof *out->labels);
  int64_t *raw = malloc((size_t)out->n * sizeof *raw);
  int rc = -1;
  if (!out->images || !out->labels || !raw) {
    qt_err(err, "data: %s: out of memory for %" PRIu64 " image bytes", path, image_bytes);
  } else if (qt_h5_check_chunks(dimg, NULL, path, "images", msg) ||
             qt_h5_check_chunks(dlab, NULL, path, "labels", msg)) {
    qt_err(err, "data: %s", msg);
  } else if (H5Dread(dimg, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->images) < 0) {
    qt_err(err, "data: %s: dataset \"images\": read failed (corrupt or truncated file)", path);
  } else if (H5Dread(dlab, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) < 0) {
    /* read as int64 so any integer type converts without wrapping; range-checked below */
    qt_err(err, "data: %s: dataset \"labels\": read failed (corrupt or truncated file)", path);
  } else {
    rc = 0;
    for (int64_t i = 0; i < out->n && rc == 0; i++) {
      if (raw[i] < 0 || raw[i] >= QT_DATA_MAX_CLASSES)
        rc = qt_err(err,
                    "data: %s: dataset \"labels\"[%" PRId64
                    "]: expected a label in [0, %d] (at most %d classes), "
                    "found %" PRId64,
                    path, i, QT_DATA_MAX_CLASSES - 1, QT_DATA_MAX_CLASSES, raw[i]);
      else
        out->labels[i] = (int32_t)raw[i];
    }
  }
  free(raw);
  return rc;
}

static int load_hdf5_here(qt_dataset *ds, const char *path, char *err) {
  qt_dataset out = {0};
  hid_t file = -1, dimg = -1, dlab = -1, timg = -1, tlab = -1;
  hsize_t idims[8], ldims[8], channels = 0;
  int irank = 0, lrank = 0, status = -1;
  uint64_t image_bytes = 0;
  /* The HDF5 library prints its error stack by default; our messages replace it. */
  H5E_auto2_t old_func;
  void *old_data;
  H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if ((file = open_hdf5_file(path, err)) < 0 ||
      (dimg = open_h5_dataset(file, path, "images", "uint8 images of shape (N,H,W,C) or (N,H,W)", &timg, idims, &irank,
                              err)) < 0 ||
      check_images(timg, idims, irank, path, &channels, &image_bytes, err) ||
      (dlab = open_h5_dataset(file, path, "labels", "integer labels of shape (N)", &tlab, ldims, &lrank, err)) < 0 ||
      check_labels(tlab, ldims, lrank, idims[0], path, err))
    goto done;
  out.h = (int)idims[1];
  out.w = (int)idims[2];
  out.c = (int)channels;
  if (read_hdf5_data(&out, dimg, dlab, tlab, idims, irank, ldims, lrank, image_bytes, path, err)) goto done;
  set_num_classes(&out);
  status = 0;
done:
  QT_H5_CLOSE_ALL(timg, tlab, dimg, dlab, file);
  H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
  if (status == 0) {
    *ds = out;
  } else {
    qt_dataset_free(&out);
    memset(ds, 0, sizeof *ds);
  }
  return status;
}

typedef struct {
  qt_dataset *ds;
  const char *path;
} hdf5_job;

static int hdf5_parse(void *ctx, char *err) {
  const hdf5_job *j = ctx;
  return load_hdf5_here(j->ds, j->path, err);
}

int qt_dataset_load_hdf5(qt_dataset *ds, const char *path, char *err) {
  hdf5_job j = {ds, path};
  if (qt_h5_contained(path, "HDF5 data", hdf5_parse, &j, err) == 0) return 0;
  if (!strncmp(err, path, strlen(path))) { /* a crash in the child: the data loader's prefix */
    char why[QT_ERR_LEN];
    snprintf(why, sizeof why, "%s", err);
    qt_err(err, "data: %s", why);
  }
  return -1;
}

/* ================================================================ image folder */

typedef struct {
  char **items;
  size_t n, cap;
} name_list;

static void name_list_free(name_list *l) {
  for (size_t i = 0; i < l->n; i++) free(l->items[i]);
  free(l->items);
  memset(l, 0, sizeof *l);
}

static int name_list_push(name_list *l, const char *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    char **items = realloc(l->items, cap * sizeof *items);
    if (!items) return -1;
    l->items = items;
    l->cap = cap;
  }
  char *copy = strdup(s);
  if (!copy) return -1;
  l->items[l->n++] = copy;
  return 0;
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int has_image_extension(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot || dot == name) return 0;
  return !strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg");
}

static char *join_path(const char *dir, const char *name) {
  size_t len = strlen(dir) + 1 + strlen(name) + 1;
  char *p = malloc(len);
  if (p) snprintf(p, len, "%s/%s", dir, name);
  return p;
}

/* Lists the entries of dir that are directories (want_dirs) or image files, sorted by name. */
static int list_entries(const char *dir, int want_dirs, name_list *out, char *err) {
  DIR *d = opendir(dir);
  if (!d) {
    qt_err(err, "data: %s: cannot open folder: %s", dir, strerror(errno));
    return -1;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (!want_dirs && !has_image_extension(e->d_name)) continue;
    char *full = join_path(dir, e->d_name);
    struct stat st;
    if (!full) goto oom;
    int ok = stat(full, &st) == 0 && (want_dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
    free(full);
    if (ok && name_list_push(out, e->d_name) != 0) goto oom;
  }
  closedir(d);
  if (out->n) qsort(out->items, out->n, sizeof *out->items, compare_names);
  return 0;
oom:
  closedir(d);
  qt_err(err, "data: %s: out of memory listing the folder", dir);
  return -1;
}

int qt_dataset_folder_classes_match(const char *train_root, const qt_dataset *test, const char *test_root, char *err) {
  name_list train = {0};
  if (list_entries(train_root, 1, &train, err) != 0) return -1;
  const size_t nt = (size_t)test->num_classes;
  size_t i = 0, j = 0;
  int rc = 0;
  /* Both lists are sorted: walk them together to the first name only one side has. */
  while (!rc && (i < train.n || j < nt)) {
    const int c = i == train.n ? 1 : j == nt ? -1 : strcmp(train.items[i], test->class_names[j]);
    if (c < 0)
      rc = qt_err(err,
                  "data: class folder '%s' of the training folder %s is missing from the test folder %s (%zu training "
                  "classes, %zu test classes): labels are class indices in sorted order, so they would not match",
                  train.items[i], train_root, test_root, train.n, nt);
    else if (c > 0)
      rc = qt_err(err,
                  "data: class folder '%s' of the test folder %s is not in the training folder %s (%zu training "
                  "classes, %zu test classes): labels are class indices in sorted order, so they would not match",
                  test->class_names[j], test_root, train_root, train.n, nt);
    i++;
    j++;
  }
  name_list_free(&train);
  return rc;
}

/* Per-file outcome of the parallel decode, reported afterwards for the first failing file. */
typedef struct {
  const char *reason;   /* why decode_image failed, else NULL */
  int other_size, w, h; /* found size, when it differs from the first image */
} decode_status;

/* Checks of a JPEG's tables that stb_image 2.27 (Debian 12's) does not make, done before it
 * decodes; NULL when they pass, else the reason. It walks the markers as stb does (segments by
 * their length, entropy-coded data up to the next marker: progressive files define tables
 * between scans).
 * - A Huffman table of more than 255 codes. stb builds a table without checking that its 16 code
 *   counts add up to at most 256, and then writes past its 257 code sizes and 256 values (fixed
 *   upstream in 2.28). Exactly 256 codes is unsafe too: the fast lookup stores symbol index 255,
 *   which is also its "not in the fast table" mark, so a short code of symbol 255 goes down the
 *   long-code path, whose symbol index then lies outside the table (the STBI_ASSERT in
 *   stbi__jpeg_huff_decode aborts the program; 2.28 added a range check). Encoders emit at most
 *   162 symbols per table.
 * - A scan that uses a Huffman table no DHT segment defined before it, or a component whose
 *   quantization table no DQT segment defined. stb's decoder state is malloc'd, not cleared, and
 *   it never checks that a table was defined: it decodes with whatever the heap held there
 *   (garbage tables reach the same STBI_ASSERT, depending on earlier allocations). Which tables a
 *   scan uses follows stb: a baseline scan both of its components' tables; a progressive scan
 *   its DC tables when it starts at coefficient 0 and is a first pass, its AC tables otherwise. */
static const char *jpeg_tables_problem(const uint8_t *b, size_t n) {
  unsigned huffman[2] = {0, 0}, quant = 0; /* bit t: table t defined (DC, AC; quantization) */
  uint8_t comp_id[4], comp_tq[4];
  int n_comp = 0, progressive = 0;
  size_t p = 2; /* after SOI */
  while (p + 1 < n) {
    const uint8_t m = b[p + 1];
    if (b[p] != 0xff || m == 0xff || m == 0x00 || m == 0x01 || (m >= 0xd0 && m <= 0xd8)) {
      p += b[p] == 0xff && m != 0xff ? 2 : 1; /* data, fill, stuffing, RSTn, TEM, SOI */
      continue;
    }
    if (m == 0xd9 || p + 4 > n) return NULL; /* EOI */
    const size_t len = (size_t)b[p + 2] << 8 | b[p + 3], q0 = p + 4, end = p + 2 + len < n ? p + 2 + len : n;
    if (m == 0xc4) {
      for (size_t q = q0; q < end;) {
        int codes = 0;
        for (size_t i = 1; i <= 16; i++) codes += q + i < n ? b[q + i] : 0;
        if (codes > 255) return "corrupt JPEG: a Huffman table with more than 255 codes";
        if ((b[q] >> 4) < 2 && (b[q] & 15) < 4) huffman[b[q] >> 4] |= 1u << (b[q] & 15);
        q += 17 + (size_t)codes;
      }
    } else if (m == 0xdb) {
      for (size_t q = q0; q < end; q += (b[q] >> 4 ? 129 : 65))
        if ((b[q] & 15) < 4) quant |= 1u << (b[q] & 15);
    } else if (m == 0xc0 || m == 0xc1 || m == 0xc2) {
      progressive = m == 0xc2;
      n_comp = q0 + 5 < end && b[q0 + 5] <= 4 ? b[q0 + 5] : 0; /* more: stb refuses the frame */
      for (int c = 0; c < n_comp; c++) {
        comp_id[c] = q0 + 6 + 3 * (size_t)c < end ? b[q0 + 6 + 3 * c] : 0;
        comp_tq[c] = q0 + 8 + 3 * (size_t)c < end ? b[q0 + 8 + 3 * c] : 0;
      }
    } else if (m == 0xda && q0 < end) {
      const size_t ns = b[q0], tail = q0 + 1 + 2 * ns; /* Ss, Se, Ah/Al follow the components */
      if (tail + 2 >= end) return NULL;                /* stb refuses the scan header */
      const int dc = !progressive || (b[tail] == 0 && (b[tail + 2] >> 4) == 0), ac = !progressive || b[tail] != 0;
      for (size_t i = 0; i < ns; i++) {
        const uint8_t id = b[q0 + 1 + 2 * i], td = b[q0 + 2 + 2 * i] >> 4, ta = b[q0 + 2 + 2 * i] & 15;
        if ((dc && td < 4 && !(huffman[0] >> td & 1)) || (ac && ta < 4 && !(huffman[1] >> ta & 1)))
          return "corrupt JPEG: a scan uses a Huffman table that was not defined";
        for (int c = 0; c < n_comp; c++)
          if (comp_id[c] == id && comp_tq[c] < 4 && !(quant >> comp_tq[c] & 1))
            return "corrupt JPEG: a component's quantization table was not defined";
      }
    }
    p += 2 + len;
  }
  return NULL;
}

/* stb_image decodes a JPEG to the size its header declares, going on with zero bits when the
 * data runs out: 1134 bytes declaring 13827x16464 pixels took 6 s and 340 MB. Every 8x8 block of
 * the first component codes at least one bit (its DC difference, in any scan order), so a file
 * shorter than blocks / 8 bytes cannot hold its image; 0 then. */
static int jpeg_size_plausible(const uint8_t *b, size_t n) {
  int w, h, comp;
  if (!stbi_info_from_memory(b, (int)n, &w, &h, &comp)) return 1; /* the decoder reports it */
  const uint64_t blocks = (uint64_t)((w + 7) / 8) * (uint64_t)((h + 7) / 8);
  return (uint64_t)n >= blocks / 8;
}

/* Decodes one image file (channels 1..4) into a new stb_image buffer and its size; NULL with a
 * static *reason. stb_image picks its decoder from the content, not the name, so a file named
 * .png could reach its BMP, TGA, PSD, PIC, HDR, GIF or PNM decoders (hostile BMP and TGA headers
 * of a few hundred bytes kept them busy for seconds): only PNG and JPEG content is decoded, the
 * formats the extensions name. Thread-safe (stbi_failure_reason is thread-local in this stb). */
static uint8_t *decode_image(const char *path, int channels, int *w, int *h, const char **reason) {
  static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  FILE *f = fopen(path, "rb");
  struct stat st;
  if (!f || fstat(fileno(f), &st) != 0) {
    if (f) fclose(f);
    *reason = "cannot open the file";
    return NULL;
  }
  if (st.st_size > INT32_MAX) {
    fclose(f);
    *reason = "larger than 2 GiB";
    return NULL;
  }
  const size_t n = (size_t)st.st_size;
  uint8_t *bytes = malloc(n ? n : 1);
  const int read_ok = bytes && fread(bytes, 1, n, f) == n;
  fclose(f);
  const int jpeg = read_ok && n >= 2 && bytes[0] == 0xff && bytes[1] == 0xd8;
  const char *jpeg_problem = jpeg ? jpeg_tables_problem(bytes, n) : NULL;
  uint8_t *pixels = NULL;
  int comp;
  if (!read_ok)
    *reason = bytes ? "cannot read the file" : "out of memory";
  else if (!jpeg && !(n >= 8 && memcmp(bytes, png, 8) == 0))
    *reason = "not a PNG or JPEG file (found another signature)";
  else if (jpeg_problem)
    *reason = jpeg_problem;
  else if (jpeg && !jpeg_size_plausible(bytes, n))
    *reason = "a JPEG too short for the size it declares (truncated or crafted)";
  else if (!(pixels = stbi_load_from_memory(bytes, (int)n, w, h, &comp, channels)))
    *reason = stbi_failure_reason() ? stbi_failure_reason() : "unknown error";
  free(bytes);
  return pixels;
}

/* Every image path under root/<class>/ with its class index, in sorted class then file order. */
static int gather_files(const char *root, const name_list *classes, name_list *files, int32_t **file_labels,
                        char *err) {
  for (size_t k = 0; k < classes->n; k++) {
    char *class_dir = join_path(root, classes->items[k]);
    name_list names = {0};
    if (!class_dir) return qt_err(err, "data: %s: out of memory", root);
    int rc = list_entries(class_dir, 0, &names, err);
    if (rc == 0 && names.n == 0) {
      qt_err(err, "data: %s: expected .png/.jpg/.jpeg images in class folder, found none", class_dir);
      rc = -1;
    }
    int32_t *grown = rc == 0 ? realloc(*file_labels, (files->n + names.n) * sizeof *grown) : NULL;
    if (rc == 0 && !grown) {
      qt_err(err, "data: %s: out of memory", root);
      rc = -1;
    }
    if (grown) *file_labels = grown;
    for (size_t i = 0; rc == 0 && i < names.n; i++) {
      char *full = join_path(class_dir, names.items[i]);
      if (!full || name_list_push(files, full) != 0) {
        qt_err(err, "data: %s: out of memory", root);
        rc = -1;
      } else {
        (*file_labels)[files->n - 1] = (int32_t)k;
      }
      free(full);
    }
    name_list_free(&names);
    free(class_dir);
    if (rc != 0) return -1;
  }
  return 0;
}

/* The first image, which fixes the size every other image must have: out's shape and buffers
 * (status: one per file), the image copied in; or -1. */
static int first_image(qt_dataset *out, const name_list *files, int channels, const char *root, decode_status **status,
                       char *err) {
  int w0, h0;
  const char *why = NULL;
  uint8_t *pix = decode_image(files->items[0], channels, &w0, &h0, &why);
  if (!pix) return qt_err(err, "data: %s: cannot decode image: %s", files->items[0], why);
  int rc = 0;
  const size_t image_size = (size_t)w0 * (size_t)h0 * (size_t)channels;
  /* a decoder may return a 0-pixel image without an error (stb_image does for BMP and PNM,
   * which are not decoded here; the check covers every format) */
  if (w0 < 1 || h0 < 1) {
    rc = qt_err(err, "data: %s: expected an image of at least 1x1 pixels, found %dx%d", files->items[0], w0, h0);
  } else if ((uint64_t)image_size * files->n > MAX_IMAGE_BYTES) {
    rc = qt_err(err, "data: %s: %zu images of %dx%dx%d exceed the %" PRIu64 "-byte limit", root, files->n, h0, w0,
                channels, MAX_IMAGE_BYTES);
  } else {
    out->n = (int64_t)files->n;
    out->h = h0;
    out->w = w0;
    out->c = channels;
    out->images = malloc(files->n * image_size);
    out->labels = malloc(files->n * sizeof *out->labels);
    *status = calloc(files->n, sizeof **status);
    if (!out->images || !out->labels || !*status)
      rc = qt_err(err, "data: %s: out of memory for %zu images of %dx%dx%d", root, files->n, h0, w0, channels);
    else
      memcpy(out->images, pix, image_size);
  }
  stbi_image_free(pix);
  return rc;
}

/* The other images, decoded in parallel (stbi_failure_reason is thread-local in this stb); errors
 * are reported afterwards for the first failing file, so the message does not depend on timing. */
static int decode_rest(qt_dataset *out, const name_list *files, int channels, decode_status *status, char *err) {
  const int w0 = out->w, h0 = out->h;
  const size_t image_size = (size_t)w0 * (size_t)h0 * (size_t)channels;
  const int64_t nfiles = (int64_t)files->n;
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 1; i < nfiles; i++) {
    int w, h;
    uint8_t *p = decode_image(files->items[i], channels, &w, &h, &status[i].reason);
    if (!p) continue;
    if (w != w0 || h != h0) {
      status[i].other_size = 1;
      status[i].w = w;
      status[i].h = h;
    } else {
      memcpy(out->images + (size_t)i * image_size, p, image_size);
    }
    stbi_image_free(p);
  }
  for (size_t i = 1; i < files->n; i++) {
    if (status[i].reason) return qt_err(err, "data: %s: cannot decode image: %s", files->items[i], status[i].reason);
    if (status[i].other_size)
      return qt_err(err, "data: %s: expected %dx%d (width x height) like %s, found %dx%d", files->items[i], w0, h0,
                    files->items[0], status[i].w, status[i].h);
  }
  return 0;
}

int qt_dataset_load_folder(qt_dataset *ds, const char *root, int channels, char *err) {
  qt_dataset out = {0};
  name_list classes = {0}, files = {0};
  int32_t *file_labels = NULL;
  decode_status *status = NULL;
  int result = -1;
  if (channels < 1 || channels > 4) {
    qt_err(err, "data: %s: expected channels in 1..4 (1 gray, 3 RGB), found %d", root, channels);
    goto done;
  }
  if (list_entries(root, 1, &classes, err) != 0) goto done;
  if (classes.n == 0) {
    qt_err(err, "data: %s: expected class folders %s/<class>/ holding images, found none", root, root);
    goto done;
  }
  if (classes.n > QT_DATA_MAX_CLASSES) {
    qt_err(err, "data: %s: %zu class folders, at most %d", root, classes.n, QT_DATA_MAX_CLASSES);
    goto done;
  }
  if (gather_files(root, &classes, &files, &file_labels, err) ||
      first_image(&out, &files, channels, root, &status, err) || decode_rest(&out, &files, channels, status, err))
    goto done;
  memcpy(out.labels, file_labels, files.n * sizeof *out.labels);
  out.num_classes = (int)classes.n;
  out.class_names = classes.items; /* ownership moves to the dataset */
  classes.items = NULL;
  classes.n = classes.cap = 0;
  result = 0;
done:
  free(status);
  free(file_labels);
  name_list_free(&files);
  name_list_free(&classes);
  if (result == 0) {
    *ds = out;
  } else {
    qt_dataset_free(&out);
    memset(ds, 0, sizeof *ds);
  }
  return result;
}
