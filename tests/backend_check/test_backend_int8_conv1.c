/* The int8 convolution of a one-channel image (backend/int8_conv1.c), which the lowering runs in
 * place of oneDNN's kernel: bit for bit against oneDNN's own kernel for the same parameters
 * (dnnl_only) and against a plain-C reference of the requantization oneDNN documents
 * (int8_dnnl.c): the exact integer accumulator with padding at zp_src, then in float
 * (acc + bias) * oscale, the relu / relu6 / clip bound, + zp_dst, saturation to [0, 255] and round to
 * nearest even. Cases: kernel sizes 1x1 to 5x5 (and 1x7), strides 1, 2 and 9, paddings 0 to 4
 * (one wider than a strided row), output channels 8 to 64 (a partial block of 16), zero points,
 * each post-op, f32 output, and power-of-two scales with integer biases, where exact .5 ties
 * decide the rounding. CMake runs it twice: as the CPU allows, and under ONEDNN_MAX_CPU_ISA=AVX2,
 * where our kernel declines and oneDNN's AVX2 kernels are held to the reference. Tolerance: 0
 * (every output bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "backend/int8.h"
#include "tests/common/testutil.h"

/* The kernel the lowering gets for a one-channel image: ours where the build has AVX-512 VNNI
 * and oneDNN's ISA limit allows it, else oneDNN's (then both ops below are oneDNN's, still held
 * to the reference). */
static const char *own_impl(const qt_int8_op *dnnl) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  if ((dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni)
    return "own:conv1_direct";
#endif
  return qt_int8_op_impl(dnnl);
}

typedef struct {
  int H, W, OC, KH, KW, stride, pad, zp_src, zp_dst, relu, relu6, clip, dst_f32, ties, N;
} conv1_case;

static uint64_t rng_state;
static uint32_t rnd(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rng_state >> 33);
}

/* The plain-C reference: one output (u8 or f32) per (n, oh, ow, oc). */
static void reference(const qt_int8_params *p, const int8_t *w, const float *bias, const float *oscale,
                      const uint8_t *x, int N, void *dst) {
  float lo = p->relu || p->relu6 ? 0.0f : -INFINITY, hi = p->relu6 ? p->relu6_hi : INFINITY;
  if (p->clip) {
    lo = fmaxf(lo, (float)p->clip_lo);
    hi = fminf(hi, (float)p->clip_hi);
  }
  if (hi < lo) hi = lo;
  for (int n = 0; n < N; n++)
    for (int oh = 0; oh < p->OH; oh++)
      for (int ow = 0; ow < p->OW; ow++)
        for (int oc = 0; oc < p->OC; oc++) {
          int32_t acc = 0;
          for (int kh = 0; kh < p->KH; kh++)
            for (int kw = 0; kw < p->KW; kw++) {
              const int ih = oh * p->stride_h - p->pad_h + kh, iw = ow * p->stride_w - p->pad_w + kw;
              const int xv =
                  ih >= 0 && ih < p->H && iw >= 0 && iw < p->W ? x[((size_t)n * p->H + ih) * p->W + iw] : p->zp_src;
              acc += (xv - p->zp_src) * w[(oc * p->KH + kh) * p->KW + kw];
            }
          float a = ((float)acc + bias[oc]) * oscale[oc];
          a = a < lo ? lo : a;
          a = a > hi ? hi : a;
          const size_t o = (((size_t)n * p->OH + oh) * p->OW + ow) * p->OC + oc;
          if (p->dst_f32) {
            ((float *)dst)[o] = a;
            continue;
          }
          a += (float)p->zp_dst;
          a = a < 0.0f ? 0.0f : a > 255.0f ? 255.0f : a;
          ((uint8_t *)dst)[o] = (uint8_t)nearbyintf(a);
        }
}

static void run_case(const conv1_case *c, uint64_t seed) {
  rng_state = seed;
  qt_int8_params p;
  memset(&p, 0, sizeof p);
  p.kind = QT_INT8_CONV;
  p.H = c->H, p.W = c->W, p.C = 1, p.OC = c->OC;
  p.KH = c->KH, p.KW = c->KW, p.stride_h = p.stride_w = c->stride, p.pad_h = p.pad_w = c->pad;
  p.OH = (c->H + 2 * c->pad - c->KH) / c->stride + 1;
  p.OW = (c->W + 2 * c->pad - c->KW) / c->stride + 1;
  p.zp_src = c->zp_src, p.zp_dst = c->zp_dst, p.relu = c->relu, p.relu6 = c->relu6, p.clip = c->clip;
  p.dst_f32 = c->dst_f32;
  const int K = c->KH * c->KW;
  int8_t *w = malloc((size_t)c->OC * K);
  float *bias = malloc((size_t)c->OC * sizeof(float)), *oscale = malloc((size_t)c->OC * sizeof(float));
  for (int i = 0; i < c->OC * K; i++) w[i] = (int8_t)((int)(rnd() % 256) - 128);
  for (int oc = 0; oc < c->OC; oc++) {
    if (c->ties) { /* integer bias, scale 2^-e: (acc + bias) * scale lands on .5 often */
      bias[oc] = (float)((int)(rnd() % 2001) - 1000);
      oscale[oc] = ldexpf(1.0f, -(int)(8 + rnd() % 3));
    } else {
      bias[oc] = (float)((int)(rnd() % 400001) - 200000) / 97.0f;
      oscale[oc] = 1.0f / (float)(1500 + rnd() % 6000);
    }
  }
  p.relu6_hi = 6.0f / 0.047f; /* 127.66: a bound between integers */
  if (p.clip) p.clip_lo = -p.zp_dst, p.clip_hi = 15 - p.zp_dst;
  const size_t in_n = (size_t)c->N * c->H * c->W, out_n = (size_t)c->N * p.OH * p.OW * c->OC,
               out_bytes = out_n * (c->dst_f32 ? sizeof(float) : 1);
  uint8_t *x = malloc(in_n);
  for (size_t i = 0; i < in_n; i++) x[i] = (uint8_t)(rnd() % 256);
  char what[160], err[QT_ERR_LEN];
  snprintf(what, sizeof what, "%dx%d -> %d, %dx%d s%d p%d, zp %d/%d, relu %d relu6 %d clip %d, f32 %d, ties %d, N %d",
           c->H, c->W, c->OC, c->KH, c->KW, c->stride, c->pad, c->zp_src, c->zp_dst, c->relu, c->relu6, c->clip,
           c->dst_f32, c->ties, c->N);
  qt_int8_op *own = qt_int8_op_create(&p, w, bias, oscale, err);
  p.dnnl_only = 1;
  qt_int8_op *dnnl = qt_int8_op_create(&p, w, bias, oscale, err);
  QT_ASSERT(own && dnnl, "%s: %s", what, err);
  if (strcmp(qt_int8_op_impl(own), own_impl(dnnl)) != 0)
    qt_test_fail("%s: implementation %s, want %s", what, qt_int8_op_impl(own), own_impl(dnnl));
  if (strncmp(qt_int8_op_impl(dnnl), "own:", 4) == 0) qt_test_fail("%s: dnnl_only ran our kernel", what);
  uint8_t *got = malloc(out_bytes), *want_dnnl = malloc(out_bytes), *want_ref = malloc(out_bytes);
  memset(got, 0xA5, out_bytes); /* every byte must be written */
  qt_int8_op_run(own, got, x, c->N);
  qt_int8_op_run(dnnl, want_dnnl, x, c->N);
  reference(&p, w, bias, oscale, x, c->N, want_ref);
  const size_t elem = c->dst_f32 ? sizeof(float) : 1;
  int64_t diff_dnnl = 0, diff_ref = 0, first = -1;
  for (size_t i = 0; i < out_n; i++) {
    const int dd = memcmp(got + i * elem, want_dnnl + i * elem, elem) != 0,
              dr = memcmp(got + i * elem, want_ref + i * elem, elem) != 0;
    diff_dnnl += dd;
    diff_ref += dr;
    if ((dd || dr) && first < 0) first = (int64_t)i;
  }
  if (diff_dnnl || diff_ref) {
    const size_t f = (size_t)first;
    const double gv = c->dst_f32 ? ((float *)(void *)got)[f] : got[f],
                 dv = c->dst_f32 ? ((float *)(void *)want_dnnl)[f] : want_dnnl[f],
                 rv = c->dst_f32 ? ((float *)(void *)want_ref)[f] : want_ref[f];
    qt_test_fail(
        "%s: %lld of %zu outputs differ from oneDNN's, %lld from the reference (first at %lld: %.9g, "
        "oneDNN %.9g, reference %.9g)",
        what, (long long)diff_dnnl, out_n, (long long)diff_ref, (long long)first, gv, dv, rv);
  }
  qt_int8_op_free(own);
  qt_int8_op_free(dnnl);
  QT_FREE_ALL(w, bias, oscale, x, got, want_dnnl, want_ref);
}

/* A shape our kernel does not take goes to oneDNN: 80 output channels; an f32 output with a zero
 * point. */
static void not_taken(void) {
  qt_int8_params p;
  memset(&p, 0, sizeof p);
  p.kind = QT_INT8_CONV;
  p.H = p.W = p.OH = p.OW = 8, p.C = 1, p.OC = 80, p.KH = p.KW = 3, p.stride_h = p.stride_w = 1, p.pad_h = p.pad_w = 1;
  int8_t w[80 * 9] = {0};
  float b[80] = {0}, s[80];
  for (int i = 0; i < 80; i++) s[i] = 1.0f;
  char err[QT_ERR_LEN];
  qt_int8_op *op = qt_int8_op_create(&p, w, b, s, err);
  QT_ASSERT(op, "%s", err);
  if (strncmp(qt_int8_op_impl(op), "own:", 4) == 0) qt_test_fail("80 output channels: our kernel took it");
  qt_int8_op_free(op);
  p.OC = 16, p.dst_f32 = 1, p.zp_dst = 2;
  op = qt_int8_op_create(&p, w, b, s, err);
  QT_ASSERT(op, "%s", err);
  if (strncmp(qt_int8_op_impl(op), "own:", 4) == 0) qt_test_fail("f32 output with a zero point: our kernel took it");
  qt_int8_op_free(op);
}

int main(void) {
  static const conv1_case cases[] = {
      /* H  W  OC KH KW s  p  zs  zd relu r6 clip f32 ties N */
      {28, 28, 16, 3, 3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 5},   /* ResCNN's stem, relu fused */
      {28, 28, 32, 3, 3, 1, 1, 87, 0, 1, 0, 0, 0, 0, 4},  /* FashionCNN's conv1, input zero point */
      {28, 28, 16, 3, 3, 1, 1, 87, 0, 1, 0, 0, 0, 1, 3},  /* ties */
      {28, 28, 32, 3, 3, 1, 1, 128, 6, 0, 0, 0, 0, 1, 2}, /* output zero point (even), ties */
      {28, 28, 32, 3, 3, 1, 1, 7, 4, 0, 0, 1, 0, 0, 3},   /* 4-bit clip */
      {28, 28, 16, 3, 3, 1, 1, 0, 0, 0, 1, 0, 0, 0, 2},   /* relu6 bound */
      {28, 28, 16, 3, 3, 1, 1, 0, 2, 0, 1, 1, 0, 1, 2},   /* relu6 and clip */
      {28, 28, 16, 3, 3, 1, 1, 33, 0, 0, 0, 0, 1, 0, 2},  /* f32 dst (odd zero point, or an act) */
      {17, 13, 24, 5, 5, 2, 2, 40, 0, 1, 0, 0, 0, 0, 3},  /* stride 2, 5x5, a partial block */
      {15, 11, 8, 1, 1, 1, 0, 255, 0, 0, 0, 0, 0, 1, 2},  /* 1x1, 8 channels */
      {12, 20, 64, 1, 7, 2, 0, 12, 0, 1, 0, 0, 0, 0, 2},  /* 1x7, 64 channels (four blocks) */
      {9, 9, 48, 3, 3, 2, 0, 3, 0, 0, 0, 0, 1, 0, 1},     /* no padding, stride 2, batch 1, f32 */
      {28, 28, 16, 3, 3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1},   /* batch 1 */
      {5, 1, 16, 1, 1, 9, 4, 9, 0, 0, 0, 0, 0, 0, 2},     /* padding wider than a strided row */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], 1000 + i);
  not_taken();
  return qt_test_finish();
}
