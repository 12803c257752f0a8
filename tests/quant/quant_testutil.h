/* Helpers shared by the quantization tests: exact comparisons that report the first mismatch
 * and count a failure, loading of numbered reference cases from tests/ref/quant.h5, and the
 * deterministic upstream gradient make_ref_quant.py also uses. */
#ifndef QT_QUANT_TESTUTIL_H
#define QT_QUANT_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "tests/common/testutil.h"

#define QUANT_REF "tests/ref/quant.h5"

/* Bit-for-bit equality (any NaN equals any NaN); with zero_sign_free, +0 also equals -0: an
 * accumulated gradient (dinp += dy * mask) starts from +0, and +0 + -0 is +0, whereas PyTorch
 * returns the product dy * 0 = -0 for a negative dy. Returns 1 when equal. */
static inline int quant_check_same(const char *what, const float *got, const float *want, int64_t n,
                                   int zero_sign_free) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    if (memcmp(&got[i], &want[i], sizeof(float)) == 0 || (isnan(got[i]) && isnan(want[i]))) continue;
    if (zero_sign_free && got[i] == 0.0f && want[i] == 0.0f) continue;
    if (bad < 5) fprintf(stderr, "%s: element %lld: got %.9g want %.9g\n", what, (long long)i, got[i], want[i]);
    if (first < 0) first = i;
    bad++;
  }
  if (bad) qt_test_fail("%s: %lld of %lld elements differ (first at %lld)", what, (long long)bad, (long long)n,
                        (long long)first);
  return bad == 0;
}

static inline int quant_check_bits(const char *what, const float *got, const float *want, int64_t n) {
  return quant_check_same(what, got, want, n, 0);
}

/* Gradients: bit for bit up to the sign of zero (see quant_check_same). */
static inline int quant_check_grad(const char *what, const float *got, const float *want, int64_t n) {
  return quant_check_same(what, got, want, n, 1);
}

static inline int quant_check_i32(const char *what, const int32_t *got, const int32_t *want, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    if (got[i] == want[i]) continue;
    if (bad < 5) fprintf(stderr, "%s: element %lld: got %d want %d\n", what, (long long)i, got[i], want[i]);
    bad++;
  }
  if (bad) qt_test_fail("%s: %lld of %lld elements differ", what, (long long)bad, (long long)n);
  return bad == 0;
}

static inline int quant_check_mask(const char *what, const uint8_t *got, const int32_t *want, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    if ((int32_t)got[i] == want[i]) continue;
    if (bad < 5) fprintf(stderr, "%s: element %lld: got %d want %d\n", what, (long long)i, got[i], want[i]);
    bad++;
  }
  if (bad) qt_test_fail("%s: %lld of %lld mask bytes differ", what, (long long)bad, (long long)n);
  return bad == 0;
}

/* dy[j] = ((j * 37) % 17 - 8) * 0.25, as tests/ref/make_ref_quant.py writes it */
static inline float *quant_upstream(int64_t n) {
  float *dy = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  for (int64_t j = 0; j < n; j++) dy[j] = (float)((j * 37) % 17 - 8) * 0.25f;
  return dy;
}

/* Reference dataset <prefix><i>_<field> of QUANT_REF; *n gets its element count. */
static inline float *quant_load_f32(const char *prefix, int i, const char *field, int64_t *n) {
  char name[128];
  snprintf(name, sizeof name, "%s%d_%s", prefix, i, field);
  return qt_test_load_f32_n(qt_test_path(QUANT_REF), name, n);
}

static inline int32_t *quant_load_i32(const char *prefix, int i, const char *field, int64_t *n) {
  char name[128];
  snprintf(name, sizeof name, "%s%d_%s", prefix, i, field);
  return qt_test_load_i32_n(qt_test_path(QUANT_REF), name, n);
}

static inline int quant_load_count(const char *name) {
  int32_t *p = qt_test_load_i32(qt_test_path(QUANT_REF), name, NULL, NULL);
  int c = p[0];
  free(p);
  return c;
}

#endif
