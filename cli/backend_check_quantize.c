/* qat_backend_check --quantize: the PTQ pipeline that makes a Q/DQ graph from a qat_train config
 * with the Quantizer of a backend description (kept apart from the program so that it can be
 * replaced by the training pipeline's PTQ stage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/backend_check_quantize.h"
#include "train/train.h"

/* PTQ with the Quantizer derived from d: build, load the fp32 checkpoint, annotate, prepare,
 * calibrate, convert, save. */
int qt_backend_check_quantize(const qt_config *cfg, const qt_backend_desc *d, const char *out_path, char *err) {
  int rc = -1;
  qt_graph *g = qt_model_build(qt_config_string(cfg, "model", "name"), err), *p = NULL, *c = NULL;
  qt_dataset train, test;
  memset(&train, 0, sizeof train);
  memset(&test, 0, sizeof test);
  qt_loader *l = NULL;
  qt_ctx *ctx = NULL;
  qt_annotations ann;
  memset(&ann, 0, sizeof ann);
  if (!g) goto done;
  const char *ck = qt_config_string(cfg, "quant", "fp32_checkpoint");
  if (!ck[0]) {
    snprintf(err, QT_ERR_LEN, "--quantize: the config sets no quant.fp32_checkpoint (the fp32 model to quantize)");
    goto done;
  }
  if (qt_checkpoint_load(ck, g, NULL, NULL, err)) goto done;
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qc.weight_bits = qt_config_int(cfg, "quant", "weight_bits");
  qc.activation_bits = qt_config_int(cfg, "quant", "activation_bits");
  const char *wo = qt_config_string(cfg, "quant", "weight_observer");
  if (qt_observer_kind_parse(strcmp(wo, "auto") == 0 ? "minmax" : wo, &qc.weight_observer) ||
      qt_observer_kind_parse(qt_config_string(cfg, "quant", "activation_observer"), &qc.activation_observer) ||
      qt_range_method_parse(qt_config_string(cfg, "quant", "activation_range"), &qc.activation_method)) {
    snprintf(err, QT_ERR_LEN, "--quantize: unknown observer or range method");
    goto done;
  }
  qc.percentile = (float)qt_config_float(cfg, "quant", "percentile");
  if (qt_parse_overrides(&qc, qt_config_string(cfg, "quant", "layer_overrides"), err)) goto done;
  if (qt_quantizer(g, d, &qc, &ann, err)) goto done;
  printf("quantizer derived from %s (W%d A%d):\n", d->name, qc.weight_bits, qc.activation_bits);
  qt_annotations_print(g, &ann, stdout);
  p = qt_prepare(g, &ann, QT_PREPARE_PTQ, err);
  if (!p) goto done;
  if (qt_train_load_data(cfg, &train, &test, err)) goto done;
  qt_loader_config lc = qt_train_loader_config(cfg, qt_config_int(cfg, "train", "batch_size"), 0, 0);
  lc.shuffle = 1;
  l = qt_loader_create(&train, &lc, err);
  if (!l) goto done;
  ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  /* calibration mode: observers on, fake quant off, BN (none left after PTQ folding) in eval */
  qt_graph_set_training(p, 0);
  for (int i = 0; i < p->n_nodes; i++)
    if (p->nodes[i].q || p->nodes[i].wq) p->nodes[i].training = 1;
  qt_set_observers(p, 1);
  qt_set_fake_quant(p, 0);
  qt_loader_start_epoch(l, 0);
  const int batches = qt_config_int(cfg, "quant", "calibration_batches");
  int done_batches = 0, B;
  const float *images;
  const int32_t *labels;
  while (done_batches < batches && (B = qt_loader_next(l, &images, &labels)) > 0) {
    qt_ctx_reset(ctx);
    const int64_t shape[4] = {B, train.h, train.w, train.c};
    if (!qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images))) {
      snprintf(err, QT_ERR_LEN, "calibration batch %d: %s", done_batches + 1, p->error);
      goto done;
    }
    done_batches++;
  }
  qt_set_observers(p, 0);
  qt_set_fake_quant(p, 1);
  qt_graph_set_training(p, 0);
  c = qt_convert(p, err);
  if (!c || qt_mkdir_parent(out_path, err) || qt_qdq_save(out_path, c, err)) goto done;
  printf("calibrated on %d batches; wrote %s\n", done_batches, out_path);
  rc = 0;
done:
  qt_annotations_free(&ann);
  qt_ctx_free(ctx);
  qt_loader_free(l);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  qt_graph_free(c);
  qt_graph_free(p);
  qt_graph_free(g);
  return rc;
}
