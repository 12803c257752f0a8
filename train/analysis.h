/* Private to train/: PTQ debugging (the [analysis] keys; QAT runs: per-node SQNR only). On a PTQ run, after the fp32
 * model is loaded, compares calibration methods and calibration lengths, measures the SQNR between the fp32 and the
 * fake-quant model node by node, the accuracy drop when only one layer is quantized, and a mixed-precision sweep (the k
 * most sensitive layers kept at 8 bits or fp32, the rest at the configured widths) with model sizes. Writes
 * <dir>/analysis.md and <dir>/analysis.json. Everything is evaluated on the first analysis.images test images. */
#ifndef QT_ANALYSIS_H
#define QT_ANALYSIS_H

#include "eval/report.h"
#include "train/options.h"
#include "train/train.h"

/* ---- per-node SQNR (fp32 graph vs fake-quant graph) ----------------------------------------- */
typedef struct {
  char node[QT_NAME_LEN];    /* node of the fake-quant graph */
  char ref[2 * QT_NAME_LEN]; /* fp32 value compared against ("bn1" for a PTQ-folded conv1) */
  char op[24];
  int weight_bits;   /* 0: no weight or fp32 weight */
  int act_quantized; /* the node's output goes through a fake quant */
  qt_sqnr_sum sqnr;  /* fp32 value vs what the fake-quant graph's consumers see */
} qt_node_sqnr;

/* Runs the first `images` images of ds (lc's batches; shuffle and augmentation off) through
 * both graphs in eval mode and accumulates, for every node of `fq` (except fake quants) that
 * has a counterpart in `fp32` by name, the SQNR of the fp32 value against the fake-quant
 * graph's value after its fake quant (if any). A conv whose fp32 output feeds a batch_norm is
 * compared against the batch_norm's output (PTQ folds BN into the conv). Both graphs are left
 * in training mode, as qt_evaluate leaves them. *rows: malloc'd, *n_rows entries. */
int qt_analysis_node_sqnr(qt_graph *fp32, qt_graph *fq, qt_ctx *ctx, const qt_dataset *ds, const qt_loader_config *lc,
                          int64_t images, qt_node_sqnr **rows, int *n_rows, char *err);

/* Bytes of the conv/linear layers of g: each weight at its width (the weight quantizer's bits,
 * 32 when fp32), rounded up to whole bytes per layer, plus 4 bytes per bias element (a conv
 * without bias feeding a batch_norm counts the bias the fold gives it). */
int64_t qt_analysis_model_bytes(const qt_graph *g);

/* Whether the options ask for any analysis. */
int qt_analysis_wanted(const qt_options *o);
/* -1 (err set) when the options ask for what their quant.mode cannot do (the calibration
 * sweep, sensitivity and mixed precision need PTQ; layer_sqnr needs PTQ or QAT); checked by
 * qt_options_resolve. */
int qt_analysis_check_mode(const qt_options *o, char *err);

/* The whole analysis; fp32 is the loaded fp32 model (left in training mode). methods (may be
 * NULL): the run's calibrated prepared graph after its PTQ methods (quant.cle, quant.adaround,
 * quant.bias_correction); with analysis.layer_sqnr, the per-node SQNR is then taken for it and
 * for the same calibration without the methods, side by side (left in training mode). lc: the
 * calibration loader (as the run calibrates), ec: the evaluation loader. Fills path with
 * <dir>/analysis.json. */
int qt_analysis_run(const qt_options *o, qt_graph *fp32, qt_graph *methods, const qt_dataset *train,
                    const qt_dataset *test, const qt_loader_config *lc, const qt_loader_config *ec, qt_ctx *ctx,
                    const char *dir, char *json_path, size_t json_path_len, int verbose, char *err);

/* QAT debugging (analysis.layer_sqnr on a QAT run), after training: the accuracy of the trained
 * prepared graph with and without fake quant, and the per-node SQNR between the two (the float
 * model QAT trained against what its fake quants make of it). Writes <dir>/analysis.md/.json;
 * fills json_path. The graph is left in training mode with fake quant on. */
int qt_analysis_run_qat(const qt_options *o, qt_graph *qat, const qt_dataset *test, const qt_loader_config *ec,
                        qt_ctx *ctx, const char *dir, char *json_path, size_t json_path_len, int verbose, char *err);

#endif
