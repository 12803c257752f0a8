/* The quantization training state of a prepared graph inside an open HDF5 file: what a QAT
 * checkpoint holds beyond parameters, buffers and optimizer state (train/checkpoint.c). It
 * reuses the Q/DQ file's quantization records (docs/qdq_format.md, written and read by
 * qat/qdq_write.c and qat/qdq_read.c; this part is qat/qstate_file.c) and adds to each record
 * the state training needs to continue bit for bit:
 *
 *   /quant                              attributes: format "qt-quant-state", format_version 1
 *   /quant/activation/<node>            a record as in model_trained.h5 (spec attributes, scale,
 *   /quant/weight/<node>                zero_point), plus attributes observe, fake_quant,
 *                                       calibrated, pow2_scale (int 0/1) and learned_scale (LSQ:
 *                                       the scale parameter's tensor name; absent otherwise)
 *   /quant/{activation,weight}/<node>/observer
 *                                       attributes kind, channels, averaging_constant, method,
 *                                       percentile, bins, initialized, hist_min, hist_max;
 *                                       datasets min, max (float32, channels) and hist (int64,
 *                                       bins; histogram observers once they have seen data)
 *   /quant/bn                           one int attribute per batch_norm / conv_bn node, named
 *                                       after it: its bn_frozen flag
 *
 * Private to the library (it exposes hid_t); the public API is qat.h and train.h. */
#ifndef QT_QSTATE_FILE_H
#define QT_QSTATE_FILE_H

#include <hdf5.h>

#include "nn/nn.h"

/* 1 when g has quantization state to keep (a quantization record, a fake_quant or a conv_bn
 * node): a prepared graph. */
int qt_graph_has_quant_state(const qt_graph *g);

/* Writes /quant for g into an open, writable file. -1 with a message naming the object. */
int qt_quant_state_write(hid_t file, const qt_graph *g, char *err);

/* The state read from a file, checked against the graph it is meant for, not yet applied. */
typedef struct qt_quant_state qt_quant_state;

/* Reads /quant of an open file for g: every quantization record of g must be there with the
 * same spec (bits, range, signedness, symmetry, channels, observer and its settings, LSQ,
 * power-of-two scales), no record may be left over, and every batch_norm / conv_bn node needs
 * its flag. NULL with a message naming the object and the mismatch; g is not touched. */
qt_quant_state *qt_quant_state_read(hid_t file, const qt_graph *g, char *err);
/* Copies the state into g (scales, zero points, flags, observers, bn_frozen) and frees s. */
void qt_quant_state_apply(qt_graph *g, qt_quant_state *s);
void qt_quant_state_free(qt_quant_state *s);

#endif
