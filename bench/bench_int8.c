/* bench_int8 [MODEL_QDQ.h5] [--backend onednn|xnnpack] [--batch N] [--seconds S] [--rounds R] [--int8-only]:
 * FashionCNN inference images/s at batch 256 (default) for the framework's fp32 graph executor, the
 * Q/DQ reference interpreter and the int8 device (qt_device_open); --int8-only times the device
 * alone (no OpenMP engines in between). Beside images/s, the process's CPU time (user + system,
 * all threads) per 1000 images: work plus spin-waiting, a figure other processes on the machine
 * change less than the wall clock. Without a file, the Q/DQ graph is made here: FashionCNN
 * with PyTorch's initialization -> the backend's Quantizer (W8A8) -> PTQ prepare -> calibration on
 * random batches -> convert. Inputs are random (speed does not depend on the values).
 * Prints one line per engine and the int8 / fp32 speed-up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "backend/backend.h"
#include "qat/qat.h"

static void fill(float *x, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    x[i] = -0.8f + 2.8f * (float)((seed >> 40) & 0xffffff) / 16777216.0f;
  }
}

static qt_graph *make_qdq(const qt_backend_desc *d, char *err) {
  qt_graph *g = qt_model_build("fashion_cnn", err);
  if (!g) return NULL;
  qt_graph_init_params(g, 1);
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qt_annotations a;
  if (qt_quantizer(g, d, &qc, &a, err)) return NULL;
  qt_graph *p = qt_prepare(g, &a, QT_PREPARE_PTQ, err);
  qt_annotations_free(&a);
  qt_graph_free(g);
  if (!p) return NULL;
  qt_ctx *ctx = qt_ctx_create();
  float *x = malloc(sizeof(float) * 64 * 784);
  const int64_t shape[4] = {64, 28, 28, 1};
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  for (int s = 0; s < 4; s++) {
    fill(x, 64 * 784, 100 + (uint64_t)s);
    qt_ctx_reset(ctx);
    if (!qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x))) {
      snprintf(err, QT_ERR_LEN, "calibration: %s", p->error);
      return NULL;
    }
  }
  qt_set_observers(p, 0);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  free(x);
  qt_ctx_free(ctx);
  qt_graph *c = qt_convert(p, err);
  qt_graph_free(p);
  return c;
}

/* Prints msg as the bench's error; returns `status` for the caller to pass on. */
static int report(const char *msg, int status) {
  fprintf(stderr, "bench_int8: %s\n", msg);
  return status;
}

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
         1e-6 * (double)u.ru_stime.tv_usec;
}

/* Runs fn until `seconds` have passed (after 2 warm-up calls); returns images/s and sets *cpu_ms
 * to the process's CPU milliseconds per 1000 images over the same runs. */
typedef int (*run_fn)(void *state, const float *x, int n);

static double measure(run_fn fn, void *state, const float *x, int n, double seconds, double *cpu_ms) {
  for (int i = 0; i < 2; i++)
    if (fn(state, x, n)) return -1;
  int iters = 0;
  const double c0 = cpu_seconds();
  double t0 = qt_now_seconds(), t;
  do {
    if (fn(state, x, n)) return -1;
    iters++;
    t = qt_now_seconds();
  } while (t - t0 < seconds);
  *cpu_ms = (cpu_seconds() - c0) * 1e6 / ((double)iters * n);
  return (double)iters * n / (t - t0);
}

typedef struct {
  qt_graph *g;
  qt_ctx *ctx;
} graph_state;

static int run_graph(void *state, const float *x, int n) {
  graph_state *s = state;
  qt_ctx_reset(s->ctx);
  const int64_t shape[4] = {n, 28, 28, 1};
  if (!qt_graph_forward(s->g, s->ctx, qt_tensor_wrap(s->ctx, QT_F32, 4, shape, (void *)x)))
    return report(s->g->error, -1);
  return 0;
}

typedef struct {
  qt_device *m;
  float *out;
} lowered_state;

static int run_lowered(void *state, const float *x, int n) {
  lowered_state *s = state;
  char err[QT_ERR_LEN];
  if (qt_device_run(s->m, s->out, x, n, err)) return report(err, -1);
  return 0;
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  const char *path = NULL, *backend = "onednn";
  int batch = 256;
  double seconds = 6.0;
  int rounds = 3, int8_only = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
    else if (strcmp(argv[i], "--int8-only") == 0) int8_only = 1;
    else if (argv[i][0] != '-' && !path) path = argv[i];
    else {
      fprintf(stderr, "usage: bench_int8 [MODEL_QDQ.h5] [--backend onednn|xnnpack] [--batch N] [--seconds S] [--rounds R] "
                      "[--int8-only]\n");
      return 2;
    }
  }
  if (batch < 1) batch = 256;
  if (rounds < 1) rounds = 1;
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  if (qt_backend_desc_named(&d, backend, QT_ISA_AUTO, err)) return report(err, 2);
  qt_graph *fp32 = qt_model_build("fashion_cnn", err);
  qt_graph *qdq = path ? qt_qdq_load(path, err) : make_qdq(&d, err);
  if (!fp32 || !qdq) return report(err, 2);
  qt_graph_init_params(fp32, 1);
  qt_graph_set_mode(fp32, QT_MODE_EVAL);
  qt_graph_set_mode(qdq, QT_MODE_EVAL);
  qt_device *m = qt_device_open(qdq, &d, err);
  if (!m) return report(err, 2);
  float *x = malloc(sizeof(float) * (size_t)batch * 784);
  fill(x, (int64_t)batch * 784, 7);
  graph_state gf = {fp32, qt_ctx_create()}, gq = {qdq, qt_ctx_create()};
  lowered_state ls = {m, malloc(sizeof(float) * (size_t)batch * (size_t)qt_device_output_numel(m))};
  printf("bench_int8: FashionCNN %s, batch %d, %.1f s per engine in %d rounds\n",
         path ? path : "(converted here, W8A8 PTQ)", batch, seconds, rounds);
  /* Engines alternate over `rounds` rounds and each keeps its best round: on a shared
   * machine, other processes slow single measurements down, never up. */
  double f = int8_only, q = int8_only, i8 = 0, fc = 1e30, qc = 1e30, ic = 1e30, ac = 0, bc = 0, cc = 0;
  for (int r = 0; r < rounds; r++) {
    const double a = int8_only ? 1 : measure(run_graph, &gf, x, batch, seconds / rounds, &ac);
    const double b = int8_only ? 1 : measure(run_graph, &gq, x, batch, seconds / rounds, &bc);
    const double c = measure(run_lowered, &ls, x, batch, seconds / rounds, &cc);
    if (a < 0 || b < 0 || c < 0) return 1;
    if (!int8_only) {
      f = a > f ? a : f;
      q = b > q ? b : q;
      fc = ac < fc ? ac : fc;
      qc = bc < qc ? bc : qc;
      printf("  round %d: fp32 %.0f, Q/DQ %.0f, int8 %.0f images/s; CPU ms per 1000 images %.1f, %.1f, %.1f\n", r + 1,
             a, b, c, ac, bc, cc);
    } else
      printf("  round %d: int8 %.0f images/s, %.1f CPU ms per 1000 images\n", r + 1, c, cc);
    i8 = c > i8 ? c : i8;
    ic = cc < ic ? cc : ic;
  }
  if (!int8_only) {
    printf("  fp32 graph executor      %8.0f images/s (best round), %6.1f CPU ms per 1000 images (least)\n", f, fc);
    printf("  Q/DQ reference graph     %8.0f images/s, %6.1f CPU ms per 1000 images\n", q, qc);
  }
  printf("  int8 lowered             %8.0f images/s, %6.1f CPU ms per 1000 images (%d int8, %d fallback partitions)\n", i8,
         ic, qt_device_count(m, QT_PART_INT8), qt_device_count(m, QT_PART_FALLBACK));
  if (!int8_only) printf("  int8 / fp32 speed-up     %8.2fx\n", i8 / f);
  free(x);
  free(ls.out);
  qt_ctx_free(gf.ctx);
  qt_ctx_free(gq.ctx);
  qt_device_free(m);
  qt_graph_free(fp32);
  qt_graph_free(qdq);
  return f > 0 && q > 0 && i8 > 0 ? 0 : 1;
}
