/* The executor's fusion pass (fuse.c), private to nn/: which nodes of a graph run fused with
 * their producer or consumer in one forward call, with which partners and in which layout. The
 * executor (exec.c) dispatches per node from these marks and decides nothing itself. */
#ifndef QT_NN_FUSE_H
#define QT_NN_FUSE_H

#include "nn/nn.h"

typedef enum {
  QT_FUSE_NONE = 0,      /* its op alone (conv_bn: conv, / sf, + bias, BN with `relu` when >= 0, and the
                          * eval mode's bias rounding; its convolution takes `lsq_input` when >= 0) */
  QT_FUSE_DONE,          /* a fused producer computed its output: its value is its input's tensor */
  QT_FUSE_CONV1,         /* conv2d (with batch norm `bn`) or conv_bn of the image, with `relu`, the fake
                          * quant `fq` (conv_bn; -1: none) and `pool` as one op
                          * (qt_conv1_bn_relu_max_pool2d; conv_bn's convolution takes `lsq_input`) */
  QT_FUSE_CONV,          /* conv2d quantizing its input with fake quant `lsq_input` (qt_conv2d_lsq_input)
                          * or, when lsq_input < 0, writing its output blocked (qt_conv2d_to_blocked) */
  QT_FUSE_CONV_BN_TRAIN, /* conv_bn's training forward: BN of conv / sf without the quotient in memory,
                          * with `relu`, `fq` and `pool` as one op (qt_batch_norm_relu_max_pool2d) when
                          * pool >= 0, else qt_batch_norm_div with `relu` (-1: none); its convolution
                          * takes `lsq_input` or writes blocked (to_blocked) */
  QT_FUSE_BN_RELU,       /* batch_norm with `relu` (qt_batch_norm_relu) */
  QT_FUSE_BN_RELU_POOL,  /* batch_norm with `relu`, `fq` (-1: none) and `pool`
                          * (qt_batch_norm_relu_max_pool2d) */
  QT_FUSE_FQ_POOL,       /* fake_quant with the max pool `pool` (qt_fake_quant_lsq_max_pool2d,
                          * qt_fake_quant_max_pool2d) */
  QT_FUSE_FQ_TO_CONV,    /* fake_quant whose quantization the convolution `conv` runs: its value is
                          * its input */
} qt_fuse_kind;

/* How one node runs in a forward call. A node index is -1 where the kind does not use it. */
typedef struct {
  qt_fuse_kind kind;
  int relu;       /* the relu or relu6 node that runs with a batch norm or conv_bn */
  int fq;         /* the per-tensor fake quant between that relu and `pool` */
  int pool;       /* the max pool node that runs with this node */
  int bn;         /* QT_FUSE_CONV1 of a conv2d: its batch norm node */
  int lsq_input;  /* conv2d, conv_bn: the fake quant node whose LSQ runs inside the convolution */
  int conv;       /* QT_FUSE_FQ_TO_CONV: the convolution node */
  int to_blocked; /* the output goes to its consumer in oneDNN's blocked layout */
} qt_fuse_mark;

/* The marks of every node of finalized graph g for one forward call on `input` (N images) in
 * ctx's mode, with the forced values `force` and kept values `keep` of that call (either may be
 * NULL) and keep_all (every value is kept): allocated in ctx's arena. The fusions are the
 * training forward's (grad on, values not all kept); otherwise every node runs alone. They
 * depend on the nodes' modes and quantization flags, which must not change before the call. */
qt_fuse_mark *qt_fuse_plan(const qt_graph *g, qt_ctx *ctx, const qt_tensor *input, qt_tensor *const *force,
                           const unsigned char *keep, int keep_all);

#endif
