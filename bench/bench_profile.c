/* bench_profile CONFIG.ini [section.key=value ...] [--steps N] [--warmup W] [--json FILE] [--nhwc-handoff]:
 * where one training step's time goes, per op kind. Runs W warm-up steps (default 3: oneDNN
 * primitive creation, the QAT observers and LSQ initialization of the first step) and then N
 * measured steps (default 50) of the configured training (fp32 or QAT, built with the pipeline's
 * stages and trained by qt_trainer_epoch), with the autograd profiler on the step's ctx
 * (qt_ctx_set_profile), and prints a table: per op kind its calls, forward and backward
 * milliseconds per step and share of the step; rows for the data wait, zero_grad, the optimizer
 * and the observers (timed by the trainer and the graph executor); "other" (the step's wall time
 * minus all of those: the graph executor's own work, arena resets, accuracy counting); the step
 * total and images/s; the thread count and oneDNN's ISA; the model's arithmetic per training image
 * (2 x the multiply-adds of its convolutions and linear layers: forward, weight gradient and input
 * gradient, the image's excepted) and the rate the step reached, against this machine's FMA peak
 * measured in the same run (a register-only loop of independent FMAs on every thread, 512-bit and
 * 256-bit: the one of the ISA oneDNN ran is the reference). --json FILE writes the same figures.
 * --nhwc-handoff turns off the blocked handoff (qt_ctx_set_blocked_handoff): the fused ops then
 * write NHWC and Winograd convolutions reorder it, the comparison for that handoff.
 * Under mpirun it profiles data-parallel training (every process trains its slice of each batch)
 * and process 0 prints its own profile, with a grad_sum row: the gradient sum after the backward,
 * or with dist.bucket_mb > 0 the wait for the buckets left after it (the posting and testing
 * during the backward then fall in "other").
 *
 * A benchmark: it prints figures and judges nothing about them (exit 0 unless the run fails).
 * QAT starts from quant.fp32_checkpoint when that file exists; otherwise from the model's
 * initialization (it does not train the fp32 model first, as qat_train would); the output says
 * which. The steps run from the start of epoch 1 and continue into the next epoch(s) only when
 * one epoch has too few batches (the freeze schedules may then change what a step does). */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/dnnl_util.h"
#include "backend/backend.h"
#include "dist/dist.h"
#include "train/pipeline.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_profile CONFIG.ini [section.key=value ...] [--steps N] [--warmup W] [--json FILE]\n"
          "                     [--nhwc-handoff]\n"
          "Times W warm-up (default 3) and N measured (default 50) training steps of CONFIG's model\n"
          "(fp32 or QAT) and prints time per op kind, forward and backward, per step.\n"
          "--nhwc-handoff: fused ops hand NHWC activations to Winograd convolutions (reordered there),\n"
          "not oneDNN's blocked layout.\n"
          "e.g. bench_profile experiments/fashion_cnn_qat_w4a4.ini --steps 50\n");
}

typedef struct {
  qt_profile *profile;
  int warmup, steps, done; /* steps asked for; steps run so far, warm-up included */
  int64_t images;          /* rows of the measured steps */
} bench_state;

/* After every step: the profile starts over once the warm-up is done; the run ends after the
 * measured steps. */
static int on_step(void *user, int64_t batch, int rows) {
  (void)batch;
  bench_state *b = user;
  b->done++;
  if (b->done <= b->warmup) {
    if (b->done == b->warmup) qt_profile_clear(b->profile);
    return 0;
  }
  b->images += rows;
  return b->done >= b->warmup + b->steps;
}

static int parse_count(const char *flag, const char *v, int min, int *out, char *err) {
  char *end;
  long n = v ? strtol(v, &end, 10) : 0;
  if (!v || *end || end == v || n < min || n > 1000000)
    return qt_err(err, "%s wants an integer in [%d, 1000000], got '%s'", flag, min, v ? v : "(nothing)");
  *out = (int)n;
  return 0;
}

typedef struct {
  const char *config, *json;
  int steps, warmup, nhwc_handoff;
  char **overrides;
  int n_overrides;
} bench_args;

static int parse_args(int argc, char **argv, bench_args *a, char *err) {
  memset(a, 0, sizeof *a);
  a->steps = 50;
  a->warmup = 3;
  a->overrides = calloc((size_t)argc, sizeof *a->overrides);
  QT_ASSERT(a->overrides, "out of memory");
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--steps") == 0) {
      if (parse_count("--steps", i + 1 < argc ? argv[++i] : NULL, 1, &a->steps, err)) return -1;
    } else if (strcmp(argv[i], "--warmup") == 0) {
      if (parse_count("--warmup", i + 1 < argc ? argv[++i] : NULL, 0, &a->warmup, err)) return -1;
    } else if (strcmp(argv[i], "--json") == 0) {
      if (i + 1 >= argc) return qt_err(err, "--json wants a file name");
      a->json = argv[++i];
    } else if (strcmp(argv[i], "--nhwc-handoff") == 0) {
      a->nhwc_handoff = 1;
    } else if (strncmp(argv[i], "--", 2) == 0) {
      return qt_err(err, "unknown option '%s'", argv[i]);
    } else if (!a->config) {
      a->config = argv[i];
    } else {
      a->overrides[a->n_overrides++] = argv[i];
    }
  }
  if (!a->config) return qt_err(err, "no config file given");
  return 0;
}

/* ---- arithmetic and the machine's peak ------------------------------------------------------- */
/* Multiply-adds of one training image through g: each conv2d / conv_bn and linear node's forward,
 * weight gradient, and input gradient unless no trained layer (conv, linear, batch norm) lies
 * upstream of its input (the image, or its fake quant: no gradient needed). Elementwise ops are
 * not counted. */
static double training_macs_per_image(const qt_graph *g) {
  double macs = 0;
  unsigned char *trained = calloc((size_t)g->n_values, 1); /* per value: a trained layer upstream */
  QT_ASSERT(trained, "out of memory");
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    const int layer = n->op == QT_OP_CONV2D || n->op == QT_OP_CONV_BN || n->op == QT_OP_LINEAR;
    int upstream = 0;
    for (int k = 0; k < n->n_inputs; k++) upstream |= trained[n->inputs[k]];
    trained[n->output] = (unsigned char)(upstream || layer || n->op == QT_OP_BATCH_NORM);
    if (!layer) continue;
    const qt_value *in = &g->values[n->inputs[0]], *out = &g->values[n->output];
    double fwd;
    if (n->op != QT_OP_LINEAR) {
      const int groups = n->attr.groups > 0 ? n->attr.groups : 1;
      fwd = (double)out->shape[0] * (double)out->shape[1] * (double)out->shape[2] * (double)(in->shape[2] / groups) *
            n->attr.kernel_h * n->attr.kernel_w;
    } else {
      double fin = 1;
      for (int d = 0; d < in->ndim; d++) fin *= (double)in->shape[d];
      fwd = fin * (double)n->attr.out_channels;
    }
    macs += fwd * (trained[n->inputs[0]] ? 3 : 2);
  }
  free(trained);
  return macs;
}

/* 12 independent FMA chains per thread on every thread: the best of 3 rounds of ~0.1 s, in
 * GFLOP/s (2 per lane per FMA). The widths are compiled for their targets and run only where the
 * CPU has them (0 otherwise). */
#define PEAK_CHAINS 12
__attribute__((target("avx512f"))) static double fma_loop512(long iters) {
  __m512 a[PEAK_CHAINS];
  for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm512_set1_ps(1.0f + (float)i * 1e-7f);
  const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (long k = 0; k < iters; k++)
#pragma GCC unroll 12 /* the chains in registers: at -O2 the array stays in memory otherwise */
    for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
  __m512 s = a[0];
  for (int i = 1; i < PEAK_CHAINS; i++) s = _mm512_add_ps(s, a[i]);
  return (double)_mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"))) static double fma_loop256(long iters) {
  __m256 a[PEAK_CHAINS];
  for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm256_set1_ps(1.0f + (float)i * 1e-7f);
  const __m256 b = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
    for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
  __m256 s = a[0];
  for (int i = 1; i < PEAK_CHAINS; i++) s = _mm256_add_ps(s, a[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  return (double)lanes[0];
}

static double fma_peak_gflops(int width) {
  if (width == 512 ? !__builtin_cpu_supports("avx512f") : !__builtin_cpu_supports("fma")) return 0;
  const int lanes = width / 32;
  double best = 0, sink = 0;
  for (int round = 0; round < 3; round++) {
    const long iters = 20000000L / lanes;
    const double t0 = omp_get_wtime();
    int threads = 1;
#pragma omp parallel reduction(+ : sink)
    {
#pragma omp single
      threads = omp_get_num_threads();
      sink += width == 512 ? fma_loop512(iters) : fma_loop256(iters);
    }
    const double secs = omp_get_wtime() - t0;
    const double gflops = 2.0 * lanes * PEAK_CHAINS * (double)iters * threads / secs * 1e-9;
    if (gflops > best) best = gflops;
  }
  if (sink == 42.0) printf(" "); /* keeps the loops' results live */
  return best;
}

/* ---- the run ---------------------------------------------------------------------------------- */
typedef struct {
  char mode[96];   /* "fp32", "QAT W4A4 (LSQ)", ... */
  char start[QT_OPT_STR + 96];
  char isa[40];
  int threads, epochs;
  bench_state b;
  qt_profile p;
  double macs_per_image;   /* training_macs_per_image of the graph trained */
  double peak512, peak256; /* fma_peak_gflops, measured after the steps */
  int nhwc_handoff;        /* --nhwc-handoff */
} bench_result;

/* Builds the model (and for QAT prepares and, with quant.qat_init = calibration, calibrates it)
 * as qat_train does, then trains until the warm-up and measured steps are done. */
static int bench_run(const qt_options *o, const bench_args *a, bench_result *r, qt_status *st) {
  qt_dataset train, test;
  memset(&train, 0, sizeof train);
  memset(&test, 0, sizeof test);
  qt_graph *g = NULL, *p = NULL, *tg = NULL; /* tg: the graph trained, g or p */
  qt_ctx *ctx = NULL;
  qt_trainer *t = NULL;
  int rc = -1;
  const int qat = o->quant.mode == QT_QUANT_QAT;
  if (o->quant.mode == QT_QUANT_PTQ) {
    qt_status_set(st, QT_STATUS_INPUT, "quant.mode = ptq trains no steps: profile an fp32 or a qat config");
    goto done;
  }
  if (!(g = qt_stage_build_model(o, NULL, st))) goto done;
  snprintf(r->start, sizeof r->start, "the model's initialization (train.seed %d)", o->train.seed);
  if (qat && o->quant.fp32_checkpoint[0]) {
    if (access(o->quant.fp32_checkpoint, R_OK) == 0) {
      if (qt_stage_obtain_fp32(o, g, 0, NULL, st)) goto done;
      snprintf(r->start, sizeof r->start, "quant.fp32_checkpoint %s", o->quant.fp32_checkpoint);
    } else {
      snprintf(r->start, sizeof r->start, "the model's initialization (quant.fp32_checkpoint %s does not exist; "
               "not trained here)", o->quant.fp32_checkpoint);
    }
  }
  if (qt_stage_load_data(&o->data, QT_SPLIT_TRAIN, &train, &test, st) || qt_stage_model_fits(o, g, &train, st))
    goto done;
  ctx = qt_ctx_create();
  qt_ctx_set_blocked_handoff(ctx, !a->nhwc_handoff);
  tg = g;
  if (qat) {
    if (!(p = qt_stage_prepare(o, g, NULL, NULL, st))) goto done;
    if (o->quant.qat_init == QT_QAT_INIT_CALIBRATION && qt_stage_calibrate(o, p, &train, ctx, NULL, 0, st)) goto done;
    tg = p;
    snprintf(r->mode, sizeof r->mode, "QAT W%dA%d (%s)", o->quant.weight_bits, o->quant.activation_bits,
             o->quant.learnable_scale ? "LSQ" : "fake quant with observers");
  } else {
    snprintf(r->mode, sizeof r->mode, "fp32");
  }
  r->macs_per_image = training_macs_per_image(tg);
  r->nhwc_handoff = a->nhwc_handoff;
  if (!(t = qt_trainer_create(o, tg, &train, st))) goto done;
  if (qt_trainer_batches(t) <= 0) {
    qt_status_set(st, QT_STATUS_INPUT, "the training split gives no batches");
    goto done;
  }
  qt_profile_clear(&r->p);
  r->b = (bench_state){.profile = &r->p, .warmup = a->warmup, .steps = a->steps};
  qt_trainer_set_step_hook(t, on_step, &r->b);
  qt_ctx_set_profile(ctx, &r->p);
  for (int e = 0; r->b.done < a->warmup + a->steps; e++) {
    qt_epoch_stats es;
    if (qt_trainer_epoch(t, ctx, e, &es, st)) goto done;
    r->epochs = e + 1;
  }
  qt_ctx_set_profile(ctx, NULL);
  r->peak512 = fma_peak_gflops(512);
  r->peak256 = fma_peak_gflops(256);
  rc = 0;
done:
  qt_trainer_free(t);
  qt_ctx_free(ctx);
  qt_graph_free(p);
  qt_graph_free(g);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  return rc;
}

/* ---- the table -------------------------------------------------------------------------------- */
/* The step phases shown as rows of their own (STEP is the total). */
static const qt_profile_phase phase_rows[] = {QT_PROFILE_DATA, QT_PROFILE_ZERO_GRAD, QT_PROFILE_OPTIMIZER,
                                              QT_PROFILE_OBSERVER, QT_PROFILE_GRAD_SUM};
#define N_PHASE_ROWS ((int)(sizeof phase_rows / sizeof phase_rows[0]))

typedef struct {
  double step_ms, fwd_ms, bwd_ms, phases_ms, other_ms, images_per_s;
} bench_totals;

static bench_totals totals(const bench_result *r) {
  const qt_profile *p = &r->p;
  const double n = r->b.steps;
  bench_totals s = {0};
  s.step_ms = 1e3 * p->phase[QT_PROFILE_STEP].seconds / n;
  for (int k = 0; k < QT_PROFILE_OP_COUNT; k++) {
    s.fwd_ms += 1e3 * p->forward[k].seconds / n;
    s.bwd_ms += 1e3 * p->backward[k].seconds / n;
  }
  for (int i = 0; i < N_PHASE_ROWS; i++) s.phases_ms += 1e3 * p->phase[phase_rows[i]].seconds / n;
  s.other_ms = s.step_ms - s.fwd_ms - s.bwd_ms - s.phases_ms;
  const double secs = p->phase[QT_PROFILE_STEP].seconds;
  s.images_per_s = secs > 0 ? (double)r->b.images / secs : 0;
  return s;
}

static int op_ran(const qt_profile *p, int k) { return p->forward[k].calls > 0 || p->backward[k].calls > 0; }

/* The peak of the vector width oneDNN's ISA uses (AVX-512 ISAs: 512-bit; else 256-bit). */
static double reference_peak(const bench_result *r) {
  return strncmp(r->isa, "avx512", 6) == 0 ? r->peak512 : r->peak256;
}

static void print_table(const char *config, const qt_options *o, const bench_result *r) {
  const qt_profile *p = &r->p;
  const double n = r->b.steps;
  const bench_totals s = totals(r);
  const double pct = s.step_ms > 0 ? 100.0 / s.step_ms : 0;
  printf("bench_profile: %s: %s, %s, batch %d, %d steps after %d warm-up (%d epoch%s), %d threads, oneDNN ISA %s\n",
         config, o->model.onnx[0] ? o->model.onnx : o->model.name, r->mode, o->train.batch_size, r->b.steps,
         r->b.warmup, r->epochs, r->epochs == 1 ? "" : "s", r->threads, r->isa);
  printf("start: %s\n", r->start);
  printf("activations to Winograd convolutions: %s\n",
         r->nhwc_handoff ? "NHWC, reordered there (--nhwc-handoff)" : "blocked where a fused op writes them");
  if (qt_dist_size() > 1)
    printf("data parallel: process 0 of %d, dist.bucket_mb %g (grad_sum: %s)\n", qt_dist_size(), o->dist.bucket_mb,
           o->dist.bucket_mb > 0 ? "the wait for the buckets left after the backward" : "one sum after the backward");
  printf("%-25s %11s %16s %17s %8s\n", "op kind", "calls/step", "forward ms/step", "backward ms/step", "share %");
  for (int k = 0; k < QT_PROFILE_OP_COUNT; k++) {
    if (!op_ran(p, k)) continue;
    const double f = 1e3 * p->forward[k].seconds / n, b = 1e3 * p->backward[k].seconds / n;
    printf("%-25s %11.2f %16.3f %17.3f %8.1f\n", qt_profile_op_name((qt_profile_op)k),
           (double)p->forward[k].calls / n, f, b, (f + b) * pct);
  }
  for (int i = 0; i < N_PHASE_ROWS; i++) {
    const qt_profile_bucket *q = &p->phase[phase_rows[i]];
    if (q->calls == 0 && phase_rows[i] != QT_PROFILE_DATA && phase_rows[i] != QT_PROFILE_OPTIMIZER &&
        phase_rows[i] != QT_PROFILE_ZERO_GRAD)
      continue;
    const double ms = 1e3 * q->seconds / n;
    printf("%-25s %11.2f %16.3f %17s %8.1f\n", qt_profile_phase_name(phase_rows[i]), (double)q->calls / n, ms, "-",
           ms * pct);
  }
  printf("%-25s %11s %16.3f %17s %8.1f\n", "other", "-", s.other_ms, "-", s.other_ms * pct);
  printf("%-25s %11s %16.3f %17.3f %8.1f\n", "ops total", "-", s.fwd_ms, s.bwd_ms, (s.fwd_ms + s.bwd_ms) * pct);
  printf("step total: %.3f ms/step, %.1f images/s\n", s.step_ms, s.images_per_s);
  printf("oneDNN kernels: %s\n", qt_dnnl_kernels_used());
  const double gflops = 2.0 * r->macs_per_image * s.images_per_s * 1e-9, peak = reference_peak(r);
  printf("arithmetic: %.2f MFLOP per training image (conv and linear multiply-adds x 2), %.1f GFLOP/s in the steps\n",
         2.0 * r->macs_per_image * 1e-6, gflops);
  printf("FMA peak measured after the steps, %d threads: 512-bit %.1f GFLOP/s, 256-bit %.1f GFLOP/s; the steps reached "
         "%.1f%% of the %s peak\n",
         r->threads, r->peak512, r->peak256, peak > 0 ? 100.0 * gflops / peak : 0.0,
         strncmp(r->isa, "avx512", 6) == 0 ? "512-bit" : "256-bit");
}

static int write_json(const char *path, const char *config, const qt_options *o, const bench_result *r, char *err) {
  const qt_profile *p = &r->p;
  const double n = r->b.steps;
  const bench_totals s = totals(r);
  const double share = s.step_ms > 0 ? 1.0 / s.step_ms : 0;
  qt_strbuf b = {0};
  qt_strbuf_printf(&b, "{\n  \"config\": ");
  qt_strbuf_json_string(&b, config);
  qt_strbuf_printf(&b, ",\n  \"model\": ");
  qt_strbuf_json_string(&b, o->model.onnx[0] ? o->model.onnx : o->model.name);
  qt_strbuf_printf(&b, ",\n  \"mode\": ");
  qt_strbuf_json_string(&b, r->mode);
  qt_strbuf_printf(&b, ",\n  \"start\": ");
  qt_strbuf_json_string(&b, r->start);
  qt_strbuf_printf(&b, ",\n  \"blocked_handoff\": %s", r->nhwc_handoff ? "false" : "true");
  qt_strbuf_printf(&b, ",\n  \"onednn_isa\": ");
  qt_strbuf_json_string(&b, r->isa);
  qt_strbuf_printf(&b, ",\n  \"onednn_kernels\": ");
  qt_strbuf_json_string(&b, qt_dnnl_kernels_used());
  qt_strbuf_printf(&b,
                   ",\n  \"threads\": %d,\n  \"batch_size\": %d,\n  \"steps\": %d,\n  \"warmup_steps\": %d,\n"
                   "  \"epochs\": %d,\n  \"images\": %lld,\n  \"step_ms\": %.6f,\n  \"images_per_s\": %.3f,\n"
                   "  \"forward_ms\": %.6f,\n  \"backward_ms\": %.6f,\n  \"other_ms\": %.6f,\n"
                   "  \"mflop_per_image\": %.6f,\n  \"gflops\": %.3f,\n  \"fma_peak_gflops_512\": %.3f,\n"
                   "  \"fma_peak_gflops_256\": %.3f,\n  \"peak_share\": %.6f,\n  \"ops\": [",
                   r->threads, o->train.batch_size, r->b.steps, r->b.warmup, r->epochs, (long long)r->b.images,
                   s.step_ms, s.images_per_s, s.fwd_ms, s.bwd_ms, s.other_ms, 2.0 * r->macs_per_image * 1e-6,
                   2.0 * r->macs_per_image * s.images_per_s * 1e-9, r->peak512, r->peak256,
                   reference_peak(r) > 0 ? 2.0 * r->macs_per_image * s.images_per_s * 1e-9 / reference_peak(r) : 0.0);
  int first = 1;
  for (int k = 0; k < QT_PROFILE_OP_COUNT; k++) {
    if (!op_ran(p, k)) continue;
    const double f = 1e3 * p->forward[k].seconds / n, bw = 1e3 * p->backward[k].seconds / n;
    qt_strbuf_printf(&b,
                     "%s\n    {\"kind\": \"%s\", \"forward_calls\": %lld, \"backward_calls\": %lld, "
                     "\"forward_ms\": %.6f, \"backward_ms\": %.6f, \"share\": %.6f}",
                     first ? "" : ",", qt_profile_op_name((qt_profile_op)k), (long long)p->forward[k].calls,
                     (long long)p->backward[k].calls, f, bw, (f + bw) * share);
    first = 0;
  }
  qt_strbuf_printf(&b, "\n  ],\n  \"phases\": [");
  for (int i = 0; i < N_PHASE_ROWS; i++) {
    const qt_profile_bucket *q = &p->phase[phase_rows[i]];
    const double ms = 1e3 * q->seconds / n;
    qt_strbuf_printf(&b, "%s\n    {\"name\": \"%s\", \"calls\": %lld, \"ms\": %.6f, \"share\": %.6f}", i ? "," : "",
                     qt_profile_phase_name(phase_rows[i]), (long long)q->calls, ms, ms * share);
  }
  qt_strbuf_printf(&b, ",\n    {\"name\": \"other\", \"calls\": 0, \"ms\": %.6f, \"share\": %.6f}\n  ]\n}\n",
                   s.other_ms, s.other_ms * share);
  int rc = qt_write_file_atomic(path, b.s, b.len, err);
  free(b.s);
  return rc;
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    usage(stdout);
    return 0;
  }
  bench_args a;
  static qt_options o;
  static bench_result r;
  qt_status st = {0};
  if (qt_dist_init(&argc, &argv, st.msg)) {
    fprintf(stderr, "bench_profile: %s\n", st.msg);
    return 2;
  }
  if (parse_args(argc, argv, &a, st.msg)) {
    fprintf(stderr, "bench_profile: %s\n", st.msg);
    usage(stderr);
    free(a.overrides);
    qt_dist_finalize();
    return 2;
  }
  int rc = 0;
  if (qt_options_load(a.config, a.overrides, a.n_overrides, &o, st.msg)) {
    rc = 2;
    goto out;
  }
  o.output.progress = QT_PROGRESS_NONE;
  if (o.train.threads > 0) omp_set_num_threads(o.train.threads);
  r.threads = omp_get_max_threads();
  qt_backend_desc d;
  qt_backend_desc_onednn_cpu(&d, QT_ISA_AUTO);
  snprintf(r.isa, sizeof r.isa, "%s", d.isa);
  if (bench_run(&o, &a, &r, &st)) {
    rc = qt_status_exit_code(st.code);
    goto out;
  }
  if (qt_dist_rank() == 0) { /* under mpirun: process 0's profile */
    print_table(a.config, &o, &r);
    if (a.json && write_json(a.json, a.config, &o, &r, st.msg)) rc = 1;
  }
out:
  if (rc && qt_dist_size() > 1) qt_dist_abort(rc, "bench_profile: process %d: %s", qt_dist_rank(), st.msg);
  if (rc) fprintf(stderr, "bench_profile: %s\n", st.msg);
  free(a.overrides);
  qt_dist_finalize();
  return rc;
}
