/* Observers and qparams against PyTorch 1.13, bit for bit: MinMaxObserver,
 * MovingAverageMinMaxObserver (averaging constant 0.01, the first batch initializes),
 * PerChannelMinMaxObserver and MovingAveragePerChannelMinMaxObserver on a sequence of batches:
 * min/max after every batch, and calculate_qparams() (scale bits and zero point) for quint8
 * affine, qint8 symmetric and quint8 symmetric with default ranges and customized 2-, 4- and
 * 7-bit ranges. Per tensor views both (1, 1, n) and (n, 1, 1); per channel the channel axis of
 * NHWC activations (inner 1) and axis 0 of OIHW weights (outer 1), including an all-negative
 * and an all-zero channel. A 400-step moving-average run per tensor and per channel. Then qt_qparams_from_range on edge ranges (min == max, zeros,
 * all-negative, all-positive, ranges whose scale clamps to FLT_EPSILON, half-way zero points,
 * random ranges, ranges where a reciprocal instead of a division would change the result).
 * Tolerance: none. */
#include "tests/quant/quant_testutil.h"

#define MAX_CFG 16

static int32_t cfg[MAX_CFG][4];
static int n_cfg;

static void run(const char *kind_name, qt_observer_kind kind, const char *gran) {
  char name[128], what[160], err[QT_ERR_LEN];
  int64_t shape[8];
  int nd;
  const int weights = strcmp(gran, "pcw") == 0;
  float *batches = qt_test_load_f32(qt_test_path(QUANT_REF), weights ? "obs_w_batches" : "obs_act_batches", shape, &nd);
  const int nb = (int)shape[0];
  const int64_t per = qt_test_numel(shape + 1, nd - 1);
  int C;
  int64_t outer, inner;
  if (strcmp(gran, "pt") == 0) {
    C = 1, outer = kind == QT_OBSERVER_MINMAX ? 1 : per, inner = kind == QT_OBSERVER_MINMAX ? per : 1;
  } else if (strcmp(gran, "pca") == 0) {
    C = (int)shape[nd - 1], outer = per / C, inner = 1; /* NHWC: channel last */
  } else {
    C = (int)shape[1], outer = 1, inner = per / C; /* OIHW: output channel first */
  }
  snprintf(name, sizeof name, "obs_%s_%s_min", kind_name, gran);
  float *want_min = qt_test_load_f32(qt_test_path(QUANT_REF), name, NULL, NULL);
  snprintf(name, sizeof name, "obs_%s_%s_max", kind_name, gran);
  float *want_max = qt_test_load_f32(qt_test_path(QUANT_REF), name, NULL, NULL);
  snprintf(name, sizeof name, "obs_%s_%s_scale", kind_name, gran);
  float *want_s = qt_test_load_f32(qt_test_path(QUANT_REF), name, NULL, NULL);
  snprintf(name, sizeof name, "obs_%s_%s_zp", kind_name, gran);
  int32_t *want_z = qt_test_load_i32(qt_test_path(QUANT_REF), name, NULL, NULL);

  qt_observer o;
  QT_CHECK(qt_observer_init(&o, kind, C, err) == 0);
  float *s = malloc((size_t)C * sizeof(float));
  int32_t *z = malloc((size_t)C * sizeof(int32_t));
  for (int b = 0; b < nb; b++) {
    QT_CHECK(qt_observer_update(&o, batches + b * per, outer, inner, err) == 0);
    snprintf(what, sizeof what, "%s %s batch %d min", kind_name, gran, b);
    quant_check_bits(what, o.min, want_min + (int64_t)b * C, C);
    snprintf(what, sizeof what, "%s %s batch %d max", kind_name, gran, b);
    quant_check_bits(what, o.max, want_max + (int64_t)b * C, C);
    for (int k = 0; k < n_cfg; k++) {
      QT_CHECK(qt_observer_qparams(&o, cfg[k][0], cfg[k][1], cfg[k][2], s, z, err) == 0);
      snprintf(what, sizeof what, "%s %s batch %d config [%d, %d] %s scale", kind_name, gran, b, cfg[k][0], cfg[k][1],
               cfg[k][2] ? "symmetric" : "affine");
      quant_check_bits(what, s, want_s + ((int64_t)b * n_cfg + k) * C, C);
      snprintf(what, sizeof what, "%s %s batch %d config [%d, %d] %s zero point", kind_name, gran, b, cfg[k][0],
               cfg[k][1], cfg[k][2] ? "symmetric" : "affine");
      quant_check_i32(what, z, want_z + ((int64_t)b * n_cfg + k) * C, C);
    }
  }
  qt_observer_free(&o);
  free(s), free(z), free(batches), free(want_min), free(want_max), free(want_s), free(want_z);
}

/* 400 moving-average steps on batches regenerated from make_ref_quant.py's formula: long
 * enough that double rounding (c * d, then +) versus a fused multiply-add would show. */
static void long_moving_average(void) {
  char err[QT_ERR_LEN];
  const int steps = 400, rows = 8, C = 3;
  float *want[4];
  const char *names[4] = {"obs_long_pt_min", "obs_long_pt_max", "obs_long_pc_min", "obs_long_pc_max"};
  for (int k = 0; k < 4; k++) want[k] = qt_test_load_f32(qt_test_path(QUANT_REF), names[k], NULL, NULL);
  qt_observer pt, pc;
  QT_CHECK(qt_observer_init(&pt, QT_OBSERVER_MOVING_AVERAGE, 1, err) == 0);
  QT_CHECK(qt_observer_init(&pc, QT_OBSERVER_MOVING_AVERAGE, C, err) == 0);
  float x[24];
  int64_t bad = 0;
  for (int b = 0; b < steps; b++) {
    for (int j = 0; j < rows * C; j++) {
      int64_t k = ((int64_t)b * 7919 + (int64_t)j * 104729) % 2001 - 1000;
      x[j] = (float)k * 0.0037f + (float)(b % 13) * 0.25f;
    }
    QT_CHECK(qt_observer_update(&pt, x, rows * C, 1, err) == 0);
    QT_CHECK(qt_observer_update(&pc, x, rows, 1, err) == 0);
    int differs = memcmp(pt.min, want[0] + b, sizeof(float)) != 0 || memcmp(pt.max, want[1] + b, sizeof(float)) != 0 ||
                  memcmp(pc.min, want[2] + b * C, C * sizeof(float)) != 0 ||
                  memcmp(pc.max, want[3] + b * C, C * sizeof(float)) != 0;
    if (differs && !bad)
      fprintf(stderr,
              "long moving average: first difference at step %d: per tensor [%.9g, %.9g] want [%.9g, %.9g], "
              "channel 0 [%.9g, %.9g] want [%.9g, %.9g]\n",
              b, pt.min[0], pt.max[0], want[0][b], want[1][b], pc.min[0], pc.max[0], want[2][b * C], want[3][b * C]);
    bad += differs;
  }
  if (bad) qt_test_fail("long moving average: state differs from PyTorch on some of %d steps", steps);
  qt_observer_free(&pt);
  qt_observer_free(&pc);
  for (int k = 0; k < 4; k++) free(want[k]);
}

static void qparams_edges(void) {
  int64_t shape[8];
  int nd;
  float *ranges = qt_test_load_f32(qt_test_path(QUANT_REF), "qp_ranges", shape, &nd);
  float *want_s = qt_test_load_f32(qt_test_path(QUANT_REF), "qp_scale", NULL, NULL);
  int32_t *want_z = qt_test_load_i32(qt_test_path(QUANT_REF), "qp_zp", NULL, NULL);
  const int R = (int)shape[0];
  int eps_seen = 0;
  for (int r = 0; r < R; r++) {
    for (int k = 0; k < n_cfg; k++) {
      float s = -1.0f;
      int32_t z = -999;
      float lo = ranges[2 * r], hi = ranges[2 * r + 1];
      QT_CHECK(qt_qparams_from_range(lo, hi, cfg[k][0], cfg[k][1], cfg[k][2], &s, &z) == 0);
      float ws = want_s[r * n_cfg + k];
      int32_t wz = want_z[r * n_cfg + k];
      if (memcmp(&s, &ws, sizeof s) != 0 || z != wz)
        qt_test_fail("qparams of [%.9g, %.9g] config [%d, %d] %s: got (%.9g, %d) want (%.9g, %d)", lo, hi, cfg[k][0],
                     cfg[k][1], cfg[k][2] ? "symmetric" : "affine", s, z, ws, wz);
      eps_seen += ws == 1.1920929e-07f;
    }
  }
  QT_CHECK(eps_seen > 0); /* the reference does exercise the FLT_EPSILON clamp */
  free(ranges), free(want_s), free(want_z);
}

int main(void) {
  int64_t shape[8];
  int nd;
  int32_t *c = qt_test_load_i32(qt_test_path(QUANT_REF), "obs_configs", shape, &nd);
  n_cfg = (int)shape[0];
  QT_CHECK(n_cfg <= MAX_CFG && shape[1] == 4);
  memcpy(cfg, c, (size_t)n_cfg * 4 * sizeof(int32_t));
  free(c);
  const char *grans[] = {"pt", "pca", "pcw"};
  for (int g = 0; g < 3; g++) {
    run("minmax", QT_OBSERVER_MINMAX, grans[g]);
    run("movavg", QT_OBSERVER_MOVING_AVERAGE, grans[g]);
  }
  long_moving_average();
  qparams_edges();
  return qt_test_finish();
}
