/* Private to train/: the quantization steps of the training job. */
#ifndef QT_QUANT_JOB_H
#define QT_QUANT_JOB_H

#include "qat/qat.h"
#include "train/train.h"

typedef struct {
  qt_eval_result fake_quant, qdq;
  char qdq_path[4200];
  char trained_path[4200];
  qt_check_report check;
} qt_quant_result;

int qt_quant_obtain_fp32(const qt_config *cfg, qt_graph *g, int verbose, char *err);
qt_graph *qt_quant_prepare(const qt_config *cfg, const qt_graph *g, FILE *report, char *err);
void qt_calibration_mode(qt_graph *p);
int qt_quant_calibrate(const qt_config *cfg, qt_graph *p, const qt_dataset *train, const qt_loader_config *lc,
                       qt_ctx *ctx, int verbose, char *err);
int qt_quant_finish(const qt_config *cfg, qt_graph *p, const qt_dataset *test, const qt_loader_config *ec,
                    qt_ctx *ctx, const char *dir, qt_quant_result *res, int verbose, char *err);

#endif
