/* conv2d kernels over NHWC activations and PyTorch-layout (OC, C/groups, KH, KW) weights.
 * The optimized path runs oneDNN fp32 primitives, created once per shape and kept in a small
 * table. Weights are declared format_tag_any and reordered into whatever layout each primitive
 * picks: with plain oihw weights oneDNN 2.6 falls back to its reference kernels (measured
 * 300x slower). The single-input-channel first layer also runs on oneDNN: its JIT kernels
 * beat straightforward OpenMP loops there (measured 0.28 vs 1.7 ms forward, 0.53 vs 1.5 ms
 * backward-weights at batch 128). A primitive is kept per shape and OpenMP thread count: oneDNN
 * fixes its thread count when it creates a convolution, so one created under two threads would
 * go on waking two where the caller now asks for one (the XNNPACK runtime's fp32 fallbacks).
 * A shape with `winograd` set (training steps: qt_ctx_set_conv_winograd) runs oneDNN's Winograd
 * F(4x4, 3x3) kernels where oneDNN has them (3x3, stride 1, AVX-512; here also at least 16 input
 * and output channels): on blocked activations (nChw16c), reordered from and to NHWC around each
 * primitive, about half the time of the direct kernels for FashionCNN's conv2 (measured 2.3-2.5
 * against 4.1-4.6 ms per pass at batch 128, two threads; the reorders 0.04-0.12 ms each with the
 * data in cache, about 1.2 ms of a training step in all by perf), at the cost of its transforms'
 * rounding. A caller whose input is nChw16c already (src_blocked: FashionCNN's conv1 op writes it
 * so, qt_ctx_set_blocked_handoff) skips the source's reorders: two of the five (the forward's and
 * the weight gradient's), and a fresh input gradient is written straight into its buffer (the
 * third). With 16 channels nChw16c is NHWC's byte order: such an input or output is bound as
 * it is, with no reorder, whoever wrote it.
 * A convolution whose output has at most CONV_GEMM_MAX_PIXELS pixels runs as matrix products
 * instead (conv2d_gemm.c), and so does the weight gradient of a depthwise one there.
 * The _ref twins are plain loops with double accumulation. */
#include "autograd/conv2d_int.h"
#include "autograd/dnnl_util.h"
#include "base/base.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int qt_conv2d_shape_init(qt_conv2d_shape *s) {
  if (s->N <= 0 || s->H <= 0 || s->W <= 0 || s->C <= 0 || s->OC <= 0 || s->KH <= 0 || s->KW <= 0) return -1;
  if (s->stride_h <= 0 || s->stride_w <= 0 || s->pad_h < 0 || s->pad_w < 0) return -1;
  if (s->groups <= 0 || s->C % s->groups != 0 || s->OC % s->groups != 0) return -1;
  int64_t span_h = (int64_t)s->H + 2 * (int64_t)s->pad_h - s->KH;
  int64_t span_w = (int64_t)s->W + 2 * (int64_t)s->pad_w - s->KW;
  if (span_h < 0 || span_w < 0) return -1;
  s->OH = (int)(span_h / s->stride_h + 1);
  s->OW = (int)(span_w / s->stride_w + 1);
  return 0;
}

/* ---- reference twins --------------------------------------------------------------------- */

void qt_conv2d_forward_ref(float *out, const float *inp, const float *weight, const float *bias,
                           const qt_conv2d_shape *s) {
  const int Cg = s->C / s->groups, OCg = s->OC / s->groups;
  for (int n = 0; n < s->N; n++)
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow = 0; ow < s->OW; ow++)
        for (int oc = 0; oc < s->OC; oc++) {
          const int g = oc / OCg;
          double acc = bias ? bias[oc] : 0.0;
          for (int kh = 0; kh < s->KH; kh++) {
            const int ih = oh * s->stride_h - s->pad_h + kh;
            if (ih < 0 || ih >= s->H) continue;
            for (int kw = 0; kw < s->KW; kw++) {
              const int iw = ow * s->stride_w - s->pad_w + kw;
              if (iw < 0 || iw >= s->W) continue;
              for (int ci = 0; ci < Cg; ci++) {
                const float x = inp[(((int64_t)n * s->H + ih) * s->W + iw) * s->C + g * Cg + ci];
                const float w = weight[(((int64_t)oc * Cg + ci) * s->KH + kh) * s->KW + kw];
                acc += (double)x * w;
              }
            }
          }
          out[(((int64_t)n * s->OH + oh) * s->OW + ow) * s->OC + oc] = (float)acc;
        }
}

/* Scatters every output gradient into double buffers, then adds them to the outputs. */
void qt_conv2d_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const qt_conv2d_shape *s) {
  const int Cg = s->C / s->groups, OCg = s->OC / s->groups;
  const int64_t n_inp = (int64_t)s->N * s->H * s->W * s->C;
  const int64_t n_wei = (int64_t)s->OC * Cg * s->KH * s->KW;
  double *di = calloc((size_t)n_inp, sizeof *di);
  double *dw = calloc((size_t)n_wei, sizeof *dw);
  double *db = calloc((size_t)s->OC, sizeof *db);
  if (!di || !dw || !db) qt_dnnl_die(__FILE__, __LINE__, "out of memory in qt_conv2d_backward_ref");
  for (int n = 0; n < s->N; n++)
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow = 0; ow < s->OW; ow++)
        for (int oc = 0; oc < s->OC; oc++) {
          const int g = oc / OCg;
          const double d = dout[(((int64_t)n * s->OH + oh) * s->OW + ow) * s->OC + oc];
          db[oc] += d;
          for (int kh = 0; kh < s->KH; kh++) {
            const int ih = oh * s->stride_h - s->pad_h + kh;
            if (ih < 0 || ih >= s->H) continue;
            for (int kw = 0; kw < s->KW; kw++) {
              const int iw = ow * s->stride_w - s->pad_w + kw;
              if (iw < 0 || iw >= s->W) continue;
              for (int ci = 0; ci < Cg; ci++) {
                const int64_t xi = (((int64_t)n * s->H + ih) * s->W + iw) * s->C + g * Cg + ci;
                const int64_t wi = (((int64_t)oc * Cg + ci) * s->KH + kh) * s->KW + kw;
                di[xi] += d * weight[wi];
                dw[wi] += d * inp[xi];
              }
            }
          }
        }
  if (dinp)
    for (int64_t i = 0; i < n_inp; i++) dinp[i] += (float)di[i];
  if (dweight)
    for (int64_t i = 0; i < n_wei; i++) dweight[i] += (float)dw[i];
  if (dbias)
    for (int i = 0; i < s->OC; i++) dbias[i] += (float)db[i];
  QT_FREE_ALL(di, dw, db);
}

/* ---- oneDNN path ------------------------------------------------------------------------- */

/* A primitive plus, when it wants its weights in another layout than PyTorch's, the reorder
 * that converts them and the buffer it converts into. */
typedef struct {
  dnnl_primitive_t prim;
  dnnl_primitive_t wei_reorder; /* user layout -> wei, or NULL when the layouts agree */
  dnnl_memory_t wei;            /* primitive-layout weights (owned), NULL when layouts agree */
  dnnl_memory_t pad;            /* its scratchpad, bound to the shared one per call; NULL: none */
} conv_prim;

typedef struct {
  qt_conv2d_shape shape;
  int threads; /* omp_get_max_threads() when created: part of the key */
  int in_use;
  dnnl_alg_kind_t alg;                 /* direct, or winograd (shape.winograd and oneDNN has it) */
  dnnl_memory_desc_t act_src, act_dst; /* the activations' layouts the primitives run on */
  int blocked;                         /* act_* differ from NHWC: the reorders below run around them */
  int src16, dst16;                    /* act_src / act_dst are nChw16c: a caller may hand its input over so
                                        * (src_blocked) / take its output so (dst_blocked) */
  int src_as_nhwc, dst_as_nhwc;        /* nChw16c with 16 channels: the bytes of NHWC, bound as they are
                                        * with no reorder, as if the caller had set src_blocked / dst_blocked */
  dnnl_primitive_t src_in, dst_out, ddst_in, dsrc_out, dsrc_add; /* NHWC <-> act_* (add: accumulating) */
  dnnl_memory_t bsrc, bdst;   /* act_* memories, bound to the blocked scratch per call */
  dnnl_primitive_desc_t hint; /* a forward pd, the hint the backward pds are created from */
  conv_prim fwd[2];           /* indexed by has_bias */
  conv_prim bwd_data;
  dnnl_primitive_t bwd_weights;
  dnnl_memory_t bwd_weights_pad; /* its scratchpad (as conv_prim's pad) */
  dnnl_primitive_t dwei_reorder; /* primitive-layout diff weights -> user layout, accumulating */
  dnnl_memory_t dwei;            /* (owned) diff weights as the primitive writes them */
  dnnl_memory_t dbias;           /* (owned) (OC) */
  /* user-side memories, bound to the caller's buffers per call */
  dnnl_memory_t src, dst, wei_user, bias, dsrc, ddst, dwei_user;
} conv_entry;

/* Enough for every (layer, batch size) pair of the models here; beyond it, round-robin
 * eviction keeps the cache correct, only slower. */
#define CONV_CACHE_SIZE 64
static conv_entry g_cache[CONV_CACHE_SIZE];
static int g_cache_next;
static float *g_scratch; /* diff_src before it is added into the caller's dinp */
static size_t g_scratch_len;
/* Blocked entries' activations: source-shaped (src, then diff_src) and destination-shaped (dst,
 * diff_dst), and the primitives' scratchpad (user-managed: oneDNN's own would keep one per
 * primitive, 7.5-9.7 MB for each of conv2's Winograd ones at batch 128), each shared by every
 * entry (a call uses them only while it runs; qt_conv2d_release_scratch frees them). */
static void *g_bsrc, *g_bdst, *g_pad;
static size_t g_bsrc_len, g_bdst_len, g_pad_len;
static dnnl_primitive_attr_t g_attr; /* user-managed scratchpad */
static int g_registered_cleanup;

static int conv_shape_equal(const qt_conv2d_shape *a, const qt_conv2d_shape *b) {
  return a->winograd == b->winograd && a->N == b->N && a->H == b->H && a->W == b->W && a->C == b->C && a->OC == b->OC &&
         a->KH == b->KH && a->KW == b->KW && a->stride_h == b->stride_h && a->stride_w == b->stride_w &&
         a->pad_h == b->pad_h && a->pad_w == b->pad_w && a->groups == b->groups && a->OH == b->OH && a->OW == b->OW;
}

static void conv_prim_release(conv_prim *p) {
  qt_dnnl_primitive_destroy(&p->prim);
  qt_dnnl_primitive_destroy(&p->wei_reorder);
  qt_dnnl_memory_destroy(&p->wei);
  qt_dnnl_memory_destroy(&p->pad);
}

static void conv_entry_release(conv_entry *e) {
  if (e->hint) QT_DNNL_CHECK(dnnl_primitive_desc_destroy(e->hint));
  conv_prim_release(&e->fwd[0]);
  conv_prim_release(&e->fwd[1]);
  conv_prim_release(&e->bwd_data);
  qt_dnnl_primitive_destroy(&e->bwd_weights);
  qt_dnnl_primitive_destroy(&e->dwei_reorder);
  dnnl_primitive_t *reorders[] = {&e->src_in, &e->dst_out, &e->ddst_in, &e->dsrc_out, &e->dsrc_add};
  for (size_t i = 0; i < sizeof reorders / sizeof reorders[0]; i++) qt_dnnl_primitive_destroy(reorders[i]);
  dnnl_memory_t *mems[] = {&e->dwei, &e->dbias, &e->src,  &e->dst,  &e->wei_user,  &e->bias,
                           &e->dsrc, &e->ddst,  &e->bsrc, &e->bdst, &e->dwei_user, &e->bwd_weights_pad};
  for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) qt_dnnl_memory_destroy(mems[i]);
  memset(e, 0, sizeof *e);
}

/* Runs before the engine's own exit handler (registered earlier), so no primitive outlives it. */
static void conv_cache_release(void) {
  for (int i = 0; i < CONV_CACHE_SIZE; i++)
    if (g_cache[i].in_use) conv_entry_release(&g_cache[i]);
  qt_conv2d_release_scratch();
  if (g_attr) QT_DNNL_CHECK(dnnl_primitive_attr_destroy(g_attr));
  g_attr = NULL;
}

/* Frees the shared buffers, mapped by qt_dnnl_mapped (dnnl_util.h says why). */
void qt_conv2d_release_scratch(void) {
  free(g_scratch);
  g_scratch = NULL;
  g_scratch_len = 0;
  qt_dnnl_unmap(&g_bsrc, &g_bsrc_len);
  qt_dnnl_unmap(&g_bdst, &g_bdst_len);
  qt_dnnl_unmap(&g_pad, &g_pad_len);
  qt_conv2d_gemm_release_scratch();
}

void qt_conv2d_scratch_bytes(size_t *src, size_t *dst, size_t *pad) {
  *src = g_bsrc_len;
  *dst = g_bdst_len;
  *pad = g_pad_len;
}

/* *buf grown to at least bytes (contents not kept), bound to mem. */
static void bind_shared(dnnl_memory_t mem, void **buf, size_t *len, size_t bytes) {
  qt_dnnl_memory_bind(mem, qt_dnnl_mapped(buf, len, bytes));
}

/* A blocked entry's source-shaped (bind_src) or destination-shaped (bind_dst) activation memory:
 * on the caller's buffer user when the caller's activations are blocked already (user_blocked),
 * else on the shared buffer. */
static void bind_src(conv_entry *e, const float *user, int user_blocked) {
  if (user_blocked)
    qt_dnnl_memory_bind(e->bsrc, user);
  else
    bind_shared(e->bsrc, &g_bsrc, &g_bsrc_len, dnnl_memory_desc_get_size(&e->act_src));
}
static void bind_dst(conv_entry *e, const float *user, int user_blocked) {
  if (user_blocked)
    qt_dnnl_memory_bind(e->bdst, user);
  else
    bind_shared(e->bdst, &g_bdst, &g_bdst_len, dnnl_memory_desc_get_size(&e->act_dst));
}

/* The caller's layout flags against what the entry runs on. */
static void check_layout(const conv_entry *e, const qt_conv2d_shape *s) {
  if ((s->src_blocked && !e->src16) || (s->dst_blocked && !e->dst16)) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "conv2d: a blocked (nChw16c) %s to a convolution that does not run on that layout (input "
             "%dx%dx%dx%d, kernel %dx%d, %d output channels, Winograd %s)",
             s->src_blocked && !e->src16 ? "input" : "output", s->N, s->H, s->W, s->C, s->KH, s->KW, s->OC,
             s->winograd ? "allowed" : "off");
    qt_dnnl_die(__FILE__, __LINE__, msg);
  }
}

/* The attributes every conv primitive is created with: a scratchpad the caller passes. */
static const_dnnl_primitive_attr_t conv_attr(void) {
  if (!g_attr) {
    QT_DNNL_CHECK(dnnl_primitive_attr_create(&g_attr));
    QT_DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(g_attr, dnnl_scratchpad_mode_user));
  }
  return g_attr;
}

/* A memory for pd's scratchpad, or NULL when it needs none. */
static dnnl_memory_t conv_pad_memory(const_dnnl_primitive_desc_t pd) {
  const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  return md && dnnl_memory_desc_get_size(md) > 0 ? qt_dnnl_memory_unbound(md) : NULL;
}

/* Runs prim with args (room for one more) and its scratchpad pad, if any, on the shared buffer. */
static void conv_execute(dnnl_primitive_t prim, dnnl_memory_t pad, int nargs, dnnl_exec_arg_t *args) {
  if (pad) {
    const dnnl_memory_desc_t *md = NULL;
    QT_DNNL_CHECK(dnnl_memory_get_memory_desc(pad, &md));
    bind_shared(pad, &g_pad, &g_pad_len, dnnl_memory_desc_get_size(md));
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, pad};
  }
  qt_dnnl_execute(prim, nargs, args);
}

static float *conv_scratch(size_t n) {
  if (n > g_scratch_len) {
    free(g_scratch);
    g_scratch = malloc(n * sizeof *g_scratch);
    if (!g_scratch) qt_dnnl_die(__FILE__, __LINE__, "out of memory for the conv2d scratch buffer");
    g_scratch_len = n;
  }
  return g_scratch;
}

/* Logical oneDNN descriptors of a shape: activations (N, C, H, W) stored NHWC; weights
 * (OC, C, KH, KW) or, grouped, (G, OC/G, C/G, KH, KW), with the given format tag. */
static dnnl_memory_desc_t conv_src_md(const qt_conv2d_shape *s) {
  const dnnl_dim_t d[4] = {s->N, s->C, s->H, s->W};
  return qt_dnnl_md(4, d, dnnl_nhwc);
}
static dnnl_memory_desc_t conv_dst_md(const qt_conv2d_shape *s) {
  const dnnl_dim_t d[4] = {s->N, s->OC, s->OH, s->OW};
  return qt_dnnl_md(4, d, dnnl_nhwc);
}
static dnnl_memory_desc_t conv_wei_md(const qt_conv2d_shape *s, int any) {
  if (s->groups == 1) {
    const dnnl_dim_t d[4] = {s->OC, s->C, s->KH, s->KW};
    return qt_dnnl_md(4, d, any ? dnnl_format_tag_any : dnnl_oihw);
  }
  const dnnl_dim_t d[5] = {s->groups, s->OC / s->groups, s->C / s->groups, s->KH, s->KW};
  return qt_dnnl_md(5, d, any ? dnnl_format_tag_any : dnnl_goihw);
}
static dnnl_memory_desc_t conv_bias_md(const qt_conv2d_shape *s) {
  const dnnl_dim_t d[1] = {s->OC};
  return qt_dnnl_md(1, d, dnnl_x);
}

static void conv_geometry(const qt_conv2d_shape *s, dnnl_dims_t strides, dnnl_dims_t pad_l, dnnl_dims_t pad_r) {
  strides[0] = s->stride_h;
  strides[1] = s->stride_w;
  pad_l[0] = s->pad_h;
  pad_l[1] = s->pad_w;
  /* oneDNN wants the right padding that yields exactly OH/OW; with PyTorch's floor rounding
   * some of the symmetric padding may go unused, and the last input rows may too (negative) */
  pad_r[0] = (dnnl_dim_t)(s->OH - 1) * s->stride_h + s->KH - s->H - s->pad_h;
  pad_r[1] = (dnnl_dim_t)(s->OW - 1) * s->stride_w + s->KW - s->W - s->pad_w;
}

static dnnl_primitive_desc_t conv_forward_pd(const conv_entry *e, int has_bias, int may_fail);
static void conv_choose_algorithm(conv_entry *e);

static conv_entry *conv_lookup(const qt_conv2d_shape *s) {
  const int threads = omp_get_max_threads();
  for (int i = 0; i < CONV_CACHE_SIZE; i++)
    if (g_cache[i].in_use && g_cache[i].threads == threads && conv_shape_equal(&g_cache[i].shape, s))
      return &g_cache[i];
  qt_dnnl_engine(); /* its exit handler must be registered before ours */
  if (!g_registered_cleanup) {
    atexit(conv_cache_release);
    g_registered_cleanup = 1;
  }
  conv_entry *e = &g_cache[g_cache_next];
  g_cache_next = (g_cache_next + 1) % CONV_CACHE_SIZE;
  if (e->in_use) conv_entry_release(e);
  e->shape = *s;
  e->threads = threads;
  e->in_use = 1;
  const dnnl_memory_desc_t src = conv_src_md(s), dst = conv_dst_md(s), wei = conv_wei_md(s, 0);
  const dnnl_memory_desc_t bias = conv_bias_md(s);
  e->src = qt_dnnl_memory_unbound(&src);
  e->dsrc = qt_dnnl_memory_unbound(&src);
  e->dst = qt_dnnl_memory_unbound(&dst);
  e->ddst = qt_dnnl_memory_unbound(&dst);
  e->wei_user = qt_dnnl_memory_unbound(&wei);
  e->dwei_user = qt_dnnl_memory_unbound(&wei);
  e->bias = qt_dnnl_memory_unbound(&bias);
  conv_choose_algorithm(e);
  return e;
}

/* Completes p from its primitive descriptor: the primitive itself, and the weight reorder
 * when the primitive's weight layout differs from the user's. */
static void conv_prim_finish(conv_prim *p, const_dnnl_primitive_desc_t pd, dnnl_query_t wei_query,
                             const qt_conv2d_shape *s) {
  p->prim = qt_dnnl_primitive_create(pd);
  p->pad = conv_pad_memory(pd);
  const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, wei_query, 0);
  const dnnl_memory_desc_t user = conv_wei_md(s, 0);
  if (!want) qt_dnnl_die(__FILE__, __LINE__, "conv2d: primitive reports no weights descriptor");
  if (!dnnl_memory_desc_equal(want, &user)) {
    p->wei = qt_dnnl_memory_owned(want);
    p->wei_reorder = qt_dnnl_reorder_create(&user, want, 0);
  }
}

/* The entry's forward primitive descriptor (its algorithm, on its activation layouts); with
 * may_fail, NULL where oneDNN has no implementation. */
static dnnl_primitive_desc_t conv_forward_pd(const conv_entry *e, int has_bias, int may_fail) {
  const qt_conv2d_shape *s = &e->shape;
  const dnnl_memory_desc_t wei = conv_wei_md(s, 1), bias = conv_bias_md(s);
  dnnl_dims_t strides, pad_l, pad_r;
  conv_geometry(s, strides, pad_l, pad_r);
  dnnl_convolution_desc_t desc;
  QT_DNNL_CHECK(dnnl_convolution_forward_desc_init(&desc, dnnl_forward_training, e->alg, &e->act_src, &wei,
                                                   has_bias ? &bias : NULL, &e->act_dst, strides, pad_l, pad_r));
  dnnl_primitive_desc_t pd = NULL;
  const dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, conv_attr(), qt_dnnl_engine(), NULL);
  if (st == dnnl_unimplemented && may_fail) return NULL;
  QT_DNNL_CHECK(st);
  return pd;
}

/* Direct on NHWC, or for a shape that allows it and where oneDNN implements it, Winograd on the
 * layout oneDNN picks for it (with the reorders from and to NHWC). Not below 16 input or output
 * channels: oneDNN's Winograd pads channels to blocks of 16, and FashionCNN's conv1 (1 -> 32)
 * measured 9.9 against 5.5 ms forward (its two conv2d calls per step under QAT with observers).
 * Not for an output smaller than one 4x4 tile (F(4x4, 3x3)) in height or width: the tile is
 * then mostly padding; ResNet-18 on 28x28 images (3x3 convs at 7x7, 4x4, 2x2 and 1x1) trained
 * at 340 images/s with Winograd at every size, 720 with 2x2 and 1x1 direct, 650 with only 1x1
 * direct (bench_profile, 2 threads). */
static void conv_choose_algorithm(conv_entry *e) {
  const qt_conv2d_shape *s = &e->shape;
  e->alg = dnnl_convolution_direct;
  e->act_src = conv_src_md(s);
  e->act_dst = conv_dst_md(s);
  if (!s->winograd || s->groups != 1 || s->KH != 3 || s->KW != 3 || s->stride_h != 1 || s->stride_w != 1 || s->C < 16 ||
      s->OC < 16 || s->OH < 4 || s->OW < 4)
    return;
  const dnnl_memory_desc_t nhwc_src = e->act_src, nhwc_dst = e->act_dst;
  const dnnl_dim_t ds[4] = {s->N, s->C, s->H, s->W}, dd[4] = {s->N, s->OC, s->OH, s->OW};
  e->alg = dnnl_convolution_winograd;
  e->act_src = qt_dnnl_md(4, ds, dnnl_format_tag_any);
  e->act_dst = qt_dnnl_md(4, dd, dnnl_format_tag_any);
  dnnl_primitive_desc_t pd = conv_forward_pd(e, 0, 1);
  if (!pd) {
    e->alg = dnnl_convolution_direct;
    e->act_src = nhwc_src;
    e->act_dst = nhwc_dst;
    return;
  }
  e->act_src = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
  e->act_dst = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
  e->hint = pd;
  e->blocked = !dnnl_memory_desc_equal(&e->act_src, &nhwc_src) || !dnnl_memory_desc_equal(&e->act_dst, &nhwc_dst);
  if (!e->blocked) return;
  const dnnl_memory_desc_t src16 = qt_dnnl_md(4, ds, dnnl_nChw16c), dst16 = qt_dnnl_md(4, dd, dnnl_nChw16c);
  e->src16 = s->C % 16 == 0 && dnnl_memory_desc_equal(&e->act_src, &src16);
  e->dst16 = s->OC % 16 == 0 && dnnl_memory_desc_equal(&e->act_dst, &dst16);
  e->src_as_nhwc = e->src16 && s->C == 16;
  e->dst_as_nhwc = e->dst16 && s->OC == 16;
  e->src_in = qt_dnnl_reorder_create(&nhwc_src, &e->act_src, 0);
  e->dst_out = qt_dnnl_reorder_create(&e->act_dst, &nhwc_dst, 0);
  e->ddst_in = qt_dnnl_reorder_create(&nhwc_dst, &e->act_dst, 0);
  e->dsrc_out = qt_dnnl_reorder_create(&e->act_src, &nhwc_src, 0);
  e->dsrc_add = qt_dnnl_reorder_create(&e->act_src, &nhwc_src, 1);
  e->bsrc = qt_dnnl_memory_unbound(&e->act_src);
  e->bdst = qt_dnnl_memory_unbound(&e->act_dst);
}

static conv_prim *conv_forward_prim(conv_entry *e, int has_bias) {
  conv_prim *p = &e->fwd[has_bias];
  if (p->prim) return p;
  dnnl_primitive_desc_t pd = conv_forward_pd(e, has_bias, 0);
  conv_prim_finish(p, pd, dnnl_query_weights_md, &e->shape);
  if (!e->hint)
    e->hint = pd;
  else
    QT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  return p;
}

static const_dnnl_primitive_desc_t conv_hint(conv_entry *e) {
  if (!e->hint) e->hint = conv_forward_pd(e, 0, 0);
  return e->hint;
}

/* The primitive descriptor of the entry's backward-data pass (weights 0) or backward-weights
 * pass with the bias gradient (weights 1): in the entry's algorithm, else direct on the same
 * layouts (where oneDNN has a Winograd forward but not that backward). */
static dnnl_primitive_desc_t conv_backward_pd(conv_entry *e, int weights) {
  const qt_conv2d_shape *s = &e->shape;
  const dnnl_memory_desc_t wei = conv_wei_md(s, 1), bias = conv_bias_md(s);
  dnnl_dims_t strides, pad_l, pad_r;
  conv_geometry(s, strides, pad_l, pad_r);
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t st = dnnl_unimplemented;
  const dnnl_alg_kind_t algs[2] = {e->alg, dnnl_convolution_direct};
  for (int i = 0; i < 2 && st == dnnl_unimplemented; i++) {
    dnnl_convolution_desc_t desc;
    if (weights)
      QT_DNNL_CHECK(dnnl_convolution_backward_weights_desc_init(&desc, algs[i], &e->act_src, &wei, &bias, &e->act_dst,
                                                                strides, pad_l, pad_r));
    else
      QT_DNNL_CHECK(dnnl_convolution_backward_data_desc_init(&desc, algs[i], &e->act_src, &wei, &e->act_dst, strides,
                                                             pad_l, pad_r));
    st = dnnl_primitive_desc_create(&pd, &desc, conv_attr(), qt_dnnl_engine(), conv_hint(e));
  }
  QT_DNNL_CHECK(st);
  return pd;
}

static conv_prim *conv_backward_data_prim(conv_entry *e) {
  conv_prim *p = &e->bwd_data;
  if (p->prim) return p;
  dnnl_primitive_desc_t pd = conv_backward_pd(e, 0);
  conv_prim_finish(p, pd, dnnl_query_weights_md, &e->shape);
  QT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  return p;
}

/* Backward weights always computes the bias gradient too (a scratch one when the caller
 * passes no dbias): one primitive per shape, and the bias sum costs next to nothing. */
static void conv_backward_weights_prim(conv_entry *e) {
  if (e->bwd_weights) return;
  const dnnl_memory_desc_t user = conv_wei_md(&e->shape, 0);
  dnnl_primitive_desc_t pd = conv_backward_pd(e, 1);
  e->bwd_weights = qt_dnnl_primitive_create(pd);
  e->bwd_weights_pad = conv_pad_memory(pd);
  const dnnl_memory_desc_t *have = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
  const dnnl_memory_desc_t *have_bias = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 1);
  if (!have || !have_bias) qt_dnnl_die(__FILE__, __LINE__, "conv2d: backward weights reports no diff descriptors");
  e->dwei = qt_dnnl_memory_owned(have);
  e->dbias = qt_dnnl_memory_owned(have_bias);
  e->dwei_reorder = qt_dnnl_reorder_create(have, &user, 1);
  QT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

/* The weights memory a primitive reads: the caller's, or the reordered copy. */
static dnnl_memory_t conv_prepare_weights(conv_entry *e, conv_prim *p, const float *weight) {
  qt_dnnl_memory_bind(e->wei_user, weight);
  if (!p->wei_reorder) return e->wei_user;
  qt_dnnl_reorder_run(p->wei_reorder, e->wei_user, p->wei);
  return p->wei;
}

static void add_into(float *dst, const float *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* dbias (OC) += the sum of dout over its N * OH * OW pixels, in pixel order (dout blocked when
 * s->dst_blocked). */
static void bias_grad_accumulate(float *dbias, const float *dout, const qt_conv2d_shape *s) {
  const int OC = s->OC;
  const int64_t rows = (int64_t)s->N * s->OH * s->OW, hw = (int64_t)s->OH * s->OW;
  double *acc = calloc((size_t)OC, sizeof *acc);
  if (!acc) qt_dnnl_die(__FILE__, __LINE__, "out of memory in bias_grad_accumulate");
  for (int64_t r = 0; r < rows; r++)
    for (int oc = 0; oc < OC; oc++)
      acc[oc] += dout[s->dst_blocked ? ((r / hw * (OC / 16) + oc / 16) * hw + r % hw) * 16 + oc % 16 : r * OC + oc];
  for (int oc = 0; oc < OC; oc++) dbias[oc] += (float)acc[oc];
  free(acc);
}

void qt_conv2d_forward(float *out, const float *inp, const float *weight, const float *bias, const qt_conv2d_shape *s) {
  if (qt_conv2d_gemm_applies(s)) {
    qt_conv2d_gemm_forward(out, inp, weight, bias, s);
    return;
  }
  conv_entry *e = conv_lookup(s);
  conv_prim *p = conv_forward_prim(e, bias != NULL);
  dnnl_memory_t wei = conv_prepare_weights(e, p, weight);
  qt_dnnl_memory_bind(e->src, inp);
  qt_dnnl_memory_bind(e->dst, out);
  if (bias) qt_dnnl_memory_bind(e->bias, bias);
  dnnl_memory_t src = e->src, dst = e->dst;
  check_layout(e, s);
  const int src_blocked = s->src_blocked || e->src_as_nhwc, dst_blocked = s->dst_blocked || e->dst_as_nhwc;
  if (e->blocked) {
    bind_src(e, inp, src_blocked);
    bind_dst(e, out, dst_blocked);
    if (!src_blocked) qt_dnnl_reorder_run(e->src_in, e->src, e->bsrc);
    src = e->bsrc;
    dst = e->bdst;
  }
  dnnl_exec_arg_t args[5] = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}, {DNNL_ARG_BIAS, e->bias}};
  conv_execute(p->prim, p->pad, bias ? 4 : 3, args);
  if (e->blocked && !dst_blocked) qt_dnnl_reorder_run(e->dst_out, e->bdst, e->dst);
}

int qt_conv2d_src_blocked16(const qt_conv2d_shape *s) { return conv_lookup(s)->src16; }
int qt_conv2d_dst_blocked16(const qt_conv2d_shape *s) { return conv_lookup(s)->dst16; }

/* Convolutions with one input channel (FashionCNN's conv1 on the image) get their input gradient
 * from a kernel of this file (below); their weight gradient stays with oneDNN (a direct one-pass
 * kernel measured 2.7 ms against oneDNN's 1.3 ms, one thread, batch 128). */
#define CONV_C1_MAX_TAPS 49
#define CONV_C1_MAX_OC 512

static int conv_c1_applies(const qt_conv2d_shape *s) {
  return s->C == 1 && s->groups == 1 && s->KH * s->KW <= CONV_C1_MAX_TAPS && s->OC <= CONV_C1_MAX_OC;
}

/* 16 floats in vector lanes (a GNU C vector: one AVX-512 register, two AVX2 ones) for the kernels
 * below, which keep accumulators in registers across taps. */
/* The helpers taking and returning these vectors are static and inlined, so no call crosses an
 * ABI boundary: GCC's -Wpsabi note (a 64-byte vector returned without AVX-512 enabled, as in a
 * QT_NATIVE=OFF build) does not apply, and QT_WERROR would turn it into an error. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16f __attribute__((vector_size(64)));
static inline v16f load16(const float *p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline v16f fma16(v16f a, v16f b, v16f c) {
  for (int j = 0; j < 16; j++) c[j] = fmaf(a[j], b[j], c[j]);
  return c;
}

/* Input gradient of a convolution with one input channel (conv1's, needed under QAT for the input
 * quantizer's learned scale), which oneDNN 2.6 runs slowly (5.0-5.6 ms, one thread, batch 128;
 * this kernel 2.9 ms). Per input pixel: the sum over its
 * taps of dot(dout at the output pixel the tap reaches, the tap's weights over OC), OC in vector
 * lanes, one horizontal sum per pixel. Writes dinp (dinp_write) or adds to it. */
static void conv_c1_backward_data(float *dinp, int dinp_write, const float *dout, const float *weight,
                                  const qt_conv2d_shape *s) {
  const int K = s->KH * s->KW, OC = s->OC, OH = s->OH, OW = s->OW, H = s->H, W = s->W;
  const int OCv = (OC + 15) & ~15;
  float *wT = calloc((size_t)K * (size_t)OCv, sizeof *wT); /* (taps, OC padded to 16) */
  if (!wT) qt_dnnl_die(__FILE__, __LINE__, "out of memory in conv_c1_backward_data");
  for (int oc = 0; oc < OC; oc++)
    for (int k = 0; k < K; k++) wT[(size_t)k * OCv + oc] = weight[(size_t)oc * K + k];
  const int64_t rows = (int64_t)s->N * H;
  const int sh1 = s->stride_h == 1, sw1 = s->stride_w == 1; /* no integer division per tap */
#pragma omp parallel for schedule(static) if (rows * W * OC > (1 << 16))
  for (int64_t r = 0; r < rows; r++) {
    const int n = (int)(r / H), ih = (int)(r % H);
    for (int iw = 0; iw < W; iw++) {
      v16f e0 = {0}, e1 = {0}, o0 = {0}, o1 = {0}; /* four independent accumulation chains */
      float tail = 0;
      for (int kh = 0; kh < s->KH; kh++) {
        const int th = ih + s->pad_h - kh; /* = oh * stride_h */
        if (th < 0 || (sh1 ? 0 : th % s->stride_h)) continue;
        const int oh = sh1 ? th : th / s->stride_h;
        if (oh >= OH) continue;
        for (int kw = 0; kw < s->KW; kw++) {
          const int tw = iw + s->pad_w - kw;
          if (tw < 0 || (sw1 ? 0 : tw % s->stride_w)) continue;
          const int ow = sw1 ? tw : tw / s->stride_w;
          if (ow >= OW) continue;
          const float *d = dout + (((int64_t)n * OH + oh) * OW + ow) * OC;
          const float *wk = wT + (size_t)(kh * s->KW + kw) * OCv;
          int oc = 0;
          for (; oc + 32 <= OC; oc += 32) {
            e0 = fma16(load16(d + oc), load16(wk + oc), e0);
            e1 = fma16(load16(d + oc + 16), load16(wk + oc + 16), e1);
          }
          if (oc + 16 <= OC) {
            e0 = fma16(load16(d + oc), load16(wk + oc), e0);
            oc += 16;
          }
          for (; oc < OC; oc++) tail = fmaf(d[oc], wk[oc], tail);
          const v16f t0 = e0, t1 = e1; /* alternate two pairs of chains between taps */
          e0 = o0, e1 = o1, o0 = t0, o1 = t1;
        }
      }
      const v16f v = (e0 + e1) + (o0 + o1);
      float acc = tail;
      for (int j = 0; j < 16; j++) acc += v[j];
      float *out = dinp + r * W + iw;
      *out = dinp_write ? acc : *out + acc;
    }
  }
  free(wT);
}

void qt_conv2d_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const qt_conv2d_shape *s) {
  qt_conv2d_backward_ex(dinp, 0, dweight, dbias, dout, inp, weight, s);
}

void qt_conv2d_backward_ex(float *dinp, int dinp_write, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const qt_conv2d_shape *s) {
  if (!dinp && !dweight) {
    if (dbias) bias_grad_accumulate(dbias, dout, s);
    return;
  }
  if (qt_conv2d_gemm_applies(s)) {
    if (dinp) qt_conv2d_gemm_backward_data(dinp, dinp_write, dout, weight, s);
    if (dweight) qt_conv2d_gemm_backward_weights(dweight, dout, inp, s);
    if (dbias) bias_grad_accumulate(dbias, dout, s);
    return;
  }
  if (dweight && qt_conv2d_dw_weights_applies(s)) { /* the input gradient on oneDNN's depthwise kernel */
    qt_conv2d_backward_ex(dinp, dinp_write, NULL, NULL, dout, inp, weight, s);
    qt_conv2d_dw_backward_weights(dweight, dout, inp, s);
    if (dbias) bias_grad_accumulate(dbias, dout, s);
    return;
  }
  conv_entry *e = conv_lookup(s);
  check_layout(e, s);
  const int src_blocked = s->src_blocked || e->src_as_nhwc, dst_blocked = s->dst_blocked || e->dst_as_nhwc;
  qt_dnnl_memory_bind(e->ddst, dout);
  dnnl_memory_t ddst = e->ddst;
  if (e->blocked) {
    bind_dst(e, dout, dst_blocked);
    if (!dst_blocked) qt_dnnl_reorder_run(e->ddst_in, e->ddst, e->bdst);
    ddst = e->bdst;
  }
  if (dinp && conv_c1_applies(s)) {
    conv_c1_backward_data(dinp, dinp_write, dout, weight, s);
  } else if (dinp && e->blocked) {
    /* diff_src into dinp when it is blocked and fresh, else into the source-shaped scratch, then
     * added into a blocked dinp or reordered into an NHWC one */
    const int direct = src_blocked && dinp_write;
    conv_prim *p = conv_backward_data_prim(e);
    dnnl_memory_t wei = conv_prepare_weights(e, p, weight);
    bind_src(e, dinp, direct);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, e->bsrc}};
    conv_execute(p->prim, p->pad, 3, args);
    if (src_blocked && !direct) {
      add_into(dinp, (const float *)g_bsrc, (int64_t)s->N * s->H * s->W * s->C);
    } else if (!src_blocked) {
      qt_dnnl_memory_bind(e->dsrc, dinp);
      qt_dnnl_reorder_run(dinp_write ? e->dsrc_out : e->dsrc_add, e->bsrc, e->dsrc);
    }
  } else if (dinp) {
    conv_prim *p = conv_backward_data_prim(e);
    dnnl_memory_t wei = conv_prepare_weights(e, p, weight);
    const int64_t n = (int64_t)s->N * s->H * s->W * s->C;
    float *tmp = dinp_write ? dinp : conv_scratch((size_t)n);
    qt_dnnl_memory_bind(e->dsrc, tmp);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, e->dsrc}};
    conv_execute(p->prim, p->pad, 3, args);
    if (!dinp_write) add_into(dinp, tmp, n);
  }
  if (dweight) {
    conv_backward_weights_prim(e);
    qt_dnnl_memory_bind(e->src, inp);
    dnnl_memory_t src = e->src;
    if (e->blocked) { /* the source-shaped scratch is free again (diff_src went out above) */
      bind_src(e, inp, src_blocked);
      if (!src_blocked) qt_dnnl_reorder_run(e->src_in, e->src, e->bsrc);
      src = e->bsrc;
    }
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, src},
                               {DNNL_ARG_DIFF_DST, ddst},
                               {DNNL_ARG_DIFF_WEIGHTS, e->dwei},
                               {DNNL_ARG_DIFF_BIAS, e->dbias}};
    conv_execute(e->bwd_weights, e->bwd_weights_pad, 4, args);
    qt_dnnl_memory_bind(e->dwei_user, dweight);
    qt_dnnl_reorder_run(e->dwei_reorder, e->dwei, e->dwei_user);
    if (dbias) {
      void *db = NULL;
      QT_DNNL_CHECK(dnnl_memory_get_data_handle(e->dbias, &db));
      for (int oc = 0; oc < s->OC; oc++) dbias[oc] += ((const float *)db)[oc];
    }
  } else if (dbias) {
    bias_grad_accumulate(dbias, dout, s);
  }
}
