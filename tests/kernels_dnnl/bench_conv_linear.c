/* Benchmark (not a test): ms per forward / backward-data / backward-weights call of the conv2d
 * and linear kernels at FashionCNN's shapes, batch 128 (and 256 for eval-mode linear). For
 * the record of the linear design choice it also times oneDNN's inner-product primitives on
 * the same shapes (weights in the primitive's preferred layout, reorders and gradient
 * accumulation included, as a kernel would have to do them).
 * Usage: bench_conv_linear [seconds per measurement, default 0.5]. Threads: OMP_NUM_THREADS. */
#include "autograd/kernels.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tests/common/testutil.h"

static double g_budget = 0.5;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef void (*bench_fn)(void *ctx);

/* ms per call: the best of 5 runs' means, each run lasting budget/5 seconds, after a warm-up
 * (the first call creates and caches the primitives). The best run is the one least disturbed
 * by other processes on this shared 2-core machine. */
static double time_ms(bench_fn fn, void *ctx) {
  for (int i = 0; i < 3; i++) fn(ctx);
  double best = 1e30;
  for (int run = 0; run < 5; run++) {
    int iters = 0;
    const double t0 = now_s();
    double t = t0;
    while (t - t0 < g_budget / 5 || iters < 3) {
      fn(ctx);
      iters++;
      t = now_s();
    }
    const double ms = 1e3 * (t - t0) / iters;
    if (ms < best) best = ms;
  }
  return best;
}

/* ---- conv2d ------------------------------------------------------------------------------ */

typedef struct {
  qt_conv2d_shape s;
  float *inp, *weight, *out, *dout, *dinp, *dweight;
} conv_case;

static void conv_fwd(void *c) {
  conv_case *k = c;
  qt_conv2d_forward(k->out, k->inp, k->weight, NULL, &k->s);
}
static void conv_bwd_data(void *c) {
  conv_case *k = c;
  qt_conv2d_backward(k->dinp, NULL, NULL, k->dout, k->inp, k->weight, &k->s);
}
static void conv_bwd_weights(void *c) {
  conv_case *k = c;
  qt_conv2d_backward(NULL, k->dweight, NULL, k->dout, k->inp, k->weight, &k->s);
}

static void bench_conv(const char *name, int N, int H, int C, int OC) {
  conv_case k = {.s = {.N = N, .H = H, .W = H, .C = C, .OC = OC, .KH = 3, .KW = 3, .stride_h = 1, .stride_w = 1,
                       .pad_h = 1, .pad_w = 1, .groups = 1}};
  if (qt_conv2d_shape_init(&k.s) != 0) {
    fprintf(stderr, "bench: bad conv shape\n");
    exit(1);
  }
  const int64_t ni = (int64_t)N * H * H * C, no = (int64_t)N * k.s.OH * k.s.OW * OC, nw = (int64_t)OC * C * 9;
  k.inp = qt_test_uniform(ni, 1);
  k.weight = qt_test_uniform(nw, 2);
  k.out = qt_test_uniform(no, 3);
  k.dout = qt_test_uniform(no, 4);
  k.dinp = qt_test_uniform(ni, 5);
  k.dweight = qt_test_uniform(nw, 6);
  const double gflop = 2.0 * (double)no * C * 9 * 1e-9;
  const double f = time_ms(conv_fwd, &k), bd = time_ms(conv_bwd_data, &k), bw = time_ms(conv_bwd_weights, &k);
  printf("%-34s fwd %7.3f  bwd_data %7.3f  bwd_weights %7.3f ms   (fwd %5.1f GFLOP/s)\n", name, f, bd, bw,
         gflop / (f * 1e-3));
  free(k.inp), free(k.weight), free(k.out), free(k.dout), free(k.dinp), free(k.dweight);
}

/* ---- linear: the kernels (dnnl_sgemm) ------------------------------------------------------ */

typedef struct {
  int N, IN, OUT;
  float *inp, *weight, *bias, *out, *dout, *dinp, *dweight, *dbias;
} linear_case;

static void lin_fwd(void *c) {
  linear_case *k = c;
  qt_linear_forward(k->out, k->inp, k->weight, k->bias, k->N, k->IN, k->OUT);
}
static void lin_bwd_data(void *c) {
  linear_case *k = c;
  qt_linear_backward(k->dinp, NULL, NULL, k->dout, k->inp, k->weight, k->N, k->IN, k->OUT);
}
static void lin_bwd_weights(void *c) {
  linear_case *k = c;
  qt_linear_backward(NULL, k->dweight, k->dbias, k->dout, k->inp, k->weight, k->N, k->IN, k->OUT);
}

/* ---- linear: oneDNN inner product, for comparison ----------------------------------------- */

#define CHECK(x)                                                                          \
  do {                                                                                    \
    dnnl_status_t st_ = (x);                                                              \
    if (st_ != dnnl_success) {                                                            \
      fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)st_);      \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

typedef struct {
  linear_case *k;
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  dnnl_primitive_t fwd, bwd_d, bwd_w, wei_to_fwd, wei_to_bwd_d, dwei_back;
  dnnl_memory_t src, wei_user, wei_fwd, wei_bwd_d, bias, dst, ddst, dsrc, dwei, dwei_user, dbias;
  float *dsrc_scratch;
} ip_case;

static dnnl_memory_desc_t md2(dnnl_dim_t a, dnnl_dim_t b, dnnl_format_tag_t tag) {
  dnnl_memory_desc_t md;
  const dnnl_dims_t d = {a, b};
  CHECK(dnnl_memory_desc_init_by_tag(&md, 2, d, dnnl_f32, tag));
  return md;
}

static dnnl_primitive_t make_prim(dnnl_primitive_desc_t pd) {
  dnnl_primitive_t p;
  CHECK(dnnl_primitive_create(&p, pd));
  return p;
}

static dnnl_primitive_t make_reorder(ip_case *c, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                                     int accumulate) {
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  if (accumulate) {
    CHECK(dnnl_primitive_attr_create(&attr));
    CHECK(dnnl_post_ops_create(&ops));
    CHECK(dnnl_post_ops_append_sum(ops, 1.0f));
    CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
  }
  dnnl_primitive_desc_t pd;
  CHECK(dnnl_reorder_primitive_desc_create(&pd, from, c->eng, to, c->eng, attr));
  dnnl_primitive_t p = make_prim(pd);
  dnnl_primitive_desc_destroy(pd);
  if (ops) dnnl_post_ops_destroy(ops);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return p;
}

static dnnl_memory_t make_mem(ip_case *c, const dnnl_memory_desc_t *md, void *handle) {
  dnnl_memory_t m;
  CHECK(dnnl_memory_create(&m, md, c->eng, handle));
  return m;
}

static void run(ip_case *c, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args) {
  CHECK(dnnl_primitive_execute(p, c->stream, n, args));
  CHECK(dnnl_stream_wait(c->stream));
}

static void ip_init(ip_case *c, linear_case *k) {
  c->k = k;
  CHECK(dnnl_engine_create(&c->eng, dnnl_cpu, 0));
  CHECK(dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags));
  const dnnl_memory_desc_t src = md2(k->N, k->IN, dnnl_nc), dst = md2(k->N, k->OUT, dnnl_nc);
  const dnnl_memory_desc_t wei_user = md2(k->OUT, k->IN, dnnl_oi), wei_any = md2(k->OUT, k->IN, dnnl_format_tag_any);
  dnnl_memory_desc_t bias;
  const dnnl_dims_t bd = {k->OUT};
  CHECK(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_x));
  dnnl_inner_product_desc_t d;
  dnnl_primitive_desc_t fpd, dpd, wpd;
  CHECK(dnnl_inner_product_forward_desc_init(&d, dnnl_forward_training, &src, &wei_any, &bias, &dst));
  CHECK(dnnl_primitive_desc_create(&fpd, &d, NULL, c->eng, NULL));
  CHECK(dnnl_inner_product_backward_data_desc_init(&d, &src, &wei_any, &dst));
  CHECK(dnnl_primitive_desc_create(&dpd, &d, NULL, c->eng, fpd));
  CHECK(dnnl_inner_product_backward_weights_desc_init(&d, &src, &wei_any, &bias, &dst));
  CHECK(dnnl_primitive_desc_create(&wpd, &d, NULL, c->eng, fpd));
  c->fwd = make_prim(fpd);
  c->bwd_d = make_prim(dpd);
  c->bwd_w = make_prim(wpd);
  const dnnl_memory_desc_t *wf = dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0);
  const dnnl_memory_desc_t *wd = dnnl_primitive_desc_query_md(dpd, dnnl_query_weights_md, 0);
  const dnnl_memory_desc_t *ww = dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 0);
  c->wei_to_fwd = make_reorder(c, &wei_user, wf, 0);
  c->wei_to_bwd_d = make_reorder(c, &wei_user, wd, 0);
  c->dwei_back = make_reorder(c, ww, &wei_user, 1);
  c->src = make_mem(c, &src, k->inp);
  c->wei_user = make_mem(c, &wei_user, k->weight);
  c->wei_fwd = make_mem(c, wf, DNNL_MEMORY_ALLOCATE);
  c->wei_bwd_d = make_mem(c, wd, DNNL_MEMORY_ALLOCATE);
  c->bias = make_mem(c, &bias, k->bias);
  c->dst = make_mem(c, &dst, k->out);
  c->ddst = make_mem(c, &dst, k->dout);
  c->dsrc_scratch = malloc((size_t)k->N * k->IN * sizeof(float));
  c->dsrc = make_mem(c, &src, c->dsrc_scratch);
  c->dwei = make_mem(c, ww, DNNL_MEMORY_ALLOCATE);
  c->dwei_user = make_mem(c, &wei_user, k->dweight);
  c->dbias = make_mem(c, &bias, DNNL_MEMORY_ALLOCATE);
  dnnl_primitive_desc_destroy(fpd);
  dnnl_primitive_desc_destroy(dpd);
  dnnl_primitive_desc_destroy(wpd);
}

static void ip_release(ip_case *c) {
  dnnl_primitive_t ps[] = {c->fwd, c->bwd_d, c->bwd_w, c->wei_to_fwd, c->wei_to_bwd_d, c->dwei_back};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) dnnl_primitive_destroy(ps[i]);
  dnnl_memory_t ms[] = {c->src, c->wei_user, c->wei_fwd, c->wei_bwd_d, c->bias, c->dst,
                        c->ddst, c->dsrc, c->dwei, c->dwei_user, c->dbias};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) dnnl_memory_destroy(ms[i]);
  free(c->dsrc_scratch);
  dnnl_stream_destroy(c->stream);
  dnnl_engine_destroy(c->eng);
}

static void ip_fwd(void *p) {
  ip_case *c = p;
  dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, c->wei_user}, {DNNL_ARG_TO, c->wei_fwd}};
  run(c, c->wei_to_fwd, 2, r);
  dnnl_exec_arg_t a[4] = {
      {DNNL_ARG_SRC, c->src}, {DNNL_ARG_WEIGHTS, c->wei_fwd}, {DNNL_ARG_BIAS, c->bias}, {DNNL_ARG_DST, c->dst}};
  run(c, c->fwd, 4, a);
}
static void ip_bwd_data(void *p) {
  ip_case *c = p;
  dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, c->wei_user}, {DNNL_ARG_TO, c->wei_bwd_d}};
  run(c, c->wei_to_bwd_d, 2, r);
  dnnl_exec_arg_t a[3] = {{DNNL_ARG_DIFF_DST, c->ddst}, {DNNL_ARG_WEIGHTS, c->wei_bwd_d}, {DNNL_ARG_DIFF_SRC, c->dsrc}};
  run(c, c->bwd_d, 3, a);
  const int64_t n = (int64_t)c->k->N * c->k->IN;
  for (int64_t i = 0; i < n; i++) c->k->dinp[i] += c->dsrc_scratch[i];
}
static void ip_bwd_weights(void *p) {
  ip_case *c = p;
  dnnl_exec_arg_t a[4] = {{DNNL_ARG_SRC, c->src},
                          {DNNL_ARG_DIFF_DST, c->ddst},
                          {DNNL_ARG_DIFF_WEIGHTS, c->dwei},
                          {DNNL_ARG_DIFF_BIAS, c->dbias}};
  run(c, c->bwd_w, 4, a);
  dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, c->dwei}, {DNNL_ARG_TO, c->dwei_user}};
  run(c, c->dwei_back, 2, r);
}

static void bench_linear(const char *name, int N, int IN, int OUT, int forward_only) {
  linear_case k = {.N = N, .IN = IN, .OUT = OUT};
  k.inp = qt_test_uniform((int64_t)N * IN, 1);
  k.weight = qt_test_uniform((int64_t)OUT * IN, 2);
  k.bias = qt_test_uniform(OUT, 3);
  k.out = qt_test_uniform((int64_t)N * OUT, 4);
  k.dout = qt_test_uniform((int64_t)N * OUT, 5);
  k.dinp = qt_test_uniform((int64_t)N * IN, 6);
  k.dweight = qt_test_uniform((int64_t)OUT * IN, 7);
  k.dbias = qt_test_uniform(OUT, 8);
  ip_case c;
  ip_init(&c, &k);
  if (forward_only) {
    printf("%-34s fwd %7.3f ms   (inner product: fwd %7.3f)\n", name, time_ms(lin_fwd, &k), time_ms(ip_fwd, &c));
  } else {
    const double f = time_ms(lin_fwd, &k), bd = time_ms(lin_bwd_data, &k), bw = time_ms(lin_bwd_weights, &k);
    const double pf = time_ms(ip_fwd, &c), pbd = time_ms(ip_bwd_data, &c), pbw = time_ms(ip_bwd_weights, &c);
    printf("%-34s fwd %7.3f  bwd_data %7.3f  bwd_weights %7.3f ms\n", name, f, bd, bw);
    printf("%-34s fwd %7.3f  bwd_data %7.3f  bwd_weights %7.3f ms\n", "  (inner product, for comparison)", pf, pbd,
           pbw);
  }
  ip_release(&c);
  free(k.inp), free(k.weight), free(k.bias), free(k.out), free(k.dout), free(k.dinp), free(k.dweight), free(k.dbias);
}

int main(int argc, char **argv) {
  if (argc > 1) g_budget = atof(argv[1]);
  printf("ms per call, best of 5 run means; OMP_NUM_THREADS=%s\n", getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)");
  bench_conv("conv 1->32 3x3 p1 28x28 N128", 128, 28, 1, 32);
  bench_conv("conv 32->64 3x3 p1 14x14 N128", 128, 14, 32, 64);
  bench_linear("linear 3136->128 N128", 128, 3136, 128, 0);
  bench_linear("linear 128->10 N128", 128, 128, 10, 0);
  bench_linear("linear 3136->128 N256 (eval)", 256, 3136, 128, 1);
  bench_linear("linear 128->10 N256 (eval)", 256, 128, 10, 1);
  return 0;
}
