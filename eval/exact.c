/* The exact reference representation of a Q/DQ graph (exact.h): an interpreter that keeps
 * integers as integers (int32) and every other value in float64, one chunk of images at a time,
 * each value freed after its last reader. */
#include "eval/exact.h"
#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
  EXACT_CHUNK = 32,        /* images per pass through the graph: bounds the memory */
  EXACT_DOT_SPLIT = 16384, /* int32 partial sums: 16384 * 255 * 255 < 2^31 */
};

/* How a layer (conv2d / linear) is computed. */
typedef struct {
  int integer;     /* 1: the integer path (the input's integer view, wi); 0: float64 (wd) */
  double in_scale; /* integer path: s_x; zp_x in in_zp */
  int32_t in_zp;
  int16_t *wi;        /* integer path: q_w - zp_w, conv (OC, KH, KW, C/groups), linear (OUT, IN) */
  double *wscale;     /* integer path: s_x * s_w[oc], per output channel */
  double *wd;         /* float path: the weight the graph computes with, same layout, float64 */
  double *bias;       /* per output channel (zeros without a bias); with an int32 bias its
                       * real value qb * s_x * s_w[oc] */
  int64_t *ibias;     /* integer path with an int32 bias: qb per output channel (added to
                       * the integer sum: the bias in accumulator units), else NULL */
  int OC, Cg, KH, KW; /* linear: OC = OUT, Cg = IN, KH = KW = 1 */
} layer_plan;

struct qt_exact {
  const qt_graph *g;
  layer_plan *layers; /* per node */
  int *last_use;      /* per value: the last node reading it */
  int *iq;            /* per value: the dequantize whose (s, zp) give its integer view, or -1 */
  int integer_layers;
  /* per value during a run: int32 (quantize outputs) or float64 data, chunk-sized */
  int32_t **vi;
  double **vd;
  /* buffers of values read for the last time, kept for the next value or chunk (every chunk
   * allocates the same sequence: after the first, none is allocated or faulted in again) */
  void **pool;
  int n_pool, cap_pool;
  /* teacher forcing (qt_exact_run_forced): per value, or NULL; the chunk's first image */
  const int32_t *const *forced;
  int32_t *const *own;
  int64_t image0;
  /* values written out (qt_exact_run_values): n_keep value indices and their destinations */
  const int *keep;
  float *const *keep_dst;
  int n_keep;
};

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  QT_ASSERT(p, "exact reference: out of memory for %zu bytes", bytes);
  return p;
}

/* Value buffers: a 64-byte header holds the capacity (keeps the data 64-byte aligned). */
enum { BUF_HEADER = 64 };
static size_t buf_cap(const void *b) { return *(const size_t *)((const unsigned char *)b - BUF_HEADER); }

/* The smallest pooled buffer of at least `bytes`, else a new one. */
static void *buf_get(qt_exact *x, size_t bytes) {
  int best = -1;
  for (int i = 0; i < x->n_pool; i++)
    if (buf_cap(x->pool[i]) >= bytes && (best < 0 || buf_cap(x->pool[i]) < buf_cap(x->pool[best]))) best = i;
  if (best >= 0) {
    void *b = x->pool[best];
    x->pool[best] = x->pool[--x->n_pool];
    return b;
  }
  unsigned char *m = aligned_alloc(BUF_HEADER, BUF_HEADER + ((bytes + BUF_HEADER - 1) / BUF_HEADER) * BUF_HEADER);
  QT_ASSERT(m, "exact reference: out of memory for %zu bytes", bytes);
  *(size_t *)m = bytes;
  return m + BUF_HEADER;
}

static void buf_put(qt_exact *x, void *b) {
  if (!b) return;
  if (x->n_pool == x->cap_pool) {
    x->cap_pool = x->cap_pool ? 2 * x->cap_pool : 16;
    x->pool = realloc(x->pool, (size_t)x->cap_pool * sizeof *x->pool);
    QT_ASSERT(x->pool, "out of memory");
  }
  x->pool[x->n_pool++] = b;
}

static void buf_free(void *b) {
  if (b) free((unsigned char *)b - BUF_HEADER);
}

/* The weight of layer n as float64 in the plan's layout: the dequantized integers (exact) when
 * the layer has them, else the fp32 parameter. */
static double *weight_double(const qt_graph *g, const qt_node *n, int OC, int Cg, int KH, int KW) {
  const qt_param *t = &g->tensors[n->param[QT_P_WEIGHT]];
  const float *w = g->params + t->offset;
  double *wd = xmalloc((size_t)t->numel * sizeof *wd);
  const qt_qstate *q = n->wq && n->wq->qweight ? n->wq : NULL;
  for (int o = 0; o < OC; o++)
    for (int c = 0; c < Cg; c++)
      for (int kh = 0; kh < KH; kh++)
        for (int kw = 0; kw < KW; kw++) {
          const int64_t src = (((int64_t)o * Cg + c) * KH + kh) * KW + kw; /* OIHW */
          const int64_t dst = (((int64_t)o * KH + kh) * KW + kw) * Cg + c;
          if (q) {
            const int ch = q->channels == 1 ? 0 : o;
            wd[dst] = (double)(q->qweight[src] - q->zero_point[ch]) * (double)q->scale[ch];
          } else {
            wd[dst] = (double)w[src];
          }
        }
  return wd;
}

static int plan_layer(qt_exact *x, int i, char *err) {
  const qt_graph *g = x->g;
  const qt_node *n = &g->nodes[i];
  layer_plan *p = &x->layers[i];
  const qt_value *in = &g->values[n->inputs[0]];
  if (n->op == QT_OP_CONV2D) {
    p->OC = n->attr.out_channels;
    const int groups = n->attr.groups > 0 ? n->attr.groups : 1;
    p->Cg = (int)in->shape[2] / groups;
    p->KH = n->attr.kernel_h;
    p->KW = n->attr.kernel_w;
  } else {
    p->OC = n->attr.out_channels;
    p->Cg = (int)qt_value_numel(in);
    p->KH = p->KW = 1;
  }
  p->bias = calloc((size_t)p->OC, sizeof *p->bias);
  QT_ASSERT(p->bias, "out of memory");
  if (n->param[QT_P_BIAS] >= 0) {
    const float *b = g->params + g->tensors[n->param[QT_P_BIAS]].offset;
    for (int o = 0; o < p->OC; o++) p->bias[o] = (double)b[o];
  }
  const qt_qstate *wq = n->wq && n->wq->qweight ? n->wq : NULL;
  if (wq && wq->qbias) { /* an int32 bias: qb * s_x * s_w[oc], exact in float64 (24 x 24 bits, |qb| < 2^31) */
    const int src = qt_graph_quant_source(g, n->inputs[0]);
    if (src < 0 || wq->n_qbias != p->OC)
      return qt_err(err, "exact reference: layer %s: an int32 bias without a per-tensor quantized input", n->name);
    const double s_x = (double)g->nodes[src].q->scale[0];
    for (int o = 0; o < p->OC; o++)
      p->bias[o] = (double)wq->qbias[o] * (s_x * (double)wq->scale[wq->channels == 1 ? 0 : o]);
  }
  if (!wq || x->iq[n->inputs[0]] < 0) {
    p->wd = weight_double(g, n, p->OC, p->Cg, p->KH, p->KW);
    return 0;
  }
  const qt_node *dq = &g->nodes[x->iq[n->inputs[0]]];
  const int64_t numel = (int64_t)p->OC * p->Cg * p->KH * p->KW;
  if (wq->n_qweight != numel)
    return qt_err(err, "exact reference: layer %s holds %lld integer weights for %lld", n->name,
                  (long long)wq->n_qweight, (long long)numel);
  p->integer = 1;
  p->in_scale = (double)dq->q->scale[0];
  p->in_zp = dq->q->zero_point[0];
  /* |q - zp| <= 255 (int16 operands, int32 partial sums): the integers lie in the quantize's
   * [qmin, qmax], at most 256 wide, and so does the dequantize's zero point. */
  const qt_qspec *qs = &g->nodes[g->values[dq->inputs[0]].producer].q->spec;
  if (qs->qmax - qs->qmin > 255 || p->in_zp < qs->qmin || p->in_zp > qs->qmax)
    return qt_err(err, "exact reference: %s: zero point %d and range [%d, %d] outside the 8-bit integer path", dq->name,
                  (int)p->in_zp, qs->qmin, qs->qmax);
  p->wi = xmalloc((size_t)numel * sizeof *p->wi);
  p->wscale = xmalloc((size_t)p->OC * sizeof *p->wscale);
  if (wq->qbias) {
    p->ibias = xmalloc((size_t)p->OC * sizeof *p->ibias);
    for (int o = 0; o < p->OC; o++) p->ibias[o] = wq->qbias[o];
  }
  for (int o = 0; o < p->OC; o++) {
    const int ch = wq->channels == 1 ? 0 : o;
    p->wscale[o] = p->in_scale * (double)wq->scale[ch]; /* 24 x 24 bits: exact in float64 */
    for (int c = 0; c < p->Cg; c++)
      for (int kh = 0; kh < p->KH; kh++)
        for (int kw = 0; kw < p->KW; kw++) {
          const int64_t src = (((int64_t)o * p->Cg + c) * p->KH + kh) * p->KW + kw;
          const int32_t v = wq->qweight[src] - wq->zero_point[ch];
          if (v < -255 || v > 255)
            return qt_err(err, "exact reference: layer %s: integer weight %d (zero point %d) outside the 8-bit range",
                          n->name, (int)wq->qweight[src], (int)wq->zero_point[ch]);
          p->wi[(((int64_t)o * p->KH + kh) * p->KW + kw) * p->Cg + c] = (int16_t)v;
        }
  }
  x->integer_layers++;
  return 0;
}

void qt_exact_free(qt_exact *x) {
  if (!x) return;
  for (int i = 0; x->layers && i < x->g->n_nodes; i++) {
    QT_FREE_ALL(x->layers[i].wi, x->layers[i].wscale, x->layers[i].wd, x->layers[i].bias, x->layers[i].ibias);
  }
  for (int v = 0; x->vi && v < x->g->n_values; v++) {
    buf_free(x->vi[v]);
    buf_free(x->vd[v]);
  }
  for (int i = 0; i < x->n_pool; i++) buf_free(x->pool[i]);
  QT_FREE_ALL(x->pool, x->vi, x->vd, x->layers, x->last_use, x->iq, x);
}

qt_exact *qt_exact_open(const qt_graph *g, char *err) {
  if (!g->finalized) {
    qt_err(err, "exact reference: graph %s is not finalized", g->name);
    return NULL;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN) {
      qt_err(err, "exact reference: graph %s is a prepared graph (node %s is %s): convert it to a Q/DQ graph first",
             g->name, n->name, qt_op_name(n->op));
      return NULL;
    }
    if ((n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR) && n->wq && !n->wq->qweight) {
      qt_err(err, "exact reference: layer %s of graph %s has quantized weights without integers (a prepared graph?)",
             n->name, g->name);
      return NULL;
    }
  }
  qt_exact *x = calloc(1, sizeof *x);
  QT_ASSERT(x, "out of memory");
  x->g = g;
  x->layers = calloc((size_t)g->n_nodes, sizeof *x->layers);
  x->last_use = malloc((size_t)g->n_values * sizeof *x->last_use);
  x->vi = calloc((size_t)g->n_values, sizeof *x->vi);
  x->vd = calloc((size_t)g->n_values, sizeof *x->vd);
  x->iq = malloc((size_t)g->n_values * sizeof *x->iq);
  QT_ASSERT(x->layers && x->last_use && x->vi && x->vd && x->iq, "out of memory");
  for (int v = 0; v < g->n_values; v++) {
    x->last_use[v] = v == g->output ? g->n_nodes : -1;
    x->iq[v] = -1;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    /* Integer views: a per-tensor dequantize of a quantize's integers, and max pooling or flatten
     * of such a value ((q - zp) * s is increasing in q: the max of the integers is the integer of
     * the max). */
    if (n->op == QT_OP_DEQUANTIZE && n->q->channels == 1 && n->inputs[0] != g->input &&
        g->nodes[g->values[n->inputs[0]].producer].op == QT_OP_QUANTIZE)
      x->iq[n->output] = i;
    else if ((n->op == QT_OP_MAX_POOL2D || n->op == QT_OP_FLATTEN || n->op == QT_OP_DROPOUT) &&
             x->iq[n->inputs[0]] >= 0)
      x->iq[n->output] = x->iq[n->inputs[0]];
    if ((n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR) && plan_layer(x, i, err)) {
      qt_exact_free(x);
      return NULL;
    }
    for (int k = 0; k < n->n_inputs; k++) x->last_use[n->inputs[k]] = i;
  }
  return x;
}

int64_t qt_exact_output_numel(const qt_exact *x) { return qt_value_numel(&x->g->values[x->g->output]); }
int qt_exact_integer_layers(const qt_exact *x) { return x->integer_layers; }

/* ---- the ops, on a chunk of n images ------------------------------------------------------ */

/* sum a[k] * b[k], exact: |a|, |b| <= 255, so int32 partial sums of at most EXACT_DOT_SPLIT
 * terms cannot overflow (the int16 operands let the compiler use multiply-add-pairs). */
static inline int64_t dot_i16(const int16_t *a, const int16_t *b, int len) {
  int64_t acc = 0;
  for (int k0 = 0; k0 < len; k0 += EXACT_DOT_SPLIT) {
    const int k1 = len - k0 < EXACT_DOT_SPLIT ? len : k0 + EXACT_DOT_SPLIT;
    int32_t s = 0;
#pragma omp simd reduction(+ : s)
    for (int k = k0; k < k1; k++) s += (int32_t)a[k] * (int32_t)b[k];
    acc += s;
  }
  return acc;
}

/* In order (no vector reduction): the float64 path gives the same sums on every ISA. */
static inline double dot_f64(const double *a, const double *b, int len) {
  double s = 0;
  for (int k = 0; k < len; k++) s += a[k] * b[k];
  return s;
}

/* conv2d (linear as a 1x1 conv on a 1x1 image): out (n, OH, OW, OC) float64. Each output pixel
 * gathers its receptive field per group into a patch (KH, KW, C/groups), zeros for padding (the
 * real zero: q - zp = 0), and takes one dot product per output channel with the weights in the
 * same order. */
static void run_layer(const qt_exact *x, const qt_node *nd, const layer_plan *p, double *out, int n) {
  const qt_graph *g = x->g;
  const qt_value *in = &g->values[nd->inputs[0]], *ov = &g->values[nd->output];
  const int lin = nd->op == QT_OP_LINEAR;
  const int H = lin ? 1 : (int)in->shape[0], W = lin ? 1 : (int)in->shape[1], C = lin ? p->Cg : (int)in->shape[2];
  const int OH = lin ? 1 : (int)ov->shape[0], OW = lin ? 1 : (int)ov->shape[1], OC = p->OC, Cg = p->Cg;
  const int KH = p->KH, KW = p->KW, K = KH * KW * Cg;
  const int sh = lin ? 1 : nd->attr.stride_h, sw = lin ? 1 : nd->attr.stride_w;
  const int ph = lin ? 0 : nd->attr.pad_h, pw = lin ? 0 : nd->attr.pad_w;
  const int groups = C / Cg, OCg = OC / groups;
  const int64_t in_image = (int64_t)H * W * C, out_image = (int64_t)OH * OW * OC;
  const int32_t *q = p->integer ? x->vi[nd->inputs[0]] : NULL;
  const double *xd = p->integer ? NULL : x->vd[nd->inputs[0]];
#pragma omp parallel
  {
    int16_t *pi = p->integer ? xmalloc((size_t)K * sizeof *pi) : NULL;
    double *pd = p->integer ? NULL : xmalloc((size_t)K * sizeof *pd);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < n; b++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++)
          for (int grp = 0; grp < groups; grp++) {
            int k = 0;
            for (int kh = 0; kh < KH; kh++) {
              const int ih = oh * sh - ph + kh;
              for (int kw = 0; kw < KW; kw++, k += Cg) {
                const int iw = ow * sw - pw + kw;
                const int inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
                const int64_t at = b * in_image + ((int64_t)ih * W + iw) * C + (int64_t)grp * Cg;
                for (int c = 0; c < Cg; c++) {
                  if (pi)
                    pi[k + c] = inside ? (int16_t)(q[at + c] - p->in_zp) : 0;
                  else
                    pd[k + c] = inside ? xd[at + c] : 0.0;
                }
              }
            }
            double *o = out + b * out_image + ((int64_t)oh * OW + ow) * OC;
            for (int oc = grp * OCg; oc < (grp + 1) * OCg; oc++)
              o[oc] = !pi        ? dot_f64(pd, p->wd + (int64_t)oc * K, K) + p->bias[oc]
                      : p->ibias ? (double)(dot_i16(pi, p->wi + (int64_t)oc * K, K) + p->ibias[oc]) * p->wscale[oc]
                                 : (double)dot_i16(pi, p->wi + (int64_t)oc * K, K) * p->wscale[oc] + p->bias[oc];
          }
    free(pi);
    free(pd);
  }
}

/* Max pooling of an integer view (padding ignored, as for the float64 values). */
static void run_max_pool_int(const qt_node *nd, const qt_value *in, const qt_value *ov, const int32_t *src,
                             int32_t *out, int n) {
  const int H = (int)in->shape[0], W = (int)in->shape[1], C = (int)in->shape[2];
  const int OH = (int)ov->shape[0], OW = (int)ov->shape[1];
  const qt_node_attrs *a = &nd->attr;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < n; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int c = 0; c < C; c++) {
          int32_t best = INT32_MIN;
          for (int kh = 0; kh < a->kernel_h; kh++)
            for (int kw = 0; kw < a->kernel_w; kw++) {
              const int ih = oh * a->stride_h - a->pad_h + kh, iw = ow * a->stride_w - a->pad_w + kw;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              const int32_t v = src[(((int64_t)b * H + ih) * W + iw) * C + c];
              if (v > best) best = v;
            }
          out[(((int64_t)b * OH + oh) * OW + ow) * C + c] = best;
        }
}

static void run_pool(const qt_node *nd, const qt_value *in, const qt_value *ov, const double *src, double *out, int n) {
  const int H = (int)in->shape[0], W = (int)in->shape[1], C = (int)in->shape[2];
  const int OH = (int)ov->shape[0], OW = (int)ov->shape[1];
  const qt_node_attrs *a = &nd->attr;
  const int is_max = nd->op == QT_OP_MAX_POOL2D;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < n; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int c = 0; c < C; c++) {
          double best = -INFINITY, sum = 0;
          int count = 0, seen = 0;
          for (int kh = 0; kh < a->kernel_h; kh++)
            for (int kw = 0; kw < a->kernel_w; kw++) {
              const int ih = oh * a->stride_h - a->pad_h + kh, iw = ow * a->stride_w - a->pad_w + kw;
              if (!is_max && (ih < -a->pad_h || ih >= H + a->pad_h || iw < -a->pad_w || iw >= W + a->pad_w)) continue;
              count++; /* average pools count padding (PyTorch's count_include_pad) */
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              const double v = src[(((int64_t)b * H + ih) * W + iw) * C + c];
              if (!seen || v > best || isnan(v)) best = v;
              seen = 1;
              sum += v;
            }
          out[(((int64_t)b * OH + oh) * OW + ow) * C + c] = is_max ? best : sum / count;
        }
}

/* requantization of a float64 value: round half to even of y / s, plus zp, clamped; NaN and
 * values beyond int64 go to qmin, as qt_quantize's float formula sends them. */
static inline int32_t requantize(double y, double s, double zp, double lo, double hi) {
  double q = nearbyint(y / s) + zp;
  if (!(q < 0x1p63)) q = -INFINITY;
  q = q > lo ? q : lo;
  return (int32_t)(q < hi ? q : hi);
}

/* quantize: of the graph input (fp32 data: the format's float32 formula) or of a float64 value. */
static int run_quantize(qt_exact *x, const qt_node *nd, const float *input, int64_t numel, char *err) {
  const qt_graph *g = x->g;
  const qt_qstate *q = nd->q;
  const int a = nd->inputs[0];
  const double *src = x->vd[a];
  int32_t *y = x->vi[nd->output] = buf_get(x, (size_t)numel * sizeof *y);
  if (a == g->input) {
    qt_quantize(y, input, numel / q->channels, q->channels, 1, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
  } else {
    if (!src) return qt_err(err, "exact reference: quantize %s reads integers", nd->name);
    const double lo = q->spec.qmin, hi = q->spec.qmax;
    const int C = q->channels;
    const int64_t rows = numel / C;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
      for (int c = 0; c < C; c++)
        y[r * C + c] = requantize(src[r * C + c], (double)q->scale[c], (double)q->zero_point[c], lo, hi);
  }
  if (x->forced && x->forced[nd->output]) {
    const int64_t at = x->image0 * qt_value_numel(&g->values[nd->output]);
    memcpy(x->own[nd->output] + at, y, (size_t)numel * sizeof *y);
    memcpy(y, x->forced[nd->output] + at, (size_t)numel * sizeof *y);
  }
  return 0;
}

/* dequantize into y; the integers are kept too where a later integer op reads them (iq). */
static int run_dequantize(qt_exact *x, const qt_node *nd, double *y, int64_t numel, char *err) {
  const qt_qstate *q = nd->q;
  const int v = nd->output;
  const int32_t *qi = x->vi[nd->inputs[0]];
  if (!qi) return qt_err(err, "exact reference: dequantize %s reads a float value", nd->name);
  const int C = q->channels;
  const int64_t rows = numel / C;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int c = 0; c < C; c++) y[r * C + c] = (double)(qi[r * C + c] - q->zero_point[c]) * (double)q->scale[c];
  if (x->iq[v] >= 0) {
    x->vi[v] = buf_get(x, (size_t)numel * sizeof *x->vi[v]);
    memcpy(x->vi[v], qi, (size_t)numel * sizeof *qi);
  }
  return 0;
}

/* batch norm in eval mode with its running statistics, in float64. */
static void run_batch_norm(const qt_graph *g, const qt_node *nd, const double *src, double *y, int64_t numel) {
  const qt_value *ov = &g->values[nd->output];
  const int C = (int)ov->shape[ov->ndim - 1];
  const float *gm = g->params + g->tensors[nd->param[QT_P_GAMMA]].offset;
  const float *bt = g->params + g->tensors[nd->param[QT_P_BETA]].offset;
  const float *mu = g->buffers + g->tensors[nd->buffer[QT_B_RUNNING_MEAN]].offset;
  const float *var = g->buffers + g->tensors[nd->buffer[QT_B_RUNNING_VAR]].offset;
  double *sd = xmalloc((size_t)C * sizeof *sd);
  for (int c = 0; c < C; c++) sd[c] = sqrt((double)var[c] + (double)nd->attr.eps);
  const int64_t rows = numel / C;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int c = 0; c < C; c++) y[r * C + c] = (src[r * C + c] - mu[c]) / sd[c] * gm[c] + bt[c];
  free(sd);
}

/* Layer norm of every row of C channels in float64 (the biased variance, as PyTorch's). */
static void run_layer_norm(const qt_graph *g, const qt_node *nd, const double *src, double *y, int64_t numel) {
  const qt_value *ov = &g->values[nd->output];
  const int64_t C = ov->shape[ov->ndim - 1], rows = numel / C;
  const float *gm = g->params + g->tensors[nd->param[QT_P_GAMMA]].offset;
  const float *bt = g->params + g->tensors[nd->param[QT_P_BETA]].offset;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const double *s = src + r * C;
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; c++) m += s[c];
    m /= (double)C;
    for (int64_t c = 0; c < C; c++) v += (s[c] - m) * (s[c] - m);
    const double sd = sqrt(v / (double)C + (double)nd->attr.eps);
    for (int64_t c = 0; c < C; c++) y[r * C + c] = (s[c] - m) / sd * gm[c] + bt[c];
  }
}

/* Multi-head attention of q, k, v (n images of T pixels, C channels) in float64, per image and
 * head: softmax(Q K^T / sqrt(C / heads)) V. */
static void run_attention(const qt_graph *g, const qt_node *nd, const double *q, const double *k, const double *v,
                          double *y, int n) {
  const qt_value *ov = &g->values[nd->output];
  const int64_t T = ov->shape[0] * ov->shape[1], C = ov->shape[2], H = nd->attr.heads, dh = C / H;
  const double scale = 1.0 / sqrt((double)dh);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < (int64_t)n * H; bh++) {
    const int64_t o = bh / H * T * C + bh % H * dh;
    double *p = xmalloc((size_t)T * sizeof *p);
    for (int64_t i = 0; i < T; i++) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < T; j++) {
        double s = 0;
        for (int64_t d = 0; d < dh; d++) s += q[o + i * C + d] * k[o + j * C + d];
        p[j] = s * scale;
        mx = p[j] > mx ? p[j] : mx;
      }
      for (int64_t j = 0; j < T; j++) sum += p[j] = exp(p[j] - mx);
      for (int64_t d = 0; d < dh; d++) {
        double s = 0;
        for (int64_t j = 0; j < T; j++) s += p[j] * v[o + j * C + d];
        y[o + i * C + d] = s / sum;
      }
    }
    free(p);
  }
}

/* relu (six: relu6) in float64; NaN passes through. */
static void run_relu(const double *src, double *y, int64_t numel, int six) {
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < numel; k++) {
    const double t = src[k] > 0 ? src[k] : (src[k] == src[k] ? 0.0 : src[k]);
    y[k] = six && !(t < 6) ? 6.0 : t;
  }
}

/* The activations of qt_activation in float64 (the formulas of autograd/ops_act.c; hard sigmoid
 * with PyTorch's (1/6, 1/2) as relu6(x + 3) / 6). */
static double act_f64(double v, const qt_node_attrs *a) {
  const double al = a->alpha, be = a->beta;
  switch ((qt_act_kind)a->act) {
    case QT_ACT_SIGMOID: return 1.0 / (1.0 + exp(-v));
    case QT_ACT_TANH: return tanh(v);
    case QT_ACT_SILU: return v / (1.0 + exp(-v));
    case QT_ACT_HARDSIGMOID: {
      const double t = qt_act_torch_hardsigmoid(a->alpha, a->beta) ? (v + 3.0) / 6.0 : al * v + be;
      return t < 0 ? 0.0 : t > 1 ? 1.0 : t;
    }
    case QT_ACT_HARDSWISH: {
      const double t = v + 3.0 < 0 ? 0.0 : v + 3.0 > 6 ? 6.0 : v + 3.0;
      return v * t / 6.0;
    }
    case QT_ACT_GELU: return v * 0.5 * (1.0 + erf(v * 0.70710678118654752440));
    case QT_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    case QT_ACT_LEAKY_RELU: return v > 0 ? v : v * al;
    case QT_ACT_ELU: return v <= 0 ? al * (exp(v) - 1.0) : v;
    case QT_ACT_AFFINE: return al * v + be;
    case QT_ACT_DIV: return v / al;
    case QT_ACT_COUNT: break;
  }
  return NAN;
}

static void run_global_avg_pool(const qt_value *in, const double *src, double *y, int n) {
  const int64_t HW = in->shape[0] * in->shape[1], C = in->shape[2];
#pragma omp parallel for schedule(static)
  for (int b = 0; b < n; b++)
    for (int64_t c = 0; c < C; c++) {
      double s = 0;
      for (int64_t k = 0; k < HW; k++) s += src[((int64_t)b * HW + k) * C + c];
      y[(int64_t)b * C + c] = s / (double)HW;
    }
}

/* Node i of a float64 value y (n images); the integers too where a later integer op reads them. */
static int run_float_node(qt_exact *x, int i, double *y, int n, int64_t numel, char *err) {
  const qt_graph *g = x->g;
  const qt_node *nd = &g->nodes[i];
  const int v = nd->output, a = nd->n_inputs > 0 ? nd->inputs[0] : -1;
  const double *src = a >= 0 ? x->vd[a] : NULL;
  switch (nd->op) {
    case QT_OP_DEQUANTIZE: return run_dequantize(x, nd, y, numel, err);
    case QT_OP_CONV2D:
    case QT_OP_LINEAR: run_layer(x, nd, &x->layers[i], y, n); return 0;
    case QT_OP_BATCH_NORM: run_batch_norm(g, nd, src, y, numel); return 0;
    case QT_OP_LAYER_NORM: run_layer_norm(g, nd, src, y, numel); return 0;
    case QT_OP_ATTENTION: run_attention(g, nd, src, x->vd[nd->inputs[1]], x->vd[nd->inputs[2]], y, n); return 0;
    case QT_OP_ADD_PARAM: { /* a tensor of one image's shape */
      const float *p = g->params + g->tensors[nd->param[QT_P_WEIGHT]].offset;
      const int64_t per = numel / n;
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < numel; k++) y[k] = src[k] + p[k % per];
      return 0;
    }
    case QT_OP_PRELU: { /* in float64, as the other fp32 ops here */
      const qt_param *w = &g->tensors[nd->param[QT_P_WEIGHT]];
      const float *p = g->params + w->offset;
      const int64_t C = g->values[v].shape[g->values[v].ndim - 1];
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < numel; k++) y[k] = src[k] > 0.0f ? src[k] : p[w->numel == 1 ? 0 : k % C] * src[k];
      return 0;
    }
    case QT_OP_RELU: run_relu(src, y, numel, 0); return 0;
    case QT_OP_RELU6: run_relu(src, y, numel, 1); return 0;
    case QT_OP_MAX_POOL2D:
    case QT_OP_AVG_POOL2D:
      run_pool(nd, &g->values[a], &g->values[v], src, y, n);
      if (x->iq[v] >= 0) {
        x->vi[v] = buf_get(x, (size_t)numel * sizeof *x->vi[v]);
        run_max_pool_int(nd, &g->values[a], &g->values[v], x->vi[a], x->vi[v], n);
      }
      return 0;
    case QT_OP_GLOBAL_AVG_POOL: run_global_avg_pool(&g->values[a], src, y, n); return 0;
    case QT_OP_FLATTEN:
    case QT_OP_DROPOUT: /* the identity in eval (convert leaves it out; a file may still hold one) */
      memcpy(y, src, (size_t)numel * sizeof *y);
      if (x->iq[v] >= 0) {
        x->vi[v] = buf_get(x, (size_t)numel * sizeof *x->vi[v]);
        memcpy(x->vi[v], x->vi[a], (size_t)numel * sizeof *x->vi[v]);
      }
      return 0;
    case QT_OP_ADD: {
      const double *s2 = x->vd[nd->inputs[1]];
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < numel; k++) y[k] = src[k] + s2[k];
      return 0;
    }
    case QT_OP_ACTIVATION:
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < numel; k++) y[k] = act_f64(src[k], &nd->attr);
      return 0;
    case QT_OP_MUL: { /* b of a's shape, or a (C) vector per sample scaling every pixel */
      const double *s2 = x->vd[nd->inputs[1]];
      const int64_t per = numel / n, C = g->values[nd->inputs[1]].ndim == 1 ? g->values[nd->inputs[1]].shape[0] : per;
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < numel; k++) y[k] = src[k] * s2[k / per * C + k % C];
      return 0;
    }
    case QT_OP_CONCAT: { /* along the last dim (channels or features) */
      const qt_value *ov = &g->values[v];
      const int64_t Y = ov->shape[ov->ndim - 1], rows = numel / Y;
      int64_t off = 0;
      for (int k = 0; k < nd->n_inputs; k++) {
        const qt_value *iv = &g->values[nd->inputs[k]];
        const int64_t C = iv->shape[iv->ndim - 1];
        const double *sk = x->vd[nd->inputs[k]];
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) memcpy(y + r * Y + off, sk + r * C, (size_t)C * sizeof *y);
        off += C;
      }
      return 0;
    }
    case QT_OP_CHANNEL_SHUFFLE:
    case QT_OP_CHANNEL_SLICE: { /* copies along the last dim: channels */
      const qt_value *iv = &g->values[a];
      const int shuffle = nd->op == QT_OP_CHANNEL_SHUFFLE, G = shuffle ? nd->attr.groups : 1;
      const int64_t C = iv->shape[iv->ndim - 1], K = shuffle ? C : nd->attr.end - nd->attr.begin, rows = numel / K,
                    per = C / G;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k++)
          y[r * K + k] = src[r * C + (shuffle ? (k % G) * per + k / G : nd->attr.begin + k)];
      return 0;
    }
    case QT_OP_RESIZE: { /* by 2: autograd/ops_resize.c's sources and weights, in float64 */
      const qt_value *iv = &g->values[a];
      const int64_t H = iv->shape[0], W = iv->shape[1], C = iv->shape[2], OH = 2 * H, OW = 2 * W;
      const int bil = nd->attr.mode == QT_RESIZE_BILINEAR;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < (int64_t)n * OH; r++) {
        const int64_t b = r / OH, oh = r % OH;
        double fh = bil ? fmax(0.5 * ((double)oh + 0.5) - 0.5, 0.0) : (double)(oh / 2);
        const int64_t h0 = (int64_t)fh, h1 = h0 + (bil && h0 < H - 1 ? 1 : 0);
        const double a1 = fh - (double)h0, a0 = 1.0 - a1;
        for (int64_t ow = 0; ow < OW; ow++) {
          double fw = bil ? fmax(0.5 * ((double)ow + 0.5) - 0.5, 0.0) : (double)(ow / 2);
          const int64_t w0 = (int64_t)fw, w1 = w0 + (bil && w0 < W - 1 ? 1 : 0);
          const double b1 = fw - (double)w0, b0 = 1.0 - b1;
          const double *s = src + b * H * W * C;
          double *o = y + (r * OW + ow) * C;
          for (int64_t c = 0; c < C; c++)
            o[c] = (s[(h0 * W + w0) * C + c] * b0 + s[(h0 * W + w1) * C + c] * b1) * a0 +
                   (s[(h1 * W + w0) * C + c] * b0 + s[(h1 * W + w1) * C + c] * b1) * a1;
        }
      }
      return 0;
    }
    case QT_OP_PREPEND_TOKEN: { /* the learned token, then the input's tokens */
      const float *p = g->params + g->tensors[nd->param[QT_P_WEIGHT]].offset;
      const int64_t per = numel / n, C = g->values[v].shape[2];
      for (int b = 0; b < n; b++) {
        for (int64_t c = 0; c < C; c++) y[b * per + c] = p[c];
        memcpy(y + b * per + C, src + b * (per - C), (size_t)(per - C) * sizeof *y);
      }
      return 0;
    }
    case QT_OP_FIRST_TOKEN: { /* the first token's features */
      const int64_t C = numel / n, per = qt_value_numel(&g->values[a]);
      for (int b = 0; b < n; b++) memcpy(y + b * C, src + b * per, (size_t)C * sizeof *y);
      return 0;
    }
    default: return qt_err(err, "exact reference: node %s: op %s has no exact form", nd->name, qt_op_name(nd->op));
  }
}

/* The values node i read for the last time: their buffers go back to the pool. */
static void release_inputs(qt_exact *x, const qt_node *nd, int i) {
  for (int k = 0; k < nd->n_inputs; k++) {
    const int u = nd->inputs[k];
    if (x->last_use[u] != i) continue;
    buf_put(x, x->vi[u]);
    buf_put(x, x->vd[u]);
    x->vi[u] = NULL;
    x->vd[u] = NULL;
  }
}

/* Copies value v of the chunk (numel elements from image image0) to the destinations that asked
 * for it: float64 data rounded to float32; a quantize's integers (its output holds no float64 data)
 * dequantized in float32, (q - zp) * s, as a device returns them. */
static void keep_value(qt_exact *x, int v, int64_t numel) {
  for (int k = 0; k < x->n_keep; k++) {
    if (x->keep[k] != v) continue;
    float *dst = x->keep_dst[k] + x->image0 * qt_value_numel(&x->g->values[v]);
    if (x->vd[v]) {
      for (int64_t e = 0; e < numel; e++) dst[e] = (float)x->vd[v][e];
    } else {
      const qt_qstate *q = x->g->nodes[x->g->values[v].producer].q;
      const int C = q->channels;
      for (int64_t e = 0; e < numel; e++) dst[e] = (float)(x->vi[v][e] - q->zero_point[e % C]) * q->scale[e % C];
    }
  }
}

/* One chunk of n images from in (n, H, W, C) fp32 to out (n, output numel) fp32. Elementwise
 * passes run in parallel over rows of the channel axis (each element's arithmetic is the same
 * whichever thread computes it). */
static int run_chunk(qt_exact *x, float *out, const float *input, int n, char *err) {
  const qt_graph *g = x->g;
  int rc = 0;
  for (int i = 0; i < g->n_nodes && !rc; i++) {
    const qt_node *nd = &g->nodes[i];
    const int64_t numel = qt_value_numel(&g->values[nd->output]) * n;
    if (nd->op == QT_OP_QUANTIZE) {
      if ((rc = run_quantize(x, nd, input, numel, err))) break;
    } else if (nd->op == QT_OP_INPUT) {
      double *y = x->vd[nd->output] = buf_get(x, (size_t)numel * sizeof *y);
      for (int64_t k = 0; k < numel; k++) y[k] = (double)input[k];
    } else {
      double *y = x->vd[nd->output] = buf_get(x, (size_t)numel * sizeof *y);
      rc = run_float_node(x, i, y, n, numel, err);
    }
    if (!rc && x->n_keep) keep_value(x, nd->output, numel);
    release_inputs(x, nd, i);
  }
  if (!rc) {
    const int o = g->output;
    const int64_t numel = qt_value_numel(&g->values[o]) * n;
    if (!x->vd[o])
      rc = qt_err(err, "exact reference: graph %s: the output is integers", g->name);
    else
      for (int64_t k = 0; k < numel; k++) out[k] = (float)x->vd[o][k];
  }
  for (int v = 0; v < g->n_values; v++) {
    buf_put(x, x->vi[v]);
    buf_put(x, x->vd[v]);
    x->vi[v] = NULL;
    x->vd[v] = NULL;
  }
  return rc;
}

int qt_exact_run_forced(qt_exact *x, float *out, const float *input, int n, const int32_t *const *forced,
                        int32_t *const *own, char *err) {
  const qt_value *in = &x->g->values[x->g->input];
  const int64_t in_image = qt_value_numel(in), out_image = qt_exact_output_numel(x);
  x->forced = forced;
  x->own = own;
  int rc = 0;
  for (int b = 0; b < n && !rc; b += EXACT_CHUNK) {
    const int m = n - b < EXACT_CHUNK ? n - b : EXACT_CHUNK;
    x->image0 = b;
    rc = run_chunk(x, out + b * out_image, input + b * in_image, m, err);
  }
  x->forced = NULL;
  x->own = NULL;
  return rc;
}

int qt_exact_run(qt_exact *x, float *out, const float *input, int n, char *err) {
  return qt_exact_run_forced(x, out, input, n, NULL, NULL, err);
}

int qt_exact_run_values(qt_exact *x, float *out, const float *input, int n, const int *values, float *const *dst,
                        int n_values, char *err) {
  x->keep = values;
  x->keep_dst = dst;
  x->n_keep = n_values;
  const int rc = qt_exact_run_forced(x, out, input, n, NULL, NULL, err);
  x->keep = NULL;
  x->keep_dst = NULL;
  x->n_keep = 0;
  return rc;
}
