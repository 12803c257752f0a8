/* oneDNN int8 primitives behind the lowered model (private to the backend library): int8
 * convolution and inner product (u8 activations, s8 weights, per-channel output scales,
 * bias in accumulator units, fused ReLU / ReLU6 / clip, runtime zero points) and u8 max pooling.
 * Each op keeps its primitives per batch size (a few sizes, round robin); weights are
 * reordered into the primitive's layout once per primitive, never per call. A convolution of a
 * one-channel image runs our own kernel instead where the CPU has AVX-512 VNNI and oneDNN's ISA
 * limit allows it (int8_conv1.h: the same bits, faster). */
#ifndef QT_BACKEND_INT8_H
#define QT_BACKEND_INT8_H

#include <math.h>
#include <stdint.h>

#include "base/base.h"

typedef enum { QT_INT8_CONV, QT_INT8_LINEAR, QT_INT8_MAX_POOL } qt_int8_kind;

typedef struct {
  qt_int8_kind kind;
  int H, W, C;                                  /* input per sample, NHWC; linear: H = W = 1, C = IN */
  int OC, OH, OW;                               /* output per sample; pool: OC = C; linear: OH = OW = 1 */
  int KH, KW, stride_h, stride_w, pad_h, pad_w; /* conv (symmetric padding), max pool (right padding: as OH, OW ask) */
  int groups;         /* conv: 0 or 1 = dense; C / groups input channels per group (depthwise: C) */
  int zp_src, zp_dst; /* conv: runtime zero points (0 = none); linear: must be 0 */
  int relu;           /* eltwise relu post-op */
  int relu6;          /* eltwise clip post-op to [0, relu6_hi] (relu6; instead of relu) */
  float relu6_hi;     /* 6 in output units: 6 / s_out */
  int clip;           /* eltwise clip post-op to [clip_lo, clip_hi] (output units before zp_dst) */
  int clip_lo, clip_hi;
  int dst_f32;   /* f32 dst (the caller requantizes) instead of u8 */
  int dnnl_only; /* oneDNN's kernel even for a shape with one of our own (int8_conv1.h): tests */
} qt_int8_params;

/* The op's post-op as one clamp to [*lo, *hi] in output units (before zp_dst): relu (relu6) and
 * the narrowed output range are clamps, and clamping twice equals clamping once to the
 * intersection; -inf / inf where nothing bounds. A relu6 bound below the range: everything
 * clamps to the range's bottom. */
static inline void qt_int8_post_bounds(const qt_int8_params *p, float *lo, float *hi) {
  float l = p->relu || p->relu6 ? 0.0f : -INFINITY, h = p->relu6 ? p->relu6_hi : INFINITY;
  if (p->clip) {
    l = fmaxf(l, (float)p->clip_lo);
    h = fminf(h, (float)p->clip_hi);
  }
  *lo = l;
  *hi = h < l ? l : h;
}

typedef struct qt_int8_op qt_int8_op;

/* weight: s8 in OIHW (conv; grouped: (OC, C/groups, KH, KW)) or (OUT, IN) (linear), NULL for
 * pooling; bias: f32 (OC) in
 * accumulator units; oscale: (OC). All copied. Creates a primitive for a probe batch to learn
 * whether oneDNN implements the scheme: NULL with err when it does not. */
qt_int8_op *qt_int8_op_create(const qt_int8_params *p, const int8_t *weight, const float *bias, const float *oscale,
                              char *err);
/* dst (N, OH, OW, OC) u8 (or f32 for dst_f32) from src (N, H, W, C) u8. */
void qt_int8_op_run(qt_int8_op *op, void *dst, const uint8_t *src, int N);
void qt_int8_op_free(qt_int8_op *op);
/* The implementation that runs the op: the one oneDNN picked for the last primitive created
 * ("jit_int8:avx512_core_vnni"...), or "own:conv1_direct" (int8_conv1.h). */
const char *qt_int8_op_impl(const qt_int8_op *op);

#endif
