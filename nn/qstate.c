/* Quantization state on graph nodes: spec, observer, qparams and flags. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "base/base.h"

qt_qstate *qt_qstate_create(const qt_qspec *spec, int channels, char *err) {
  qt_qstate *q = calloc(1, sizeof *q);
  QT_ASSERT(q, "out of memory");
  q->spec = *spec;
  q->channels = channels;
  q->scale = calloc((size_t)channels, sizeof(float));
  q->zero_point = calloc((size_t)channels, sizeof(int32_t));
  QT_ASSERT(q->scale && q->zero_point, "out of memory");
  for (int c = 0; c < channels; c++) q->scale[c] = 1.0f;
  if (qt_observer_init(&q->obs, spec->observer, channels, err)) {
    QT_FREE_ALL(q->scale, q->zero_point, q);
    return NULL;
  }
  q->obs.method = spec->method;
  if (spec->percentile > 0) q->obs.percentile = spec->percentile;
  q->observe = 1;
  q->fake_quant = 1;
  q->scale_param = -1;
  if (spec->fixed_scale > 0) {
    q->scale[0] = spec->fixed_scale;
    q->zero_point[0] = spec->fixed_zero_point;
    q->calibrated = 1;
  }
  return q;
}

qt_qstate *qt_qstate_clone(const qt_qstate *src) {
  if (!src) return NULL;
  char err[QT_ERR_LEN];
  qt_qstate *q = calloc(1, sizeof *q);
  QT_ASSERT(q, "out of memory");
  *q = *src;
  memset(&q->obs, 0, sizeof q->obs);
  q->scale = malloc((size_t)src->channels * sizeof(float));
  q->zero_point = malloc((size_t)src->channels * sizeof(int32_t));
  QT_ASSERT(q->scale && q->zero_point, "out of memory");
  memcpy(q->scale, src->scale, (size_t)src->channels * sizeof(float));
  memcpy(q->zero_point, src->zero_point, (size_t)src->channels * sizeof(int32_t));
  QT_ASSERT(qt_observer_copy(&q->obs, &src->obs, err) == 0, "cloning an observer: %s", err);
  if (src->qweight) {
    q->qweight = malloc((size_t)src->n_qweight * sizeof(int32_t));
    QT_ASSERT(q->qweight, "out of memory");
    memcpy(q->qweight, src->qweight, (size_t)src->n_qweight * sizeof(int32_t));
  }
  if (src->qbias) {
    q->qbias = malloc((size_t)src->n_qbias * sizeof(int32_t));
    QT_ASSERT(q->qbias, "out of memory");
    memcpy(q->qbias, src->qbias, (size_t)src->n_qbias * sizeof(int32_t));
  }
  return q;
}

void qt_qstate_free(qt_qstate *q) {
  if (!q) return;
  qt_observer_free(&q->obs);
  QT_FREE_ALL(q->scale, q->zero_point, q->qweight, q->qbias, q);
}

/* Rounds each scale up to the next power of two (exact: frexpf/ldexpf), so that hardware can
 * rescale by shifting; an affine zero point is recomputed for the new scale from the observed
 * range, with the formula of qt_qparams_from_range. */
static int round_scales_to_pow2(qt_qstate *q, char *err) {
  float *mn = NULL;
  if (!q->spec.symmetric) {
    mn = malloc(2 * (size_t)q->channels * sizeof(float));
    QT_ASSERT(mn, "out of memory");
    if (qt_observer_range(&q->obs, q->spec.qmin, q->spec.qmax, mn, mn + q->channels)) {
      snprintf(err, QT_ERR_LEN, "observer: no range to round a power-of-two scale from");
      free(mn);
      return -1;
    }
  }
  for (int c = 0; c < q->channels; c++) {
    int e;
    const float m = frexpf(q->scale[c], &e); /* scale = m * 2^e, m in [0.5, 1) */
    if (m != 0.5f) q->scale[c] = ldexpf(1.0f, e);
    if (mn) {
      const float min_neg = mn[c] < 0.0f ? mn[c] : 0.0f;
      const float r = nearbyintf(min_neg / q->scale[c]);
      const int64_t z = (int64_t)q->spec.qmin - (int64_t)r;
      q->zero_point[c] = (int32_t)(z < q->spec.qmin ? q->spec.qmin : z > q->spec.qmax ? q->spec.qmax : z);
    }
  }
  free(mn);
  return 0;
}

int qt_qstate_observe(qt_qstate *q, const float *data, int64_t outer, int64_t inner, char *err) {
  return qt_qstate_observe_sync(q, data, outer, inner, NULL, err);
}

int qt_qstate_observe_sync(qt_qstate *q, const float *data, int64_t outer, int64_t inner, const qt_batch_sync *sync,
                           char *err) {
  if (q->spec.fixed_scale > 0) { /* fixed qparams: nothing to observe */
    for (int c = 0; c < q->channels; c++) {
      q->scale[c] = q->spec.fixed_scale;
      q->zero_point[c] = q->spec.fixed_zero_point;
    }
    q->calibrated = 1;
    return 0;
  }
  if (qt_observer_update_sync(&q->obs, data, outer, inner, sync, err)) return -1;
  if (qt_observer_qparams(&q->obs, q->spec.qmin, q->spec.qmax, q->spec.symmetric, q->scale, q->zero_point, err))
    return -1;
  if (q->spec.pow2_scale && round_scales_to_pow2(q, err)) return -1;
  q->calibrated = 1;
  return 0;
}
