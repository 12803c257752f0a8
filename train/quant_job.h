/* Private to train/: the quantization steps of the training job. */
#ifndef QT_QUANT_JOB_H
#define QT_QUANT_JOB_H

#include "eval/report.h"
#include "qat/qat.h"
#include "train/train.h"

typedef struct {
  qt_eval_result fake_quant, qdq;
  char qdq_path[4200];
  char trained_path[4200];
  qt_check_report check;
  /* qt_quant_deploy: the lowered Q/DQ graph on the test set and inference speed */
  int deployed;
  qt_report report;
  qt_inference_speed speed;
  char report_path[4200];
} qt_quant_result;

/* Trains quant.fp32_checkpoint with quant.fp32_config when it does not exist yet (a sub-run
 * in this process). The job calls it before loading its own data, so the two runs' datasets
 * are never in memory together. */
int qt_quant_ensure_fp32(const qt_config *cfg, int verbose, char *err);
/* The above, then loads the checkpoint into g (nothing to load: g keeps its initialization). */
int qt_quant_obtain_fp32(const qt_config *cfg, qt_graph *g, int verbose, char *err);
qt_graph *qt_quant_prepare(const qt_config *cfg, const qt_graph *g, FILE *report, char *err);
/* Calibrates p on the next batches of the started loader l (observers on, fake quant off, BN
 * in eval) until *done (counted across calls) reaches `until` or the epoch ends, then leaves p
 * in training mode with fake quant on and observers off. -1 with err on a forward error. */
int qt_quant_calibrate_until(qt_graph *p, qt_loader *l, const qt_dataset *train, qt_ctx *ctx, int until, int *done,
                             char *err);
/* quant.calibration_batches training batches (lc, epoch 0) through qt_quant_calibrate_until. */
int qt_quant_calibrate(const qt_config *cfg, qt_graph *p, const qt_dataset *train, const qt_loader_config *lc,
                       qt_ctx *ctx, int verbose, char *err);
int qt_quant_finish(const qt_config *cfg, qt_graph *p, const qt_dataset *test, const qt_loader_config *ec,
                    qt_ctx *ctx, const char *dir, qt_quant_result *res, int verbose, char *err);
/* After qt_quant_finish: lowers the saved Q/DQ graph (res->qdq_path), runs the three-stage
 * report (fp32 graph, Q/DQ graph, int8 device) on the test set, times fp32 and int8 inference
 * at batch 256, writes <dir>/report.txt and prints it when verbose. */
int qt_quant_deploy(qt_graph *fp32, const qt_dataset *test, const qt_loader_config *ec, const char *dir,
                    qt_quant_result *res, int verbose, char *err);

#endif
