/* What the trainer's gradient buckets rely on (train/trainer.c): the tape position the forward
 * records for each parameter (qt_param.tape_at) and the backward hook (qt_ctx_set_backward_hook).
 * For the presets (fashion_cnn, fashion_mlp, res_cnn) in fp32 and fashion_cnn prepared for QAT W4A8
 * with LSQ scales, two training steps each (the first initializes LSQ's scales): the hook sees
 * every tape entry once, from the last to 0; every parameter the forward used has a tape_at; and
 * once the hook has reported an entry at or before a parameter's tape_at, the parameter's gradient
 * never changes again (its bits then are its bits after the backward), while the step does write
 * gradients. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "qat/qat.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"

#define BATCH 4

typedef struct {
  const char *name;
  qt_graph *g;
  size_t next;     /* the entry the hook should see next */
  int *final;      /* per tensor: its gradient is final */
  uint64_t *hash;  /* per tensor: the gradient's bits when it became final */
} watch;

static uint64_t grad_hash(const qt_graph *g, const qt_param *p) {
  return qt_dist_hash(QT_DIST_HASH_INIT, g->grads + p->offset, (size_t)p->numel * sizeof(float));
}

static void on_entry(void *user, size_t entry) {
  watch *w = user;
  if (entry != w->next) qt_test_fail("%s: the hook saw entry %zu, want %zu", w->name, entry, w->next);
  w->next = entry - 1;
  for (int i = 0; i < w->g->n_tensors; i++) {
    const qt_param *p = &w->g->tensors[i];
    if (p->is_buffer || p->tape_at < 0 || w->final[i] || (int64_t)entry > p->tape_at) continue;
    w->final[i] = 1;
    w->hash[i] = grad_hash(w->g, p);
  }
}

static void steps(const char *name, qt_graph *g) {
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {BATCH, in->shape[0], in->shape[1], in->shape[2]};
  const int64_t n = BATCH * in->shape[0] * in->shape[1] * in->shape[2];
  float *images = malloc((size_t)n * sizeof *images);
  QT_ASSERT(images, "out of memory");
  int32_t labels[BATCH] = {1, 0, 3, 2};
  watch w = {name, g, 0, calloc((size_t)g->n_tensors, sizeof(int)), calloc((size_t)g->n_tensors, sizeof(uint64_t))};
  QT_ASSERT(w.final && w.hash, "out of memory");
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_backward_frees(ctx, 1);
  qt_ctx_set_backward_hook(ctx, on_entry, &w);
  for (int step = 0; step < 2; step++) {
    qt_test_fill_uniform(images, n, -1.0f, 1.0f, 7 + (uint64_t)step);
    qt_ctx_reset(ctx);
    qt_ctx_set_grad(ctx, 1);
    qt_tensor *logits = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, images));
    QT_ASSERT(logits, "%s: %s", name, g->error);
    float *probs;
    qt_tensor *loss = qt_cross_entropy(ctx, logits, labels, &probs);
    qt_graph_zero_grad(g);
    memset(w.final, 0, (size_t)g->n_tensors * sizeof *w.final);
    w.next = qt_ctx_tape_length(ctx) - 1;
    qt_backward(ctx, loss);
    if (w.next != (size_t)-1) qt_test_fail("%s: the hook stopped before entry 0 (next %zu)", name, w.next);
    int used = 0, written = 0;
    for (int i = 0; i < g->n_tensors; i++) {
      const qt_param *p = &g->tensors[i];
      if (p->is_buffer) continue;
      if (p->tape_at < 0) {
        qt_test_fail("%s step %d: parameter %s: no tape position after the forward", name, step, p->name);
        continue;
      }
      used++;
      if (!w.final[i]) qt_test_fail("%s step %d: parameter %s never became final", name, step, p->name);
      else if (w.hash[i] != grad_hash(g, p))
        qt_test_fail("%s step %d: parameter %s (tape_at %lld): its gradient changed after the hook said it was final",
                     name, step, p->name, (long long)p->tape_at);
      for (int64_t k = 0; k < p->numel && !written; k++) written = g->grads[p->offset + k] != 0;
    }
    if (!used || !written) qt_test_fail("%s step %d: %d parameters used, gradients written: %d", name, step, used, written);
  }
  qt_ctx_free(ctx);
  free(w.final);
  free(w.hash);
  free(images);
}

int main(void) {
  char err[QT_ERR_LEN];
  static const char *const models[] = {"fashion_cnn", "fashion_mlp", "res_cnn"};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    qt_graph *g = qt_model_build(models[i], err);
    QT_ASSERT(g, "%s", err);
    qt_graph_set_mode(g, QT_MODE_TRAIN);
    steps(models[i], g);
    if (i == 0) {
      qt_quantizer_config qc = qt_test_quantizer_config(4, 8);
      qc.learnable_scale = 1;
      qt_graph *p = qt_test_prepare_onednn(g, &qc, QT_PREPARE_QAT);
      qt_graph_set_mode(p, QT_MODE_TRAIN);
      steps("fashion_cnn QAT W4A8 LSQ", p);
      qt_graph_free(p);
    }
    qt_graph_free(g);
  }
  return qt_test_finish();
}
