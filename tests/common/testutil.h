/* Test helpers: load PyTorch reference tensors from HDF5 files under tests/ref/, compare
 * buffers with a stated tolerance and report the first mismatches and the max difference.
 * Every test is a standalone program whose exit status is its verdict. */
#ifndef QT_TESTUTIL_H
#define QT_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Absolute path of a file under the source tree (QT_SOURCE_DIR is set by CTest).
 * Returns a static buffer. */
const char *qt_test_path(const char *relative);

/* Loads float dataset `name` from HDF5 file `path`. Fills shape (up to 8 dims) and *ndim.
 * Aborts the test with a message if missing. Caller frees. */
float *qt_test_load_f32(const char *path, const char *name, int64_t *shape, int *ndim);
/* Same for int32 datasets (e.g. labels). */
int32_t *qt_test_load_i32(const char *path, const char *name, int64_t *shape, int *ndim);
/* The same two, reporting only the element count in *n (n may be NULL). */
float *qt_test_load_f32_n(const char *path, const char *name, int64_t *n);
int32_t *qt_test_load_i32_n(const char *path, const char *name, int64_t *n);
/* Number of elements in a loaded shape. */
int64_t qt_test_numel(const int64_t *shape, int ndim);

/* Compares got against want elementwise: |got-want| <= atol + rtol*|want|.
 * Prints the first 5 mismatches and the max abs difference under `what` on failure.
 * Returns 1 when all match, 0 otherwise (and counts a failure). */
int qt_test_close(const char *what, const float *got, const float *want, int64_t n, float atol, float rtol);

/* Records a failed check with a printf-style message. */
void qt_test_fail(const char *fmt, ...);
/* CHECK(cond): records a failure naming file:line and the expression. */
#define QT_CHECK(cond) do { if (!(cond)) qt_test_fail("%s:%d: check failed: %s", __FILE__, __LINE__, #cond); } while (0)

/* QT_CHECK_NAMES(type, count, name_fn, parse_fn): the name of every value 0..count-1 of an enum
 * parses back to that value (a failure names the value and its name). */
#define QT_CHECK_NAMES(type, count, name_fn, parse_fn)                                                               \
  do {                                                                                                               \
    for (int k_ = 0; k_ < (int)(count); k_++) {                                                                      \
      type got_ = (type)(count);                                                                                     \
      if (parse_fn(name_fn((type)k_), &got_) != 0 || got_ != (type)k_)                                               \
        qt_test_fail("%s:%d: %s(%s(%d) = '%s') does not give %d back", __FILE__, __LINE__, #parse_fn, #name_fn,      \
                     k_, name_fn((type)k_), k_);                                                                     \
    }                                                                                                                \
  } while (0)

/* Number of failures so far; tests end with `return qt_test_finish();`, which prints
 * "N passed, M failed"-style summary only on failure and returns the exit status. */
/* Whether a temporary file that an atomic write of path makes ("<path>.tmp*") is left beside it. */
int qt_test_temp_left(const char *path);
int qt_test_failures(void);
int qt_test_finish(void);

/* Deterministic uniform random floats in [lo, hi) from a seed (splitmix-based). */
void qt_test_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed);

/* Float buffers for kernel tests: n zeros, n uniform in [-1, 1) from seed, a copy of src. Each
 * holds at least one element and exits the test with a message when memory runs out. */
float *qt_test_zeros(int64_t n);
float *qt_test_uniform(int64_t n, uint64_t seed);
/* n uniform in [lo, hi) from seed (qt_test_fill_uniform into a new buffer, as above). */
float *qt_test_uniform_range(int64_t n, float lo, float hi, uint64_t seed);
float *qt_test_copy_f32(const float *src, int64_t n);

#endif
