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

#include "quant/quant.h"
#include "quant/quant_assert.h"

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

QT_DEFINE_NAMES(qt_observer_kind, QT_OBSERVER_COUNT, qt_observer_kind_name, qt_observer_kind_parse, "minmax",
                "moving_average", "histogram")
QT_DEFINE_NAMES(qt_range_method, QT_RANGE_COUNT, qt_range_method_name, qt_range_method_parse, "minmax", "percentile",
                "mse")
