/* oneDNN 2.6 int8 primitives for the lowered model (see int8.h). The requantization oneDNN
 * computes is dst = sat(nearbyint(post_ops((acc + bias) * oscale[c])) + zp_dst) (docs/design.md: no VNNI):
 * the caller passes the bias already divided by s_x * s_w[c] and the clip bounds in output
 * units, so the result equals clamp(round(acc_real / s_out) + zp, qmin, qmax) up to float
 * rounding of the scales. Zero points are runtime arguments: the x64 int8 convolution only
 * implements them in that form, and it treats padding as zp_src (zero in real space).
 * Note the order: oneDNN rounds x + zp_dst where the reference rounds x and then adds zp;
 * on an exact .5 tie the two agree only for an even zp_dst (the caller uses an f32 dst and
 * requantizes itself for an odd one). */
#include "backend/int8.h"
#include "backend/int8_conv1.h"
#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/dnnl_util.h"

#define INT8_CACHE_SIZE 3

typedef struct {
  int N; /* 0 = empty */
  dnnl_primitive_t prim;
  dnnl_memory_t wei;      /* primitive-layout weights (owned), NULL for pooling */
  dnnl_memory_t src, dst; /* unbound, set per call */
} int8_entry;

struct qt_int8_op {
  qt_int8_params p;
  int8_t *weight;               /* OIHW / (OUT, IN) */
  float *oscale;                /* OC */
  dnnl_memory_t bias;           /* owned (OC) f32 */
  dnnl_memory_t zp_src, zp_dst; /* owned s32 (1) */
  int8_entry cache[INT8_CACHE_SIZE];
  int next;
  qt_conv1 *conv1; /* our kernel for one input channel (int8_conv1.c) instead of oneDNN's */
  char impl[64];
};

static dnnl_memory_desc_t md_tag(int ndims, const dnnl_dims_t dims, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
  dnnl_memory_desc_t md;
  QT_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&md, ndims, dims, dt, tag));
  return md;
}

static dnnl_memory_desc_t src_md(const qt_int8_params *p, int N) {
  if (p->kind == QT_INT8_LINEAR) {
    const dnnl_dims_t d = {N, p->C};
    return md_tag(2, d, dnnl_u8, dnnl_nc);
  }
  const dnnl_dims_t d = {N, p->C, p->H, p->W};
  return md_tag(4, d, dnnl_u8, dnnl_nhwc);
}

static dnnl_memory_desc_t dst_md(const qt_int8_params *p, int N) {
  if (p->kind == QT_INT8_LINEAR) {
    const dnnl_dims_t d = {N, p->OC};
    return md_tag(2, d, p->dst_f32 ? dnnl_f32 : dnnl_u8, dnnl_nc);
  }
  const dnnl_dims_t d = {N, p->OC, p->OH, p->OW};
  return md_tag(4, d, p->dst_f32 ? dnnl_f32 : dnnl_u8, dnnl_nhwc);
}

static int groups_of(const qt_int8_params *p) { return p->groups > 1 ? p->groups : 1; }

static dnnl_memory_desc_t wei_md(const qt_int8_params *p, int any) {
  if (p->kind == QT_INT8_LINEAR) {
    const dnnl_dims_t d = {p->OC, p->C};
    return md_tag(2, d, dnnl_s8, any ? dnnl_format_tag_any : dnnl_oi);
  }
  const int G = groups_of(p);
  if (G > 1) { /* (G, OC/G, C/G, KH, KW): the same bytes as (OC, C/G, KH, KW) */
    const dnnl_dims_t d = {G, p->OC / G, p->C / G, p->KH, p->KW};
    return md_tag(5, d, dnnl_s8, any ? dnnl_format_tag_any : dnnl_goihw);
  }
  const dnnl_dims_t d = {p->OC, p->C, p->KH, p->KW};
  return md_tag(4, d, dnnl_s8, any ? dnnl_format_tag_any : dnnl_oihw);
}

/* Builds the primitive descriptor for batch N; returns oneDNN's status (unimplemented when
 * no kernel takes the scheme). */
static dnnl_status_t make_pd(const qt_int8_op *op, int N, dnnl_primitive_desc_t *pd) {
  const qt_int8_params *p = &op->p;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  QT_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
  if (p->kind != QT_INT8_MAX_POOL) {
    QT_DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, p->OC, 1 << 1, op->oscale));
    const int32_t runtime = DNNL_RUNTIME_S32_VAL;
    if (p->zp_src) QT_DNNL_CHECK(dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0, &runtime));
    if (p->zp_dst) QT_DNNL_CHECK(dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_DST, 1, 0, &runtime));
    if (p->relu || p->relu6 || p->clip) {
      QT_DNNL_CHECK(dnnl_post_ops_create(&ops));
      /* One eltwise post-op (qt_int8_post_bounds). (oneDNN 2.6 dropped the second of two clip
       * post-ops in its int8 convolutions: a 4-bit relu6 output whose 6 / s_out exceeds 15
       * reached 16 and 17, found on the MobileNet-style W4A4 model.) */
      float lo, hi;
      qt_int8_post_bounds(p, &lo, &hi);
      if (!p->clip && !p->relu6)
        QT_DNNL_CHECK(dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
      else
        QT_DNNL_CHECK(dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_clip, lo, hi));
      QT_DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
    }
  }
  dnnl_memory_desc_t s = src_md(p, N), d = dst_md(p, N);
  const dnnl_dims_t strides = {p->stride_h, p->stride_w}, pad = {p->pad_h, p->pad_w}, kernel = {p->KH, p->KW};
  dnnl_status_t st;
  if (p->kind == QT_INT8_CONV || p->kind == QT_INT8_LINEAR) {
    dnnl_memory_desc_t w = wei_md(p, 1);
    const dnnl_dims_t bd = {p->OC};
    dnnl_memory_desc_t b = md_tag(1, bd, dnnl_f32, dnnl_x);
    if (p->kind == QT_INT8_CONV) {
      dnnl_convolution_desc_t cd;
      QT_DNNL_CHECK(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &s, &w, &b,
                                                       &d, strides, pad, pad));
      st = dnnl_primitive_desc_create(pd, &cd, attr, qt_dnnl_engine(), NULL);
    } else {
      dnnl_inner_product_desc_t id;
      QT_DNNL_CHECK(dnnl_inner_product_forward_desc_init(&id, dnnl_forward_inference, &s, &w, &b, &d));
      st = dnnl_primitive_desc_create(pd, &id, attr, qt_dnnl_engine(), NULL);
    }
  } else {
    /* right / bottom padding as the output size asks: a ceil-mode pool's last window hangs over
     * the input (oneDNN's max ignores padding); in floor mode this is the left padding */
    const int rh = (p->OH - 1) * p->stride_h + p->KH - p->H - p->pad_h,
              rw = (p->OW - 1) * p->stride_w + p->KW - p->W - p->pad_w;
    const dnnl_dims_t pad_r = {rh > p->pad_h ? rh : p->pad_h, rw > p->pad_w ? rw : p->pad_w};
    dnnl_pooling_desc_t pl;
    QT_DNNL_CHECK(dnnl_pooling_forward_desc_init(&pl, dnnl_forward_inference, dnnl_pooling_max, &s, &d, strides, kernel,
                                                 pad, pad_r));
    st = dnnl_primitive_desc_create(pd, &pl, attr, qt_dnnl_engine(), NULL);
  }
  if (ops) QT_DNNL_CHECK(dnnl_post_ops_destroy(ops));
  QT_DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  return st;
}

static void entry_release(int8_entry *e) {
  qt_dnnl_primitive_destroy(&e->prim);
  qt_dnnl_memory_destroy(&e->wei);
  qt_dnnl_memory_destroy(&e->src);
  qt_dnnl_memory_destroy(&e->dst);
  e->N = 0;
}

/* Creates the primitive for batch N into e, reordering the weights into its layout. */
static dnnl_status_t entry_build(qt_int8_op *op, int8_entry *e, int N) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t st = make_pd(op, N, &pd);
  if (st != dnnl_success) return st;
  const char *impl = NULL;
  QT_DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
  snprintf(op->impl, sizeof op->impl, "%s", impl ? impl : "?");
  e->prim = qt_dnnl_primitive_create(pd);
  e->src = qt_dnnl_memory_unbound(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0));
  e->dst = qt_dnnl_memory_unbound(dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
  if (op->p.kind != QT_INT8_MAX_POOL) {
    const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_desc_t user = wei_md(&op->p, 0);
    dnnl_memory_t user_mem = qt_dnnl_memory_unbound(&user);
    qt_dnnl_memory_bind(user_mem, op->weight);
    e->wei = qt_dnnl_memory_owned(want);
    dnnl_primitive_t r = qt_dnnl_reorder_create(&user, want, 0);
    qt_dnnl_reorder_run(r, user_mem, e->wei);
    qt_dnnl_primitive_destroy(&r);
    qt_dnnl_memory_destroy(&user_mem);
  }
  QT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  e->N = N;
  return dnnl_success;
}

static dnnl_memory_t s32_scalar(int32_t v) {
  const dnnl_dims_t d = {1};
  dnnl_memory_desc_t md = md_tag(1, d, dnnl_s32, dnnl_x);
  dnnl_memory_t m = qt_dnnl_memory_owned(&md);
  void *h = NULL;
  QT_DNNL_CHECK(dnnl_memory_get_data_handle(m, &h));
  *(int32_t *)h = v;
  return m;
}

qt_int8_op *qt_int8_op_create(const qt_int8_params *p, const int8_t *weight, const float *bias, const float *oscale,
                              char *err) {
  qt_int8_op *op = calloc(1, sizeof *op);
  if (!op) qt_dnnl_die(__FILE__, __LINE__, "out of memory");
  op->p = *p;
  if (!p->dnnl_only && (op->conv1 = qt_conv1_create(p, weight, bias, oscale))) {
    snprintf(op->impl, sizeof op->impl, "own:conv1_direct");
    return op;
  }
  qt_dnnl_engine();
  if (p->kind != QT_INT8_MAX_POOL) {
    const size_t nw =
        (size_t)p->OC * (size_t)(p->C / groups_of(p)) * (p->kind == QT_INT8_CONV ? (size_t)p->KH * p->KW : 1);
    op->weight = malloc(nw);
    op->oscale = malloc((size_t)p->OC * sizeof(float));
    if (!op->weight || !op->oscale) qt_dnnl_die(__FILE__, __LINE__, "out of memory");
    memcpy(op->weight, weight, nw);
    memcpy(op->oscale, oscale, (size_t)p->OC * sizeof(float));
    const dnnl_dims_t bd = {p->OC};
    dnnl_memory_desc_t bmd = md_tag(1, bd, dnnl_f32, dnnl_x);
    op->bias = qt_dnnl_memory_owned(&bmd);
    void *h = NULL;
    QT_DNNL_CHECK(dnnl_memory_get_data_handle(op->bias, &h));
    memcpy(h, bias, (size_t)p->OC * sizeof(float));
    if (p->zp_src) op->zp_src = s32_scalar(p->zp_src);
    if (p->zp_dst) op->zp_dst = s32_scalar(p->zp_dst);
  }
  /* Probe: does oneDNN implement this scheme at all? (Batch 1; kept as a cache entry.) */
  dnnl_status_t st = entry_build(op, &op->cache[0], 1);
  if (st != dnnl_success) {
    snprintf(err, QT_ERR_LEN, "oneDNN 2.6 has no %s kernel for this scheme (%s)",
             p->kind == QT_INT8_CONV     ? (groups_of(p) > 1 ? "grouped int8 convolution" : "int8 convolution")
             : p->kind == QT_INT8_LINEAR ? "int8 inner product"
                                         : "u8 max pooling",
             st == dnnl_unimplemented ? "unimplemented" : "invalid arguments");
    qt_int8_op_free(op);
    return NULL;
  }
  op->next = 1;
  return op;
}

static int8_entry *entry_for(qt_int8_op *op, int N) {
  for (int i = 0; i < INT8_CACHE_SIZE; i++)
    if (op->cache[i].N == N) return &op->cache[i];
  int8_entry *e = &op->cache[op->next];
  op->next = (op->next + 1) % INT8_CACHE_SIZE;
  entry_release(e);
  /* The probe succeeded for batch 1; another batch size failing is a broken invariant. */
  QT_DNNL_CHECK(entry_build(op, e, N));
  return e;
}

void qt_int8_op_run(qt_int8_op *op, void *dst, const uint8_t *src, int N) {
  if (op->conv1) {
    qt_conv1_run(op->conv1, dst, src, N);
    return;
  }
  int8_entry *e = entry_for(op, N);
  qt_dnnl_memory_bind(e->src, src);
  qt_dnnl_memory_bind(e->dst, dst);
  dnnl_exec_arg_t args[6];
  int n = 0;
  args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, e->src};
  args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, e->dst};
  if (e->wei) {
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, e->wei};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, op->bias};
  }
  if (op->zp_src) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, op->zp_src};
  if (op->zp_dst) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, op->zp_dst};
  qt_dnnl_execute(e->prim, n, args);
}

void qt_int8_op_free(qt_int8_op *op) {
  if (!op) return;
  qt_conv1_free(op->conv1);
  for (int i = 0; i < INT8_CACHE_SIZE; i++) entry_release(&op->cache[i]);
  qt_dnnl_memory_destroy(&op->bias);
  qt_dnnl_memory_destroy(&op->zp_src);
  qt_dnnl_memory_destroy(&op->zp_dst);
  QT_FREE_ALL(op->weight, op->oscale, op);
}

const char *qt_int8_op_impl(const qt_int8_op *op) { return op->impl; }
