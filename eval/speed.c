/* Inference speed (report.h): the framework's fp32 executor against the device on
 * the same batch of test images, timed model-only (no data loading). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval/report.h"

typedef struct {
  qt_graph *fp32;
  qt_ctx *ctx;
  qt_device *device;
  float *out;
  const float *x;
  int n, h, w, c;
  char *err;
} engines;

static int run_fp32(engines *e) {
  qt_ctx_reset(e->ctx);
  const int64_t shape[4] = {e->n, e->h, e->w, e->c};
  if (!qt_graph_forward(e->fp32, e->ctx, qt_tensor_wrap(e->ctx, QT_F32, 4, shape, (void *)e->x))) {
    snprintf(e->err, QT_ERR_LEN, "inference speed: fp32 model: %s", e->fp32->error);
    return -1;
  }
  return 0;
}

static int run_int8(engines *e) { return qt_device_run(e->device, e->out, e->x, e->n, e->err); }

/* Seconds for `batches` runs, or -1. */
static double time_runs(int (*run)(engines *), engines *e, int batches) {
  const double t0 = qt_now_seconds();
  for (int i = 0; i < batches; i++)
    if (run(e)) return -1;
  return qt_now_seconds() - t0;
}

int qt_inference_measure(qt_graph *fp32, qt_device *device, const qt_dataset *ds, const qt_loader_config *lc, int batch,
                         int batches, int rounds, qt_inference_speed *out, char *err) {
  memset(out, 0, sizeof *out);
  QT_ASSERT(batch > 0 && batches > 0 && rounds > 0, "inference speed: batch %d, %d batches, %d rounds", batch, batches,
            rounds);
  int h, w, c;
  qt_device_input_shape(device, &h, &w, &c);
  if (ds->n == 0 || ds->h != h || ds->w != w || ds->c != c) {
    snprintf(err, QT_ERR_LEN, "inference speed: the model takes %dx%dx%d images, the test set holds %lld of %dx%dx%d",
             h, w, c, (long long)ds->n, ds->h, ds->w, ds->c);
    return -1;
  }
  /* One batch of the first test images, repeated when the set is smaller than a batch. */
  qt_loader_config cfg = *lc;
  cfg.batch_size = ds->n < batch ? (int)ds->n : batch;
  cfg.shuffle = 0;
  cfg.crop_pad = 0;
  cfg.flip = 0;
  qt_loader *l = qt_loader_create(ds, &cfg, err);
  if (!l) return -1;
  qt_loader_start_epoch(l, 0);
  const float *images;
  const int32_t *labels;
  const int got = qt_loader_next(l, &images, &labels);
  const size_t per_sample = (size_t)h * (size_t)w * (size_t)c;
  float *x = malloc((size_t)batch * per_sample * sizeof(float));
  float *o = malloc((size_t)batch * (size_t)qt_device_output_numel(device) * sizeof(float));
  QT_ASSERT(x && o && got > 0, "inference speed: a batch of %d", batch);
  for (int i = 0; i < batch; i++)
    memcpy(x + (size_t)i * per_sample, images + (size_t)(i % got) * per_sample, per_sample * sizeof(float));
  qt_loader_free(l);

  engines e = {fp32, NULL, device, o, x, batch, h, w, c, err};
  int rc = -1;
  if (fp32) {
    e.ctx = qt_ctx_create();
    qt_ctx_set_grad(e.ctx, 0);
    qt_graph_set_mode(fp32, QT_MODE_EVAL);
  }
  /* Warm-up: oneDNN primitives are created for the batch size on first use. */
  for (int i = 0; i < 2; i++)
    if ((fp32 && run_fp32(&e)) || run_int8(&e)) goto done;
  double best_fp32 = 0, best_int8 = 0;
  for (int r = 0; r < rounds; r++) {
    if (fp32) {
      const double s = time_runs(run_fp32, &e, batches);
      if (s < 0) goto done;
      if (s > 0 && (double)batches * batch / s > best_fp32) best_fp32 = (double)batches * batch / s;
    }
    const double s = time_runs(run_int8, &e, batches);
    if (s < 0) goto done;
    if (s > 0 && (double)batches * batch / s > best_int8) best_int8 = (double)batches * batch / s;
  }
  out->batch = batch;
  out->images = (int64_t)batches * batch;
  out->fp32_images_per_s = best_fp32;
  out->int8_images_per_s = best_int8;
  rc = 0;
done:
  qt_ctx_free(e.ctx);
  free(x);
  free(o);
  return rc;
}
