/* Quantization spec helpers: integer ranges for a bit width, qparams from an observed range
 * (PyTorch 1.13's UniformQuantizationObserverBase._calculate_qparams, in float32), and the
 * name tables of the observer and range-method enums.
 *
 * Relies on the C11 (non-GNU) default -ffp-contract=off: no expression here may be fused into
 * an FMA, or the scales would stop matching PyTorch bit for bit (the tests would notice). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/quant.h"

#define QUANT_ASSERT(cond, msg) QT_ASSERT(cond, "invariant broken: %s", msg)

int qt_qrange(int bits, int is_signed, int *qmin, int *qmax) {
  if (bits < 2 || bits > 8) return -1;
  if (is_signed) {
    *qmin = -(1 << (bits - 1));
    *qmax = (1 << (bits - 1)) - 1;
  } else {
    *qmin = 0;
    *qmax = (1 << bits) - 1;
  }
  return 0;
}

int qt_qparams_from_range(float min, float max, int qmin, int qmax, int symmetric, float *scale, int32_t *zp) {
  QUANT_ASSERT(qmin < qmax, "qparams: quant_min must be below quant_max");
  if (!isfinite(min) || !isfinite(max) || min > max) return -1;
  /* torch.min(min_val, 0) / torch.max(max_val, 0): the range always holds zero. */
  float min_neg = min < 0.0f ? min : 0.0f;
  float max_pos = max > 0.0f ? max : 0.0f;
  float s;
  int32_t z;
  if (symmetric) {
    float m = -min_neg > max_pos ? -min_neg : max_pos;
    /* float(quant_max - quant_min) / 2 is exact in float32 for every range we allow. */
    s = m / ((float)(qmax - qmin) / 2.0f);
    if (!(s >= FLT_EPSILON)) s = FLT_EPSILON;
    if (qmin < 0) {
      z = 0;
    } else if (qmin == 0 && qmax == 255) {
      z = 128; /* quint8 with PyTorch's default range */
    } else {
      z = (qmin + qmax) / 2; /* quint8 with a customized range: the down-rounded midpoint */
    }
  } else {
    s = (max_pos - min_neg) / (float)(qmax - qmin);
    if (!(s >= FLT_EPSILON)) s = FLT_EPSILON;
    float r = nearbyintf(min_neg / s); /* torch.round: half to even; |r| <= qmax - qmin */
    int64_t zz = (int64_t)qmin - (int64_t)r;
    z = (int32_t)(zz < qmin ? qmin : zz > qmax ? qmax : zz);
  }
  if (!isfinite(s)) return -1; /* the range's width overflows float32 */
  *scale = s;
  *zp = z;
  return 0;
}

static const char *const observer_kind_names[] = {"minmax", "moving_average", "histogram"};
_Static_assert(sizeof observer_kind_names / sizeof observer_kind_names[0] == QT_OBSERVER_COUNT,
               "every observer kind needs a name");
static const char *const range_method_names[] = {"minmax", "percentile", "mse"};
_Static_assert(sizeof range_method_names / sizeof range_method_names[0] == QT_RANGE_COUNT,
               "every range method needs a name");

const char *qt_observer_kind_name(qt_observer_kind k) {
  return (unsigned)k < QT_OBSERVER_COUNT ? observer_kind_names[k] : "?";
}

int qt_observer_kind_parse(const char *name, qt_observer_kind *out) {
  for (int k = 0; k < QT_OBSERVER_COUNT; k++) {
    if (name && strcmp(name, observer_kind_names[k]) == 0) {
      *out = (qt_observer_kind)k;
      return 0;
    }
  }
  return -1;
}

const char *qt_range_method_name(qt_range_method m) {
  return (unsigned)m < QT_RANGE_COUNT ? range_method_names[m] : "?";
}

int qt_range_method_parse(const char *name, qt_range_method *out) {
  for (int m = 0; m < QT_RANGE_COUNT; m++) {
    if (name && strcmp(name, range_method_names[m]) == 0) {
      *out = (qt_range_method)m;
      return 0;
    }
  }
  return -1;
}
