/* Observer errors and state: a NaN, +Inf or -Inf anywhere in a batch (per tensor, per channel
 * with the channel last or in the middle, small and parallel-sized batches) fails the update
 * with "input holds NaN at element i" naming the first bad element, and leaves the state
 * exactly as it was (min/max, histogram, initialized). Also: qparams before any data fail;
 * a per-channel histogram is refused; empty batches change nothing; reset, copy (deep, into a
 * zeroed or a live observer); name tables round-trip; qt_qrange; qt_qparams_from_range
 * rejects NaN/Inf/min > max and leaves its outputs alone. */
#include "tests/quant/quant_testutil.h"

typedef struct {
  int initialized;
  float min[64], max[64];
  int64_t hist[2048];
  int has_hist;
  float hist_min, hist_max;
} snapshot;

static void take(snapshot *s, const qt_observer *o) {
  memset(s, 0, sizeof *s);
  s->initialized = o->initialized;
  memcpy(s->min, o->min, (size_t)o->channels * sizeof(float));
  memcpy(s->max, o->max, (size_t)o->channels * sizeof(float));
  s->has_hist = o->hist != NULL;
  if (o->hist) memcpy(s->hist, o->hist, (size_t)o->bins * sizeof(int64_t));
  s->hist_min = o->hist_min;
  s->hist_max = o->hist_max;
}

static int same(const snapshot *a, const snapshot *b) { return memcmp(a, b, sizeof *a) == 0; }

static void bad_values(qt_observer_kind kind, int C, int64_t outer, int64_t inner) {
  char err[QT_ERR_LEN], want[64], what[128];
  const int64_t n = outer * C * inner;
  float *x = malloc((size_t)n * sizeof(float));
  qt_test_fill_uniform(x, n, -2.0f, 3.0f, 7 + (uint64_t)n);
  qt_observer o;
  QT_CHECK(qt_observer_init(&o, kind, C, err) == 0);
  o.bins = 512;
  snprintf(what, sizeof what, "%s (%lld, %d, %lld)", qt_observer_kind_name(kind), (long long)outer, C, (long long)inner);

  /* a bad first batch leaves the observer empty */
  x[n / 2] = NAN;
  err[0] = 0;
  QT_CHECK(qt_observer_update(&o, x, outer, inner, err) == -1);
  snprintf(want, sizeof want, "input holds NaN at element %lld", (long long)(n / 2));
  if (!strstr(err, want)) qt_test_fail("%s: message '%s' lacks '%s'", what, err, want);
  QT_CHECK(!o.initialized);
  float s[64];
  int32_t z[64];
  QT_CHECK(qt_observer_qparams(&o, 0, 255, 0, s, z, err) == -1 && strstr(err, "nothing observed"));
  x[n / 2] = 0.5f;

  QT_CHECK(qt_observer_update(&o, x, outer, inner, err) == 0);
  snapshot before, after;
  take(&before, &o);
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  const char *names[3] = {"NaN", "+Inf", "-Inf"};
  const int64_t where[3] = {n - 1, 0, n / 3};
  for (int k = 0; k < 3; k++) {
    float *y = qt_test_copy_f32(x, n);
    for (int64_t i = 0; i < n; i++) y[i] *= 10.0f; /* would widen the range if accepted */
    y[where[k]] = bad[k];
    if (k == 2 && n > 8) y[n - 2] = NAN; /* a later NaN: the first bad element is named */
    err[0] = 0;
    QT_CHECK(qt_observer_update(&o, y, outer, inner, err) == -1);
    snprintf(want, sizeof want, "input holds %s at element %lld", names[k], (long long)where[k]);
    if (!strstr(err, want)) qt_test_fail("%s: message '%s' lacks '%s'", what, err, want);
    take(&after, &o);
    if (!same(&before, &after)) qt_test_fail("%s: state changed by a batch holding %s", what, names[k]);
    free(y);
  }
  /* still usable */
  QT_CHECK(qt_observer_qparams(&o, -128, 127, 1, s, z, err) == 0);
  qt_observer_free(&o);
  free(x);
}

static void lifecycle(void) {
  char err[QT_ERR_LEN];
  qt_observer o, c;
  err[0] = 0;
  QT_CHECK(qt_observer_init(&o, QT_OBSERVER_HISTOGRAM, 4, err) == -1 && strstr(err, "per tensor"));
  QT_CHECK(qt_observer_init(&o, QT_OBSERVER_MINMAX, 0, err) == -1);

  QT_CHECK(qt_observer_init(&o, QT_OBSERVER_HISTOGRAM, 1, err) == 0);
  QT_CHECK(o.averaging_constant == 0.01f && o.bins == 2048 && o.percentile == 99.99f);
  float x[1000];
  qt_test_fill_uniform(x, 1000, -1.0f, 2.0f, 3);
  QT_CHECK(qt_observer_update(&o, x, 0, 1000, err) == 0 && !o.initialized); /* empty: nothing happens */
  QT_CHECK(qt_observer_update(&o, x, 1, 1000, err) == 0 && o.initialized);

  /* deep copy into a zeroed observer and into a live one */
  memset(&c, 0, sizeof c);
  QT_CHECK(qt_observer_copy(&c, &o, err) == 0);
  QT_CHECK(c.hist != o.hist && c.min != o.min && c.bins == o.bins && c.kind == o.kind);
  QT_CHECK(memcmp(c.hist, o.hist, (size_t)o.bins * sizeof(int64_t)) == 0);
  QT_CHECK(c.min[0] == o.min[0] && c.max[0] == o.max[0] && c.hist_min == o.hist_min && c.hist_max == o.hist_max);
  float s1, s2;
  int32_t z1, z2;
  QT_CHECK(qt_observer_qparams(&o, 0, 255, 0, &s1, &z1, err) == 0);
  QT_CHECK(qt_observer_qparams(&c, 0, 255, 0, &s2, &z2, err) == 0);
  QT_CHECK(s1 == s2 && z1 == z2);
  for (int i = 0; i < 1000; i++) x[i] *= 5.0f;
  QT_CHECK(qt_observer_update(&o, x, 1, 1000, err) == 0);
  QT_CHECK(c.max[0] < o.max[0]); /* the copy does not follow the source */
  qt_observer live;
  QT_CHECK(qt_observer_init(&live, QT_OBSERVER_MINMAX, 3, err) == 0);
  QT_CHECK(qt_observer_copy(&live, &o, err) == 0); /* frees live's buffers (ASan checks) */
  QT_CHECK(live.channels == 1 && live.kind == QT_OBSERVER_HISTOGRAM && live.max[0] == o.max[0]);
  qt_observer_free(&live);

  qt_observer_reset(&o);
  QT_CHECK(!o.initialized && o.hist == NULL);
  QT_CHECK(qt_observer_qparams(&o, 0, 255, 0, &s1, &z1, err) == -1);
  float lo, hi;
  QT_CHECK(qt_observer_range(&o, 0, 255, &lo, &hi) == -1);
  o.bins = 3; /* too few bins: refused at the next update */
  QT_CHECK(qt_observer_update(&o, x, 1, 1000, err) == -1 && strstr(err, "bins"));
  o.bins = 256;
  QT_CHECK(qt_observer_update(&o, x, 1, 1000, err) == 0);
  o.method = QT_RANGE_PERCENTILE;
  o.percentile = 120.0f;
  QT_CHECK(qt_observer_qparams(&o, 0, 255, 0, &s1, &z1, err) == -1 && strstr(err, "percentile"));
  qt_observer_free(&o);
  qt_observer_free(&c);
}

static void names_and_ranges(void) {
  QT_CHECK_NAMES(qt_observer_kind, QT_OBSERVER_COUNT, qt_observer_kind_name, qt_observer_kind_parse);
  QT_CHECK_NAMES(qt_range_method, QT_RANGE_COUNT, qt_range_method_name, qt_range_method_parse);
  qt_observer_kind k;
  qt_range_method m;
  QT_CHECK(qt_observer_kind_parse("min_max", &k) == -1 && qt_observer_kind_parse(NULL, &k) == -1);
  QT_CHECK(qt_range_method_parse("l2", &m) == -1);
  QT_CHECK(strcmp(qt_observer_kind_name(QT_OBSERVER_MOVING_AVERAGE), "moving_average") == 0);

  int lo = 1, hi = 1;
  QT_CHECK(qt_qrange(1, 1, &lo, &hi) == -1 && qt_qrange(9, 0, &lo, &hi) == -1 && lo == 1 && hi == 1);
  QT_CHECK(qt_qrange(8, 1, &lo, &hi) == 0 && lo == -128 && hi == 127);
  QT_CHECK(qt_qrange(8, 0, &lo, &hi) == 0 && lo == 0 && hi == 255);
  QT_CHECK(qt_qrange(4, 1, &lo, &hi) == 0 && lo == -8 && hi == 7);
  QT_CHECK(qt_qrange(2, 0, &lo, &hi) == 0 && lo == 0 && hi == 3);
  QT_CHECK(qt_qrange(7, 1, &lo, &hi) == 0 && lo == -64 && hi == 63);

  float s = 7.0f;
  int32_t z = 7;
  QT_CHECK(qt_qparams_from_range(NAN, 1.0f, 0, 255, 0, &s, &z) == -1);
  QT_CHECK(qt_qparams_from_range(-1.0f, INFINITY, 0, 255, 0, &s, &z) == -1);
  QT_CHECK(qt_qparams_from_range(-INFINITY, 1.0f, -128, 127, 1, &s, &z) == -1);
  QT_CHECK(qt_qparams_from_range(2.0f, 1.0f, 0, 255, 0, &s, &z) == -1);
  QT_CHECK(qt_qparams_from_range(-3e38f, 3e38f, 0, 255, 0, &s, &z) == -1); /* width overflows */
  QT_CHECK(s == 7.0f && z == 7);
  QT_CHECK(qt_qparams_from_range(0.0f, 0.0f, 0, 255, 0, &s, &z) == 0 && s == 1.1920929e-07f && z == 0);
  QT_CHECK(qt_qparams_from_range(0.0f, 0.0f, -128, 127, 1, &s, &z) == 0 && s == 1.1920929e-07f && z == 0);
  QT_CHECK(qt_qparams_from_range(-2.0f, -2.0f, 0, 15, 0, &s, &z) == 0 && z == 15);
}

int main(void) {
  lifecycle();
  names_and_ranges();
  for (int kind = 0; kind < QT_OBSERVER_COUNT; kind++) {
    bad_values((qt_observer_kind)kind, 1, 1, 1000);
    bad_values((qt_observer_kind)kind, 1, 50000, 1); /* parallel-sized, per tensor */
    if (kind == QT_OBSERVER_HISTOGRAM) continue;
    bad_values((qt_observer_kind)kind, 7, 13, 1);   /* channel last */
    bad_values((qt_observer_kind)kind, 7, 3, 11);   /* channel in the middle */
    bad_values((qt_observer_kind)kind, 33, 1, 1200); /* weights, parallel-sized */
    bad_values((qt_observer_kind)kind, 48, 900, 1);  /* NHWC, parallel-sized */
  }
  return qt_test_finish();
}
