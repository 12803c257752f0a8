/* Optimized conv2d / linear kernels against their plain-C reference twins: forward with and
 * without bias; backward with every subset of (dinp, dweight, dbias) requested, accumulating
 * into pre-filled gradient buffers; weights changed between calls on a cached shape; more
 * shapes than the primitive cache holds; the same with Winograd allowed (training steps' shapes,
 * qt_ctx_set_conv_winograd), which must run oneDNN's Winograd kernels on a CPU with AVX-512 (and
 * ONEDNN_MAX_CPU_ISA unset) and fall back to direct ones elsewhere; on Winograd, a blocked input
 * (src_blocked) gives the NHWC path's bits, and is taken nowhere else. Tolerance: atol 2e-4, rtol
 * 1e-4 (fp32 vs a double-accumulating reference, values in [-1, 1], sums of at most a few
 * thousand products), Winograd's shapes included: its transforms round more but stay inside it
 * (largest differences seen, conv2 at batch 4: forward 2.6e-5, input gradient 2.3e-5, weight
 * gradient 5.0e-5 on values up to ~40). */
#include "autograd/dnnl_util.h"
#include "autograd/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "tests/kernels_dnnl/conv_linear_util.h"

#define ATOL 2e-4f
#define RTOL 1e-4f

/* ---- conv2d ------------------------------------------------------------------------------ */

static void conv_label(char *buf, size_t len, const qt_conv2d_shape *s, const char *what) {
  snprintf(buf, len, "conv N%d %dx%d C%d OC%d k%dx%d s%d,%d p%d,%d g%d: %s", s->N, s->H, s->W, s->C, s->OC, s->KH,
           s->KW, s->stride_h, s->stride_w, s->pad_h, s->pad_w, s->groups, what);
}

static void check_conv(qt_conv2d_shape s, uint64_t seed) {
  if (qt_conv2d_shape_init(&s) != 0) {
    qt_test_fail("conv shape N%d %dx%d C%d OC%d rejected", s.N, s.H, s.W, s.C, s.OC);
    return;
  }
  const int64_t ni = (int64_t)s.N * s.H * s.W * s.C, no = (int64_t)s.N * s.OH * s.OW * s.OC;
  const int64_t nw = (int64_t)s.OC * (s.C / s.groups) * s.KH * s.KW;
  float *inp = qt_test_uniform(ni, seed + 1), *weight = qt_test_uniform(nw, seed + 2), *bias = qt_test_uniform(s.OC, seed + 3);
  float *dout = qt_test_uniform(no, seed + 4);
  float *out = qt_test_uniform(no, 99), *out_ref = qt_test_uniform(no, 98);
  char what[256];

  for (int has_bias = 0; has_bias < 2; has_bias++) {
    qt_conv2d_forward(out, inp, weight, has_bias ? bias : NULL, &s);
    qt_conv2d_forward_ref(out_ref, inp, weight, has_bias ? bias : NULL, &s);
    conv_label(what, sizeof what, &s, has_bias ? "forward with bias" : "forward");
    qt_test_close(what, out, out_ref, no, ATOL, RTOL);
  }

  /* weights change between calls on a cached shape: the reorder must see the new values */
  for (int64_t i = 0; i < nw; i++) weight[i] *= -0.5f;
  qt_conv2d_forward(out, inp, weight, bias, &s);
  qt_conv2d_forward_ref(out_ref, inp, weight, bias, &s);
  conv_label(what, sizeof what, &s, "forward after weight update");
  qt_test_close(what, out, out_ref, no, ATOL, RTOL);

  /* every subset of requested gradients, accumulating into pre-filled buffers */
  for (int mask = 0; mask < 8; mask++) {
    float *di = qt_test_uniform(ni, seed + 10), *dw = qt_test_uniform(nw, seed + 11), *db = qt_test_uniform(s.OC, seed + 12);
    float *di_ref = qt_test_copy_f32(di, ni), *dw_ref = qt_test_copy_f32(dw, nw), *db_ref = qt_test_copy_f32(db, s.OC);
    float *di0 = qt_test_copy_f32(di, ni), *dw0 = qt_test_copy_f32(dw, nw), *db0 = qt_test_copy_f32(db, s.OC);
    const int want_i = mask & 1, want_w = mask & 2, want_b = mask & 4;
    qt_conv2d_backward(want_i ? di : NULL, want_w ? dw : NULL, want_b ? db : NULL, dout, inp, weight, &s);
    qt_conv2d_backward_ref(want_i ? di_ref : NULL, want_w ? dw_ref : NULL, want_b ? db_ref : NULL, dout, inp,
                           weight, &s);
    char tag[64];
    snprintf(tag, sizeof tag, "backward mask %d dinp", mask);
    conv_label(what, sizeof what, &s, tag);
    qt_test_close(what, di, want_i ? di_ref : di0, ni, ATOL, RTOL);
    snprintf(tag, sizeof tag, "backward mask %d dweight", mask);
    conv_label(what, sizeof what, &s, tag);
    qt_test_close(what, dw, want_w ? dw_ref : dw0, nw, ATOL, RTOL);
    snprintf(tag, sizeof tag, "backward mask %d dbias", mask);
    conv_label(what, sizeof what, &s, tag);
    qt_test_close(what, db, want_b ? db_ref : db0, s.OC, ATOL, RTOL);
    free(di), free(dw), free(db), free(di_ref), free(dw_ref), free(db_ref), free(di0), free(dw0), free(db0);
  }

  /* dinp written, not added to (a fresh gradient buffer): NaN contents must not leak through */
  {
    float *di = malloc((size_t)ni * sizeof *di), *di_ref = calloc((size_t)ni, sizeof *di_ref);
    float *dw = calloc((size_t)nw, sizeof *dw), *dw_ref = calloc((size_t)nw, sizeof *dw_ref);
    for (int64_t i = 0; i < ni; i++) di[i] = NAN;
    qt_conv2d_backward_ex(di, 1, dw, NULL, dout, inp, weight, &s);
    qt_conv2d_backward_ref(di_ref, dw_ref, NULL, dout, inp, weight, &s);
    conv_label(what, sizeof what, &s, "backward, dinp written");
    qt_test_close(what, di, di_ref, ni, ATOL, RTOL);
    conv_label(what, sizeof what, &s, "backward, dinp written: dweight");
    qt_test_close(what, dw, dw_ref, nw, ATOL, RTOL);
    free(di), free(di_ref), free(dw), free(dw_ref);
  }
  free(inp), free(weight), free(bias), free(dout), free(out), free(out_ref);
}

static void check_conv_shape_init(void) {
  qt_conv2d_shape s = conv_shape(2, 8, 7, 4, 6, 3, 3, 2, 1, 1, 0, 2);
  QT_CHECK(qt_conv2d_shape_init(&s) == 0 && s.OH == 4 && s.OW == 5);
  s = conv_shape(1, 2, 2, 1, 1, 3, 3, 1, 1, 0, 0, 1); /* kernel larger than the input */
  QT_CHECK(qt_conv2d_shape_init(&s) == -1);
  s = conv_shape(1, 5, 5, 6, 4, 3, 3, 1, 1, 1, 1, 4); /* C not divisible by groups */
  QT_CHECK(qt_conv2d_shape_init(&s) == -1);
  s = conv_shape(1, 5, 5, 4, 6, 3, 3, 1, 1, 1, 1, 4); /* OC not divisible by groups */
  QT_CHECK(qt_conv2d_shape_init(&s) == -1);
  s = conv_shape(1, 5, 5, 4, 4, 3, 3, 0, 1, 1, 1, 1); /* zero stride */
  QT_CHECK(qt_conv2d_shape_init(&s) == -1);
  s = conv_shape(1, 5, 5, 4, 4, 3, 3, 1, 1, -1, 1, 1); /* negative padding */
  QT_CHECK(qt_conv2d_shape_init(&s) == -1);
  s = conv_shape(0, 5, 5, 4, 4, 3, 3, 1, 1, 1, 1, 1); /* empty batch */
  QT_CHECK(qt_conv2d_shape_init(&s) == -1);
  s = conv_shape(1, 5, 4, 4, 4, 1, 1, 3, 2, 2, 1, 1); /* padding beyond the kernel, as torch allows */
  QT_CHECK(qt_conv2d_shape_init(&s) == 0 && s.OH == 3 && s.OW == 3);
  s = conv_shape(1, 3, 3, 4, 4, 3, 3, 1, 1, 0, 0, 1); /* one output pixel */
  QT_CHECK(qt_conv2d_shape_init(&s) == 0 && s.OH == 1 && s.OW == 1);
}

/* More distinct shapes than the primitive cache holds (64), then the first ones again:
 * eviction must leave every later call correct. */
static void check_conv_cache_eviction(void) {
  for (int round = 0; round < 2; round++)
    for (int n = 1; n <= 70; n += round ? 23 : 1) {
      qt_conv2d_shape s = conv_shape(n, 4, 3, 2, 3, 3, 3, 1, 1, 1, 1, 1);
      QT_CHECK(qt_conv2d_shape_init(&s) == 0);
      const int64_t ni = (int64_t)n * 4 * 3 * 2, no = (int64_t)n * s.OH * s.OW * 3, nw = 3 * 2 * 9;
      float *inp = qt_test_uniform(ni, 500 + n), *weight = qt_test_uniform(nw, 600 + n), *dout = qt_test_uniform(no, 700 + n);
      float *out = qt_test_uniform(no, 1), *out_ref = qt_test_uniform(no, 2);
      float *dw = qt_test_uniform(nw, 3), *dw_ref = qt_test_copy_f32(dw, nw), *di = qt_test_uniform(ni, 4), *di_ref = qt_test_copy_f32(di, ni);
      qt_conv2d_forward(out, inp, weight, NULL, &s);
      qt_conv2d_forward_ref(out_ref, inp, weight, NULL, &s);
      qt_conv2d_backward(di, dw, NULL, dout, inp, weight, &s);
      qt_conv2d_backward_ref(di_ref, dw_ref, NULL, dout, inp, weight, &s);
      char what[64];
      snprintf(what, sizeof what, "cache eviction round %d N%d", round, n);
      qt_test_close(what, out, out_ref, no, ATOL, RTOL);
      qt_test_close(what, dw, dw_ref, nw, ATOL, RTOL);
      qt_test_close(what, di, di_ref, ni, ATOL, RTOL);
      free(inp), free(weight), free(dout), free(out), free(out_ref), free(dw), free(dw_ref), free(di), free(di_ref);
    }
}

/* ---- linear ------------------------------------------------------------------------------ */

static void check_linear(int N, int IN, int OUT, uint64_t seed) {
  const int64_t ni = (int64_t)N * IN, no = (int64_t)N * OUT, nw = (int64_t)OUT * IN;
  float *inp = qt_test_uniform(ni, seed + 1), *weight = qt_test_uniform(nw, seed + 2), *bias = qt_test_uniform(OUT, seed + 3);
  float *dout = qt_test_uniform(no, seed + 4), *out = qt_test_uniform(no, 99), *out_ref = qt_test_uniform(no, 98);
  char what[128];
  for (int has_bias = 0; has_bias < 2; has_bias++) {
    qt_linear_forward(out, inp, weight, has_bias ? bias : NULL, N, IN, OUT);
    qt_linear_forward_ref(out_ref, inp, weight, has_bias ? bias : NULL, N, IN, OUT);
    snprintf(what, sizeof what, "linear N%d IN%d OUT%d forward%s", N, IN, OUT, has_bias ? " with bias" : "");
    qt_test_close(what, out, out_ref, no, ATOL, RTOL);
  }
  for (int mask = 0; mask < 8; mask++) {
    float *di = qt_test_uniform(ni, seed + 10), *dw = qt_test_uniform(nw, seed + 11), *db = qt_test_uniform(OUT, seed + 12);
    float *di_ref = qt_test_copy_f32(di, ni), *dw_ref = qt_test_copy_f32(dw, nw), *db_ref = qt_test_copy_f32(db, OUT);
    float *di0 = qt_test_copy_f32(di, ni), *dw0 = qt_test_copy_f32(dw, nw), *db0 = qt_test_copy_f32(db, OUT);
    const int want_i = mask & 1, want_w = mask & 2, want_b = mask & 4;
    qt_linear_backward(want_i ? di : NULL, want_w ? dw : NULL, want_b ? db : NULL, dout, inp, weight, N, IN, OUT);
    qt_linear_backward_ref(want_i ? di_ref : NULL, want_w ? dw_ref : NULL, want_b ? db_ref : NULL, dout, inp, weight,
                           N, IN, OUT);
    snprintf(what, sizeof what, "linear N%d IN%d OUT%d backward mask %d dinp", N, IN, OUT, mask);
    qt_test_close(what, di, want_i ? di_ref : di0, ni, ATOL, RTOL);
    snprintf(what, sizeof what, "linear N%d IN%d OUT%d backward mask %d dweight", N, IN, OUT, mask);
    qt_test_close(what, dw, want_w ? dw_ref : dw0, nw, ATOL, RTOL);
    snprintf(what, sizeof what, "linear N%d IN%d OUT%d backward mask %d dbias", N, IN, OUT, mask);
    qt_test_close(what, db, want_b ? db_ref : db0, OUT, ATOL, RTOL);
    free(di), free(dw), free(db), free(di_ref), free(dw_ref), free(db_ref), free(di0), free(dw0), free(db0);
  }
  free(inp), free(weight), free(bias), free(dout), free(out), free(out_ref);
}

/* The one-input-channel input gradient (a kernel of this project's, not oneDNN's) gives the same
 * bits under 1 and 2 threads: each input pixel is summed by one thread in a fixed order. */
static void check_conv_c1_threads(void) {
  qt_conv2d_shape s = conv_shape(4, 28, 28, 1, 32, 3, 3, 1, 1, 1, 1, 1);
  QT_CHECK(qt_conv2d_shape_init(&s) == 0);
  const int64_t ni = (int64_t)s.N * s.H * s.W, no = (int64_t)s.N * s.OH * s.OW * s.OC, nw = (int64_t)s.OC * 9;
  float *inp = qt_test_uniform(ni, 71), *weight = qt_test_uniform(nw, 72), *dout = qt_test_uniform(no, 73);
  float *di1 = calloc((size_t)ni, sizeof *di1), *di2 = calloc((size_t)ni, sizeof *di2);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  qt_conv2d_backward(di1, NULL, NULL, dout, inp, weight, &s);
  omp_set_num_threads(2);
  qt_conv2d_backward(di2, NULL, NULL, dout, inp, weight, &s);
  omp_set_num_threads(saved);
  QT_CHECK(memcmp(di1, di2, (size_t)ni * sizeof *di1) == 0);
  free(inp), free(weight), free(dout), free(di1), free(di2);
}

static qt_conv2d_shape winograd(qt_conv2d_shape s) {
  s.winograd = 1;
  return s;
}

/* (N, H, W, C) NHWC to oneDNN's nChw16c (kernels.h; C % 16 == 0), and back */
static float *to_blocked(const float *x, const qt_conv2d_shape *s) {
  const int64_t hw = (int64_t)s->H * s->W, n = (int64_t)s->N * hw * s->C;
  float *b = malloc((size_t)n * sizeof *b);
  for (int64_t i = 0; i < (int64_t)s->N * hw; i++)
    for (int c = 0; c < s->C; c++) b[((i / hw * (s->C / 16) + c / 16) * hw + i % hw) * 16 + c % 16] = x[i * s->C + c];
  return b;
}
static float *from_blocked(const float *b, const qt_conv2d_shape *s) {
  const int64_t hw = (int64_t)s->H * s->W, n = (int64_t)s->N * hw * s->C;
  float *x = malloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < (int64_t)s->N * hw; i++)
    for (int c = 0; c < s->C; c++) x[i * s->C + c] = b[((i / hw * (s->C / 16) + c / 16) * hw + i % hw) * 16 + c % 16];
  return x;
}

/* A blocked input (src_blocked, where qt_conv2d_src_blocked16 allows it) gives the NHWC path's
 * bits: the same primitive on the same values, without the reorders: the output, the input
 * gradient written and added to, the weight and bias gradients. Returns whether the shape takes it. */
static int check_conv_blocked(qt_conv2d_shape s, uint64_t seed) {
  if (qt_conv2d_shape_init(&s) != 0 || !qt_conv2d_src_blocked16(&s)) return 0;
  const int64_t ni = (int64_t)s.N * s.H * s.W * s.C, no = (int64_t)s.N * s.OH * s.OW * s.OC;
  const int64_t nw = (int64_t)s.OC * s.C * s.KH * s.KW;
  float *inp = qt_test_uniform(ni, seed + 1), *weight = qt_test_uniform(nw, seed + 2), *bias = qt_test_uniform(s.OC, seed + 3);
  float *dout = qt_test_uniform(no, seed + 4), *inpb = to_blocked(inp, &s);
  float *out = malloc((size_t)no * sizeof *out), *outb = malloc((size_t)no * sizeof *outb);
  char what[256];
  qt_conv2d_shape sb = s;
  sb.src_blocked = 1;
  qt_conv2d_forward(out, inp, weight, bias, &s);
  qt_conv2d_forward(outb, inpb, weight, bias, &sb);
  conv_label(what, sizeof what, &s, "blocked input: forward");
  if (memcmp(out, outb, (size_t)no * sizeof *out) != 0) qt_test_fail("%s: bits differ", what);
  for (int write = 0; write <= 1; write++) {
    float *di = qt_test_uniform(ni, seed + 5), *dib = to_blocked(di, &s);
    float *dw = qt_test_uniform(nw, seed + 6), *dwb = qt_test_copy_f32(dw, nw);
    float *db = qt_test_uniform(s.OC, seed + 7), *dbb = qt_test_copy_f32(db, s.OC);
    if (write)
      for (int64_t i = 0; i < ni; i++) di[i] = dib[i] = NAN; /* written, never read */
    qt_conv2d_backward_ex(di, write, dw, db, dout, inp, weight, &s);
    qt_conv2d_backward_ex(dib, write, dwb, dbb, dout, inpb, weight, &sb);
    float *diu = from_blocked(dib, &s);
    conv_label(what, sizeof what, &s, write ? "blocked input: dinp written" : "blocked input: dinp added to");
    if (memcmp(di, diu, (size_t)ni * sizeof *di) != 0) qt_test_fail("%s: bits differ", what);
    conv_label(what, sizeof what, &s, "blocked input: dweight, dbias");
    if (memcmp(dw, dwb, (size_t)nw * sizeof *dw) != 0 || memcmp(db, dbb, (size_t)s.OC * sizeof *db) != 0)
      qt_test_fail("%s: bits differ", what);
    free(di), free(dib), free(dw), free(dwb), free(db), free(dbb), free(diu);
  }
  free(inp), free(weight), free(bias), free(dout), free(inpb), free(out), free(outb);
  return 1;
}

/* Winograd where oneDNN has it: 3x3, stride 1, on AVX-512 (oneDNN 2.6's jit_wino_4x3). */
static void check_conv_winograd(void) {
  /*                             N   H   W   C  OC KH KW sh sw ph pw  g */
  check_conv(winograd(conv_shape(4, 14, 14, 32, 64, 3, 3, 1, 1, 1, 1, 1)), 2000); /* FashionCNN conv2 */
  check_conv(winograd(conv_shape(3, 7, 5, 32, 32, 3, 3, 1, 1, 1, 1, 1)), 2100);   /* H, W not tiles of 4 */
  check_conv(winograd(conv_shape(2, 9, 6, 16, 48, 3, 3, 1, 1, 0, 0, 1)), 2200);   /* no padding */
  check_conv(winograd(conv_shape(2, 6, 6, 16, 24, 3, 3, 1, 1, 1, 1, 1)), 2300);  /* channels not blocks of 16 */
  check_conv(winograd(conv_shape(2, 6, 6, 8, 32, 3, 3, 1, 1, 1, 1, 1)), 2350);   /* under 16 channels: direct */
  check_conv(winograd(conv_shape(2, 9, 8, 16, 16, 3, 3, 2, 2, 1, 1, 1)), 2400);  /* stride 2: direct */
  check_conv(winograd(conv_shape(2, 7, 7, 16, 16, 3, 3, 1, 1, 1, 1, 16)), 2500); /* depthwise: direct */
  check_conv(winograd(conv_shape(2, 8, 8, 1, 32, 3, 3, 1, 1, 1, 1, 1)), 2600);   /* one input channel: direct */
  check_conv(winograd(conv_shape(2, 3, 5, 32, 32, 3, 3, 1, 1, 1, 1, 1)), 2650);  /* under 4 rows: direct */
  check_conv(winograd(conv_shape(2, 1, 1, 64, 64, 3, 3, 1, 1, 1, 1, 1)), 2660);  /* 1x1: a matrix product */
  const char *used = qt_dnnl_kernels_used();
  const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const int forced = getenv("ONEDNN_MAX_CPU_ISA") != NULL;
  printf("winograd shapes ran: %s\n", used);
  if (avx512 && !forced) {
    QT_CHECK(strstr(used, "convolution forward_training: jit_wino") != NULL);
    QT_CHECK(strstr(used, "convolution backward_data: jit_wino") != NULL);
    QT_CHECK(strstr(used, "convolution backward_weights: jit_wino") != NULL);
  }
  /* blocked inputs: where Winograd runs (nChw16c), and nowhere else */
  const int conv2 = check_conv_blocked(winograd(conv_shape(4, 14, 14, 32, 64, 3, 3, 1, 1, 1, 1, 1)), 2700);
  check_conv_blocked(winograd(conv_shape(3, 7, 5, 32, 32, 3, 3, 1, 1, 1, 1, 1)), 2800);
  check_conv_blocked(winograd(conv_shape(2, 6, 6, 16, 24, 3, 3, 1, 1, 1, 1, 1)), 2900);
  QT_CHECK(conv2 == (avx512 && !forced));
  QT_CHECK(!check_conv_blocked(conv_shape(4, 14, 14, 32, 64, 3, 3, 1, 1, 1, 1, 1), 3000)); /* direct */
  QT_CHECK(!check_conv_blocked(winograd(conv_shape(2, 9, 8, 16, 16, 3, 3, 2, 2, 1, 1, 1)), 3100)); /* stride 2 */
}

int main(void) {
  check_conv_shape_init();
  check_conv_c1_threads();
  /*                    N   H   W   C  OC KH KW sh sw ph pw  g */
  check_conv(conv_shape(3, 7, 5, 1, 4, 3, 3, 1, 1, 1, 1, 1), 100);      /* C=1, non-square input */
  check_conv(conv_shape(1, 8, 8, 1, 32, 3, 3, 1, 1, 1, 1, 1), 200);     /* FashionCNN layer 1, batch 1 */
  /* one input channel: the input-gradient kernel (channel blocks of 32, 16 and a remainder;
   * stride 2; padding past the kernel; a 1x7 kernel) */
  check_conv(conv_shape(2, 40, 41, 1, 40, 3, 3, 1, 1, 1, 1, 1), 210);
  check_conv(conv_shape(2, 9, 11, 1, 17, 5, 3, 2, 2, 3, 2, 1), 220);
  check_conv(conv_shape(1, 4, 30, 1, 16, 1, 7, 1, 3, 0, 4, 1), 230);
  check_conv(conv_shape(3, 6, 6, 32, 64, 3, 3, 1, 1, 1, 1, 1), 300);    /* FashionCNN layer 2, C=32 */
  check_conv(conv_shape(3, 8, 7, 8, 12, 3, 3, 2, 2, 1, 1, 1), 400);     /* stride 2, unused right padding */
  check_conv(conv_shape(2, 10, 7, 6, 4, 5, 3, 2, 1, 2, 0, 1), 500);     /* 5x3 kernel, pad 2 and 0 */
  check_conv(conv_shape(3, 6, 6, 8, 6, 3, 3, 1, 1, 0, 0, 2), 600);      /* groups=2, no padding */
  check_conv(conv_shape(2, 9, 8, 4, 6, 3, 3, 2, 2, 1, 1, 2), 700);      /* groups=2, stride 2 */
  check_conv(conv_shape(2, 7, 7, 16, 16, 3, 3, 1, 1, 1, 1, 16), 800);   /* depthwise */
  check_conv(conv_shape(1, 7, 6, 8, 16, 3, 3, 2, 2, 1, 1, 8), 900);     /* depthwise, multiplier 2, stride 2 */
  check_conv(conv_shape(3, 5, 4, 32, 8, 1, 1, 1, 1, 0, 0, 1), 1000);    /* 1x1 */
  check_conv(conv_shape(2, 6, 5, 16, 24, 1, 1, 2, 2, 0, 0, 1), 1100);   /* 1x1 stride 2 */
  check_conv(conv_shape(1, 1, 1, 3, 2, 1, 1, 1, 1, 0, 0, 1), 1200);     /* a single pixel */
  check_conv(conv_shape(3, 5, 5, 32, 32, 3, 3, 1, 1, 2, 2, 1), 1300);   /* pad 2 on both sides */
  check_conv(conv_shape(2, 28, 28, 1, 32, 3, 3, 1, 1, 1, 1, 1), 1400);  /* layer 1 at full size */
  check_conv(conv_shape(2, 7, 8, 4, 6, 1, 1, 3, 3, 0, 0, 1), 1500);     /* stride 3: last rows unused */
  check_conv(conv_shape(2, 5, 4, 3, 4, 1, 3, 2, 1, 2, 3, 1), 1600);     /* padding beyond the kernel */
  /* outputs of at most 4 pixels: matrix products (conv2d_gemm.c) */
  check_conv(conv_shape(4, 1, 1, 64, 48, 3, 3, 1, 1, 1, 1, 1), 1700);   /* 3x3 on 1x1: the centre tap alone */
  check_conv(conv_shape(4, 2, 2, 32, 40, 3, 3, 1, 1, 1, 1, 1), 1710);   /* 3x3 on 2x2: one linear map */
  check_conv(conv_shape(2, 1, 2, 8, 6, 3, 3, 1, 1, 1, 1, 1), 1712);     /* the same on 1x2 */
  check_conv(conv_shape(2, 2, 2, 4, 6, 5, 5, 1, 1, 2, 2, 1), 1714);     /* 5x5 on 2x2 */
  check_conv(conv_shape(3, 4, 4, 16, 24, 3, 3, 2, 2, 1, 1, 1), 1720);   /* stride 2 to 2x2 */
  check_conv(conv_shape(2, 2, 1, 8, 8, 3, 3, 2, 2, 1, 1, 1), 1730);     /* stride 2 to 1x1, taps on two rows */
  check_conv(conv_shape(3, 2, 2, 24, 12, 1, 1, 1, 1, 0, 0, 1), 1740);   /* 1x1: the input itself */
  check_conv(conv_shape(2, 4, 3, 8, 6, 1, 1, 3, 3, 0, 0, 1), 1750);     /* 1x1 stride 3: one tap, not one to one */
  check_conv(conv_shape(2, 1, 1, 4, 4, 1, 1, 2, 2, 1, 1, 1), 1760);     /* every tap on padding */
  check_conv(conv_shape(2, 3, 1, 6, 5, 5, 3, 4, 1, 2, 1, 1), 1770);     /* 5x3, some taps dead */
  /* depthwise with at most 4 output pixels: the weight gradient of conv2d_gemm.c */
  check_conv(conv_shape(4, 2, 2, 32, 32, 3, 3, 1, 1, 1, 1, 32), 1800);
  check_conv(conv_shape(3, 1, 1, 20, 20, 3, 3, 1, 1, 1, 1, 20), 1810); /* channels not blocks of 16 */
  check_conv(conv_shape(2, 2, 2, 16, 16, 3, 3, 2, 2, 1, 1, 16), 1820); /* stride 2 to 1x1 */
  check_conv(conv_shape(2, 2, 2, 8, 16, 3, 3, 1, 1, 1, 1, 8), 1830);   /* multiplier 2: oneDNN */
  check_conv_cache_eviction();
  check_conv_winograd();

  const int linears[][3] = {{1, 1, 1}, {3, 7, 5}, {4, 300, 17}, {5, 128, 10}, {32, 3136, 128}}; /* N, IN, OUT */
  for (int k = 0; k < 5; k++) check_linear(linears[k][0], linears[k][1], linears[k][2], 10 * (uint64_t)(k + 1));
  return qt_test_finish();
}
