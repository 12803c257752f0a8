/* One element of a fake quant as PyTorch computes it, forward and LSQ backward (quant/quant_fake.c's
 * kernels and the kernels that fuse a fake quant into a pass of their own, autograd/). */
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

/* Whether a relu (relu 1), relu6 (2) or none (0) passes the gradient at its output y (autograd's
 * qt_relu_passes), without branches so that vectorized loops can use it. */
static inline int quant_relu_pass(float y, int relu) {
  return (relu == 0) | (!islessequal(y, 0.0f) & !((relu == 2) & isgreaterequal(y, 6.0f)));
}

/* Below this many elements a parallel region costs more than it saves (quant/quant_fake.c's
 * kernels; a kernel elsewhere that repeats one of their reductions uses it to take the same
 * threads). */
#define QUANT_PARALLEL_MIN 32768

/* One element of PyTorch's fake_quantize_learnable_{tensor,channel}_grad_kernel_cpu as its
 * AVX2 build computes it: xq = nearbyint(fma(x, inv_s, zp)) and xfq - x = fma(xq - zp, s, -x).
 * Sets dx (dy * in_range), ds and dz (the scale and zero-point terms). A macro with quiet
 * comparisons and bit selects, so the `omp simd` loops around it vectorize. */
#define LSQ_ELEMENT(x, dy, s, inv_s, zpf, lo, hi, gf, dx, ds, dz)                 \
  do {                                                                            \
    float xq_ = nearbyintf(fmaf((x), (inv_s), (zpf)));                            \
    xq_ = select_bits(isless(xq_, QUANT_INT64_LIMIT), xq_, -INFINITY);            \
    int ge_ = isgreaterequal(xq_, (lo)), in_ = ge_ & islessequal(xq_, (hi));      \
    float in_term_ = (((dy)*fmaf(xq_ - (zpf), (s), -(x))) * (inv_s)) * (gf);      \
    float out_term_ = ((dy)*select_bits(ge_, (hi) - (zpf), (lo) - (zpf))) * (gf); \
    (dx) = (dy)*select_bits(in_, 1.0f, 0.0f);                                     \
    (ds) = select_bits(in_, in_term_, out_term_);                                 \
    (dz) = select_bits(in_, 0.0f, ((-(dy)) * (s)) * (gf));                        \
  } while (0)

#endif
