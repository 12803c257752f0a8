/* A vision transformer's ONNX ops (import_int.h). The graph IR holds the tokens [N, T, C] of a
 * patch embedding as the image (H, W, C) they came from (T = H * W, pixels in row-major order:
 * the same floats), so per-token ops are per-pixel ones:
 *   - Reshape of an image to [N, C, -1] (x.flatten(2)) then Transpose [0, 2, 1]: the tokens, no
 *     node (the sym's `tokens` says how the image stands for the ONNX tensor);
 *   - MatMul of tokens by a constant [C, E] (+ its bias Add): a 1x1 convolution;
 *   - Add of a learned [1, T, C] (a position embedding): add_param;
 *   - LayerNormalization over the last axis (tokens, or a flat [N, F]): layer_norm;
 *   - ReduceMean of tokens over T (the mean of the tokens): a global average pool;
 *   - multi-head attention as it is written by hand (timm, most small ViTs) and exported: q, k
 *     and v each Reshape'd to [N, T, heads, C / heads] and Transpose'd to [N, heads, T, C / heads]
 *     (k to [N, heads, C / heads, T], at once or by a second Transpose), MatMul(q, k^T), scaled by
 *     constants (before or after the MatMul) whose product is 1 / sqrt(C / heads), Softmax over the
 *     last axis, MatMul with v, Transpose [0, 2, 1, 3] and Reshape to [N, T, C]: one attention
 *     node. Every step before the last is pending (S_NONE, `attn`); a pending step read by anything
 *     else is refused by name;
 *   - nn.MultiheadAttention as torch's exporters write it (torchvision's ViT blocks): the tokens
 *     Transpose'd [1, 0, 2] to [T, N, C] (TOK_TN: the same image, read sequence first), q, k and v
 *     from one packed in_proj (a 1x1 convolution of 3 C outputs) by Reshape [T, N, 3, C],
 *     Unsqueeze 0, Transpose [3, 1, 2, 0, 4], Squeeze 3 and Gather 0, 1, 2 (three channel
 *     slices), each Reshape'd to [T, N * heads, C / heads], Transpose'd [1, 0, 2] and Reshape'd to
 *     [N, heads, T, C / heads]; k^T by Transpose [0, 1, 3, 2], or by Reshape to [N * heads, T,
 *     C / heads], Transpose [0, 2, 1] and Reshape to [N, heads, C / heads, T]; the output heads
 *     Transpose'd [2, 0, 1, 3] and Reshape'd to [T * N, C] (TOK_TNF: the attention node), the
 *     out_proj Gemm on it, Reshape to [T, N, C] and Transpose [1, 0, 2] back to the tokens. The
 *     reshapes' shapes may be constants with -1 for the batch or computed from Shape, with the
 *     batch times the heads or the tokens (import_shape.c).
 *   - a class token (torchvision's ViT): Expand of a learned [1, 1, C] to [N, 1, C] (its shape
 *     [batch, 1, 1] computed or constant), Concat'ed before the tokens along axis 1:
 *     prepend_token, whose tokens are the image (1, 1 + T, C); Gather of index 0 along axis 1
 *     of tokens (x[:, 0]): first_token, a flat [N, C].
 * Element-wise ops, the residual Add and GELU read tokens as they read images. */
#define _GNU_SOURCE /* struct hsearch_data in import_int.h */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/import_int.h"

/* The attention steps (sym.attn): the ONNX tensor each pending output stands for. */
enum {
  A_SPLIT = 1, /* [N, T, heads, C / heads] of the tokens `value` */
  A_HEADS,     /* [N, heads, T, C / heads] */
  A_KT,        /* [N, heads, C / heads, T] */
  A_SCORES,    /* q k^T [N, heads, T, T] (value q, attn_k k) */
  A_PROBS,     /* its Softmax over the last axis */
  A_OUT,       /* probs v [N, heads, T, C / heads] (attn_v v) */
  A_OUT_T,     /* Transpose'd back to [N, T, heads, C / heads] */
  /* nn.MultiheadAttention's (sequence first) */
  A_PACK,     /* [T, N, 3, C] of the packed projections `value` (3 C channels) */
  A_PACK_U,   /* [1, T, N, 3, C] */
  A_PACK_T,   /* [3, T, N, 1, C] */
  A_PACK_S,   /* [3, T, N, C] */
  A_SPLIT_TN, /* [T, N * heads, C / heads] of q, k or v `value` */
  A_HEADS_NT, /* [N * heads, T, C / heads] */
  A_KT_NT,    /* [N * heads, C / heads, T] */
  A_OUT_TN,   /* the output heads [T, N, heads, C / heads] */
  /* timm's (batch first) */
  A_QKV,     /* [N, T, 3, heads, C / 3 / heads] of the packed projections `value` (3 C channels) */
  A_QKV_T,   /* [3, N, heads, T, C / 3 / heads] */
  A_QKV_PART /* [1, N, heads, T, C / 3 / heads]: part attn_part of it */
};

static const char attn_what[] =
    "a step of multi-head attention (Reshape to [N, T, heads, C / heads], Transpose, MatMul(q, k^T), scale, "
    "Softmax, MatMul with v, Transpose, Reshape to [N, T, C]; or nn.MultiheadAttention's steps)";

static void param_node_name(imp *im, const char *w, const char *b, char *out);

static int is_attn(const sym *s) { return s && s->kind == S_NONE && s->attn; }
static int is_tokens(const sym *s) { return s && s->kind == S_ACT && s->tokens == TOK_TC; }

/* The current node's output as attention step `step` from p (p's fields kept). */
static sym *attn_pending(imp *im, const sym *p, int step) {
  sym *s = qt_imp_pending(im, p, attn_what);
  s->attn = step;
  return s;
}

static int64_t tokens_of(imp *im, const sym *s) {
  const qt_value *v = &im->g->values[s->value];
  return v->shape[0] * v->shape[1];
}
static int64_t channels_of(imp *im, const sym *s) { return im->g->values[s->value].shape[2]; }

void qt_imp_attn_shape(imp *im, const sym *s, int64_t *full, int *n) {
  const int64_t T = tokens_of(im, s), C = channels_of(im, s), h = s->heads, d = h ? C / h : 0, P = C / 3;
  const int64_t N = BATCH, Nh = batch_times(h ? h : 1);
  int64_t v[5];
  int k = 4;
  switch (s->attn) {
    case A_SPLIT: v[0] = N, v[1] = T, v[2] = h, v[3] = d; break;
    case A_HEADS: v[0] = N, v[1] = h, v[2] = T, v[3] = d; break;
    case A_KT: v[0] = N, v[1] = h, v[2] = d, v[3] = T; break;
    case A_SCORES:
    case A_PROBS: v[0] = N, v[1] = h, v[2] = T, v[3] = T; break;
    case A_OUT: v[0] = N, v[1] = h, v[2] = T, v[3] = d; break;
    case A_OUT_T: v[0] = N, v[1] = T, v[2] = h, v[3] = d; break;
    case A_PACK: v[0] = T, v[1] = N, v[2] = 3, v[3] = P; break;
    case A_PACK_U: v[0] = 1, v[1] = T, v[2] = N, v[3] = 3, v[4] = P, k = 5; break;
    case A_PACK_T: v[0] = 3, v[1] = T, v[2] = N, v[3] = 1, v[4] = P, k = 5; break;
    case A_PACK_S: v[0] = 3, v[1] = T, v[2] = N, v[3] = P; break;
    case A_SPLIT_TN: v[0] = T, v[1] = Nh, v[2] = d, k = 3; break;
    case A_HEADS_NT: v[0] = Nh, v[1] = T, v[2] = d, k = 3; break;
    case A_KT_NT: v[0] = Nh, v[1] = d, v[2] = T, k = 3; break;
    case A_QKV: v[0] = N, v[1] = T, v[2] = 3, v[3] = h, v[4] = h ? P / h : 0, k = 5; break;
    case A_QKV_T: v[0] = 3, v[1] = N, v[2] = h, v[3] = T, v[4] = h ? P / h : 0, k = 5; break;
    case A_QKV_PART: v[0] = 1, v[1] = N, v[2] = h, v[3] = T, v[4] = h ? P / h : 0, k = 5; break;
    default: v[0] = T, v[1] = N, v[2] = h, v[3] = d; break; /* A_OUT_TN */
  }
  qt_imp_copy(full, v, (size_t)k * sizeof *v);
  *n = k;
}

/* Whether a Reshape's entry v is the batch times k: -1 (every other entry is checked exactly, so
 * it can only be that), computed, or the model's static batch times k. */
static int batch_is(const imp *im, int64_t v, int64_t k) {
  return v == -1 || v == batch_times(k) ||
         (k > 0 && im->static_batch > 0 && im->static_batch <= INT64_MAX / k && v == im->static_batch * k);
}

/* ---- tokens -------------------------------------------------------------------------------- */

/* Reshape of an image to [N, C, T] (or -1 for T): x.flatten(2). */
static int image_to_tokens(imp *im, sym *x, const sym *shape, int64_t allowzero) {
  const qt_value *v = val(im, x);
  const int64_t C = v->shape[2], T = v->shape[0] * v->shape[1], *s = shape->ints;
  if (shape->n_ints != 3 || s[1] != C || !(s[2] == -1 || s[2] == T) ||
      !qt_imp_batch_entry(im, s[0], allowzero, s[1] * s[2], C * T))
    return 0;
  qt_imp_alias(im, 0, x)->tokens = TOK_CT;
  im->info->dropped++;
  return 1;
}

static int is_seq_first(const sym *s) { return s && s->kind == S_ACT && (s->tokens == TOK_TN || s->tokens == TOK_TNF); }

/* Reshape of the tokens [T, N, C] (TOK_TN) into the packed projections [T, N, 3, C / 3] or into
 * heads [T, N * heads, C / heads]; of [T * N, C] (TOK_TNF) back to [T, N, C]. */
static int reshape_seq_first(imp *im, sym *x, const int64_t *s, int n) {
  const int64_t T = tokens_of(im, x), C = channels_of(im, x);
  if (x->tokens == TOK_TNF) {
    if (n != 3 || s[0] != T || !batch_is(im, s[1], 1) || s[2] != C) {
      char d[96];
      qt_imp_ints_str(s, n, d, sizeof d);
      return qt_imp_node_err(im, "Reshape of '%s' [%lld * batch, %lld] to %s: only to [%lld, batch, %lld] is supported",
                             x->name, (long long)T, (long long)C, d, (long long)T, (long long)C);
    }
    qt_imp_alias(im, 0, x)->tokens = TOK_TN;
    im->info->dropped++;
    return 1;
  }
  if (n == 4 && s[0] == T && batch_is(im, s[1], 1) && s[2] == 3 && C % 3 == 0 && s[3] == C / 3) {
    sym *p = attn_pending(im, x, A_PACK);
    p->heads = 0;
    p->tokens = TOK_NONE;
    return 1;
  }
  if (n == 3 && s[0] == T && s[2] >= 1 && s[2] <= C && C % s[2] == 0 && batch_is(im, s[1], C / s[2])) {
    sym *p = attn_pending(im, x, A_SPLIT_TN);
    p->heads = (int)(C / s[2]);
    p->attn_scale = 1.0f;
    p->tokens = TOK_NONE;
    return 1;
  }
  char d[96];
  qt_imp_ints_str(s, n, d, sizeof d);
  return qt_imp_node_err(im,
                         "Reshape of the tokens '%s' [%lld, batch, %lld] to %s: only into q, k and v packed [%lld, "
                         "batch, 3, %lld / 3] or into heads [%lld, batch * heads, %lld / heads] is supported",
                         x->name, (long long)T, (long long)C, d, (long long)T, (long long)C, (long long)T,
                         (long long)C);
}

/* Reshape of an attention step (x pending): the heads between [N * heads, T, d] and [N, heads, T,
 * d] (k^T likewise), the output back to [N, T, C] or [T * N, C]: the attention node. */
static int reshape_attn(imp *im, sym *x, const int64_t *s, int n, int64_t allowzero) {
  const int64_t T = tokens_of(im, x), C = channels_of(im, x), h = x->heads, d = h ? C / h : 0;
  int next = 0;
  if (x->attn == A_HEADS_NT && n == 4 && batch_is(im, s[0], 1) && s[1] == h && s[2] == T && s[3] == d)
    next = A_HEADS;
  else if (x->attn == A_KT_NT && n == 4 && batch_is(im, s[0], 1) && s[1] == h && s[2] == d && s[3] == T)
    next = A_KT;
  else if (x->attn == A_HEADS && n == 3 && batch_is(im, s[0], h) && s[1] == T && s[2] == d)
    next = A_HEADS_NT;
  if (next) {
    attn_pending(im, x, next);
    return 1;
  }
  const int out_t = x->attn == A_OUT_T && n == 3 && s[1] == T && (s[2] == C || s[2] == -1) &&
                    qt_imp_batch_entry(im, s[0], allowzero, s[2] == -1 ? -1 : T * C, T * C);
  const int out_tn = x->attn == A_OUT_TN && n == 2 && batch_is(im, s[0], T) && s[1] == C;
  if (!out_t && !out_tn) {
    char want[96], got[96];
    int64_t full[5];
    int k;
    qt_imp_attn_shape(im, x, full, &k);
    qt_imp_ints_str(full, k, want, sizeof want);
    qt_imp_ints_str(s, n, got, sizeof got);
    return qt_imp_node_err(im,
                           "Reshape of '%s' %s to %s: only the heads between [batch * heads, T, d] and [batch, "
                           "heads, T, d] (or their k^T), and the output back to [batch, T, C] or [T * batch, C] (%s)",
                           x->name, want, got, attn_what);
  }
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_attention(im->g, name, x->value, x->attn_k, x->attn_v, x->heads);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y)->tokens = out_t ? TOK_TC : TOK_TNF;
  return 1;
}

/* Reshape of tokens [N, T, C] to [N, T, heads, C / heads] (the split into heads), of tokens
 * sequence first, or of an attention step; of an image to [N, C, T]. */
int qt_imp_tokens_reshape(imp *im) {
  sym *x = qt_imp_raw_input(im, 0), tmp;
  if (!x || !(is_tokens(x) || is_attn(x) || is_seq_first(x) ||
              (x->kind == S_ACT && is_image(im, x) && !x->tokens && !x->perm_c)))
    return 0;
  int64_t allowzero = 0;
  const sym *shape = qt_imp_ints_input(im, 1, "shape", &tmp);
  if (!shape || qt_imp_attr_int(im, "allowzero", 0, &allowzero)) return -1;
  const int64_t *s = shape->ints;
  if (x->kind == S_ACT && !x->tokens) return image_to_tokens(im, x, shape, allowzero);
  if (is_seq_first(x)) return reshape_seq_first(im, x, s, shape->n_ints);
  if (is_attn(x)) return reshape_attn(im, x, s, shape->n_ints, allowzero);
  const int64_t T = tokens_of(im, x), C = channels_of(im, x);
  if (shape->n_ints == 5 && s[1] == T && s[2] == 3 && C % 3 == 0 && s[3] >= 1 && s[3] <= C / 3 && (C / 3) % s[3] == 0 &&
      s[4] == C / 3 / s[3] && qt_imp_batch_entry(im, s[0], allowzero, T * C, T * C)) { /* timm's packed q, k, v */
    sym *p = attn_pending(im, x, A_QKV);
    p->heads = (int)s[3];
    p->attn_scale = 1.0f;
    p->tokens = TOK_NONE;
    return 1;
  }
  if (shape->n_ints != 4 || s[1] != T || s[2] < 1 || s[2] > C || C % s[2] || !(s[3] == C / s[2] || s[3] == -1) ||
      !qt_imp_batch_entry(im, s[0], allowzero, s[3] == -1 ? -1 : T * C, T * C))
    return qt_imp_node_err(im,
                           "Reshape of the tokens [N, %lld, %lld]: only the split into heads [N, %lld, heads, %lld / "
                           "heads] or timm's packed q, k, v [N, %lld, 3, heads, %lld / 3 / heads] is supported",
                           (long long)T, (long long)C, (long long)T, (long long)C, (long long)T, (long long)C);
  sym *p = attn_pending(im, x, A_SPLIT);
  p->heads = (int)s[2];
  p->attn_scale = 1.0f;
  p->tokens = TOK_NONE;
  return 1;
}

static int perm_is(const int64_t *p, int n, const int64_t *want) {
  for (int i = 0; i < n; i++)
    if (p[i] != want[i]) return 0;
  return 1;
}

static int attn_rank(const sym *x) {
  switch (x->attn) {
    case A_PACK_U:
    case A_PACK_T:
    case A_QKV:
    case A_QKV_T:
    case A_QKV_PART: return 5;
    case A_SPLIT_TN:
    case A_HEADS_NT:
    case A_KT_NT: return 3;
    default: return 4;
  }
}

/* Transpose [0, 2, 1] between [N, C, T] and [N, T, C], [1, 0, 2] between [N, T, C] and [T, N,
 * C]; the attention's transposes. */
int qt_imp_tokens_transpose(imp *im) {
  sym *x = qt_imp_raw_input(im, 0);
  if (!x || !((x->kind == S_ACT && x->tokens) || is_attn(x))) return 0;
  int64_t perm[5];
  int found = 0;
  const int rank = x->kind == S_ACT ? 3 : attn_rank(x);
  if (qt_imp_attr_ints(im, "perm", perm, (size_t)rank, &found)) return -1;
  static const int64_t swap3[3] = {0, 2, 1}, seq3[3] = {1, 0, 2}, heads[4] = {0, 2, 1, 3}, kt[4] = {0, 2, 3, 1},
                       last[4] = {0, 1, 3, 2}, pack[5] = {3, 1, 2, 0, 4}, out_tn[4] = {2, 0, 1, 3},
                       qkv[5] = {2, 0, 3, 1, 4};
  if (x->kind == S_ACT) {
    int to = 0;
    if (found && x->tokens != TOK_TNF && x->tokens != TOK_TN && perm_is(perm, 3, swap3))
      to = x->tokens == TOK_CT ? TOK_TC : TOK_CT;
    else if (found && (x->tokens == TOK_TC || x->tokens == TOK_TN) && perm_is(perm, 3, seq3))
      to = x->tokens == TOK_TC ? TOK_TN : TOK_TC;
    if (!to)
      return qt_imp_node_err(im,
                             "Transpose of tokens: only perm [0, 2, 1] (between [N, C, T] and [N, T, C]) and [1, 0, "
                             "2] (between [N, T, C] and [T, N, C])");
    qt_imp_alias(im, 0, x)->tokens = to;
    im->info->dropped++;
    return 1;
  }
  static const struct {
    int from;
    const int64_t *perm;
    int to;
  } steps[] = {{A_SPLIT, heads, A_HEADS},    {A_SPLIT, kt, A_KT},        {A_HEADS, last, A_KT},
               {A_OUT, heads, A_OUT_T},      {A_PACK_U, pack, A_PACK_T}, {A_SPLIT_TN, seq3, A_HEADS_NT},
               {A_HEADS_NT, swap3, A_KT_NT}, {A_OUT, out_tn, A_OUT_TN},  {A_QKV, qkv, A_QKV_T}};
  for (size_t k = 0; found && k < sizeof steps / sizeof steps[0]; k++)
    if (x->attn == steps[k].from && perm_is(perm, rank, steps[k].perm)) {
      attn_pending(im, x, steps[k].to);
      return 1;
    }
  char shape[96], p[64];
  int64_t full[5];
  int k;
  qt_imp_attn_shape(im, x, full, &k);
  qt_imp_ints_str(full, k, shape, sizeof shape);
  qt_imp_ints_str(perm, found ? rank : 0, p, sizeof p);
  return qt_imp_node_err(im,
                         "Transpose %s of '%s' %s, a step of multi-head attention: not one of its transposes ([0, "
                         "2, 1, 3] of the split heads or the output, [0, 2, 3, 1] or [0, 1, 3, 2] for k^T; "
                         "nn.MultiheadAttention's [3, 1, 2, 0, 4] of the packed projections, [1, 0, 2] and [0, 2, "
                         "1] of the heads, [2, 0, 1, 3] of the output; timm's [2, 0, 3, 1, 4] of its packed q, k, v)",
                         p, x->name, shape);
}

/* Unsqueeze (squeeze 0) or Squeeze (squeeze 1) of the one axis `axis` (or its negative form
 * neg) of the packed projections at step `from`, giving step `to`; `what` names them. */
static int pack_axis(imp *im, int squeeze, int from, int64_t axis, int64_t neg, int to, const char *what) {
  sym *x = qt_imp_raw_input(im, 0);
  if (!is_attn(x)) return 0;
  int64_t axes[MAX_INTS];
  int n = 0;
  if (qt_imp_axes(im, 1, axes, &n)) return -1;
  if (x->attn != from || n != 1 || !(axes[0] == axis || axes[0] == neg))
    return qt_imp_node_err(im, "%s of '%s' (%s): only of axis %lld of the packed projections %s",
                           squeeze ? "Squeeze" : "Unsqueeze", x->name, attn_what, (long long)axis, what);
  attn_pending(im, x, to);
  return 1;
}

int qt_imp_tokens_unsqueeze(imp *im) { return pack_axis(im, 0, A_PACK, 0, -5, A_PACK_U, "[T, N, 3, C]"); }

/* Squeeze of axis 3 of the packed projections [3, T, N, 1, C]; of axis 0 of timm's part i of its
 * packed q, k, v: channels [i C, (i + 1) C) of them, as q, k or v's split heads. */
int qt_imp_tokens_squeeze(imp *im) {
  sym *x = qt_imp_raw_input(im, 0);
  if (!is_attn(x) || x->attn != A_QKV_PART) return pack_axis(im, 1, A_PACK_T, 3, -2, A_PACK_S, "[3, T, N, 1, C]");
  int64_t axes[MAX_INTS];
  int n = 0;
  if (qt_imp_axes(im, 1, axes, &n)) return -1;
  if (n != 1 || !(axes[0] == 0 || axes[0] == -5))
    return qt_imp_node_err(im, "Squeeze of '%s' (%s): only of axis 0 of a part of the packed q, k, v", x->name,
                           attn_what);
  const sym from = *x;
  const int64_t C = channels_of(im, x) / 3, i = from.attn_part;
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_channel_slice(im->g, name, from.value, (int)(i * C), (int)((i + 1) * C));
  if (qt_imp_builder_check(im, y)) return -1;
  sym *p = attn_pending(im, &from, A_HEADS);
  p->value = y;
  p->attn_part = 0;
  p->attn_scale = 1.0f;
  return 1;
}

/* Split of timm's packed q, k, v [3, N, heads, T, d] along axis 0 into its three parts, or Slice
 * of one of them ([i, i + 1) of axis 0). */
int qt_imp_tokens_split(imp *im) {
  sym *x = qt_imp_raw_input(im, 0);
  if (!is_attn(x)) return 0;
  int64_t v[4][MAX_INTS], axis = 0;
  int n[4] = {0};
  const int slice = strcmp(str(im->node->op_type), "Slice") == 0;
  if (slice ? qt_imp_ints_arg(im, "starts", 1, v[0], &n[0]) || qt_imp_ints_arg(im, "ends", 2, v[1], &n[1]) ||
                  qt_imp_ints_arg(im, "axes", 3, v[2], &n[2]) || qt_imp_ints_arg(im, "steps", 4, v[3], &n[3])
            : qt_imp_attr_int(im, "axis", 0, &axis) || qt_imp_ints_arg(im, "split", 1, v[0], &n[0]))
    return -1;
  const sym from = *x;
  if (from.attn == A_QKV_T && slice && n[0] == 1 && n[1] == 1 && (n[2] == 0 || (n[2] == 1 && v[2][0] == 0)) &&
      (n[3] == 0 || (n[3] == 1 && v[3][0] == 1)) && v[0][0] >= 0 && v[0][0] <= 2 && v[1][0] == v[0][0] + 1) {
    attn_pending(im, &from, A_QKV_PART)->attn_part = (int)v[0][0];
    return 1;
  }
  if (from.attn == A_QKV_T && !slice && axis == 0 && im->node->n_output == 3 &&
      (n[0] == 0 || (n[0] == 3 && v[0][0] == 1 && v[0][1] == 1 && v[0][2] == 1))) {
    for (size_t k = 0; k < 3; k++) {
      sym *p = qt_imp_add_sym(im, im->node->output[k], S_NONE);
      const char *name = p->name;
      *p = from;
      p->name = name;
      p->attn = A_QKV_PART;
      p->attn_part = (int)k;
    }
    im->info->folded++;
    return 1;
  }
  return qt_imp_node_err(im,
                         "%s of '%s' (%s): only of timm's packed q, k, v [3, N, heads, T, d] along axis 0, into its "
                         "three parts (or one of them)",
                         slice ? "Slice" : "Split", from.name, attn_what);
}

/* Gather of index 0 along axis 1 of tokens [N, T, C]: the first token, a flat [N, C] (x[:, 0]). */
static int first_token(imp *im, sym *x) {
  sym tmp;
  int64_t axis = 0;
  if (qt_imp_attr_int(im, "axis", 0, &axis)) return -1;
  const sym *ix = qt_imp_ints_input(im, 1, "indices", &tmp);
  if (!ix) return -1;
  if (!(axis == 1 || axis == -2) || !ix->scalar || ix->n_ints != 1 || ix->ints[0] != 0)
    return qt_imp_node_err(im, "Gather from the tokens '%s' [N, T, C]: only of the first token (index 0 along axis 1)",
                           x->name);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_first_token(im->g, name, x->value);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y);
  return 1;
}

/* Gather 0, 1 or 2 along axis 0 of the packed projections [3, T, N, C]: q, k or v, a channel
 * slice of the in_proj's 3 C outputs, tokens sequence first; of tokens, first_token. */
int qt_imp_tokens_gather(imp *im) {
  sym *x = qt_imp_raw_input(im, 0), tmp;
  if (is_tokens(x)) return first_token(im, x);
  if (!is_attn(x)) return 0;
  int64_t axis = 0;
  if (qt_imp_attr_int(im, "axis", 0, &axis)) return -1;
  const sym *ix = qt_imp_ints_input(im, 1, "indices", &tmp);
  if (!ix) return -1;
  const int64_t i = ix->n_ints == 1 ? (ix->ints[0] < 0 ? ix->ints[0] + 3 : ix->ints[0]) : -1;
  if (x->attn != A_PACK_S || axis != 0 || !ix->scalar || i < 0 || i > 2)
    return qt_imp_node_err(im,
                           "Gather from '%s' (%s): only of q, k or v (a scalar index 0, 1 or 2 along axis 0) from "
                           "the packed projections [3, T, N, C]",
                           x->name, attn_what);
  const int64_t C = channels_of(im, x) / 3;
  const sym from = *x;
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_channel_slice(im->g, name, from.value, (int)(i * C), (int)((i + 1) * C));
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y)->tokens = TOK_TN;
  return 1;
}

/* ---- the class token -------------------------------------------------------------------------- */

static const char cls_what[] = "a class token Expand'ed to the batch (a Concat before the tokens reads it)";

/* Expand of a learned [1, 1, C] to [N, 1, C] (shape [batch, 1, 1] or [batch, 1, C]:
 * class_token.expand(n, -1, -1)): pending until the Concat. 0 when the input is no such
 * parameter or the shape holds no batch. */
int qt_imp_tokens_expand(imp *im) {
  sym *p = qt_imp_raw_input(im, 0), tmp;
  if (!p || p->kind != S_CONST || p->computed || p->t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
      p->t->n_dims != 3 || p->t->dims[0] != 1 || p->t->dims[1] != 1)
    return 0;
  const sym *shape = qt_imp_ints_input(im, 1, "shape", &tmp);
  if (!shape) return -1;
  const int64_t *s = shape->ints, C = p->t->dims[2];
  if (shape->n_ints != 3 || batch_factor(s[0]) != 1) return 0;
  if (!(s[1] == 1 || s[1] == -1) || !(s[2] == 1 || s[2] == -1 || s[2] == C))
    return qt_imp_node_err(im, "Expand of the class token '%s' [1, 1, %lld]: only to [batch, 1, %lld]", str(p->t->name),
                           (long long)C, (long long)C);
  const Onnx__TensorProto *t = qt_imp_param_input(im, 0, "class token", 0);
  if (!t || qt_imp_check_float_tensor(im, t, "class token", 3, t->dims)) return -1;
  sym *o = qt_imp_add_sym(im, im->node->output[0], S_NONE);
  o->what = cls_what;
  o->cls = 1;
  o->t = t;
  im->info->folded++;
  return 1;
}

/* Concat along axis 1 of a class token [N, 1, C] and tokens [N, T, C]: prepend_token. */
int qt_imp_tokens_concat(imp *im) {
  sym *a = qt_imp_raw_input(im, 0), *b = im->node->n_input > 1 ? qt_imp_raw_input(im, 1) : NULL;
  const int a_cls = a && a->kind == S_NONE && a->cls, b_cls = b && b->kind == S_NONE && b->cls;
  if (!a_cls && !b_cls && !is_tokens(a)) return 0;
  int64_t axis = 0;
  if (qt_imp_attr_int(im, "axis", 0, &axis)) return -1;
  if (im->node->n_input != 2 || !a_cls || !is_tokens(b) || !(axis == 1 || axis == -2) ||
      channels_of(im, b) != a->t->dims[2])
    return qt_imp_node_err(im,
                           "Concat of tokens: only of a class token [N, 1, C] (a learned [1, 1, C] Expand'ed) before "
                           "tokens [N, T, C] of its C features, along axis 1");
  char name[QT_NAME_LEN];
  param_node_name(im, a->t->name, NULL, name);
  const Onnx__TensorProto *t = a->t;
  const int y = qt_graph_prepend_token(im->g, name, b->value);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_add_copy(im, im->g->nodes[node_of(im, y)].param[QT_P_WEIGHT], t, COPY_AS_IS, NULL);
  qt_imp_bind_act(im, 0, y)->tokens = TOK_TC;
  return 1;
}

/* MatMul(q, k^T) -> the scores; MatMul(probabilities, v) -> the output heads. */
int qt_imp_tokens_matmul(imp *im) {
  sym *a = qt_imp_raw_input(im, 0), *b = qt_imp_raw_input(im, 1);
  if (!is_attn(a) && !is_attn(b)) return 0;
  if (!is_attn(a) || !is_attn(b) || a->heads != b->heads || tokens_of(im, a) != tokens_of(im, b) ||
      channels_of(im, a) != channels_of(im, b) ||
      !((a->attn == A_HEADS && b->attn == A_KT) || (a->attn == A_PROBS && b->attn == A_HEADS)))
    return qt_imp_node_err(im,
                           "MatMul of '%s' and '%s': only q [N, heads, T, d] by k^T [N, heads, d, T], then the "
                           "Softmax of their product by v [N, heads, T, d], of one shape, are supported (%s)",
                           str(in_name(im->node, 0)), str(in_name(im->node, 1)), attn_what);
  if (a->attn == A_HEADS) {
    sym *p = attn_pending(im, a, A_SCORES);
    p->attn_k = b->value;
    p->attn_scale = a->attn_scale * b->attn_scale;
  } else {
    if (b->attn_scale != 1.0f)
      return qt_imp_node_err(im, "MatMul with v '%s', which is scaled: only q and k may be scaled", b->name);
    attn_pending(im, a, A_OUT)->attn_v = b->value;
  }
  return 1;
}

/* q, k or their product times (or divided by) a float constant scalar. */
int qt_imp_tokens_scale(imp *im, int divide) {
  sym *a = qt_imp_raw_input(im, 0), *b = qt_imp_raw_input(im, 1);
  if (!is_attn(a) && !is_attn(b)) return 0;
  sym *p = is_attn(a) ? a : b, *c = p == a ? b : a;
  float v = 0;
  if (!qt_imp_const_scalar(c, &v) || !isfinite(v) || v == 0.0f || (divide && p != a) ||
      !(p->attn == A_HEADS || p->attn == A_KT || p->attn == A_SCORES))
    return qt_imp_node_err(im, "%s of '%s' (%s): only q, k or their product scaled by a constant scalar",
                           divide ? "Div" : "Mul", p->name, attn_what);
  attn_pending(im, p, p->attn)->attn_scale = divide ? p->attn_scale / v : p->attn_scale * v;
  return 1;
}

/* Softmax of the scores over the last axis, scaled by 1 / sqrt(C / heads) in all. */
static int op_softmax(imp *im) {
  sym *x = qt_imp_raw_input(im, 0);
  int64_t axis = -1;
  if (qt_imp_attr_int(im, "axis", im->opset >= 13 ? -1 : 1, &axis)) return -1;
  if (!is_attn(x) || x->attn != A_SCORES || !(axis == -1 || axis == 3 || (im->opset < 13 && axis == 1)))
    return qt_imp_node_err(im, "Softmax is supported only over the last axis of attention scores (%s)", attn_what);
  const double d = (double)channels_of(im, x) / x->heads, want = 1.0 / sqrt(d);
  if (fabs((double)x->attn_scale - want) > 1e-6 * want)
    return qt_imp_node_err(im,
                           "the attention scores are scaled by %g; only by 1 / sqrt(%g) = %g (the head size's) is "
                           "supported",
                           (double)x->attn_scale, d, want);
  attn_pending(im, x, A_PROBS);
  return 0;
}

/* ---- per-token layers ------------------------------------------------------------------------ */

static int ends_with(const char *s, const char *tail) {
  const size_t n = strlen(s), t = strlen(tail);
  return n > t && strcmp(s + n - t, tail) == 0;
}

/* The IR name of a node with the parameters w (and b): after PyTorch's module name, which torch's
 * export keeps in a bias's name where it renames the weight it transposed ("onnx::MatMul_12"),
 * after nn.MultiheadAttention's in_proj_weight / in_proj_bias ("attn.in_proj"), or after a
 * parameter that is a module's attribute itself ("pos_embedding"). */
static void param_node_name(imp *im, const char *w, const char *b, char *out) {
  char buf[300];
  const char *use = NULL;
  if (w && ends_with(w, ".weight") && !strstr(w, "::"))
    use = w;
  else if (w && ends_with(w, "_weight") && !strstr(w, "::") && strlen(w) < 200)
    snprintf(buf, sizeof buf, "%.*s.weight", (int)(strlen(w) - 7), w), use = buf;
  else if (b && (ends_with(b, ".bias") || ends_with(b, "_bias")) && !strstr(b, "::") && strlen(b) < 200)
    snprintf(buf, sizeof buf, "%.*s.weight", (int)(strlen(b) - 5), b), use = buf;
  else if (w && !b && w[0] && !strstr(w, "::") && strlen(w) < 200)
    snprintf(buf, sizeof buf, "%s.weight", w), use = buf;
  qt_imp_node_name(im, use, out);
}

int qt_imp_tokens_linear(imp *im, sym *x, const Onnx__TensorProto *w, const Onnx__TensorProto *b, int out_in) {
  const int64_t C = channels_of(im, x);
  char d[96];
  qt_imp_dims_str(w->dims, w->n_dims, d, sizeof d);
  if (w->n_dims != 2 || w->dims[out_in ? 1 : 0] != C)
    return qt_imp_node_err(im, "the weight '%s' has dims %s; the tokens '%s' have %lld features, want %s", str(w->name),
                           d, x->name, (long long)C, out_in ? "[E, C] (transB)" : "[C, E]");
  const int64_t E = w->dims[out_in ? 0 : 1], want_b[1] = {E};
  if (qt_imp_check_float_tensor(im, w, "weight", 2, w->dims) ||
      (b && qt_imp_check_float_tensor(im, b, "bias", 1, want_b)))
    return -1;
  if (E < 1 || E > INT32_MAX) return qt_imp_node_err(im, "%lld output features", (long long)E);
  char name[QT_NAME_LEN];
  param_node_name(im, w->name, b ? b->name : NULL, name);
  const int y = qt_graph_conv2d(im->g, name, x->value, (int)E, 1, 1, 0, 1, b != NULL);
  if (qt_imp_builder_check(im, y)) return -1;
  const qt_node *nd = &im->g->nodes[node_of(im, y)];
  qt_imp_add_copy(im, nd->param[QT_P_WEIGHT], w, out_in ? COPY_AS_IS : COPY_TRANSPOSE, NULL);
  if (b) qt_imp_add_copy(im, nd->param[QT_P_BIAS], b, COPY_AS_IS, NULL);
  qt_imp_bind_act(im, 0, y)->tokens = x->tokens;
  return 0;
}

/* Tokens + an initializer [1, T, C] (or [T, C]): add_param. */
int qt_imp_tokens_add(imp *im) {
  sym *a = qt_imp_raw_input(im, 0), *b = qt_imp_raw_input(im, 1);
  sym *x = is_tokens(a) ? a : is_tokens(b) ? b : NULL, *p = x == a ? b : a;
  if (!x || !p || p->kind != S_CONST) return 0;
  const int64_t T = tokens_of(im, x), C = channels_of(im, x), want3[3] = {1, T, C}, want2[2] = {T, C};
  const Onnx__TensorProto *t = qt_imp_param_input(im, p == a ? 0 : 1, "parameter", 0);
  if (!t || qt_imp_check_float_tensor(im, t, "parameter", (int)t->n_dims, NULL)) return -1;
  if (!((t->n_dims == 3 && !memcmp(t->dims, want3, sizeof want3)) ||
        (t->n_dims == 2 && !memcmp(t->dims, want2, sizeof want2)))) {
    char d[96];
    qt_imp_dims_str(t->dims, t->n_dims, d, sizeof d);
    return qt_imp_node_err(im,
                           "Add of the tokens '%s' [N, %lld, %lld] and '%s' %s: only a learned [1, %lld, %lld] (a "
                           "position embedding) is supported",
                           x->name, (long long)T, (long long)C, str(t->name), d, (long long)T, (long long)C);
  }
  char name[QT_NAME_LEN];
  param_node_name(im, t->name, NULL, name);
  const int y = qt_graph_add_param(im->g, name, x->value);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_add_copy(im, im->g->nodes[node_of(im, y)].param[QT_P_WEIGHT], t, COPY_AS_IS, NULL);
  qt_imp_bind_act(im, 0, y)->tokens = TOK_TC;
  return 1;
}

/* ReduceMean of the tokens over T (axes [1], keepdims 0): the mean token, a flat [N, C]. */
int qt_imp_tokens_mean(imp *im) {
  sym *x = qt_imp_raw_input(im, 0);
  if (!is_tokens(x)) return 0;
  int64_t axes[MAX_INTS], keepdims = 1;
  int n_axes = 0;
  if (qt_imp_axes(im, 1, axes, &n_axes) || qt_imp_attr_int(im, "keepdims", 1, &keepdims)) return -1;
  if (n_axes != 1 || !(axes[0] == 1 || axes[0] == -2) || keepdims)
    return qt_imp_node_err(im, "ReduceMean of tokens [N, T, C]: only over T (axes [1], keepdims 0) is supported");
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_global_avg_pool(im->g, name, x->value);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y);
  return 1;
}

/* LayerNormalization over the last axis of tokens or of a flat [N, F]; its Mean and InvStdDev
 * outputs unused. */
static int op_layer_norm(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "X", 0);
  if (!x) return -1;
  int64_t axis = -1, stash = 1;
  float eps = 1e-5f;
  if (qt_imp_attr_int(im, "axis", -1, &axis) || qt_imp_attr_float(im, "epsilon", 1e-5f, &eps) ||
      qt_imp_attr_int(im, "stash_type", 1, &stash))
    return -1;
  const int flat = !is_image(im, x) && !x->pooled;
  if (!(x->tokens == TOK_TC || flat) || x->perm_c || !(axis == -1 || axis == (flat ? 1 : 2)))
    return qt_imp_node_err(im,
                           "LayerNormalization of '%s': only over the last axis of tokens [N, T, C] or of a flat [N, "
                           "F] is supported",
                           x->name);
  if (!(eps > 0) || !isfinite(eps)) return qt_imp_node_err(im, "epsilon %g must be finite and > 0", (double)eps);
  const Onnx__TensorProto *w = qt_imp_param_input(im, 1, "Scale", 0), *b = NULL;
  if (!w) return -1;
  if (!in_name(im->node, 2)) return qt_imp_node_err(im, "LayerNormalization without a bias B is not supported");
  if (!(b = qt_imp_param_input(im, 2, "B", 0))) return -1;
  const int64_t C[1] = {val(im, x)->shape[val(im, x)->ndim - 1]};
  if (qt_imp_check_float_tensor(im, w, "Scale", 1, C) || qt_imp_check_float_tensor(im, b, "B", 1, C)) return -1;
  qt_imp_outputs_unused(im, 1, "LayerNormalization's Mean and InvStdDev outputs");
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, w->name, name);
  const int y = qt_graph_layer_norm(im->g, name, x->value, eps);
  if (qt_imp_builder_check(im, y)) return -1;
  const qt_node *nd = &im->g->nodes[node_of(im, y)];
  qt_imp_add_copy(im, nd->param[QT_P_GAMMA], w, COPY_AS_IS, NULL);
  qt_imp_add_copy(im, nd->param[QT_P_BETA], b, COPY_AS_IS, NULL);
  qt_imp_bind_act(im, 0, y)->tokens = x->tokens;
  return 0;
}

const qt_imp_op qt_imp_tokens_ops[] = {
    {"LayerNormalization", op_layer_norm, 2, 3, 1, 3},
    {"Softmax", op_softmax, 1, 1, 1, 1},
    {NULL, NULL, 0, 0, 0, 0},
};
