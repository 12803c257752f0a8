/* ONNX external data (import_int.h): a tensor whose bytes live in a side file, as the ONNX spec
 * defines it (data_location = EXTERNAL; external_data entries `location`, a path relative to the
 * model's directory, and `offset` and `length` in bytes). torch 2.x writes its weights this way
 * ("model.onnx.data").
 *
 * A model file may come from someone else, so where it may point is limited: the location must
 * be relative, without a ".." component, and must resolve (symbolic links followed) to a regular
 * file inside the model's directory; offset and length must lie within that file, and the
 * length must be the tensor's size. Anything else is refused with the tensor and the location
 * named, before a byte is read. */
#define _GNU_SOURCE /* struct hsearch_data in import_int.h */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/import_int.h"

#define EXT_MAX_TENSOR_BYTES ((int64_t)1 << 32)

/* Bytes per element of the data types an import reads (0: not read from a side file). */
static int elem_size(int data_type) {
  switch (data_type) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: return 4;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return 8;
    default: return 0;
  }
}

/* A non-negative decimal integer, all of the text. */
static int parse_size(const char *s, int64_t *v) {
  if (!s || !*s) return -1;
  int64_t x = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9' || x > (INT64_MAX - 9) / 10) return -1;
    x = 10 * x + (*p - '0');
  }
  *v = x;
  return 0;
}

/* "onnx: <path>: tensor '<name>': external data '<location>': <what>"; returns -1. */
static int ext_err(imp *im, const Onnx__TensorProto *t, const char *loc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ext_err(imp *im, const Onnx__TensorProto *t, const char *loc, const char *fmt, ...) {
  char what[QT_ERR_LEN];
  QT_VFORMAT(what, fmt);
  return qt_imp_file_err(im, "tensor '%s': external data '%s': %s", str(t->name), str(loc), what);
}

/* location must be relative and free of ".." components. */
static int check_location(imp *im, const Onnx__TensorProto *t, const char *loc) {
  if (!loc || !loc[0]) return ext_err(im, t, loc, "no location");
  if (loc[0] == '/')
    return ext_err(im, t, loc, "an absolute path; the location must be relative to the model's directory");
  for (const char *p = loc; *p;) {
    const char *end = strchr(p, '/');
    const size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == 2 && p[0] == '.' && p[1] == '.')
      return ext_err(im, t, loc, "a '..' component; the file must be inside the model's directory");
    p += n + (end != NULL);
  }
  if (strchr(loc, '\\')) return ext_err(im, t, loc, "a backslash; the location is a POSIX path");
  return 0;
}

/* Opens the side file: its real path must lie inside the model directory's real path. */
static int open_inside(imp *im, const Onnx__TensorProto *t, const char *loc, const char *real_dir) {
  char joined[PATH_MAX], real[PATH_MAX];
  if (snprintf(joined, sizeof joined, "%s/%s", real_dir, loc) >= (int)sizeof joined)
    return ext_err(im, t, loc, "path too long");
  if (!realpath(joined, real)) return ext_err(im, t, loc, "cannot open %s: %s", joined, strerror(errno));
  const size_t n = strlen(real_dir);
  const int inside = n == 1 ? real[0] == '/' : strncmp(real, real_dir, n) == 0 && real[n] == '/'; /* n == 1: "/" */
  if (!inside)
    return ext_err(im, t, loc, "resolves to %s, outside the model's directory %s (a symbolic link?)", real, real_dir);
  const int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ext_err(im, t, loc, "cannot open %s: %s", real, strerror(errno));
  return fd;
}

static void keep(imp *im, Onnx__TensorProto *t) {
  if (im->n_ext == im->cap_ext) {
    im->cap_ext = im->cap_ext ? 2 * im->cap_ext : 64;
    im->ext = realloc(im->ext, (size_t)im->cap_ext * sizeof *im->ext);
    QT_ASSERT(im->ext, "out of memory");
  }
  im->ext[im->n_ext++] = t;
}

static int load_one(imp *im, Onnx__TensorProto *t, const char *real_dir) {
  const char *loc = NULL, *off_s = NULL, *len_s = NULL;
  for (size_t i = 0; i < t->n_external_data; i++) {
    const Onnx__StringStringEntryProto *e = t->external_data[i];
    const char *k = str(e->key);
    if (strcmp(k, "location") == 0)
      loc = e->value;
    else if (strcmp(k, "offset") == 0)
      off_s = e->value;
    else if (strcmp(k, "length") == 0)
      len_s = e->value;
  }
  if (check_location(im, t, loc)) return -1;
  /* as ONNX's checker: the data is in the side file only (and raw_data is not overwritten) */
  if (t->has_raw_data || t->n_float_data || t->n_int32_data || t->n_int64_data || t->n_double_data ||
      t->n_uint64_data || t->n_string_data)
    return ext_err(im, t, loc, "the tensor is stored externally but also holds data in the model file");
  const int elem = elem_size(t->data_type);
  if (!elem)
    return ext_err(im, t, loc, "ONNX data type %d; external data is read for float32, int32 and int64 tensors",
                   (int)t->data_type);
  const int64_t numel = numel_of(t);
  if (numel < 0 || numel > EXT_MAX_TENSOR_BYTES / elem) return ext_err(im, t, loc, "dims out of range");
  const int64_t want = numel * elem;
  int64_t offset = 0, length = want;
  if (off_s && parse_size(off_s, &offset)) return ext_err(im, t, loc, "offset '%s' is not a byte count", off_s);
  if (len_s && parse_size(len_s, &length)) return ext_err(im, t, loc, "length '%s' is not a byte count", len_s);
  if (length != want)
    return ext_err(im, t, loc, "length %lld, but the tensor's %lld values take %lld bytes", (long long)length,
                   (long long)numel, (long long)want);
  const int fd = open_inside(im, t, loc, real_dir);
  if (fd < 0) return -1;
  struct stat sb;
  if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    close(fd);
    return ext_err(im, t, loc, "not a regular file");
  }
  if (offset > (int64_t)sb.st_size || length > (int64_t)sb.st_size - offset) {
    close(fd);
    return ext_err(im, t, loc, "bytes %lld to %lld are past the end of the file (%lld bytes)", (long long)offset,
                   (long long)(offset + length), (long long)sb.st_size);
  }
  uint8_t *buf = malloc((size_t)length + 1);
  QT_ASSERT(buf, "out of memory reading %lld bytes", (long long)length);
  int64_t got = 0;
  while (got < length) {
    const ssize_t r = pread(fd, buf + got, (size_t)(length - got), (off_t)(offset + got));
    if (r <= 0) {
      const int e = r < 0 ? errno : EIO;
      close(fd);
      free(buf);
      return ext_err(im, t, loc, "read error: %s", strerror(e));
    }
    got += r;
  }
  close(fd);
  t->has_raw_data = 1;
  t->raw_data.data = buf;
  t->raw_data.len = (size_t)length;
  t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
  keep(im, t);
  im->info->external++;
  return 0;
}

static int is_external(const Onnx__TensorProto *t) {
  return t && t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

int qt_imp_load_external(imp *im) {
  const Onnx__GraphProto *gp = im->gp;
  char dir_buf[PATH_MAX], real_dir[PATH_MAX];
  int any = 0;
  for (size_t i = 0; i < gp->n_initializer && !any; i++) any = is_external(gp->initializer[i]);
  for (size_t i = 0; i < gp->n_node && !any; i++)
    for (size_t a = 0; a < gp->node[i]->n_attribute; a++) any |= is_external(gp->node[i]->attribute[a]->t);
  if (!any) return 0;
  snprintf(dir_buf, sizeof dir_buf, "%s", im->path);
  if (!realpath(dirname(dir_buf), real_dir))
    return qt_imp_file_err(im, "cannot resolve the model's directory: %s", strerror(errno));
  for (size_t i = 0; i < gp->n_initializer; i++)
    if (is_external(gp->initializer[i]) && load_one(im, gp->initializer[i], real_dir)) return -1;
  for (size_t i = 0; i < gp->n_node; i++)
    for (size_t a = 0; a < gp->node[i]->n_attribute; a++)
      if (is_external(gp->node[i]->attribute[a]->t) && load_one(im, gp->node[i]->attribute[a]->t, real_dir)) return -1;
  return 0;
}

void qt_imp_free_external(imp *im) {
  for (int i = 0; i < im->n_ext; i++) {
    Onnx__TensorProto *t = im->ext[i];
    free(t->raw_data.data);
    t->raw_data.data = NULL;
    t->raw_data.len = 0;
    t->has_raw_data = 0;
  }
  free(im->ext);
  im->ext = NULL;
  im->n_ext = 0;
}
