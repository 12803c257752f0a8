/* One element of a fake quant as PyTorch computes it (qat/quant_fake.c's kernels and the kernels
 * that fuse a fake quant into a pass of their own, autograd/cpu_batch_norm.c). */
#ifndef QT_QUANT_ELEM_H
#define QT_QUANT_ELEM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define QUANT_INT64_LIMIT 0x1p63f

/* round(x * inv_s) + zp in float as PyTorch forms it; non-representable-as-int64 -> -Inf. */
static inline float quant_round(float x, float inv_s, float zpf) {
  float q = nearbyintf(x * inv_s) + zpf;
  return q < QUANT_INT64_LIMIT ? q : -INFINITY;
}

static inline float quant_clamp(float q, float lo, float hi) {
  q = q > lo ? q : lo; /* -Inf (PyTorch's INT64_MIN) clamps to lo */
  return q < hi ? q : hi;
}

/* The fake-quantized value of x: (clamp(round(x / s) + zp) - zp) * s, PyTorch's operations in turn. */
static inline float quant_fake(float x, float s, float inv_s, float zpf, float lo, float hi) {
  return (quant_clamp(quant_round(x, inv_s, zpf), lo, hi) - zpf) * s;
}

/* c ? a : b on the bits: with gcc's default -ftrapping-math a float ?: may be turned back into
 * a branch around trapping arithmetic, which stops a loop from vectorizing. */
static inline float select_bits(int c, float a, float b) {
  uint32_t ua, ub, m = -(uint32_t)(c != 0);
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  uint32_t r = (ua & m) | (ub & ~m);
  float f;
  memcpy(&f, &r, sizeof f);
  return f;
}

#endif
