/* Test helpers: reference loading, tolerant comparison, failure accounting. */
#include "testutil.h"

#include <glob.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failures;

int qt_test_temp_left(const char *path) {
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s.tmp*", path);
  glob_t gl;
  int left = glob(pattern, 0, NULL, &gl) == 0 && gl.gl_pathc > 0;
  globfree(&gl);
  return left;
}

const char *qt_test_path(const char *relative) {
  static char buf[4096];
  const char *root = getenv("QT_SOURCE_DIR");
  if (!root) root = ".";
  snprintf(buf, sizeof buf, "%s/%s", root, relative);
  return buf;
}

static void *load(const char *path, const char *name, int64_t *shape, int *ndim, hid_t type, size_t elsize) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    fprintf(stderr, "test: cannot open reference file %s (run tests/ref/make_refs.py?)\n", path);
    exit(1);
  }
  int rank = 0;
  if (H5LTget_dataset_ndims(f, name, &rank) < 0 || rank > 8) {
    fprintf(stderr, "test: dataset '%s' missing in %s\n", name, path);
    exit(1);
  }
  hsize_t dims[8] = {0};
  H5LTget_dataset_info(f, name, dims, NULL, NULL);
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (shape) shape[i] = (int64_t)dims[i];
    n *= (int64_t)dims[i];
  }
  if (ndim) *ndim = rank;
  void *buf = malloc((size_t)(n > 0 ? n : 1) * elsize);
  if (H5LTread_dataset(f, name, type, buf) < 0) {
    fprintf(stderr, "test: cannot read dataset '%s' in %s\n", name, path);
    exit(1);
  }
  H5Fclose(f);
  return buf;
}

float *qt_test_load_f32(const char *path, const char *name, int64_t *shape, int *ndim) {
  return load(path, name, shape, ndim, H5T_NATIVE_FLOAT, sizeof(float));
}

int32_t *qt_test_load_i32(const char *path, const char *name, int64_t *shape, int *ndim) {
  return load(path, name, shape, ndim, H5T_NATIVE_INT32, sizeof(int32_t));
}

/* load, reporting the element count in *n (n may be NULL). */
static void *load_n(const char *path, const char *name, int64_t *n, hid_t type, size_t elsize) {
  int64_t shape[8];
  int nd = 0;
  void *p = load(path, name, shape, &nd, type, elsize);
  if (n) *n = qt_test_numel(shape, nd);
  return p;
}

float *qt_test_load_f32_n(const char *path, const char *name, int64_t *n) {
  return load_n(path, name, n, H5T_NATIVE_FLOAT, sizeof(float));
}

int32_t *qt_test_load_i32_n(const char *path, const char *name, int64_t *n) {
  return load_n(path, name, n, H5T_NATIVE_INT32, sizeof(int32_t));
}

int64_t qt_test_numel(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

int qt_test_close(const char *what, const float *got, const float *want, int64_t n, float atol, float rtol) {
  double maxdiff = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    if (!(d <= maxdiff)) maxdiff = isnan(d) ? INFINITY : (d > maxdiff ? d : maxdiff);
    if (!(d <= atol + rtol * fabs((double)want[i]))) {
      if (bad < 5) fprintf(stderr, "%s: mismatch at %lld: got %.9g want %.9g\n", what, (long long)i, got[i], want[i]);
      bad++;
    }
  }
  if (bad) {
    fprintf(stderr, "%s: %lld of %lld differ (atol %g rtol %g), max abs diff %.3g\n", what, (long long)bad,
            (long long)n, atol, rtol, maxdiff);
    g_failures++;
    return 0;
  }
  return 1;
}

void qt_test_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  g_failures++;
}

int qt_test_failures(void) { return g_failures; }

int qt_test_finish(void) {
  if (g_failures) {
    fprintf(stderr, "FAILED: %d check(s)\n", g_failures);
    return 1;
  }
  return 0;
}

void qt_test_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
  }
}

/* malloc of n floats (at least one), or exit. */
static float *alloc_f32(int64_t n, int zero) {
  float *p = zero ? calloc((size_t)(n > 0 ? n : 1), sizeof *p) : malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  if (!p) {
    fprintf(stderr, "test: out of memory\n");
    exit(1);
  }
  return p;
}

float *qt_test_zeros(int64_t n) { return alloc_f32(n, 1); }

float *qt_test_uniform(int64_t n, uint64_t seed) { return qt_test_uniform_range(n, -1.0f, 1.0f, seed); }

float *qt_test_uniform_range(int64_t n, float lo, float hi, uint64_t seed) {
  float *p = alloc_f32(n, 0);
  qt_test_fill_uniform(p, n, lo, hi, seed);
  return p;
}

float *qt_test_copy_f32(const float *src, int64_t n) {
  float *p = alloc_f32(n, 0);
  memcpy(p, src, (size_t)(n > 0 ? n : 0) * sizeof *p);
  return p;
}
