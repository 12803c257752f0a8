/* An int8 convolution of a one-channel image of our own (private to the backend library), used by
 * int8_dnnl.c in place of oneDNN's kernel for that shape: u8 input (N, H, W, 1), s8 weights,
 * u8 or f32 output (N, OH, OW, OC), the same parameters and the same bits as oneDNN's. */
#ifndef QT_BACKEND_INT8_CONV1_H
#define QT_BACKEND_INT8_CONV1_H

#include "backend/int8.h"

typedef struct qt_conv1 qt_conv1;

/* NULL when p is not a shape it takes: a dense convolution of one input channel to at most 64
 * output channels with at most 64 taps. weight (OC, 1, KH, KW), bias in accumulator units and
 * oscale (OC) as qt_int8_op_create takes them; all copied. */
qt_conv1 *qt_conv1_create(const qt_int8_params *p, const int8_t *weight, const float *bias, const float *oscale);
void qt_conv1_run(const qt_conv1 *k, void *dst, const uint8_t *src, int N);
void qt_conv1_free(qt_conv1 *k);

#endif
