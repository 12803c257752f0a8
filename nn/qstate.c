/* Quantization state on graph nodes: spec, observer, qparams and flags. */
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

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
    free(q->scale);
    free(q->zero_point);
    free(q);
    return NULL;
  }
  q->obs.method = spec->method;
  if (spec->percentile > 0) q->obs.percentile = spec->percentile;
  q->observe = 1;
  q->fake_quant = 1;
  q->scale_param = -1;
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
  return q;
}

void qt_qstate_free(qt_qstate *q) {
  if (!q) return;
  qt_observer_free(&q->obs);
  free(q->scale);
  free(q->zero_point);
  free(q->qweight);
  free(q);
}

int qt_qstate_observe(qt_qstate *q, const float *data, int64_t outer, int64_t inner, char *err) {
  if (qt_observer_update(&q->obs, data, outer, inner, err)) return -1;
  if (qt_observer_qparams(&q->obs, q->spec.qmin, q->spec.qmax, q->spec.symmetric, q->scale, q->zero_point, err))
    return -1;
  q->calibrated = 1;
  return 0;
}
