/* FashionCNN trained 20 SGD steps from PyTorch's initialization matches PyTorch's losses and
 * final parameters (reference: tests/ref/make_ref_fashion_cnn.py, computed in float64).
 * Tolerances: training at lr 0.05 amplifies float32 rounding, so each step's loss may differ
 * from float64 by 1e-4 relative plus 3x PyTorch's own float32 drift at that step; each final
 * tensor by 1e-5 plus 3x PyTorch's float32 max drift for that tensor. A real error (a wrong
 * gradient, a BN statistic off by n/(n-1)) shows in the first steps, where the drift is ~1e-5. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "optim/optim.h"
#include "tests/common/graph_util.h"
#include "tests/common/testutil.h"

#define STEPS 20
#define BATCH 32

int main(void) {
  const char *ref = qt_test_path("tests/ref/fashion_cnn_steps.h5");
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  QT_CHECK(g != NULL);
  if (!g) return qt_test_finish();
  qt_test_load_graph_tensors(g, ref, "init/");
  int64_t ishape[8], lshape[8];
  int nd;
  float *images = qt_test_load_f32(ref, "images", ishape, &nd); /* uint8 converted by HDF5 */
  int32_t *labels = qt_test_load_i32(ref, "labels", lshape, &nd);
  float *losses = qt_test_load_f32(ref, "losses", lshape, &nd);
  float *losses32 = qt_test_load_f32(ref, "losses_float32", lshape, &nd);

  qt_optim_config oc = {.kind = QT_OPTIM_SGD, .momentum = 0.9f, .weight_decay = 5e-4f};
  qt_optim *opt = qt_optim_create(&oc, g->n_params);
  qt_ctx *ctx = qt_ctx_create();
  float got[STEPS];
  float *x = malloc(sizeof(float) * BATCH * 784);
  for (int s = 0; s < STEPS; s++) {
    for (int i = 0; i < BATCH * 784; i++) x[i] = (images[s * BATCH * 784 + i] / 255.0f - 0.2860f) / 0.3530f;
    qt_ctx_reset(ctx);
    int64_t shape[4] = {BATCH, 28, 28, 1};
    qt_tensor *in = qt_tensor_wrap(ctx, QT_F32, 4, shape, x);
    qt_tensor *logits = qt_graph_forward(g, ctx, in);
    qt_tensor *loss = qt_cross_entropy(ctx, logits, labels + s * BATCH, NULL);
    got[s] = qt_f32(loss)[0];
    qt_graph_zero_grad(g);
    qt_backward(ctx, loss);
    if (s == 0) /* the tape's gradients against PyTorch float64 autograd: 1e-5 + 1e-4 relative
                  (conv1.weight sums 25k float32 terms with cancellation) */
      for (int i = 0; i < g->n_tensors; i++) {
        if (g->tensors[i].is_buffer) continue;
        const char *tn = g->tensors[i].name;
        int fc1 = strcmp(tn, "fc1.weight") == 0;
        char name[256];
        snprintf(name, sizeof name, "grad0/%s", fc1 ? "fc1.weight_rows0to7" : tn);
        int64_t gs[8];
        float *want = qt_test_load_f32(ref, name, gs, &nd);
        char what[300];
        snprintf(what, sizeof what, "step 0 gradient of %s", tn);
        qt_test_close(what, g->grads + g->tensors[i].offset, want, fc1 ? 8 * 3136 : g->tensors[i].numel, 1e-5f, 1e-4f);
        free(want);
      }
    qt_optim_step(opt, g->params, g->grads, 0.05f);
  }
  for (int s = 0; s < STEPS; s++) {
    float tol = 1e-4f * fabsf(losses[s]) + 3.0f * fabsf(losses32[s] - losses[s]);
    if (!(fabsf(got[s] - losses[s]) <= tol))
      qt_test_fail("step %d: loss %.6f, float64 reference %.6f (PyTorch float32 %.6f), tolerance %.2g", s, got[s],
                   losses[s], losses32[s], tol);
  }
  for (int i = 0; i < g->n_tensors; i++) {
    char name[256];
    const char *tn = g->tensors[i].name;
    int64_t n = g->tensors[i].numel;
    if (strcmp(tn, "fc1.weight") == 0) {
      snprintf(name, sizeof name, "final/fc1.weight_rows0to7");
      n = 8 * 3136;
    } else {
      snprintf(name, sizeof name, "final/%s", tn);
    }
    int64_t shape[8];
    float *want = qt_test_load_f32(ref, name, shape, &nd);
    QT_CHECK(qt_test_numel(shape, nd) == n);
    char sname[256];
    snprintf(sname, sizeof sname, "final_float32_spread/%s", strchr(name, '/') + 1);
    float *spread = qt_test_load_f32(ref, sname, shape, &nd);
    qt_test_close(tn, qt_graph_tensor_data(g, i), want, n, 1e-5f + 3.0f * spread[0], 0);
    free(spread);
    free(want);
  }
  free(x);
  free(images);
  free(labels);
  free(losses);
  free(losses32);
  qt_ctx_free(ctx);
  qt_optim_free(opt);
  qt_graph_free(g);
  return qt_test_finish();
}
