/* Private to conv2d on the CPU (kernels.h), shared by its two files:
 *   conv2d.c        the entry points, oneDNN's primitives (cached per shape), the reference twins
 *   conv2d_gemm.c   convolutions with small outputs as matrix products (dense), and the weight
 *                   gradient of depthwise ones there
 * The entry points of conv2d.c send a shape to conv2d_gemm.c where the *_applies tests say so. */
#ifndef QT_AUTOGRAD_CONV2D_INT_H
#define QT_AUTOGRAD_CONV2D_INT_H

#include "autograd/kernels.h"

#include <stddef.h>

/* The largest output (OH * OW pixels per image) conv2d_gemm.c takes. */
#define CONV_GEMM_MAX_PIXELS 4

/* Dense (groups == 1), an output of at most CONV_GEMM_MAX_PIXELS pixels, NHWC. */
int qt_conv2d_gemm_applies(const qt_conv2d_shape *s);
void qt_conv2d_gemm_forward(float *out, const float *inp, const float *weight, const float *bias,
                            const qt_conv2d_shape *s);
/* dinp written (dinp_write) or added to */
void qt_conv2d_gemm_backward_data(float *dinp, int dinp_write, const float *dout, const float *weight,
                                  const qt_conv2d_shape *s);
/* dweight += ..., no bias gradient */
void qt_conv2d_gemm_backward_weights(float *dweight, const float *dout, const float *inp, const qt_conv2d_shape *s);

/* Depthwise (groups == C == OC), an output of at most CONV_GEMM_MAX_PIXELS pixels, a kernel of at
 * most 7x7 taps, NHWC. */
int qt_conv2d_dw_weights_applies(const qt_conv2d_shape *s);
/* dweight += ..., no bias gradient */
void qt_conv2d_dw_backward_weights(float *dweight, const float *dout, const float *inp, const qt_conv2d_shape *s);

/* Frees conv2d_gemm.c's scratch (qt_conv2d_release_scratch calls it). */
void qt_conv2d_gemm_release_scratch(void);

#endif
