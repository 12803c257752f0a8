/* Private to the ONNX importer (onnx_import.h), shared by its parts:
 *   import.c        the model: the file, its IR version and opset, the graph input, the op
 *                   table's lookup, parameter copies into the finalized graph
 *   import_core.c   messages, symbols, attributes, tensors, IR node names, builder helpers
 *   import_ops.c    the ops that become graph IR nodes (Conv, BatchNormalization, ...)
 *   import_shape.c  constants and the small integer shape arithmetic folded at import (Shape,
 *                   Gather, Concat, Expand, ...): nothing of it reaches the graph
 *   import_external.c  tensors whose bytes live in a side file (ONNX external data)
 *
 * Every ONNX tensor name maps to a symbol: an activation (an IR value, with how it stands for the
 * ONNX tensor: an NCHW image as an NHWC value, a flat (N, F) tensor, a pending zero Pad, a flatten
 * whose order differs from PyTorch's), a constant (an initializer, a Constant node or a tensor
 * folded at import), or a small integer vector (shape arithmetic such as x.view(n, -1)).
 * Parameters are copied into the graph's slabs after it is finalized, converted to the graph's
 * layouts on the way. */
#ifndef QT_ONNX_IMPORT_INT_H
#define QT_ONNX_IMPORT_INT_H

#include <search.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "onnx/onnx_import.h"

#define BATCH INT64_MIN /* the batch dimension in shape arithmetic */
/* The batch times k (1 <= k < 2^24) in shape arithmetic (x.size(0) * heads, tokens * batch):
 * BATCH + k - 1 (BATCH itself for k = 1). */
#define BATCH_MAX_FACTOR ((int64_t)1 << 24)
static inline int64_t batch_times(int64_t k) { return BATCH + (k - 1); }
/* The k of a batch multiple v, 0 for an ordinary entry. */
static inline int64_t batch_factor(int64_t v) { return v < BATCH + BATCH_MAX_FACTOR - 1 ? v - BATCH + 1 : 0; }
/* The longest IR node name the importer makes: prepare and convert append up to 14 characters
 * (".fq.dequantize") to a node's name, and a name has at most QT_NAME_LEN - 1. */
#define IMP_NAME_MAX (QT_NAME_LEN - 1 - 14)
#define MAX_INTS 8

typedef enum { S_NONE, S_ACT, S_CONST, S_INTS } sym_kind;
enum { TOK_NONE, TOK_CT, TOK_TC, TOK_TN, TOK_TNF };

typedef struct {
  const char *name;
  sym_kind kind;
  /* S_ACT */
  int value;                  /* IR value id */
  int pooled;                 /* an IR (C) vector standing for ONNX [N, C, 1, 1] (GlobalAveragePool) */
  int perm_h, perm_w, perm_c; /* a flat value in (h, w, c) order standing for PyTorch's (c, h, w) flatten */
  int pad[4];                 /* a pending zero Pad (top, left, bottom, right) of the image `value` */
  int padded;
  int tokens; /* the image `value` (H, W, C) standing for ONNX's [N, C, H * W] (TOK_CT) or for the tokens
               * [N, H * W, C] (TOK_TC) of a vision transformer, or for them sequence first: [T, N, C]
               * (TOK_TN, nn.MultiheadAttention's layout) or [T * N, C] (TOK_TNF) (import_tokens.c) */
  /* S_CONST */
  const Onnx__TensorProto *t;
  const char *user; /* first node using it as a parameter (shared parameters are refused) */
  int computed;     /* folded at import from other constants (no initializer of its own) */
  /* S_INTS */
  int64_t ints[MAX_INTS];
  int n_ints, scalar;
  /* S_NONE: an output no supported consumer reads */
  const char *what;
  int gelu;            /* S_NONE: step 1..4 of a GELU decomposed as Div, Erf, Add, Mul, Mul (import_elementwise.c),
                        * with the S_ACT fields of its x */
  int shuffle, groups; /* S_NONE: step 1 (Reshape to [N, groups, C / groups, H, W]) or 2 (then
                        * Transpose) of a channel shuffle (import_ops.c), with x's S_ACT fields */
  int attn, heads;     /* S_NONE: a step of multi-head attention (import_tokens.c, attn_step), `heads`
                        * heads; value: q (or the tokens being split), attn_k, attn_v: k and v */
  int attn_part;       /* timm's packed q, k, v: which of them (0, 1, 2) a Split or Slice took */
  int attn_k, attn_v;
  float attn_scale; /* the constant factors of the scores so far */
  int cls;          /* S_NONE: a learned [1, 1, C] (t, its parameter) Expand'ed to [N, 1, C]: a class token
                     * until the Concat before the tokens (import_tokens.c) */
} sym;

typedef enum { COPY_AS_IS, COPY_TRANSPOSE } copy_kind;

typedef struct {
  int tensor; /* in the graph */
  const Onnx__TensorProto *src;
  copy_kind kind;             /* COPY_TRANSPOSE: src is (IN, OUT), the graph wants (OUT, IN) */
  int perm_h, perm_w, perm_c; /* columns from (c, h, w) to (h, w, c) order */
} param_copy;

typedef struct {
  const char *path;
  char *err;
  qt_onnx_info *info;
  const Onnx__GraphProto *gp;
  int64_t opset;
  qt_graph *g;
  sym *syms;
  int n_syms, cap_syms;
  struct hsearch_data sym_index;   /* name -> the latest symbol of that name (data: index + 1) */
  struct hsearch_data next_suffix; /* a taken node name -> the next "_k" to try after it */
  char **suffix_keys;              /* next_suffix's keys, owned */
  int n_suffix_keys, cap_suffix_keys;
  param_copy *copies;
  int n_copies, cap_copies;
  Onnx__TensorProto **made; /* tensors folded at import, owned */
  int n_made, cap_made;
  Onnx__TensorProto **ext; /* the model's tensors whose raw_data the import read from a side file */
  int n_ext, cap_ext;
  const Onnx__NodeProto *node; /* being imported (messages) */
  int node_index;
  unsigned char *absorbed; /* per node: folded into an earlier node (an Add into a MatMul) */
  int dynamic;             /* input dims from the data */
  int64_t static_batch;    /* the batch the input declares, 0 = dynamic */
} imp;

/* An ONNX op the importer reads: its function and the arity the operator allows. */
typedef struct {
  const char *op;
  int (*fn)(imp *im);
  int min_in, max_in, min_out, max_out;
} qt_imp_op;

/* The op tables, each ended by a row whose op is NULL. */
extern const qt_imp_op qt_imp_layer_ops[];       /* import_ops.c */
extern const qt_imp_op qt_imp_elementwise_ops[]; /* import_elementwise.c */
extern const qt_imp_op qt_imp_shape_ops[];
extern const qt_imp_op qt_imp_tokens_ops[]; /* import_tokens.c */
/* The transformer's steps that other files' ops hand over (import_tokens.c): each returns 1 when
 * it imported the current node, 0 when the node is none of its, -1 on an error. */
int qt_imp_tokens_reshape(imp *im);           /* Reshape of tokens or of an attention step */
int qt_imp_tokens_transpose(imp *im);         /* Transpose of tokens or of an attention step */
int qt_imp_tokens_matmul(imp *im);            /* MatMul of attention steps */
int qt_imp_tokens_scale(imp *im, int divide); /* Mul or Div of an attention step by a constant */
int qt_imp_tokens_add(imp *im);               /* Add of a learned [1, T, C] to tokens */
int qt_imp_tokens_mean(imp *im);              /* ReduceMean of tokens over T */
int qt_imp_tokens_unsqueeze(imp *im);         /* Unsqueeze of an attention step */
int qt_imp_tokens_squeeze(imp *im);           /* Squeeze of an attention step */
int qt_imp_tokens_gather(imp *im);            /* Gather of q, k or v from packed projections, of
                                               * the first token */
int qt_imp_tokens_expand(imp *im);            /* Expand of a class token to the batch */
int qt_imp_tokens_split(imp *im);             /* Split or Slice of timm's packed q, k, v */
int qt_imp_tokens_concat(imp *im);            /* Concat of a class token and tokens */
/* The ONNX shape of an attention step s (its batch as BATCH or a multiple): *n entries of full. */
void qt_imp_attn_shape(imp *im, const sym *s, int64_t *full, int *n);
/* MatMul(tokens, W) [+ b] (W stored [C, E]; out_in: stored [E, C], Gemm's transB): a 1x1
 * convolution of the image standing for them, in their layout (import_tokens.c). */
int qt_imp_tokens_linear(imp *im, sym *x, const Onnx__TensorProto *w, const Onnx__TensorProto *b, int out_in);

/* Concat of shape computations (import_shape.c; import_elementwise.c's Concat hands them over). */
int qt_imp_concat_ints(imp *im);
/* Add ('+'), Sub ('-'), Mul ('*'), Div ('/') of shape computations (import_shape.c;
 * import_elementwise.c's Add, Mul and Div hand them over). */
int qt_imp_ints_arith(imp *im, char op); /* import_shape.c */
/* Add ('+'), Sub ('-'), Mul ('*'), Div ('/') of two small float constants, folded (import_shape.c;
 * the scale torch's exporter computes from a head's size); 0 when the inputs are not both such. */
int qt_imp_floats_arith(imp *im, char op);

static inline const char *str(const char *s) { return s ? s : ""; }

/* The node's input k (NULL when absent or empty: an optional input left out). */
static inline const char *in_name(const Onnx__NodeProto *n, size_t k) {
  return k < n->n_input && n->input[k] && n->input[k][0] ? n->input[k] : NULL;
}

static inline const char *kind_text(const sym *s) {
  switch (s->kind) {
    case S_ACT: return "an activation";
    case S_CONST: return "a constant";
    case S_INTS: return "a shape computation";
    default: return "?";
  }
}

static inline const qt_value *val(imp *im, const sym *s) { return &im->g->values[s->value]; }
static inline int is_image(imp *im, const sym *s) { return val(im, s)->ndim == 3; }
static inline int64_t features(imp *im, const sym *s) { return qt_value_numel(val(im, s)); }
static inline int node_of(imp *im, int value) { return im->g->values[value].producer; }

/* Whether a Reshape's first entry s0 is the batch: computed, 0 (copied), the model's static batch,
 * or -1 with the rest of the shape holding a sample's `per` values (rest 0, per 1: never). */
static inline int qt_imp_batch_entry(const imp *im, int64_t s0, int64_t allowzero, int64_t rest, int64_t per) {
  return s0 == BATCH || (s0 == 0 && !allowzero) || (im->static_batch > 0 && s0 == im->static_batch) ||
         (s0 == -1 && rest == per);
}

/* Elements of a tensor's dims, -1 when negative or overflowing. */
static inline int64_t numel_of(const Onnx__TensorProto *t) {
  int64_t n = 1;
  for (size_t i = 0; i < t->n_dims; i++) {
    if (t->dims[i] < 0 || (t->dims[i] > 0 && n > INT64_MAX / t->dims[i])) return -1;
    n *= t->dims[i];
  }
  return n;
}

/* ---- import_core.c ---- */

/* "onnx: <path>: node '<name>' (<OpType>, opset <n>): <what>"; returns -1. */
int qt_imp_node_err(imp *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "onnx: <path>: <what>"; returns -1. */
int qt_imp_file_err(imp *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qt_imp_dims_str(const int64_t *d, size_t n, char *buf, size_t len);
/* n entries of a shape computation as "[batch, 3, batch * 4]": the batch and its multiples by
 * name. */
void qt_imp_ints_str(const int64_t *s, int n, char *buf, size_t len);

sym *qt_imp_find(imp *im, const char *name);
/* The sym of input k of the current node whatever its kind (NULL when absent). */
static inline sym *qt_imp_raw_input(imp *im, size_t k) {
  const char *name = in_name(im->node, k);
  return name ? qt_imp_find(im, name) : NULL;
}

sym *qt_imp_add_sym(imp *im, const char *name, sym_kind kind);
/* Input k of the current node, which must exist (role names it in messages). */
sym *qt_imp_input(imp *im, size_t k, const char *role);
/* An activation input (a pending Pad only where allow_pad). */
sym *qt_imp_act_input(imp *im, size_t k, const char *role, int allow_pad);
/* A parameter input: an initializer (or a constant), used by no other node. */
const Onnx__TensorProto *qt_imp_param_input(imp *im, size_t k, const char *role, int optional);
/* The symbol of a parameter input of the current node (after qt_imp_param_input). */
const sym *qt_imp_param_sym(imp *im, size_t k);

const Onnx__AttributeProto *qt_imp_attr(const Onnx__NodeProto *n, const char *name);
int qt_imp_attr_int(imp *im, const char *name, int64_t def, int64_t *v);
int qt_imp_attr_float(imp *im, const char *name, float def, float *v);
/* An INTS attribute of exactly `want` values (absent: *found = 0). */
int qt_imp_attr_ints(imp *im, const char *name, int64_t *v, size_t want, int *found);

typedef struct {
  int64_t kernel[2], stride[2], pad[4];
  int has_kernel;
} window;

/* kernel_shape, strides, pads (symmetric), dilations (1), auto_pad (NOTSET). */
int qt_imp_read_window(imp *im, window *w);
/* Adds a pending Pad of x to the window's pads, then requires them symmetric. */
int qt_imp_window_pads(imp *im, window *w, const sym *x);

/* A float32 tensor whose stored data holds exactly its dims' element count and, when want_dims
 * is given, has those dims. */
int qt_imp_check_float_tensor(imp *im, const Onnx__TensorProto *t, const char *role, int want_ndim,
                              const int64_t *want_dims);
/* The values of a float tensor checked by qt_imp_check_float_tensor. */
void qt_imp_float_data(const Onnx__TensorProto *t, float *out, int64_t n);
/* An integer tensor (int64 or int32) of at most MAX_INTS values as S_INTS data. */
int qt_imp_const_ints(imp *im, const Onnx__TensorProto *t, int64_t *v, int *n, int *scalar);
/* Whether s is a float scalar constant; its value in *v. */
int qt_imp_const_scalar(const sym *s, float *v);
/* Input k as a small integer vector (a constant or a shape computation); tmp holds a constant's. */
sym *qt_imp_ints_input(imp *im, size_t k, const char *role, sym *tmp);
/* The integers of attribute `attr` (older opsets) or else of input k (newer ones): *n of them,
 * 0 when neither is given. */
int qt_imp_ints_arg(imp *im, const char *attr, size_t k, int64_t *v, int *n);
/* A float scalar constant (Clip's min and max); *present = 0 when the input is left out. */
int qt_imp_scalar_input(imp *im, size_t k, const char *role, float *v, int *present);

/* The axes of Squeeze, Unsqueeze, ReduceMean and Pad: the attribute `axes` (older opsets), else
 * input k (newer ones); *n = 0 when neither is given. */
int qt_imp_axes(imp *im, size_t k, int64_t *axes, int *n);

/* Letters, digits, '_', '-', '.' kept, others as '_', no leading dot. */
void qt_imp_sanitize(const char *in, char *out, size_t n);
/* The IR name of the current node: after its weight's PyTorch name ("conv1.weight" -> "conv1"),
 * else its scope; made unique. */
void qt_imp_node_name(imp *im, const char *weight, char *out);

/* 0 when the builder gave a value, else the builder's message as the node's error. */
int qt_imp_builder_check(imp *im, int v);
/* Output out_k of the current node is the IR value `value`. */
sym *qt_imp_bind_act(imp *im, size_t out_k, int value);
/* Output out_k of the current node aliases x (Identity, Dropout, a flatten of a flat tensor). */
sym *qt_imp_alias(imp *im, size_t out_k, const sym *x);
/* Output 0 of the current node as a pending step of a pattern the importer folds (a GELU, a
 * channel shuffle): S_NONE, refused with `what` if anything else reads it, and x's activation
 * fields kept for the pattern's last node; counted as folded. */
sym *qt_imp_pending(imp *im, const sym *x, const char *what);
/* A parameter to copy from src into graph tensor `tensor` once the graph is finalized. */
void qt_imp_add_copy(imp *im, int tensor, const Onnx__TensorProto *src, copy_kind kind, const sym *perm);
/* A note for messages about features: where the input's dims came from. */
const char *qt_imp_dyn_note(imp *im);
/* Outputs from `from` on are marked as read by no supported consumer (what: which output). */
void qt_imp_outputs_unused(imp *im, size_t from, const char *what);
/* A new float32 or int64 tensor owned by the import (freed with it), its data zeroed. */
Onnx__TensorProto *qt_imp_new_tensor(imp *im, const char *name, int data_type, const int64_t *dims, size_t n_dims);

/* ---- import_shape.c: the shape computations of ops import_ops.c reads ---- */

/* Squeeze of a one-entry shape to a scalar. */
int qt_imp_squeeze_ints(imp *im, const int64_t *axes, int n_axes);
/* Reshape whose data is a shape computation. */
int qt_imp_reshape_ints(imp *im);

/* ---- import_external.c ---- */

/* Reads the bytes of every external-data initializer (and Constant node value) of the graph from
 * its side file, under the model's directory, into the tensor's raw_data; 0 or -1 with the
 * message. qt_imp_free_external gives the tensors back as they were, before the model is freed. */
int qt_imp_load_external(imp *im);
void qt_imp_free_external(imp *im);

/* memcpy that copies nothing for n = 0, when src may then be NULL (an empty repeated field of a
 * protobuf message has no array: memcpy from NULL is undefined even for 0 bytes). */
static inline void qt_imp_copy(void *dst, const void *src, size_t n) {
  if (n) memcpy(dst, src, n);
}

#endif
