/* Convolutions whose output has at most CONV_GEMM_MAX_PIXELS pixels, as matrix products on NHWC
 * (conv2d_int.h). oneDNN 2.6's direct kernels do badly there: they block over output pixels, and
 * a 3x3 convolution on a 1x1 map still runs its nine taps, eight of them on padding. On ResNet-18
 * and MobileNetV2 at 28x28 inputs (3x3 and 1x1 convolutions at 2x2 and 1x1 in their last stages):
 * oneDNN's weight gradient of the 512 -> 512 3x3 convolution on 1x1 maps took 6.2 ms per call at
 * batch 128 (a 128 x 512 x 512 product: 0.4 ms as a matrix product), and the weight gradients of
 * MobileNetV2's depthwise convolutions on 2x2 and 1x1 maps, where oneDNN's depthwise kernel does
 * not apply and its grouped one pads each one-channel group to 16 x 16, a third of a training
 * step (ONEDNN_VERBOSE=1 bench_profile runs/zoo/M/fp32.ini, 2 threads).
 *
 * Dense (groups == 1): the taps that reach the input from some output pixel (the live range of
 * kh and of kw) are the columns of an im2col matrix X (M = N * OH * OW rows, K = taps * C
 * columns in (tap, channel) order, zero where a tap reads padding); the weights gathered to
 * Wg (OC, K). Forward Y = X Wg^T (+ bias), input gradient dX = dY Wg scattered back over the
 * taps, weight gradient dWg = dY^T X scattered into (OC, C, KH, KW). Where the one live tap maps
 * output pixel to input pixel one to one (a 1x1 convolution with stride 1, a 3x3 one on a 1x1
 * map), X is the input itself and dX the input gradient. Products by oneDNN's dnnl_sgemm.
 *
 * Depthwise (groups == C == OC): the weight gradient only, summed per channel over the pixels;
 * its forward and input gradient stay with oneDNN's depthwise kernels, which apply there.
 *
 * Each output element is summed in a fixed order for a given thread count: the runs are
 * bit-identical run to run, as the oneDNN path's. */
#include "autograd/conv2d_int.h"
#include "autograd/dnnl_util.h"

#include <omp.h>
#include <string.h>

/* The scratch this file's products use (qt_dnnl_mapped): the im2col matrix or the input
 * gradient's columns, and the gathered weights or their gradient. */
static void *g_col, *g_wg;
static size_t g_col_len, g_wg_len;

static float *scratch(void **buf, size_t *len, size_t floats) {
  return qt_dnnl_mapped(buf, len, floats * sizeof(float));
}

void qt_conv2d_gemm_release_scratch(void) {
  qt_dnnl_unmap(&g_col, &g_col_len);
  qt_dnnl_unmap(&g_wg, &g_wg_len);
}

int qt_conv2d_gemm_applies(const qt_conv2d_shape *s) {
  return s->groups == 1 && (int64_t)s->OH * s->OW <= CONV_GEMM_MAX_PIXELS && !s->src_blocked && !s->dst_blocked;
}

#define DW_MAX_TAPS 49

int qt_conv2d_dw_weights_applies(const qt_conv2d_shape *s) {
  return s->groups == s->C && s->OC == s->C && (int64_t)s->OH * s->OW <= CONV_GEMM_MAX_PIXELS &&
         s->KH * s->KW <= DW_MAX_TAPS && !s->src_blocked && !s->dst_blocked;
}

/* The live taps along one axis: kernel offsets lo .. lo + n - 1 hold every k that reads the input
 * (0 <= o * stride - pad + k < in) from some output position o (a dead k between two live ones,
 * possible with a stride larger than the input, is kept: its columns are zero). */
typedef enum {
  GEMM_IM2COL,   /* X (M, K) the im2col matrix */
  GEMM_IDENTITY, /* one live tap, output pixel = input pixel: X is the input itself */
  GEMM_DENSE     /* fewer input pixels than live taps (a 3x3 convolution on 2x2): the convolution as
                  * one linear map from an image's H * W * C inputs to its OH * OW * OC outputs,
                  * Wt (OH * OW * OC, H * W * C), the weight joining each input pixel to each output
                  * pixel (0 where no tap does) */
} gemm_mode;

typedef struct {
  int lo_h, nh, lo_w, nw;
  int64_t M, K;   /* im2col: the matrix's rows and columns */
  int64_t IN, ON; /* dense: an image's inputs (H * W * C) and outputs (OH * OW * OC) */
  gemm_mode mode;
} gemm_plan;

static void live_range(int in, int out, int k, int stride, int pad, int *lo, int *n) {
  int a = k, b = -1;
  for (int o = 0; o < out; o++) {
    const int first = pad - o * stride, last = in - 1 + pad - o * stride; /* k reading 0 .. in - 1 */
    const int f = first < 0 ? 0 : first, l = last > k - 1 ? k - 1 : last;
    if (f > l) continue;
    if (f < a) a = f;
    if (l > b) b = l;
  }
  if (b < a) a = b = 0; /* every tap on padding (pad >= kernel): one zero column */
  *lo = a;
  *n = b - a + 1;
}

static gemm_plan plan_of(const qt_conv2d_shape *s) {
  gemm_plan p;
  live_range(s->H, s->OH, s->KH, s->stride_h, s->pad_h, &p.lo_h, &p.nh);
  live_range(s->W, s->OW, s->KW, s->stride_w, s->pad_w, &p.lo_w, &p.nw);
  p.M = (int64_t)s->N * s->OH * s->OW;
  p.K = (int64_t)p.nh * p.nw * s->C;
  p.IN = (int64_t)s->H * s->W * s->C;
  p.ON = (int64_t)s->OH * s->OW * s->OC;
  p.mode = GEMM_IM2COL;
  if (p.nh == 1 && p.nw == 1 && s->OH == s->H && s->OW == s->W && p.lo_h == s->pad_h && p.lo_w == s->pad_w &&
      (s->stride_h == 1 || s->OH == 1) && (s->stride_w == 1 || s->OW == 1))
    p.mode = GEMM_IDENTITY;
  else if ((int64_t)s->H * s->W < (int64_t)p.nh * p.nw)
    p.mode = GEMM_DENSE;
  return p;
}

/* The input pixel tap (th, tw) of output row m reads, or -1 on padding. */
static int64_t tap_source(const qt_conv2d_shape *s, const gemm_plan *p, int64_t m, int th, int tw) {
  const int64_t hw = (int64_t)s->OH * s->OW;
  const int64_t n = m / hw;
  const int oh = (int)(m % hw / s->OW), ow = (int)(m % s->OW);
  const int ih = oh * s->stride_h - s->pad_h + p->lo_h + th, iw = ow * s->stride_w - s->pad_w + p->lo_w + tw;
  if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) return -1;
  return (n * s->H + ih) * s->W + iw;
}

static const float *im2col(const float *inp, const qt_conv2d_shape *s, const gemm_plan *p) {
  if (p->mode == GEMM_IDENTITY) return inp;
  float *col = scratch(&g_col, &g_col_len, (size_t)(p->M * p->K));
  const int C = s->C;
#pragma omp parallel for schedule(static) if (p->M * p->K > (1 << 15))
  for (int64_t m = 0; m < p->M; m++)
    for (int th = 0; th < p->nh; th++)
      for (int tw = 0; tw < p->nw; tw++) {
        float *dst = col + m * p->K + (int64_t)(th * p->nw + tw) * C;
        const int64_t src = tap_source(s, p, m, th, tw);
        if (src < 0)
          memset(dst, 0, (size_t)C * sizeof *dst);
        else
          memcpy(dst, inp + src * C, (size_t)C * sizeof *dst);
      }
  return col;
}

/* Wg (OC, K): Wg[oc, (th * nw + tw) * C + c] = weight[oc, c, lo_h + th, lo_w + tw]. */
static const float *gather_weights(const float *weight, const qt_conv2d_shape *s, const gemm_plan *p) {
  float *wg = scratch(&g_wg, &g_wg_len, (size_t)(s->OC * p->K));
  const int C = s->C, KH = s->KH, KW = s->KW;
#pragma omp parallel for schedule(static) if (s->OC * p->K > (1 << 16))
  for (int oc = 0; oc < s->OC; oc++)
    for (int th = 0; th < p->nh; th++)
      for (int tw = 0; tw < p->nw; tw++)
        for (int c = 0; c < C; c++)
          wg[oc * p->K + (int64_t)(th * p->nw + tw) * C + c] =
              weight[(((int64_t)oc * C + c) * KH + p->lo_h + th) * KW + p->lo_w + tw];
  return wg;
}

/* Dense: the tap joining input pixel i to output pixel o, if one does. */
static int dense_tap(const qt_conv2d_shape *s, int o, int i, int *kh, int *kw) {
  *kh = i / s->W - o / s->OW * s->stride_h + s->pad_h;
  *kw = i % s->W - o % s->OW * s->stride_w + s->pad_w;
  return *kh >= 0 && *kh < s->KH && *kw >= 0 && *kw < s->KW;
}

/* Wt[(o * OC + oc), i * C + c] = weight[oc, c, kh, kw] of the tap joining i to o, else 0. */
static const float *dense_weights(const float *weight, const qt_conv2d_shape *s) {
  const int OP = s->OH * s->OW, IP = s->H * s->W, C = s->C, OC = s->OC, KH = s->KH, KW = s->KW;
  const int64_t K = (int64_t)IP * C;
  float *wt = scratch(&g_wg, &g_wg_len, (size_t)((int64_t)OP * OC * K));
#pragma omp parallel for schedule(static) if ((int64_t)OP * OC * K > (1 << 16))
  for (int64_t r = 0; r < (int64_t)OP * OC; r++) {
    const int o = (int)(r / OC), oc = (int)(r % OC);
    for (int i = 0; i < IP; i++) {
      float *row = wt + r * K + (int64_t)i * C;
      int kh, kw;
      if (!dense_tap(s, o, i, &kh, &kw)) {
        memset(row, 0, (size_t)C * sizeof *row);
        continue;
      }
      for (int c = 0; c < C; c++) row[c] = weight[(((int64_t)oc * C + c) * KH + kh) * KW + kw];
    }
  }
  return wt;
}

void qt_conv2d_gemm_forward(float *out, const float *inp, const float *weight, const float *bias,
                            const qt_conv2d_shape *s) {
  const gemm_plan p = plan_of(s);
  const float beta = bias ? 1.0f : 0.0f;
  if (bias)
    for (int64_t m = 0; m < p.M; m++) memcpy(out + m * s->OC, bias, (size_t)s->OC * sizeof *out);
  if (p.mode == GEMM_DENSE) {
    QT_DNNL_CHECK(
        dnnl_sgemm('N', 'T', s->N, p.ON, p.IN, 1.0f, inp, p.IN, dense_weights(weight, s), p.IN, beta, out, p.ON));
    return;
  }
  const float *wg = gather_weights(weight, s, &p);
  const float *x = im2col(inp, s, &p);
  QT_DNNL_CHECK(dnnl_sgemm('N', 'T', p.M, s->OC, p.K, 1.0f, x, p.K, wg, p.K, beta, out, s->OC));
}

void qt_conv2d_gemm_backward_data(float *dinp, int dinp_write, const float *dout, const float *weight,
                                  const qt_conv2d_shape *s) {
  const gemm_plan p = plan_of(s);
  const float beta = dinp_write ? 0.0f : 1.0f;
  if (p.mode == GEMM_DENSE) {
    QT_DNNL_CHECK(
        dnnl_sgemm('N', 'N', s->N, p.IN, p.ON, 1.0f, dout, p.ON, dense_weights(weight, s), p.IN, beta, dinp, p.IN));
    return;
  }
  const float *wg = gather_weights(weight, s, &p);
  if (p.mode == GEMM_IDENTITY) {
    QT_DNNL_CHECK(dnnl_sgemm('N', 'N', p.M, p.K, s->OC, 1.0f, dout, s->OC, wg, p.K, beta, dinp, p.K));
    return;
  }
  float *col = scratch(&g_col, &g_col_len, (size_t)(p.M * p.K));
  QT_DNNL_CHECK(dnnl_sgemm('N', 'N', p.M, p.K, s->OC, 1.0f, dout, s->OC, wg, p.K, 0.0f, col, p.K));
  /* col2im: per image (its pixels are its own), in row and tap order */
  const int C = s->C;
  const int64_t per_image = (int64_t)s->OH * s->OW, image_in = (int64_t)s->H * s->W * C;
#pragma omp parallel for schedule(static) if (p.M * p.K > (1 << 15))
  for (int n = 0; n < s->N; n++) {
    float *img = dinp + n * image_in;
    if (dinp_write) memset(img, 0, (size_t)image_in * sizeof *img);
    for (int64_t m = n * per_image; m < (n + 1) * per_image; m++)
      for (int th = 0; th < p.nh; th++)
        for (int tw = 0; tw < p.nw; tw++) {
          const int64_t src = tap_source(s, &p, m, th, tw);
          if (src < 0) continue;
          float *d = dinp + src * C;
          const float *g = col + m * p.K + (int64_t)(th * p.nw + tw) * C;
#pragma omp simd
          for (int c = 0; c < C; c++) d[c] += g[c];
        }
  }
}

void qt_conv2d_gemm_backward_weights(float *dweight, const float *dout, const float *inp, const qt_conv2d_shape *s) {
  const gemm_plan p = plan_of(s);
  const int C = s->C, KH = s->KH, KW = s->KW, OC = s->OC;
  if (p.mode == GEMM_DENSE) {
    const int OP = s->OH * s->OW, IP = s->H * s->W;
    const int64_t K = p.IN;
    float *dwt = scratch(&g_wg, &g_wg_len, (size_t)(p.ON * K));
    QT_DNNL_CHECK(dnnl_sgemm('T', 'N', p.ON, K, s->N, 1.0f, dout, p.ON, inp, K, 0.0f, dwt, K));
    /* per output channel, the pixel pairs in (o, i) order */
#pragma omp parallel for schedule(static) if (p.ON * K > (1 << 16))
    for (int oc = 0; oc < OC; oc++)
      for (int o = 0; o < OP; o++)
        for (int i = 0; i < IP; i++) {
          int kh, kw;
          if (!dense_tap(s, o, i, &kh, &kw)) continue;
          const float *g = dwt + ((int64_t)o * OC + oc) * K + (int64_t)i * C;
          for (int c = 0; c < C; c++) dweight[(((int64_t)oc * C + c) * KH + kh) * KW + kw] += g[c];
        }
    return;
  }
  const float *x = im2col(inp, s, &p);
  float *dwg = scratch(&g_wg, &g_wg_len, (size_t)(OC * p.K));
  QT_DNNL_CHECK(dnnl_sgemm('T', 'N', OC, p.K, p.M, 1.0f, dout, OC, x, p.K, 0.0f, dwg, p.K));
#pragma omp parallel for schedule(static) if (OC * p.K > (1 << 16))
  for (int oc = 0; oc < OC; oc++)
    for (int th = 0; th < p.nh; th++)
      for (int tw = 0; tw < p.nw; tw++)
        for (int c = 0; c < C; c++)
          dweight[(((int64_t)oc * C + c) * KH + p.lo_h + th) * KW + p.lo_w + tw] +=
              dwg[oc * p.K + (int64_t)(th * p.nw + tw) * C + c];
}

/* dweight (C, 1, KH, KW) += per channel and tap, the sum over the output pixels (image, row,
 * column order) of dout times the input pixel the tap reads. Threads split the channels in blocks
 * of 16, whose lanes the inner loop runs across; a block keeps its taps' sums while it reads each
 * output pixel's gradient once. */
void qt_conv2d_dw_backward_weights(float *dweight, const float *dout, const float *inp, const qt_conv2d_shape *s) {
  const int C = s->C, KH = s->KH, KW = s->KW, OH = s->OH, OW = s->OW;
  if (KH * KW > DW_MAX_TAPS) qt_dnnl_die(__FILE__, __LINE__, "depthwise weight gradient: kernel larger than 7x7");
  const int blocks = (C + 15) / 16;
#pragma omp parallel for schedule(static) if ((int64_t)s->N * OH * OW * KH * KW * C > (1 << 16))
  for (int b = 0; b < blocks; b++) {
    const int c0 = b * 16, nc = C - c0 < 16 ? C - c0 : 16;
    float acc[DW_MAX_TAPS][16];
    memset(acc, 0, sizeof acc);
    for (int n = 0; n < s->N; n++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          float g[16] = {0};
          memcpy(g, dout + (((int64_t)n * OH + oh) * OW + ow) * C + c0, (size_t)nc * sizeof *g);
          for (int kh = 0; kh < KH; kh++) {
            const int ih = oh * s->stride_h - s->pad_h + kh;
            if (ih < 0 || ih >= s->H) continue;
            for (int kw = 0; kw < KW; kw++) {
              const int iw = ow * s->stride_w - s->pad_w + kw;
              if (iw < 0 || iw >= s->W) continue;
              const float *x = inp + (((int64_t)n * s->H + ih) * s->W + iw) * C + c0;
              float *a = acc[kh * KW + kw];
              if (nc == 16) /* a whole block: a fixed trip count the compiler keeps in vector registers */
                for (int j = 0; j < 16; j++) a[j] += g[j] * x[j];
              else
                for (int j = 0; j < nc; j++) a[j] += g[j] * x[j];
            }
          }
        }
    for (int t = 0; t < KH * KW; t++)
      for (int j = 0; j < nc; j++) dweight[(int64_t)(c0 + j) * KH * KW + t] += acc[t][j];
  }
}
