/* A convolution of a one-channel image (stride 1, groups 1) followed by a training batch norm,
 * ReLU or ReLU6 and a max pool whose windows tile its input, as one training kernel pair
 * (FashionCNN's first layer): the convolution's output, the normalized and the relu'd tensors
 * are never in memory, and neither is any of their gradients.
 *
 * Why it can be done without them: every output pixel q of the convolution is w[oc] . u(q) + b,
 * u(q) the KH*KW image values under the kernel (zeros in the padding). Over the M = N*OH*OW
 * pixels, with S = sum u(q) and G = sum u(q) u(q)^T (K = KH*KW entries and K x K):
 *   mean = w.S / M + b,   var = w^T (G - S S^T / M) w / M            (batch statistics)
 * and, with g the gradient batch norm's output receives (nonzero only at the pool's argmax
 * inputs, where the relu passes), P[oc] = sum g u(q), dbeta = sum g:
 *   dgamma = invstd (w.P - (w.S / M) dbeta)
 *   dw     = gamma invstd (P - (dbeta / M) S - (dgamma / M) invstd (G - S S^T / M) w)
 *   dbias  = 0 (batch norm subtracts the mean)
 * which are batch norm's backward and the convolution's weight gradient summed in another
 * order. The forward reads the image twice (S and G; then the convolution recomputed per
 * window, normalized, clamped, pooled in registers), the backward once more with the pool's
 * gradient: no pass touches a tensor the size of the convolution's output.
 *
 * Numerics (not the separate ops' bits): S, G and P are summed per image in float lanes, then in
 * double, in image order (the same bits for any thread count); the statistics and gradients are
 * formed in double. The convolution is recomputed in float with one fused multiply-add per tap
 * in tap order (bias first), normalized as the batch norm kernels do ((y - mean_hi) - mean_lo) *
 * (gamma invstd) + beta, clamped and pooled with max pool's comparison in window order. The
 * pool's argmax is kept as the window position (one byte per output). */
#include "autograd/cpu_batch_norm_int.h"
#include "autograd/kernels.h"
#include "base/base.h"
#include "quant/quant_elem.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The helpers taking and returning these vectors are static and inlined, so no call crosses an
 * ABI boundary: GCC's -Wpsabi note (a 64-byte vector returned without AVX-512 enabled, as in a
 * QT_NATIVE=OFF build) does not apply, and QT_WERROR would turn it into an error. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define C1P_INLINE static inline __attribute__((always_inline))

C1P_INLINE v16f ld16(const float *p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}
C1P_INLINE void st16(float *p, v16f v) { memcpy(p, &v, sizeof v); }
C1P_INLINE v16f splat16(float x) {
  v16f v = {0}; /* every lane is set below; the initializer keeps -Wmaybe-uninitialized quiet */
  for (int j = 0; j < 16; j++) v[j] = x;
  return v;
}
C1P_INLINE v16f fma16(v16f a, v16f b, v16f c) {
  for (int j = 0; j < 16; j++) c[j] = fmaf(a[j], b[j], c[j]);
  return c;
}
typedef uint8_t v16u8 __attribute__((vector_size(16)));
/* 16 bytes widened to lanes (one vector load and widening: built a lane at a time, the vector's
 * first read stalls on its 16 stores) */
C1P_INLINE v16i ld16_u8(const uint8_t *p) {
  v16u8 v;
  memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, v16i);
}
/* -1 in lanes j < n, 0 in the others */
C1P_INLINE v16i lanes_below(int n) {
  v16i m = {0}; /* as in splat16 */
  for (int j = 0; j < 16; j++) m[j] = j < n ? -1 : 0;
  return m;
}
/* m ? a : b per lane, on the bits (m: -1 or 0 lanes) */
C1P_INLINE v16f sel16(v16i m, v16f a, v16f b) { return (v16f)((m & (v16i)a) | (~m & (v16i)b)); }

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  QT_ASSERT(p, "conv1_bn_relu_pool: out of memory (%zu x %zu bytes)", n, size);
  return p;
}

int qt_conv1_pool_shape_init(qt_conv1_pool_shape *s) {
  if (s->N < 1 || s->H < 1 || s->W < 1 || s->OC < 16 || s->OC % 16 || s->KH < 1 || s->KW < 1 ||
      s->KH * s->KW > QT_CONV1_POOL_MAX_TAPS || s->pad_h < 0 || s->pad_w < 0 || s->pad_h >= s->KH ||
      s->pad_w >= s->KW || s->pool < 1 || s->pool > QT_CONV1_POOL_MAX_WINDOW || s->relu < 1 || s->relu > 2)
    return -1;
  s->OH = s->H + 2 * s->pad_h - s->KH + 1;
  s->OW = s->W + 2 * s->pad_w - s->KW + 1;
  if (s->OH < s->pool || s->OW < s->pool || s->OH % s->pool || s->OW % s->pool) return -1;
  if ((int64_t)s->N * s->OH * s->OW < 2 || (int64_t)s->N * s->OH * s->OW > INT32_MAX) return -1;
  return 0;
}

/* stats: S (K) and G - S Sb^T / Mb (K x K, row t column q) of this process's pixels, invstd and
 * w.Sb / Mb (OC each) of the batch's, then Sb (K) and Mb: Sb and Mb the batch's pixel sums and
 * count (this process's alone, S and M, unless the batch is shared with other processes). */
size_t qt_conv1_pool_stats_len(const qt_conv1_pool_shape *s) {
  const size_t K = (size_t)s->KH * (size_t)s->KW;
  return K + K * K + 2 * (size_t)s->OC + K + 1;
}

/* The padded image: rows OH + KH - 1, PWd columns (room for 16-lane loads past OW), zeros
 * outside the image. */
static int padded_width(const qt_conv1_pool_shape *s) { return ((s->OW + 15) & ~15) + s->KW - 1; }

/* Within one image's outputs (NHWC, or blocked: kernels.h), the floats from one pooled pixel to the
 * next, and where channel block v (channels 16v to 16v + 15) of the first pixel is. */
static int out_pixel_stride(const qt_conv1_pool_shape *s) { return s->out_blocked ? 16 : s->OC; }
static size_t out_block_offset(const qt_conv1_pool_shape *s, int v) {
  return s->out_blocked ? (size_t)v * (size_t)(s->OH / s->pool) * (size_t)(s->OW / s->pool) * 16 : 16 * (size_t)v;
}

static void pad_image(float *xp, const float *img, const qt_conv1_pool_shape *s) {
  const int PWd = padded_width(s), rows = s->OH + s->KH - 1;
  memset(xp, 0, (size_t)rows * (size_t)PWd * sizeof *xp);
  for (int ih = 0; ih < s->H; ih++)
    memcpy(xp + (size_t)(ih + s->pad_h) * PWd + s->pad_w, img + (size_t)ih * s->W, (size_t)s->W * sizeof *xp);
}

/* One normalized, clamped value per lane (bn_pool_value's arithmetic). */
C1P_INLINE v16f norm_relu(v16f y, v16f mh, v16f ml, v16f a, v16f bt, const int RELU) {
  const v16f zero = splat16(0.0f), six = splat16(6.0f);
  v16f z = ((y - mh) - ml) * a + bt;
  z = sel16(zero > z, zero, z);
  if (RELU == 2) z = sel16(six < z, six, z);
  return z;
}

/* The fake quant of 16 values (qt_fake_quant_forward's arithmetic, per lane). */
C1P_INLINE v16f fake_quant16(v16f v, const qt_fq_params *fq) {
  const float sc = fq->scale, inv_s = 1.0f / sc, zpf = (float)fq->zero_point, lo = (float)fq->qmin,
              hi = (float)fq->qmax;
  v16f q;
#pragma omp simd
  for (int j = 0; j < 16; j++) q[j] = quant_fake(v[j], sc, inv_s, zpf, lo, hi);
  return q;
}

/* The per-channel constants of the normalization, for one block of 16 channels. */
typedef struct {
  v16f mh, ml, a, bt;
} norm16;

/* The backward's source of g (qt_conv1_pool_grad), with its constants: mode 0 given, 1 no fake
 * quant (the relu's pass at the output), 2 fixed qparams (the forward's mask), 3 LSQ; acc: this
 * thread's per-slot sums of the LSQ scale terms (NULL: not summed), slot = the output's offset
 * modulo C, as qt_fake_quant_lsq_pool_val_backward's rows of C give them. */
typedef struct {
  const qt_conv1_pool_grad *pg;
  int mode, relu, C;
  float s, inv_s, zpf, lo, hi, gf;
  double *acc;
} c1p_grad;

/* g at outputs o .. o + 15 (offset o in the whole output; lanes consecutive in either layout),
 * formed as autograd/ops.c's pool_grad_values forms it, lane by lane. */
C1P_INLINE v16f grad_value(const c1p_grad *q, size_t o) {
  const int MODE = q->mode;
  const qt_conv1_pool_grad *pg = q->pg;
  if (MODE == 0) return ld16(pg->g + o);
  const v16f d = ld16(pg->dout + o);
  v16f gv = {0}; /* every lane written below */
  if (MODE == 3) {
    const v16f ya = ld16(pg->yarg + o);
    float ds[16];
#pragma omp simd
    for (int j = 0; j < 16; j++) {
      float dx, dsj, dz;
      LSQ_ELEMENT(ya[j], 0.0f + d[j], q->s, q->inv_s, q->zpf, q->lo, q->hi, q->gf, dx, dsj, dz);
      (void)dz;
      gv[j] = select_bits(quant_relu_pass(ya[j], q->relu), 0.0f + dx, 0.0f);
      ds[j] = dsj;
    }
    if (q->acc) {
      double *a = q->acc + o % (size_t)q->C;
      for (int j = 0; j < 16; j++) a[j] += ds[j];
    }
  } else if (MODE == 2) {
    const uint8_t *m = pg->qmask + o;
    for (int j = 0; j < 16; j++) gv[j] = select_bits(m[j], 0.0f + d[j], 0.0f);
  } else {
    const v16f y = ld16(pg->out + o);
    for (int j = 0; j < 16; j++) gv[j] = select_bits(quant_relu_pass(y[j], q->relu), 0.0f + d[j], 0.0f);
  }
  return gv;
}

/* The kernels (autograd/cpu_conv1_pool_k.h) take KH, KW, the pool's size (and the number of
 * outputs at a time) as literals where they can: their loops unroll fully (#pragma GCC unroll)
 * and the accumulators stay in registers, 3-4x faster than loops over runtime counts (measured:
 * forward 2.5 -> 0.5 ms, backward 2.0 -> 0.6 ms, FashionCNN's first layer at batch 128). The
 * header is included twice: *_lit with the unroll pragmas, called with FashionCNN's 3x3 kernel
 * and 2x2 pool as literals, and *_gen without them, called with runtime counts for every other
 * shape (unrolling loops of unknown trip count by 32 or 64 made this file take 3.5 minutes to
 * compile, and gains nothing; the fuzz build skips the pragmas altogether). */
#define C1P_PRAGMA(x) _Pragma(#x)
#define C1P_CAT(a, b) a##b
#define C1P_XCAT(a, b) C1P_CAT(a, b)
#define C1P_FN(name) C1P_XCAT(name, C1P_SUFFIX)
#define C1P_SUFFIX _lit
#ifdef QT_FUZZ_BUILD /* CMakeLists.txt: no fuzz target runs these kernels */
#define C1P_UNROLL(n)
#else
#define C1P_UNROLL(n) C1P_PRAGMA(GCC unroll n)
#endif
#include "autograd/cpu_conv1_pool_k.h"
#undef C1P_SUFFIX
#undef C1P_UNROLL
#define C1P_SUFFIX _gen
#define C1P_UNROLL(n)
#include "autograd/cpu_conv1_pool_k.h"
#undef C1P_SUFFIX
#undef C1P_UNROLL

static void image_moments(double *out, const float *xp, const qt_conv1_pool_shape *s) {
  if (s->KH == 3 && s->KW == 3)
    patch_moments_k_lit(out, xp, NULL, s, 3, 3, 0);
  else
    patch_moments_k_gen(out, xp, NULL, s, s->KH, s->KW, 0);
}

static void image_pool(float *out, uint8_t *argmax, float *yarg, uint8_t *qmask, const float *xp, const float *wT,
                       const float *bias, const float *chi, const float *clo, const float *ca, const float *bb,
                       const qt_fq_params *fq, const qt_conv1_pool_shape *s) {
  const int lit = s->KH == 3 && s->KW == 3 && s->pool == 2, variant = (s->relu - 1) * 2 + (fq != NULL);
#define C1P_POOL(V, KH, KW, PK, R, F) \
  image_pool_k##V(out, argmax, yarg, qmask, xp, wT, bias, chi, clo, ca, bb, fq, s, KH, KW, PK, R, F)
  if (lit) switch (variant) {
      case 0: C1P_POOL(_lit, 3, 3, 2, 1, 0); break;
      case 1: C1P_POOL(_lit, 3, 3, 2, 1, 1); break;
      case 2: C1P_POOL(_lit, 3, 3, 2, 2, 0); break;
      default: C1P_POOL(_lit, 3, 3, 2, 2, 1); break;
    }
  else
    switch (variant) {
      case 0: C1P_POOL(_gen, s->KH, s->KW, s->pool, 1, 0); break;
      case 1: C1P_POOL(_gen, s->KH, s->KW, s->pool, 1, 1); break;
      case 2: C1P_POOL(_gen, s->KH, s->KW, s->pool, 2, 0); break;
      default: C1P_POOL(_gen, s->KH, s->KW, s->pool, 2, 1); break;
    }
#undef C1P_POOL
}

/* w (OC, 1, KH, KW) as (K, OC): one tap's weights over the channels in consecutive lanes. */
static float *weights_by_tap(const float *w, const qt_conv1_pool_shape *s) {
  const int K = s->KH * s->KW, OC = s->OC;
  float *wT = xcalloc((size_t)K * OC, sizeof *wT);
  for (int oc = 0; oc < OC; oc++)
    for (int t = 0; t < K; t++) wT[(size_t)t * OC + oc] = w[(size_t)oc * K + t];
  return wT;
}

void qt_conv1_bn_relu_pool_forward_train(float *out, uint8_t *argmax, float *yarg, uint8_t *qmask, double *stats,
                                         const float *img, const float *w, const float *bias, const float *gamma,
                                         const float *beta, float *running_mean, float *running_var, float momentum,
                                         float eps, const qt_fq_params *fq, const qt_batch_sync *sync,
                                         const qt_conv1_pool_shape *s) {
  QT_ASSERT(fq || (!yarg && !qmask), "conv1_bn_relu_pool_forward_train: argmax values or a mask without a fake quant");
  const int synced = sync && sync->size > 1;
  const int N = s->N, K = s->KH * s->KW, OC = s->OC, n_mom = K + K * (K + 1) / 2;
  const int64_t M = (int64_t)N * s->OH * s->OW;
  const size_t padded = (size_t)(s->OH + s->KH - 1) * (size_t)padded_width(s);
  const int nthreads = omp_get_max_threads();
  float *xps = xcalloc((size_t)nthreads * padded, sizeof *xps);
  double *per_image = xcalloc((size_t)N * n_mom, sizeof *per_image);
#pragma omp parallel for schedule(static) if (N > 1)
  for (int n = 0; n < N; n++) {
    float *xp = xps + (size_t)omp_get_thread_num() * padded;
    pad_image(xp, img + (size_t)n * s->H * s->W, s);
    image_moments(per_image + (size_t)n * n_mom, xp, s);
  }
  /* stats (qt_conv1_pool_stats_len) */
  double *S = stats, *Cg = stats + K, *inv = stats + K + K * K, *wsm = inv + OC, *Sb = wsm + OC, *Mb = Sb + K;
  memset(S, 0, (size_t)(K + K * K) * sizeof *S);
  for (int n = 0; n < N; n++) {
    const double *m = per_image + (size_t)n * n_mom;
    for (int t = 0; t < K; t++) S[t] += m[t];
    int p = K;
    for (int t = 0; t < K; t++)
      for (int q = t; q < K; q++, p++) Cg[t * K + q] += m[p];
  }
  /* Cb: the batch's centered Gram matrix Gb - Sb Sb^T / Mb, whose quadratic form in w is the
   * channel's centred sum of squares. One process: Cb is Cg. SyncBN: M, S and G summed over the
   * processes (sync's fixed order), and Cg centred on the batch's means, G - S Sb^T / Mb. */
  double *Cb = Cg;
  int64_t Mt = M;
  if (synced) {
    /* this process's M, S and G, then the batch's in their place */
    double *sum = xcalloc(2 * (size_t)(1 + K + K * K), sizeof *sum), *mine = sum + 1 + K + K * K;
    sum[0] = (double)M;
    memcpy(sum + 1, S, (size_t)(K + K * K) * sizeof *sum);
    memcpy(mine, sum, (size_t)(1 + K + K * K) * sizeof *sum);
    sync->sum_f64(sum, 1 + K + K * K);
    Mt = (int64_t)sum[0];
    memcpy(Sb, sum + 1, (size_t)K * sizeof *Sb);
    Cb = sum + 1 + K;
    const double *G = mine + 1 + K; /* the upper triangle is set */
    for (int t = 0; t < K; t++)
      for (int q = 0; q < K; q++) Cg[t * K + q] = G[t < q ? t * K + q : q * K + t] - S[t] * Sb[q] / (double)Mt;
    for (int t = 0; t < K; t++)
      for (int q = t; q < K; q++) {
        Cb[t * K + q] -= Sb[t] * Sb[q] / (double)Mt;
        Cb[q * K + t] = Cb[t * K + q];
      }
  } else {
    for (int t = 0; t < K; t++)
      for (int q = t; q < K; q++) {
        Cg[t * K + q] -= S[t] * S[q] / (double)M;
        Cg[q * K + t] = Cg[t * K + q];
      }
    memcpy(Sb, S, (size_t)K * sizeof *Sb);
  }
  *Mb = (double)Mt;
  float *cst = xcalloc(4 * (size_t)OC, sizeof *cst);
  float *chi = cst, *clo = cst + OC, *ca = cst + 2 * OC, *bb = cst + 3 * OC;
  for (int oc = 0; oc < OC; oc++) {
    const float *wo = w + (size_t)oc * K;
    double ws = 0, m2 = 0;
    for (int t = 0; t < K; t++) {
      ws += (double)wo[t] * Sb[t];
      double r = 0;
      for (int q = 0; q < K; q++) r += Cb[t * K + q] * (double)wo[q];
      m2 += (double)wo[t] * r;
    }
    if (m2 < 0) m2 = 0;
    const double m = ws / (double)Mt + (bias ? (double)bias[oc] : 0.0);
    const double is = 1.0 / sqrt(m2 / (double)Mt + (double)eps);
    inv[oc] = is;
    wsm[oc] = ws / (double)Mt;
    bn_channel_finish(oc, m, m2, Mt, is, momentum, gamma, running_mean, running_var, chi, clo, ca);
    bb[oc] = beta ? beta[oc] : 0.0f;
  }
  float *wT = weights_by_tap(w, s);
  const size_t per_out = (size_t)(s->OH / s->pool) * (size_t)(s->OW / s->pool) * (size_t)OC;
#pragma omp parallel for schedule(static) if (N > 1)
  for (int n = 0; n < N; n++) {
    float *xp = xps + (size_t)omp_get_thread_num() * padded;
    pad_image(xp, img + (size_t)n * s->H * s->W, s);
    const size_t o = (size_t)n * per_out;
    image_pool(out + o, argmax + o, yarg ? yarg + o : NULL, qmask ? qmask + o : NULL, xp, wT, bias, chi, clo, ca, bb,
               fq, s);
  }
  if (Cb != Cg) free(Cb - 1 - K);
  QT_FREE_ALL(wT, cst, per_image, xps);
}

#if defined(__AVX512F__)
/* image_grad_sums_lit for 3x3 taps and 2x2 windows with AVX-512: the 4x4 input patch under a
 * window's taps is one vector (X, and H of the coefficient image), and each lane's tap input at its
 * argmax window position one permute of it (index (t / 3 + j / 2) * 4 + t % 3 + j % 2, j the
 * lane's argmax): the values the selects of image_grad_sums pick, the same FMAs in the same order,
 * so the same bits, in about a third of the instructions. */
static void image_grad_sums_3x3p2(double *P, double *Ph, double *db, const c1p_grad *g, size_t obase,
                                  const uint8_t *argmax, const float *xp, const float *hp, const qt_conv1_pool_shape *s,
                                  const int HP) {
  const int OC = s->OC, PWd = padded_width(s), PH = s->OH / 2, PW = s->OW / 2, OS = out_pixel_stride(s);
  const v16f zero = splat16(0.0f);
  for (int v = 0; v < OC / 16; v++) {
    const size_t ov = out_block_offset(s, v);
    v16f acc[9], acch[9], dsum = zero;
    C1P_PRAGMA(GCC unroll 9)
    for (int t = 0; t < 9; t++) acc[t] = acch[t] = zero;
    for (int ph = 0; ph < PH; ph++)
      for (int pw = 0; pw < PW; pw++) {
        const size_t o = ((size_t)ph * PW + pw) * OS + ov;
        const v16f gv = grad_value(g, obase + o);
        dsum += gv;
        /* (ld16_u8's __builtin_convertvector compiled to slower code here: 0.38 against 0.25 ms) */
        const v16i at = (v16i)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(argmax + o)));
        const v16i base = (at >> 1) * 4 + (at & 1); /* the window position's row and column in the patch */
        const float *x0 = xp + (size_t)(ph * 2) * PWd + pw * 2, *h0 = HP ? hp + (x0 - xp) : NULL;
#define C1P_PATCH(p)                                                                                              \
  _mm512_insertf32x4(                                                                                             \
      _mm512_insertf32x4(_mm512_insertf32x4(_mm512_castps128_ps512(_mm_loadu_ps(p)), _mm_loadu_ps((p) + PWd), 1), \
                         _mm_loadu_ps((p) + 2 * PWd), 2),                                                         \
      _mm_loadu_ps((p) + 3 * PWd), 3)
        const v16f X = (v16f)C1P_PATCH(x0), H = HP ? (v16f)C1P_PATCH(h0) : zero;
#undef C1P_PATCH
        C1P_PRAGMA(GCC unroll 9)
        for (int t = 0; t < 9; t++) {
          const v16i idx = base + (t / 3) * 4 + t % 3;
          acc[t] = fma16(gv, (v16f)_mm512_permutexvar_ps((__m512i)idx, (__m512)X), acc[t]);
          if (HP) acch[t] = fma16(gv, (v16f)_mm512_permutexvar_ps((__m512i)idx, (__m512)H), acch[t]);
        }
      }
    for (int j = 0; j < 16; j++) {
      const int oc = 16 * v + j;
      db[oc] = (double)dsum[j];
      for (int t = 0; t < 9; t++) {
        P[(size_t)oc * 9 + t] = (double)acc[t][j];
        if (HP) Ph[(size_t)oc * 9 + t] = (double)acch[t][j];
      }
    }
  }
}
#endif

static void image_cross_moments(double *out, const float *xp, const float *hp, const qt_conv1_pool_shape *s) {
  if (s->KH == 3 && s->KW == 3)
    patch_moments_k_lit(out, xp, hp, s, 3, 3, 1);
  else
    patch_moments_k_gen(out, xp, hp, s, s->KH, s->KW, 1);
}

/* One image's gradient sums: the AVX-512 3x3 kernel with 2x2 pooling where it applies, else the
 * 3x3 / 2x2 specialization or the general form. */
static void image_grad_sums(double *P, double *Ph, double *db, c1p_grad *q, size_t o, const uint8_t *argmax,
                            const float *xp, const float *hp, const qt_conv1_pool_shape *s, int HP) {
#if defined(__AVX512F__)
  if (s->KH == 3 && s->KW == 3 && s->pool == 2) {
    image_grad_sums_3x3p2(P, Ph, db, q, o, argmax, xp, hp, s, HP);
    return;
  }
#endif
  if (s->KH == 3 && s->KW == 3 && s->pool == 2 && !HP)
    image_grad_sums_lit(P, Ph, db, q, o, argmax, xp, hp, s, 3, 3, 2, 0);
  else if (s->KH == 3 && s->KW == 3 && s->pool == 2)
    image_grad_sums_lit(P, Ph, db, q, o, argmax, xp, hp, s, 3, 3, 2, 1);
  else if (!HP)
    image_grad_sums_gen(P, Ph, db, q, o, argmax, xp, hp, s, s->KH, s->KW, s->pool, 0);
  else
    image_grad_sums_gen(P, Ph, db, q, o, argmax, xp, hp, s, s->KH, s->KW, s->pool, 1);
}

/* From the summed per-image sums P (and the forward's stats): dw, dgamma, dbeta; returns the
 * scale's gradient (with the coefficient image, HP). This process's terms, with batch norm's two
 * per-channel sums (of g and of g xhat) over the batch: under SyncBN summed over the processes
 * (sync's fixed order), whose dw, dgamma, dbeta and scale gradients then add up to the batch's. */
static double combine_grads(double *dw, float *dgamma, float *dbeta, const double *P, const double *stats,
                            const float *w, const float *gamma, const qt_conv1_pool_shape *s, int HP,
                            const qt_batch_sync *sync) {
  const int K = s->KH * s->KW, OC = s->OC;
  const double *S = stats, *Cg = stats + K, *inv = stats + K + K * K, *wsm = inv + OC, *Sb = wsm + OC, Mb = Sb[K];
  const double *db = P + (size_t)OC * K, *Ph = db + OC, *Sh = Ph + (size_t)OC * K, *H = Sh + K;
  /* per channel: the sum of g (dbeta) and of g * xhat, this process's, then the batch's */
  double *sums = xcalloc(4 * (size_t)OC, sizeof *sums), *sb = sums + 2 * (size_t)OC;
  for (int oc = 0; oc < OC; oc++) {
    const float *wo = w + (size_t)oc * K;
    const double *Po = P + (size_t)oc * K;
    double wp = 0;
    for (int t = 0; t < K; t++) wp += (double)wo[t] * Po[t];
    sums[oc] = db[oc];
    sums[OC + oc] = inv[oc] * (wp - wsm[oc] * db[oc]);
    if (dgamma) dgamma[oc] += (float)sums[OC + oc];
    if (dbeta) dbeta[oc] += (float)db[oc];
  }
  memcpy(sb, sums, 2 * (size_t)OC * sizeof *sb);
  if (sync && sync->size > 1) sync->sum_f64(sb, 2 * (int64_t)OC);
  double dsc = 0;
  for (int oc = 0; oc < OC; oc++) {
    const float *wo = w + (size_t)oc * K;
    const double *Po = P + (size_t)oc * K, is = inv[oc], gm = gamma ? (double)gamma[oc] : 1.0;
    /* batch norm's input gradient is a g - b - c xhat */
    const double a = gm * is, b = a * sb[oc] / Mb, c = a * sb[OC + oc] / Mb;
    for (int t = 0; t < K; t++) {
      double cw = 0; /* sum over pixels of xhat u_t, over is */
      for (int q = 0; q < K; q++) cw += Cg[t * K + q] * (double)wo[q];
      if (dw) dw[(size_t)oc * K + t] = a * Po[t] - b * S[t] - c * is * cw;
      if (HP) {
        double hw = 0; /* sum over pixels of xhat v_t, over is */
        for (int q = 0; q < K; q++) hw += (double)wo[q] * (H[q * K + t] - Sb[q] * Sh[t] / Mb);
        dsc += (double)wo[t] * (a * Ph[(size_t)oc * K + t] - b * Sh[t] - c * is * hw);
      }
    }
  }
  free(sums);
  return dsc;
}

void qt_conv1_bn_relu_pool_backward(double *dw, float *dgamma, float *dbeta, double *dscale,
                                    const qt_conv1_pool_grad *pg, const uint8_t *argmax, const double *stats,
                                    const float *img, const float *w, const float *gamma, const float *coef,
                                    const qt_batch_sync *sync, const qt_conv1_pool_shape *s) {
  QT_ASSERT(!dscale == !coef, "conv1_bn_relu_pool_backward: a scale gradient needs the coefficient image");
  const int N = s->N, K = s->KH * s->KW, OC = s->OC, HP = coef != NULL;
  const size_t padded = (size_t)(s->OH + s->KH - 1) * (size_t)padded_width(s);
  const size_t per_out = (size_t)(s->OH / s->pool) * (size_t)(s->OW / s->pool) * (size_t)OC;
  /* per image: P (OC x K), dbeta (OC); with the coefficients Ph (OC x K), Sh (K), H (K x K) */
  const size_t per_img = (size_t)OC * (K + 1) + (HP ? (size_t)OC * K + K + (size_t)K * K : 0);
  const int nthreads = omp_get_max_threads();
  float *xps = xcalloc((size_t)nthreads * padded * (HP ? 2 : 1), sizeof *xps);
  double *part = xcalloc((size_t)N * per_img, sizeof *part);
  c1p_grad src = {pg, pg->g ? 0 : pg->yarg ? 3 : pg->qmask ? 2 : 1, s->relu, OC, 0, 0, 0, 0, 0, 0, NULL};
  QT_ASSERT(pg->g || (pg->dout && (pg->yarg || pg->qmask || pg->out)),
            "conv1_bn_relu_pool_backward: neither the values nor the gradient to form them from");
  const int lsq_sum = src.mode == 3 && pg->lsq_dscale;
  if (src.mode == 3) {
    QT_ASSERT(pg->fq.qmin < pg->fq.qmax, "conv1_bn_relu_pool_backward: bad fake quant range");
    src.s = pg->fq.scale, src.inv_s = 1.0f / src.s, src.zpf = (float)pg->fq.zero_point;
    src.lo = (float)pg->fq.qmin, src.hi = (float)pg->fq.qmax, src.gf = pg->grad_factor;
  }
  /* Images split into contiguous runs per thread: with the LSQ scale's sums, on the threads and
   * runs qt_fake_quant_lsq_pool_val_backward takes, each thread's per-slot sums running over its
   * images in order, then summed slot by slot and thread by thread as it sums them. Everything else
   * is summed per image, then in image order, whatever the threads. */
  const int nt = lsq_sum ? (pg->pool_inputs >= QUANT_PARALLEL_MIN ? nthreads : 1) : N > 1 ? nthreads : 1;
  double *lsq_part = lsq_sum ? xcalloc((size_t)nt, sizeof *lsq_part) : NULL;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int per = (N + T - 1) / T, nb = t * per, ne = nb + per < N ? nb + per : N;
    c1p_grad q = src;
    q.acc = lsq_sum ? xcalloc((size_t)OC, sizeof *q.acc) : NULL;
    float *xp = xps + (size_t)t * padded * (HP ? 2 : 1), *hp = HP ? xp + padded : NULL;
    for (int n = nb; n < ne; n++) {
      pad_image(xp, img + (size_t)n * s->H * s->W, s);
      if (HP) pad_image(hp, coef + (size_t)n * s->H * s->W, s);
      double *P = part + (size_t)n * per_img, *db = P + (size_t)OC * K, *Ph = db + OC, *cross = Ph + (size_t)OC * K;
      const size_t o = (size_t)n * per_out;
      image_grad_sums(P, Ph, db, &q, o, argmax + o, xp, hp, s, HP);
      if (HP) image_cross_moments(cross, xp, hp, s);
    }
    if (q.acc) {
      double as = 0;
      for (int c = 0; c < OC; c++) as += q.acc[c];
      lsq_part[t] = as;
      free(q.acc);
    }
  }
  if (lsq_sum) {
    double sum = 0;
    for (int t = 0; t < nt; t++) sum += lsq_part[t];
    *pg->lsq_dscale = sum;
    free(lsq_part);
  }
  double *P = xcalloc(per_img, sizeof *P);
  for (int n = 0; n < N; n++) /* image order: the same sums for any thread count */
    for (size_t i = 0; i < per_img; i++) P[i] += part[(size_t)n * per_img + i];
  const double dsc = combine_grads(dw, dgamma, dbeta, P, stats, w, gamma, s, HP, sync);
  if (dscale) *dscale = dsc;
  QT_FREE_ALL(P, part, xps);
}
