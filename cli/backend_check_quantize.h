/* qat_backend_check --quantize (cli/backend_check_quantize.c). */
#ifndef QT_CLI_BACKEND_CHECK_QUANTIZE_H
#define QT_CLI_BACKEND_CHECK_QUANTIZE_H

#include "backend/backend.h"
#include "config/config.h"

/* PTQ with the Quantizer of d: build the config's model, load its fp32 checkpoint, annotate,
 * prepare, calibrate on quant.calibration_batches training batches, convert, save to out_path.
 * Prints the annotations and what it wrote. Returns 0, or -1 with err. */
int qt_backend_check_quantize(const qt_config *cfg, const qt_backend_desc *d, const char *out_path, char *err);

#endif
