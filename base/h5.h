/* The one set of HDF5 helpers (library qt_base_h5, linked to HDF5; base.h stays HDF5-free):
 * open/create with HDF5's error printing silenced, typed attribute writers, attribute readers
 * that check class, size, rank and element count BEFORE reading (a file is untrusted input: an
 * array where a scalar is expected never overflows a buffer, a variable-length string is read
 * as a string, not as a pointer), dataset readers of an expected shape, and describers of types
 * and shapes for messages.
 *
 * Messages have the form "<file>: <object>: <what>, expected <x>, found <y>". `file` may be
 * NULL when the caller adds its own prefix (the Q/DQ file reader does); `obj` names the group
 * or dataset that holds the attribute ("/", "/nodes/0003_conv1"). */
#ifndef QT_BASE_H5_H
#define QT_BASE_H5_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Turns off HDF5's automatic error-stack printing (our messages replace it). */
void qt_h5_quiet(void);
/* HDF5 1.10.8 (Debian 12's) crashes inside itself on some crafted files (fuzz/hdf5-crashes/):
 * a file this process did not write is parsed first in a child process. qt_h5_contained runs
 * parse(ctx, err) in a forked child (its output silenced, at most QT_H5_CHILD_SECONDS plus one
 * second per 16 MB of the file); when the child dies of a signal (or a sanitizer ends it), it
 * returns -1 with err "<file>: not a valid <kind> file (the HDF5 library failed reading it:
 * signal N, <name>)" and nothing of this process has changed; when the child parsed the file or
 * refused it, it returns parse(ctx, err) run here (a refusal's message comes from there). The
 * child's work is thrown away: a file is parsed twice, once where a crash costs nothing. When
 * fork fails, or containment is off (qt_h5_set_contained(0): the fuzz targets, which want the
 * crash itself), parse runs here only. */
#define QT_H5_CHILD_SECONDS 60
int qt_h5_contained(const char *file, const char *kind, int (*parse)(void *ctx, char *err), void *ctx, char *err);
void qt_h5_set_contained(int on);
/* Opens an existing file read-only (fapl may be H5P_DEFAULT). -1 with err: "<what> '<path>':
 * cannot open: <reason>" or "<what> '<path>': not a readable HDF5 file (corrupt or truncated?)". */
hid_t qt_h5_open_read(const char *path, const char *what, hid_t fapl, char *err);
/* Creates (truncates) path for writing with the given property lists (H5P_DEFAULT or lists
 * the caller made); -1 with err "cannot create '<path>' (directory missing or not writable?)"
 * for the caller to prefix. Writers create a qt_temp_create file and finish with qt_file_commit. */
hid_t qt_h5_create(const char *path, hid_t fcpl, hid_t fapl, char *err);
/* A file being built in memory (qt_h5_create_checksummed), written by qt_h5_commit. */
typedef struct qt_h5_image qt_h5_image;
/* Creates a file in memory (HDF5's core driver: nothing touches the disk until qt_h5_commit)
 * in HDF5 1.10's format, whose superblock, object headers (and so every attribute) and chunk
 * indexes carry checksums, with object times off so that the bytes depend only on what is
 * written. Datasets written with qt_h5_dataset_write carry Fletcher-32 checksums: together a
 * flipped bit anywhere that matters is refused on reading instead of loaded as another number.
 * `name` only labels the file in messages. The file id, and *img for qt_h5_commit or
 * qt_h5_discard; -1 with err. */
hid_t qt_h5_create_checksummed(const char *name, qt_h5_image **img, char *err);
/* Closes f and writes its bytes to path atomically (a qt_temp_create file, fsync, rename, fsync of the
 * directory): path then holds the whole file, or is unchanged when writing fails (a full disk
 * gives a message, never a half-written file, nor an HDF5 library left holding a file it
 * cannot flush). f and img are released either way. -1 with err naming path. */
int qt_h5_commit(hid_t f, qt_h5_image *img, const char *path, char *err);
/* Closes f without writing it anywhere. */
void qt_h5_discard(hid_t f, qt_h5_image *img);
/* Closes each of the n identifiers that is open (>= 0), whatever it is: file, group, dataset,
 * datatype, dataspace, attribute or property list; one no longer open is passed over. QT_H5_CLOSE_ALL(a, b, ...) closes
 * a list. */
void qt_h5_close_all(const hid_t *ids, size_t n);
#define QT_H5_CLOSE_ALL(...) \
  qt_h5_close_all((const hid_t[]){__VA_ARGS__}, sizeof((const hid_t[]){__VA_ARGS__}) / sizeof(hid_t))
/* A group whose object times are off and whose links stay in its (checksummed) header. */
hid_t qt_h5_group_create(hid_t loc, const char *name);

/* "signed 32-bit integer", "32-bit float", "fixed-length string of 7 bytes", "variable-length
 * string", ... */
void qt_h5_type_str(hid_t type, char *buf, size_t len);
/* "(3, 4)", "(5,)" for rank 1, "scalar" for rank 0. */
void qt_h5_dims_str(int rank, const hsize_t *dims, char *buf, size_t len);

/* ---- attributes: writing (scalars unless n >= 0 is given) -------------------------------------- */
/* A rank-1 attribute of n elements, or a scalar when n < 0; n == 0 writes an empty array. */
int qt_h5_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int n, const void *data);
int qt_h5_attr_write_int(hid_t loc, const char *name, int v);                    /* int32 scalar */
int qt_h5_attr_write_i64(hid_t loc, const char *name, int64_t v);                /* int64 scalar */
int qt_h5_attr_write_float(hid_t loc, const char *name, float v);                /* float32 scalar */
int qt_h5_attr_write_floats(hid_t loc, const char *name, const float *v, int n); /* float32 (n) */
int qt_h5_attr_write_str(hid_t loc, const char *name, const char *s);            /* fixed-length, NUL-terminated */

/* ---- attributes: reading (all checks before H5Aread) ------------------------------------------- */
/* Opens attribute `name` of loc, checking it exists, has type class cls (H5T_INTEGER, H5T_FLOAT
 * or H5T_STRING), a simple dataspace of rank <= 1 (a scalar or a vector) and min_n..max_n
 * elements. Returns the attribute id (close it) and *n, or -1 with err:
 *   "<obj>: missing attribute 'x'"
 *   "<obj>: attribute 'x' is not an integer, expected an integer, found a 32-bit float"
 *   "<obj>: attribute 'x' has 3 elements, expected 1..1, found (3,)" */
hid_t qt_h5_attr_open(hid_t loc, const char *file, const char *obj, const char *name, H5T_class_t cls, int64_t min_n,
                      int64_t max_n, int64_t *n, char *err);
/* Integer attributes: read as int64 and range-checked before narrowing. */
int qt_h5_attr_read_i64(hid_t loc, const char *file, const char *obj, const char *name, int64_t *v, char *err);
int qt_h5_attr_read_int(hid_t loc, const char *file, const char *obj, const char *name, int *v, char *err);
/* Between min_n and max_n ints into v (max_n entries of room); *n gets the count. */
int qt_h5_attr_read_ints(hid_t loc, const char *file, const char *obj, const char *name, int *v, int min_n, int max_n,
                         int *n, char *err);
int qt_h5_attr_read_float(hid_t loc, const char *file, const char *obj, const char *name, float *v, char *err);
/* Exactly n floats. */
int qt_h5_attr_read_floats(hid_t loc, const char *file, const char *obj, const char *name, float *v, int n, char *err);
/* A fixed- or variable-length string scalar into buf (cap bytes with the terminator):
 * "<obj>: attribute 'x' is longer than 63 characters". */
int qt_h5_attr_read_str(hid_t loc, const char *file, const char *obj, const char *name, char *buf, size_t cap,
                        char *err);
/* The same into a new malloc'd string of at most max_len characters; NULL with err. */
char *qt_h5_attr_read_str_alloc(hid_t loc, const char *file, const char *obj, const char *name, size_t max_len,
                                char *err);

/* ---- datasets ----------------------------------------------------------------------------------- */
/* HDF5 1.10.8 trusts a chunk's stored size: a chunk whose filters give back fewer bytes than the
 * chunk holds (a Fletcher-32 chunk whose size was cut, with a matching checksum) is copied past
 * the end of its buffer inside H5Dread (a heap over-read found by fuzzing). When every filter of
 * a chunked dataset of fixed-size elements is Fletcher-32, as this project writes them, each
 * chunk's stored size is known (its bytes, plus 4 per checksum): -1 with err when a chunk
 * stores another size. 0 otherwise, also when other filters (e.g. deflate, whose output size
 * only decoding tells) leave the check to HDF5. Call before H5Dread; qt_h5_dataset_read does. */
int qt_h5_check_chunks(hid_t d, const char *file, const char *obj, const char *name, char *err);
/* A dataset whose declared size is `bytes` must store about as much: all of it, or when
 * compressed at least 1/1024 of it. -1 with err ("dataset '<name>' declares shape <shape>
 * (<bytes> bytes) but stores <n> bytes (truncated or never written)") otherwise: a few hundred
 * bytes of file must not make a reader allocate gigabytes. Call before allocating for H5Dread. */
int qt_h5_check_stored(hid_t d, const char *file, const char *obj, const char *name, const char *shape, hsize_t bytes,
                       char *err);
/* Reads dataset `name` of loc (type class cls) into a new buffer of mtype elements (free it).
 * When want_ndim > 0 the shape must be want_dims; else any rank 1..max_ndim, returned in
 * *ndim_out / dims_out. At most max_numel elements, none empty, and the file must store what
 * the dataset declares (never-written chunks read as zeros: a small file could declare
 * gigabytes; compressed datasets may be up to 1024 times smaller). NULL with err:
 *   "<obj>: missing dataset 'x'", "<obj>: dataset 'x' is not integer",
 *   "<obj>: dataset 'x' has shape (3), want (4)", "<obj>: dataset 'x' has rank 3, want 1..2". */
void *qt_h5_dataset_read(hid_t loc, const char *file, const char *obj, const char *name, H5T_class_t cls, hid_t mtype,
                         int want_ndim, const int64_t *want_dims, int max_ndim, int64_t max_numel, int *ndim_out,
                         int64_t *dims_out, char *err);
/* The checks of qt_h5_dataset_read without reading: the shape into *ndim, dims. */
int qt_h5_dataset_shape(hid_t loc, const char *file, const char *obj, const char *name, H5T_class_t cls, int max_ndim,
                        int64_t max_numel, int *ndim, int64_t *dims, char *err);
/* float32 dataset of exactly the given shape read into out (no copy). */
int qt_h5_dataset_read_f32(hid_t loc, const char *file, const char *obj, const char *name, int ndim,
                           const int64_t *shape, float *out, char *err);
/* A chunked dataset (chunks of at most 16 MiB) with a Fletcher-32 checksum and object times
 * off: file type ftype, memory type mtype, ndim (1..8) dims. */
int qt_h5_dataset_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int ndim, const hsize_t *dims,
                        const void *data);
/* The same for a float32 dataset of the given shape. */
int qt_h5_dataset_write_f32(hid_t loc, const char *name, int ndim, const int64_t *shape, const float *data);
/* Opens group `name` of loc: "<obj>: missing group 'x'". */
hid_t qt_h5_group_open(hid_t loc, const char *file, const char *obj, const char *name, char *err);

#endif
