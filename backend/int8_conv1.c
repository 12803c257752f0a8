/* The int8 convolution of a one-channel image (int8_conv1.h): the first layer of FashionCNN,
 * ResCNN and the MobileNet-style model (1 -> 32 and 1 -> 16, 3x3), where oneDNN 2.6's int8
 * kernel is slow for what it computes (docs/performance.md). With AVX-512 VNNI (in the build and
 * within oneDNN's ISA limit, ONEDNN_MAX_CPU_ISA); without it qt_conv1_create declines and oneDNN
 * runs the shape.
 *
 * Layout: the output channels in the 16 int32 lanes; each kernel row's taps in groups of four, one
 * VNNI dot product (u8 x s8, four products summed into each lane) per output pixel and group: the
 * four image bytes under the group broadcast to every lane against each channel's four weights.
 * A 3x3 kernel is three dot products per pixel (the fourth tap of a row weighs zero). Eight pixels
 * of a row are computed at once, so each weight vector is loaded once for the eight.
 *
 * Numerics: oneDNN's, bit for bit (docs/design.md, the int8 kernels): the int32 accumulator is
 * exact, padding is zp_src (its products cancel with zp_src * sum(w)), then float(acc) + bias,
 * * oscale, the relu or clip post-op, + zp_dst, saturation and round to nearest even.
 * tests/backend_check/test_backend_int8_conv1.c holds it to oneDNN's kernel and to a plain-C
 * reference. */
#include "backend/int8_conv1.h"
#include "base/base.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define C1_MAX_BLOCKS 4 /* output channels up to 64 */

struct qt_conv1 {
  qt_int8_params p;
  int NB;             /* 16-channel blocks */
  int KQ;             /* groups of 4 taps per kernel row: ceil(KW / 4) */
  int PH, PW;         /* the padded image (PW: room for the last group's 4-byte read) */
  int32_t *w;         /* (KH, KQ, NB * 16) dwords: 4 s8 taps w[oc][kh][4q .. 4q + 3], zeros past KW, OC */
  int32_t *start;     /* (NB * 16): -zp_src * sum_t w[oc][t], where the accumulators start */
  float *add, *mul;   /* (NB * 16): the bias, oscale */
  float lo, hi;       /* the post-op bounds in output units (before zp_dst), with an f32 output */
  float lo_u8, hi_u8; /* with a u8 output: also [-zp_dst, 255 - zp_dst] (the saturation) */
};

#if defined(__AVX512F__) && defined(__AVX512VNNI__)

/* The padded image: zp_src outside the image (zero in real values). */
static void pad_image(const qt_conv1 *k, uint8_t *xp, const uint8_t *img) {
  const qt_int8_params *p = &k->p;
  const int PW = k->PW, W = p->W, left = p->pad_w < PW ? p->pad_w : PW, cols = W < PW - left ? W : PW - left;
  const uint8_t zp = (uint8_t)p->zp_src; /* left: the padding may cover the whole (strided) row */
  for (int r = 0; r < k->PH; r++) {
    const int ih = r - p->pad_h;
    uint8_t *row = xp + (size_t)r * (size_t)PW;
    if (ih < 0 || ih >= p->H) {
      memset(row, zp, (size_t)PW);
      continue;
    }
    memset(row, zp, (size_t)left);
    memcpy(row + left, img + (size_t)ih * (size_t)W, (size_t)cols);
    memset(row + left + cols, zp, (size_t)(PW - left - cols));
  }
}

qt_conv1 *qt_conv1_create(const qt_int8_params *p, const int8_t *weight, const float *bias, const float *oscale) {
  if (p->kind != QT_INT8_CONV || p->C != 1 || p->groups > 1 || p->OC < 1 || p->OC > 16 * C1_MAX_BLOCKS) return NULL;
  if (p->KH < 1 || p->KW < 1 || p->KH * p->KW > 64 || p->stride_h < 1 || p->stride_w < 1 || p->pad_h < 0 ||
      p->pad_w < 0 || p->OH < 1 || p->OW < 1 || p->zp_src < 0 || p->zp_src > 255 || p->zp_dst < 0 || p->zp_dst > 255 ||
      (p->dst_f32 && p->zp_dst)) /* an f32 output with a zero point (the lowering never asks for one) */
    return NULL;
  /* oneDNN's ISA limit holds here too: under ONEDNN_MAX_CPU_ISA=AVX2 (an AVX2 machine emulated)
   * oneDNN's kernel runs the shape */
  if ((dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_vnni) != dnnl_cpu_isa_avx512_core_vnni) return NULL;
  qt_conv1 *k = calloc(1, sizeof *k);
  QT_ASSERT(k, "out of memory");
  k->p = *p;
  k->NB = (p->OC + 15) / 16;
  k->KQ = (p->KW + 3) / 4;
  const int L = k->NB * 16;
  k->PH = (p->OH - 1) * p->stride_h + p->KH;
  k->PW = (p->OW - 1) * p->stride_w + 4 * k->KQ;
  k->w = calloc((size_t)p->KH * (size_t)k->KQ * (size_t)L, sizeof *k->w);
  k->start = calloc((size_t)L, sizeof *k->start);
  k->add = calloc((size_t)L, sizeof *k->add);
  k->mul = calloc((size_t)L, sizeof *k->mul);
  QT_ASSERT(k->w && k->start && k->add && k->mul, "out of memory");
  for (int oc = 0; oc < p->OC; oc++) {
    int32_t sum = 0;
    for (int kh = 0; kh < p->KH; kh++)
      for (int kw = 0; kw < p->KW; kw++) {
        const int8_t w = weight[((size_t)oc * (size_t)p->KH + (size_t)kh) * (size_t)p->KW + (size_t)kw];
        int8_t *quad = (int8_t *)(void *)(k->w + ((size_t)kh * (size_t)k->KQ + (size_t)(kw / 4)) * (size_t)L + oc);
        quad[kw % 4] = w;
        sum += w;
      }
    k->start[oc] = -p->zp_src * sum;
    k->add[oc] = bias[oc];
    k->mul[oc] = oscale[oc];
  }
  float lo, hi; /* oneDNN's one eltwise post-op (int8_dnnl.c) */
  qt_int8_post_bounds(p, &lo, &hi);
  k->lo = lo;
  k->hi = hi;
  /* oneDNN clamps to [lo, hi], adds zp_dst, saturates to [0, 255]. With c0 = -zp_dst and c1 =
   * 255 - zp_dst, v + zp_dst is exactly 0 at c0 and 255 at c1 and never decreases in v, so
   * saturating after the add equals clamping to [c0, c1] before it: one clamp to the
   * intersection of the two ranges (or to the end of [c0, c1] that the post-op range lies past). */
  const float c0 = (float)-p->zp_dst, c1 = (float)(255 - p->zp_dst);
  k->lo_u8 = hi < c0 ? c0 : lo > c1 ? c1 : fmaxf(lo, c0);
  k->hi_u8 = hi < c0 ? c0 : lo > c1 ? c1 : fminf(hi, c1);
  return k;
}

/* The per-channel constants of the requantization, in registers for one image. */
typedef struct {
  __m512i start[C1_MAX_BLOCKS]; /* qt_conv1.start */
  __m512 add[C1_MAX_BLOCKS], mul[C1_MAX_BLOCKS];
  __m512 lo, hi, zp;
} conv1_post;

#define C1_INLINE static inline __attribute__((always_inline))

/* Block b (channels 16b ..) of one pixel's accumulator, requantized and stored at out (u8 or f32):
 * float(acc) + bias, * oscale, the bounds (max / min: no NaN reaches them), + zp_dst and
 * the conversion's round to nearest even (MXCSR's default). */
C1_INLINE void store_block(const conv1_post *q, __m512i acc, int b, int OC, int f32, uint8_t *out) {
  __m512 a = _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(acc), q->add[b]), q->mul[b]);
  a = _mm512_min_ps(_mm512_max_ps(a, q->lo), q->hi);
  const int n = OC - 16 * b < 16 ? OC - 16 * b : 16;
  if (f32) {
    _mm512_mask_storeu_ps((float *)(void *)out + 16 * b, (__mmask16)((1u << n) - 1u), a);
    return;
  }
  const __m128i u = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_add_ps(a, q->zp)));
  if (n == 16)
    _mm_storeu_si128((__m128i *)(void *)(out + 16 * b), u);
  else
    memcpy(out + 16 * b, &u, (size_t)n);
}

/* Four image bytes at x in every dword lane. */
C1_INLINE __m512i quad(const uint8_t *x) {
  int32_t v;
  memcpy(&v, x, sizeof v);
  return _mm512_set1_epi32(v);
}

/* Block b of one output pixel (its window at x0) into out. */
C1_INLINE void pixel_run(const qt_conv1 *k, const conv1_post *q, const uint8_t *x0, uint8_t *out, int b) {
  const int L = k->NB * 16;
  __m512i a = q->start[b];
  const int32_t *wt = k->w + 16 * b;
  for (int kh = 0; kh < k->p.KH; kh++, x0 += k->PW)
    for (int g = 0; g < k->KQ; g++, wt += L) a = _mm512_dpbusd_epi32(a, quad(x0 + 4 * g), _mm512_loadu_si512(wt));
  store_block(q, a, b, k->p.OC, k->p.dst_f32, out);
}

/* Block b of 8 neighbouring output pixels of one row (the first one's window at x0) into out, px
 * bytes apart: eight int32 accumulators in registers, each weight vector loaded once per group of
 * four taps (one VNNI dot product per pixel and group). */
C1_INLINE void pixels8_run(const qt_conv1 *k, const conv1_post *q, const uint8_t *x0, uint8_t *out, size_t px, int b) {
  const int L = k->NB * 16;
  const size_t s = (size_t)k->p.stride_w;
  __m512i a0 = q->start[b], a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const int32_t *wt = k->w + 16 * b;
  for (int kh = 0; kh < k->p.KH; kh++, x0 += k->PW)
    for (int g = 0; g < k->KQ; g++, wt += L) {
      const __m512i w = _mm512_loadu_si512(wt);
      const uint8_t *x = x0 + 4 * g;
      a0 = _mm512_dpbusd_epi32(a0, quad(x), w);
      a1 = _mm512_dpbusd_epi32(a1, quad(x + s), w);
      a2 = _mm512_dpbusd_epi32(a2, quad(x + 2 * s), w);
      a3 = _mm512_dpbusd_epi32(a3, quad(x + 3 * s), w);
      a4 = _mm512_dpbusd_epi32(a4, quad(x + 4 * s), w);
      a5 = _mm512_dpbusd_epi32(a5, quad(x + 5 * s), w);
      a6 = _mm512_dpbusd_epi32(a6, quad(x + 6 * s), w);
      a7 = _mm512_dpbusd_epi32(a7, quad(x + 7 * s), w);
    }
  const int OC = k->p.OC, f32 = k->p.dst_f32;
  store_block(q, a0, b, OC, f32, out);
  store_block(q, a1, b, OC, f32, out + px);
  store_block(q, a2, b, OC, f32, out + 2 * px);
  store_block(q, a3, b, OC, f32, out + 3 * px);
  store_block(q, a4, b, OC, f32, out + 4 * px);
  store_block(q, a5, b, OC, f32, out + 5 * px);
  store_block(q, a6, b, OC, f32, out + 6 * px);
  store_block(q, a7, b, OC, f32, out + 7 * px);
}

/* One image's outputs: per row and block of 16 channels, 8 pixels at a time, the rest one at a time. */
static void image_run(const qt_conv1 *k, const conv1_post *q, uint8_t *dst, const uint8_t *xp) {
  const qt_int8_params *p = &k->p;
  const size_t px = (size_t)p->OC * (p->dst_f32 ? sizeof(float) : 1), sw = (size_t)p->stride_w;
  for (int oh = 0; oh < p->OH; oh++) {
    const uint8_t *xrow = xp + (size_t)oh * (size_t)p->stride_h * (size_t)k->PW;
    uint8_t *orow = dst + (size_t)oh * (size_t)p->OW * px;
    for (int b = 0; b < k->NB; b++) {
      int ow = 0;
      for (; ow + 8 <= p->OW; ow += 8) pixels8_run(k, q, xrow + (size_t)ow * sw, orow + (size_t)ow * px, px, b);
      for (; ow < p->OW; ow++) pixel_run(k, q, xrow + (size_t)ow * sw, orow + (size_t)ow * px, b);
    }
  }
}

void qt_conv1_run(const qt_conv1 *k, void *dst, const uint8_t *src, int N) {
  const qt_int8_params *p = &k->p;
  const size_t in_img = (size_t)p->H * (size_t)p->W,
               out_img = (size_t)p->OH * (size_t)p->OW * (size_t)p->OC * (p->dst_f32 ? sizeof(float) : 1);
#pragma omp parallel if (N > 1)
  {
    uint8_t *xp = malloc((size_t)k->PH * (size_t)k->PW);
    QT_ASSERT(xp, "out of memory");
    conv1_post q;
    for (int b = 0; b < k->NB; b++) {
      q.start[b] = _mm512_loadu_si512(k->start + 16 * b);
      q.add[b] = _mm512_loadu_ps(k->add + 16 * b);
      q.mul[b] = _mm512_loadu_ps(k->mul + 16 * b);
    }
    q.lo = _mm512_set1_ps(p->dst_f32 ? k->lo : k->lo_u8);
    q.hi = _mm512_set1_ps(p->dst_f32 ? k->hi : k->hi_u8);
    q.zp = _mm512_set1_ps((float)p->zp_dst);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      pad_image(k, xp, src + (size_t)n * in_img);
      image_run(k, &q, (uint8_t *)dst + (size_t)n * out_img, xp);
    }
    free(xp);
  }
}

#else /* no AVX-512 VNNI: oneDNN's kernel runs the shape */

qt_conv1 *qt_conv1_create(const qt_int8_params *p, const int8_t *weight, const float *bias, const float *oscale) {
  (void)p, (void)weight, (void)bias, (void)oscale;
  return NULL;
}

void qt_conv1_run(const qt_conv1 *k, void *dst, const uint8_t *src, int N) {
  (void)k, (void)dst, (void)src, (void)N;
  QT_ASSERT(0, "qt_conv1_run without AVX-512 VNNI");
}

#endif

void qt_conv1_free(qt_conv1 *k) {
  if (!k) return;
  QT_FREE_ALL(k->w, k->add, k->mul, k->start, k);
}
