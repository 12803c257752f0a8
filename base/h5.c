/* HDF5 helpers shared by the checkpoint, the Q/DQ file and the dataset loader (base/h5.h). */
#define _XOPEN_SOURCE 700 /* strsignal */
#include "base/h5.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

void qt_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* "<file>: <obj>: " (or "<obj>: " without a file) followed by the message. */
static int h5_err(char *err, const char *file, const char *obj, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int h5_err(char *err, const char *file, const char *obj, const char *fmt, ...) {
  char what[QT_ERR_LEN];
  QT_VFORMAT(what, fmt);
  if (file) return qt_err(err, "%s: %s: %s", file, obj, what);
  return qt_err(err, "%s: %s", obj, what);
}

static int h5_contained = 1;

void qt_h5_set_contained(int on) { h5_contained = on; }

int qt_h5_contained(const char *file, const char *kind, int (*parse)(void *ctx, char *err), void *ctx, char *err) {
  struct stat sb;
  if (!h5_contained || stat(file, &sb) != 0) return parse(ctx, err); /* a missing file: parse says so */
  const unsigned seconds = QT_H5_CHILD_SECONDS + (unsigned)(sb.st_size >> 24);
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return parse(ctx, err);
  if (pid == 0) { /* the child: parse, throw the result away, report by exit status only */
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      dup2(null_fd, STDOUT_FILENO);
      dup2(null_fd, STDERR_FILENO);
    }
    signal(SIGALRM, SIG_DFL);
    alarm(seconds);
    char child_err[QT_ERR_LEN];
    /* _exit: no atexit handlers (HDF5's would close the parent's files); 3, not 1, for a refusal:
     * a sanitizer that catches a memory error in HDF5 ends the child with 1 */
    _exit(parse(ctx, child_err) ? 3 : 0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return parse(ctx, err);
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    if (sig == SIGALRM)
      return qt_err(err, "%s: not a valid %s file (the HDF5 library did not finish reading it in %u s)", file, kind,
                    seconds);
    return qt_err(err, "%s: not a valid %s file (the HDF5 library failed reading it: signal %d, %s)", file, kind, sig,
                  strsignal(sig));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3)
    return qt_err(err, "%s: not a valid %s file (the HDF5 library failed reading it: exit %d)", file, kind,
                  WEXITSTATUS(status));
  return parse(ctx, err);
}

hid_t qt_h5_open_read(const char *path, const char *what, hid_t fapl, char *err) {
  qt_h5_quiet();
  if (access(path, R_OK) != 0) return qt_err(err, "%s '%s': cannot open: %s", what, path, strerror(errno));
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (f < 0) return qt_err(err, "%s '%s': not a readable HDF5 file (corrupt or truncated?)", what, path);
  return f;
}

hid_t qt_h5_create(const char *path, hid_t fcpl, hid_t fapl, char *err) {
  qt_h5_quiet();
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
  if (f < 0) return qt_err(err, "cannot create '%s' (directory missing or not writable?)", path);
  return f;
}

#define H5_CHUNK_BYTES ((size_t)1 << 24)
#define H5_COMPACT_LINKS 65535 /* links kept in the (checksummed) group header, not a heap */

/* The core driver's memory comes from these callbacks, so that the buffer survives H5Fclose:
 * only after the close has HDF5 cleared the superblock's "open for writing" flag (version 3
 * superblocks), so the bytes of an open file (H5Fget_file_image) would not open again. */
struct qt_h5_image {
  void *buf;  /* the core driver's buffer; after the close, the file's bytes */
  int closed; /* the driver released buf at the file's close: it is ours now */
};

static void *image_malloc(size_t size, H5FD_file_image_op_t op, void *udata) {
  (void)op;
  (void)udata;
  return malloc(size ? size : 1);
}
static void *image_memcpy(void *dest, const void *src, size_t size, H5FD_file_image_op_t op, void *udata) {
  (void)op;
  (void)udata;
  return memcpy(dest, src, size);
}
static void *image_realloc(void *ptr, size_t size, H5FD_file_image_op_t op, void *udata) {
  (void)op;
  qt_h5_image *im = udata;
  void *p = realloc(ptr, size ? size : 1);
  if (p && ptr == im->buf) im->buf = p;
  if (p && !im->buf) im->buf = p;
  return p;
}
static herr_t image_free(void *ptr, H5FD_file_image_op_t op, void *udata) {
  qt_h5_image *im = udata;
  if (op == H5FD_FILE_IMAGE_OP_FILE_CLOSE && ptr && ptr == im->buf) {
    im->closed = 1; /* kept for qt_h5_commit */
    return 0;
  }
  if (ptr == im->buf) im->buf = NULL;
  free(ptr);
  return 0;
}
static void *image_udata_copy(void *udata) { return udata; }
static herr_t image_udata_free(void *udata) {
  (void)udata;
  return 0;
}

hid_t qt_h5_create_checksummed(const char *name, qt_h5_image **img, char *err) {
  qt_h5_quiet();
  qt_h5_image *im = calloc(1, sizeof *im);
  QT_ASSERT(im, "out of memory");
  H5FD_file_image_callbacks_t cb = {
      image_malloc, image_memcpy, image_realloc, image_free, image_udata_copy, image_udata_free, im};
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), fcpl = H5Pcreate(H5P_FILE_CREATE);
  /* The root group is created with the file: its object times must be off too. */
  const int bad = fapl < 0 || fcpl < 0 || H5Pset_fapl_core(fapl, (size_t)1 << 20, 0) < 0 ||
                  H5Pset_file_image_callbacks(fapl, &cb) < 0 ||
                  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_LATEST) < 0 ||
                  /* closing the file closes whatever a failed writer left open in it */
                  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0 || H5Pset_obj_track_times(fcpl, 0) < 0;
  hid_t f = bad ? -1 : H5Fcreate(name, H5F_ACC_TRUNC, fcpl, fapl);
  if (fapl >= 0) H5Pclose(fapl);
  if (fcpl >= 0) H5Pclose(fcpl);
  if (f < 0) {
    free(im);
    *img = NULL;
    return qt_err(err, "cannot create '%s' in memory (HDF5 failed: out of memory?)", name);
  }
  *img = im;
  return f;
}

void qt_h5_discard(hid_t f, qt_h5_image *img) {
  H5Fclose(f);
  if (img && img->closed) free(img->buf);
  free(img);
}

int qt_h5_commit(hid_t f, qt_h5_image *img, const char *path, char *err) {
  /* The file ends at its end of allocation, the size of its image (the driver's buffer grows
   * in steps of 1 MiB). */
  const ssize_t size = H5Fflush(f, H5F_SCOPE_LOCAL) < 0 ? -1 : H5Fget_file_image(f, NULL, 0);
  const int sized = size > 0;
  const int closed = H5Fclose(f) >= 0 && img->closed && img->buf;
  int rc = sized && closed ? qt_write_file_atomic(path, img->buf, (size_t)size, err)
                           : qt_err(err, "cannot write '%s': HDF5 could not produce the file's bytes", path);
  if (img->closed) free(img->buf);
  free(img);
  return rc;
}

void qt_h5_close_all(const hid_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0) continue;
    switch (H5Iget_type(ids[i])) {
      case H5I_FILE: H5Fclose(ids[i]); break;
      case H5I_GROUP: H5Gclose(ids[i]); break;
      case H5I_DATASET: H5Dclose(ids[i]); break;
      case H5I_DATATYPE: H5Tclose(ids[i]); break;
      case H5I_DATASPACE: H5Sclose(ids[i]); break;
      case H5I_ATTR: H5Aclose(ids[i]); break;
      case H5I_GENPROP_LST: H5Pclose(ids[i]); break;
      default: break; /* not an open identifier (H5I_BADID): its close would fail, as before */
    }
  }
}

hid_t qt_h5_group_create(hid_t loc, const char *name) {
  hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  hid_t g = gcpl < 0 || H5Pset_obj_track_times(gcpl, 0) < 0 ||
                    H5Pset_link_phase_change(gcpl, H5_COMPACT_LINKS, H5_COMPACT_LINKS) < 0
                ? -1
                : H5Gcreate2(loc, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
  if (gcpl >= 0) H5Pclose(gcpl);
  return g;
}

void qt_h5_type_str(hid_t type, char *buf, size_t len) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  switch (cls) {
    case H5T_INTEGER:
      snprintf(buf, len, "%s %zu-bit integer", H5Tget_sign(type) == H5T_SGN_NONE ? "unsigned" : "signed", size * 8);
      break;
    case H5T_FLOAT: snprintf(buf, len, "%zu-bit float", size * 8); break;
    case H5T_STRING:
      if (H5Tis_variable_str(type) > 0)
        snprintf(buf, len, "variable-length string");
      else
        snprintf(buf, len, "fixed-length string of %zu bytes", size);
      break;
    case H5T_ENUM: snprintf(buf, len, "enum (e.g. bool)"); break;
    case H5T_COMPOUND: snprintf(buf, len, "compound"); break;
    case H5T_VLEN: snprintf(buf, len, "variable-length sequence"); break;
    case H5T_ARRAY: snprintf(buf, len, "array type"); break;
    default: snprintf(buf, len, "type class %d", (int)cls); break;
  }
}

void qt_h5_dims_str(int rank, const hsize_t *dims, char *buf, size_t len) {
  if (rank == 0) {
    snprintf(buf, len, "scalar");
    return;
  }
  size_t used = (size_t)snprintf(buf, len, "(");
  for (int i = 0; i < rank && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, i ? ", %llu" : "%llu", (unsigned long long)dims[i]);
  if (used < len) snprintf(buf + used, len - used, rank == 1 ? ",)" : ")");
}

/* ---- attributes: writing ----------------------------------------------------------------------- */

int qt_h5_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int n, const void *data) {
  hsize_t dims[1] = {(hsize_t)(n < 0 ? 0 : n)};
  hid_t sp = n < 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, NULL);
  if (sp < 0) return -1;
  hid_t a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t r = a < 0 ? -1 : n == 0 ? 0 : H5Awrite(a, mtype, data);
  if (a >= 0 && H5Aclose(a) < 0) r = -1;
  H5Sclose(sp);
  return r < 0 ? -1 : 0;
}
int qt_h5_attr_write_int(hid_t loc, const char *name, int v) {
  return qt_h5_attr_write(loc, name, H5T_STD_I32LE, H5T_NATIVE_INT, -1, &v);
}
int qt_h5_attr_write_i64(hid_t loc, const char *name, int64_t v) {
  return qt_h5_attr_write(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, -1, &v);
}
int qt_h5_attr_write_float(hid_t loc, const char *name, float v) {
  return qt_h5_attr_write(loc, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, -1, &v);
}
int qt_h5_attr_write_floats(hid_t loc, const char *name, const float *v, int n) {
  return qt_h5_attr_write(loc, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, n, v);
}
int qt_h5_attr_write_str(hid_t loc, const char *name, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) return -1;
  int r = H5Tset_size(t, strlen(s) + 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLTERM) < 0
              ? -1
              : qt_h5_attr_write(loc, name, t, t, -1, s);
  H5Tclose(t);
  return r;
}

/* ---- attributes: reading ----------------------------------------------------------------------- */

static const char *class_want(H5T_class_t cls) {
  return cls == H5T_INTEGER ? "an integer" : cls == H5T_FLOAT ? "a float" : "a string";
}

hid_t qt_h5_attr_open(hid_t loc, const char *file, const char *obj, const char *name, H5T_class_t cls, int64_t min_n,
                      int64_t max_n, int64_t *n, char *err) {
  htri_t exists = H5Aexists(loc, name);
  if (exists < 0)
    return h5_err(err, file, obj, "cannot read the attributes (corrupt file: checksum or decoding failed)");
  if (exists == 0) return h5_err(err, file, obj, "missing attribute '%s'", name);
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return h5_err(err, file, obj, "cannot open attribute '%s'", name);
  hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
  const H5T_class_t c = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
  const H5S_class_t sc = sp < 0 ? H5S_NO_CLASS : H5Sget_simple_extent_type(sp);
  const int rank = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
  const hssize_t np = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
  hsize_t dims[H5S_MAX_RANK];
  if (rank > 0 && rank <= H5S_MAX_RANK) H5Sget_simple_extent_dims(sp, dims, NULL);
  char found[96] = "an unreadable type", shape[96] = "an unreadable dataspace";
  if (t >= 0) qt_h5_type_str(t, found, sizeof found);
  if (rank >= 0 && rank <= H5S_MAX_RANK) qt_h5_dims_str(rank, dims, shape, sizeof shape);
  if (sc == H5S_NULL) snprintf(shape, sizeof shape, "a null dataspace");
  const size_t size = t >= 0 ? H5Tget_size(t) : 0;
  if (t >= 0) H5Tclose(t);
  if (sp >= 0) H5Sclose(sp);
  int rc = 0;
  if (c != cls)
    rc = h5_err(err, file, obj, "attribute '%s' is not %s, expected %s, found a %s", name, class_want(cls),
                class_want(cls), found);
  else if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && (size < 1 || size > 8))
    rc = h5_err(err, file, obj, "attribute '%s' has an unsupported size, expected 1..8 bytes, found %zu", name, size);
  else if (sc == H5S_NULL || rank < 0 || rank > 1)
    rc = h5_err(err, file, obj, "attribute '%s' has rank %d, expected a scalar or a vector, found %s", name, rank,
                shape);
  else if (np < min_n || np > max_n)
    rc = h5_err(err, file, obj, "attribute '%s' has %lld elements, expected %lld..%lld, found %s", name, (long long)np,
                (long long)min_n, (long long)max_n, shape);
  if (rc) {
    H5Aclose(a);
    return -1;
  }
  if (n) *n = (int64_t)np;
  return a;
}

/* Reads up to max_n integers (as int64) after the checks. */
static int read_i64s(hid_t loc, const char *file, const char *obj, const char *name, int64_t *v, int64_t min_n,
                     int64_t max_n, int64_t *n, char *err) {
  int64_t count = 0;
  hid_t a = qt_h5_attr_open(loc, file, obj, name, H5T_INTEGER, min_n, max_n, &count, err);
  if (a < 0) return -1;
  herr_t r = count ? H5Aread(a, H5T_NATIVE_INT64, v) : 0;
  H5Aclose(a);
  if (n) *n = count;
  return r < 0 ? h5_err(err, file, obj, "cannot read attribute '%s'", name) : 0;
}

int qt_h5_attr_read_i64(hid_t loc, const char *file, const char *obj, const char *name, int64_t *v, char *err) {
  return read_i64s(loc, file, obj, name, v, 1, 1, NULL, err);
}

int qt_h5_attr_read_ints(hid_t loc, const char *file, const char *obj, const char *name, int *v, int min_n, int max_n,
                         int *n, char *err) {
  int64_t buf[64], count = 0;
  QT_ASSERT(max_n >= 0 && max_n <= 64, "attribute %s: %d ints", name, max_n);
  if (read_i64s(loc, file, obj, name, buf, min_n, max_n, &count, err)) return -1;
  for (int64_t k = 0; k < count; k++) {
    if (buf[k] < INT32_MIN || buf[k] > INT32_MAX)
      return h5_err(err, file, obj, "attribute '%s'[%lld] is out of range, expected a 32-bit integer, found %lld", name,
                    (long long)k, (long long)buf[k]);
    v[k] = (int)buf[k];
  }
  if (n) *n = (int)count;
  return 0;
}

int qt_h5_attr_read_int(hid_t loc, const char *file, const char *obj, const char *name, int *v, char *err) {
  return qt_h5_attr_read_ints(loc, file, obj, name, v, 1, 1, NULL, err);
}

int qt_h5_attr_read_floats(hid_t loc, const char *file, const char *obj, const char *name, float *v, int n, char *err) {
  hid_t a = qt_h5_attr_open(loc, file, obj, name, H5T_FLOAT, n, n, NULL, err);
  if (a < 0) return -1;
  herr_t r = n ? H5Aread(a, H5T_NATIVE_FLOAT, v) : 0;
  H5Aclose(a);
  return r < 0 ? h5_err(err, file, obj, "cannot read attribute '%s'", name) : 0;
}

int qt_h5_attr_read_float(hid_t loc, const char *file, const char *obj, const char *name, float *v, char *err) {
  return qt_h5_attr_read_floats(loc, file, obj, name, v, 1, err);
}

/* A string attribute into a new buffer (max_len characters at most); -2 when longer. */
static int read_str(hid_t a, size_t max_len, char **out) {
  hid_t t = H5Aget_type(a), mt = H5Tcopy(H5T_C_S1);
  int rc = -1;
  *out = NULL;
  if (t >= 0 && mt >= 0 && H5Tset_cset(mt, H5Tget_cset(t)) >= 0) {
    if (H5Tis_variable_str(t) > 0) {
      char *s = NULL;
      if (H5Tset_size(mt, H5T_VARIABLE) >= 0 && H5Aread(a, mt, &s) >= 0) {
        const size_t len = s ? strlen(s) : 0;
        if (len > max_len) {
          rc = -2;
        } else {
          *out = malloc(len + 1);
          QT_ASSERT(*out, "out of memory");
          if (len) memcpy(*out, s, len);
          (*out)[len] = 0;
          rc = 0;
        }
      }
      if (s) H5free_memory(s);
    } else {
      const size_t sz = H5Tget_size(t);
      if (sz == 0 || sz > max_len + 1) {
        rc = sz == 0 ? -1 : -2;
      } else {
        char *buf = calloc(sz + 1, 1);
        QT_ASSERT(buf, "out of memory");
        if (H5Tset_size(mt, sz + 1) >= 0 && H5Tset_strpad(mt, H5T_STR_NULLTERM) >= 0 && H5Aread(a, mt, buf) >= 0) {
          buf[sz] = 0;
          if (strlen(buf) > max_len) {
            free(buf);
            rc = -2;
          } else {
            *out = buf;
            rc = 0;
          }
        } else {
          free(buf);
        }
      }
    }
  }
  if (mt >= 0) H5Tclose(mt);
  if (t >= 0) H5Tclose(t);
  return rc;
}

char *qt_h5_attr_read_str_alloc(hid_t loc, const char *file, const char *obj, const char *name, size_t max_len,
                                char *err) {
  hid_t a = qt_h5_attr_open(loc, file, obj, name, H5T_STRING, 1, 1, NULL, err);
  if (a < 0) return NULL;
  char *s = NULL;
  const int rc = read_str(a, max_len, &s);
  H5Aclose(a);
  if (rc == -2)
    h5_err(err, file, obj, "attribute '%s' is longer than %zu characters", name, max_len);
  else if (rc)
    h5_err(err, file, obj, "cannot read attribute '%s'", name);
  return s;
}

int qt_h5_attr_read_str(hid_t loc, const char *file, const char *obj, const char *name, char *buf, size_t cap,
                        char *err) {
  QT_ASSERT(cap >= 1, "attribute %s: no room", name);
  char *s = qt_h5_attr_read_str_alloc(loc, file, obj, name, cap - 1, err);
  if (!s) return -1;
  memcpy(buf, s, strlen(s) + 1);
  free(s);
  return 0;
}

/* ---- datasets ---------------------------------------------------------------------------------- */

static void shape_str(char *buf, size_t n, int ndim, const int64_t *s) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)s[i]);
  if (k < n) snprintf(buf + k, n - k, ")");
}

int qt_h5_check_chunks(hid_t d, const char *file, const char *obj, const char *name, char *err) {
  hid_t dcpl = H5Dget_create_plist(d), t = H5Dget_type(d), sp = H5Dget_space(d); /* 1.10.8 refuses H5S_ALL */
  const H5T_class_t cls = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
  const int fixed = cls == H5T_INTEGER || cls == H5T_FLOAT || (cls == H5T_STRING && H5Tis_variable_str(t) == 0);
  const int nf = dcpl < 0 ? -1 : H5Pget_nfilters(dcpl);
  int rc = dcpl < 0 || t < 0 || sp < 0 || nf < 0
               ? h5_err(err, file, obj, "cannot read how dataset '%s' is stored", name)
               : 0;
  int only_fletcher = rc == 0 && fixed && H5Pget_layout(dcpl) == H5D_CHUNKED;
  for (int i = 0; i < nf && only_fletcher; i++) {
    unsigned flags = 0, config = 0;
    size_t n_values = 0;
    only_fletcher =
        H5Pget_filter2(dcpl, (unsigned)i, &flags, &n_values, NULL, 0, NULL, &config) == H5Z_FILTER_FLETCHER32;
  }
  hsize_t cdims[H5S_MAX_RANK], nchunks = 0;
  const int cnd = only_fletcher ? H5Pget_chunk(dcpl, H5S_MAX_RANK, cdims) : 0;
  if (only_fletcher && (cnd < 1 || H5Dget_num_chunks(d, sp, &nchunks) < 0))
    rc = h5_err(err, file, obj, "cannot read the chunk index of dataset '%s' (corrupt file?)", name);
  hsize_t bytes = rc == 0 && only_fletcher ? (hsize_t)H5Tget_size(t) : 0;
  for (int k = 0; k < cnd && rc == 0; k++) bytes *= cdims[k];
  for (hsize_t i = 0; only_fletcher && rc == 0 && i < nchunks; i++) {
    hsize_t offset[H5S_MAX_RANK], size = 0;
    unsigned mask = 0;
    haddr_t addr = 0;
    if (H5Dget_chunk_info(d, sp, i, offset, &mask, &addr, &size) < 0) {
      rc = h5_err(err, file, obj, "cannot read the chunk index of dataset '%s' (corrupt file?)", name);
      break;
    }
    hsize_t want = bytes;
    for (int f = 0; f < nf; f++) want += (mask >> f) & 1 ? 0 : 4; /* a checksum per filter applied */
    if (size != want)
      rc = h5_err(err, file, obj, "dataset '%s': chunk %llu stores %llu bytes, expected %llu (corrupt file)", name,
                  (unsigned long long)i, (unsigned long long)size, (unsigned long long)want);
  }
  QT_H5_CLOSE_ALL(sp, t, dcpl);
  return rc;
}

/* Whether a dataset's filters compress (anything but the Fletcher-32 checksum and shuffle). */
static int compressed(hid_t d) {
  hid_t dcpl = H5Dget_create_plist(d);
  int n = dcpl < 0 ? 0 : H5Pget_nfilters(dcpl), any = 0;
  for (int k = 0; k < n; k++) {
    unsigned flags = 0, conf = 0;
    size_t nelem = 0;
    const H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)k, &flags, &nelem, NULL, 0, NULL, &conf);
    any |= id != H5Z_FILTER_FLETCHER32 && id != H5Z_FILTER_SHUFFLE;
  }
  if (dcpl >= 0) H5Pclose(dcpl);
  return any;
}

int qt_h5_check_stored(hid_t d, const char *file, const char *obj, const char *name, const char *shape, hsize_t bytes,
                       char *err) {
  const hsize_t stored = H5Dget_storage_size(d);
  if (compressed(d) ? stored >= bytes / 1024 : stored >= bytes) return 0;
  return h5_err(err, file, obj,
                "dataset '%s' declares shape %s (%llu bytes) but stores %llu bytes (truncated or never written)", name,
                shape, (unsigned long long)bytes, (unsigned long long)stored);
}

/* Opens dataset `name` of loc and checks it as qt_h5_dataset_read says, and that the file
 * stores what it declares: a dataset whose chunks were never written reads as zeros, so a
 * small file could otherwise declare gigabytes. The dataset id, *nd and got[] (its shape) and
 * *numel; -1 with err. */
static hid_t dataset_open(hid_t loc, const char *file, const char *obj, const char *name, H5T_class_t cls,
                          int want_ndim, const int64_t *want_dims, int max_ndim, int64_t max_numel, int *nd_out,
                          int64_t *got, int64_t *numel_out, char *err) {
  htri_t exists = H5Lexists(loc, name, H5P_DEFAULT);
  if (exists < 0) return h5_err(err, file, obj, "cannot look up dataset '%s' (corrupt file?)", name);
  if (exists == 0) return h5_err(err, file, obj, "missing dataset '%s'", name);
  hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
  if (d < 0) return h5_err(err, file, obj, "'%s' is not a readable dataset (corrupt file?)", name);
  hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp), ok = 0;
  hsize_t dims[8];
  char s1[96], s2[96];
  int64_t numel = 1;
  if (t < 0 || H5Tget_class(t) != cls) {
    h5_err(err, file, obj, "dataset '%s' is not %s", name,
           cls == H5T_INTEGER ? "integer"
           : cls == H5T_FLOAT ? "floating point"
                              : "a string array");
    goto done;
  }
  if (nd < 1 || nd > (want_ndim > 0 ? want_ndim : max_ndim) || nd > 8 ||
      H5Sget_simple_extent_dims(sp, dims, NULL) < 0) {
    h5_err(err, file, obj, "dataset '%s' has rank %d, want %s%d", name, nd, want_ndim > 0 ? "" : "1..",
           want_ndim > 0 ? want_ndim : max_ndim);
    goto done;
  }
  for (int k = 0; k < nd; k++) {
    got[k] = (int64_t)dims[k];
    if (dims[k] > (hsize_t)max_numel || (numel *= got[k]) > max_numel || got[k] < 1) {
      h5_err(err, file, obj, "dataset '%s' is empty or larger than %lld elements", name, (long long)max_numel);
      goto done;
    }
  }
  if (want_ndim > 0) {
    int same = nd == want_ndim;
    for (int k = 0; same && k < nd; k++) same = got[k] == want_dims[k];
    if (!same) {
      shape_str(s1, sizeof s1, nd, got);
      shape_str(s2, sizeof s2, want_ndim, want_dims);
      h5_err(err, file, obj, "dataset '%s' has shape %s, want %s", name, s1, s2);
      goto done;
    }
  }
  shape_str(s1, sizeof s1, nd, got);
  if (qt_h5_check_stored(d, file, obj, name, s1, (hsize_t)numel * H5Tget_size(t), err)) goto done;
  if (qt_h5_check_chunks(d, file, obj, name, err)) goto done;
  *nd_out = nd;
  *numel_out = numel;
  ok = 1;
done:
  if (t >= 0) H5Tclose(t);
  if (sp >= 0) H5Sclose(sp);
  if (!ok) {
    H5Dclose(d);
    return -1;
  }
  return d;
}

/* Reads the whole of d as mtype into buf, closing d; -1 with err. */
static int dataset_read_close(hid_t d, const char *file, const char *obj, const char *name, hid_t mtype, void *buf,
                              char *err) {
  const int rc =
      H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0
          ? h5_err(err, file, obj, "cannot read dataset '%s' (corrupt file: checksum or decoding failed)", name)
          : 0;
  H5Dclose(d);
  return rc;
}

void *qt_h5_dataset_read(hid_t loc, const char *file, const char *obj, const char *name, H5T_class_t cls, hid_t mtype,
                         int want_ndim, const int64_t *want_dims, int max_ndim, int64_t max_numel, int *ndim_out,
                         int64_t *dims_out, char *err) {
  int nd = 0;
  int64_t got[8], numel = 0;
  hid_t d = dataset_open(loc, file, obj, name, cls, want_ndim, want_dims, max_ndim, max_numel, &nd, got, &numel, err);
  if (d < 0) return NULL;
  void *buf = malloc((size_t)numel * H5Tget_size(mtype) + 1);
  QT_ASSERT(buf, "out of memory reading %lld elements", (long long)numel);
  if (dataset_read_close(d, file, obj, name, mtype, buf, err)) {
    free(buf);
    return NULL;
  }
  if (ndim_out) *ndim_out = nd;
  if (dims_out)
    for (int k = 0; k < nd; k++) dims_out[k] = got[k];
  return buf;
}

int qt_h5_dataset_shape(hid_t loc, const char *file, const char *obj, const char *name, H5T_class_t cls, int max_ndim,
                        int64_t max_numel, int *ndim, int64_t *dims, char *err) {
  int64_t numel = 0;
  hid_t d = dataset_open(loc, file, obj, name, cls, 0, NULL, max_ndim, max_numel, ndim, dims, &numel, err);
  if (d < 0) return -1;
  H5Dclose(d);
  return 0;
}

int qt_h5_dataset_read_f32(hid_t loc, const char *file, const char *obj, const char *name, int ndim,
                           const int64_t *shape, float *out, char *err) {
  int64_t numel = 1, got[8];
  int nd = 0;
  for (int k = 0; k < ndim; k++) numel *= shape[k];
  hid_t d =
      dataset_open(loc, file, obj, name, H5T_FLOAT, ndim, shape, ndim, numel > 0 ? numel : 1, &nd, got, &numel, err);
  return d < 0 ? -1 : dataset_read_close(d, file, obj, name, H5T_NATIVE_FLOAT, out, err);
}

int qt_h5_dataset_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int ndim, const hsize_t *dims,
                        const void *data) {
  QT_ASSERT(ndim >= 1 && ndim <= 8, "dataset %s: rank %d", name, ndim);
  hsize_t chunk[8];
  size_t bytes = H5Tget_size(ftype);
  for (int d = 0; d < ndim; d++) {
    chunk[d] = dims[d] ? dims[d] : 1;
    bytes *= (size_t)chunk[d];
  }
  while (bytes > H5_CHUNK_BYTES && chunk[0] > 1) {
    bytes /= (size_t)chunk[0];
    chunk[0] = (chunk[0] + 1) / 2;
    bytes *= (size_t)chunk[0];
  }
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t sp = H5Screate_simple(ndim, dims, NULL);
  int bad = dcpl < 0 || sp < 0 || H5Pset_obj_track_times(dcpl, 0) < 0 || H5Pset_chunk(dcpl, ndim, chunk) < 0 ||
            H5Pset_fletcher32(dcpl) < 0;
  hid_t d = bad ? -1 : H5Dcreate2(loc, name, ftype, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  bad |= d < 0 || H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0;
  if (d >= 0) bad |= H5Dclose(d) < 0;
  if (sp >= 0) H5Sclose(sp);
  if (dcpl >= 0) H5Pclose(dcpl);
  return bad ? -1 : 0;
}

int qt_h5_dataset_write_f32(hid_t loc, const char *name, int ndim, const int64_t *shape, const float *data) {
  hsize_t dims[8];
  QT_ASSERT(ndim >= 1 && ndim <= 8, "dataset %s: rank %d", name, ndim);
  for (int i = 0; i < ndim; i++) dims[i] = (hsize_t)shape[i];
  return qt_h5_dataset_write(loc, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, ndim, dims, data);
}

hid_t qt_h5_group_open(hid_t loc, const char *file, const char *obj, const char *name, char *err) {
  htri_t exists = H5Lexists(loc, name, H5P_DEFAULT);
  if (exists < 0) return h5_err(err, file, obj, "cannot look up group '%s' (corrupt file?)", name);
  if (exists == 0) return h5_err(err, file, obj, "missing group '%s'", name);
  hid_t g = H5Gopen2(loc, name, H5P_DEFAULT);
  return g < 0 ? h5_err(err, file, obj, "'%s' is not a readable group (corrupt file?)", name) : g;
}
