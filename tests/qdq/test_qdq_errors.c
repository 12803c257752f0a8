/* Q/DQ file validation: each bad input (missing file, not HDF5, truncated, wrong format or
 * version, unknown op, value id out of range or out of order, tensor shape that does not fit
 * its op, integers outside [qmin, qmax], a tensor value that is not finite, bad scales and
 * zero points, missing datasets, attributes and records, orphan records, a Q/DQ graph labelled
 * kind 'prepared', a bad input preprocessing description: std 0, a shape other than the
 * input's, no mean) fails with its own message naming the file and the object; a file without
 * the `kind` attribute (written before prepared graphs could be saved) loads as a Q/DQ graph; a
 * tensor no node uses (a huge one once took gigabytes before validation) and a tensor declared
 * but never written are refused before any tensor data is read; a refused save names the node
 * and leaves the existing file untouched. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <unistd.h>

#include "tests/qdq/qdq_common.h"

#define BASE "qdq_err_base.h5"

static void set_ints(hid_t f, const char *obj, const char *name, const int *v, size_t n) {
  QT_ASSERT(H5LTset_attribute_int(f, obj, name, v, n) >= 0, "set %s %s", obj, name);
}
static void set_int(hid_t f, const char *obj, const char *name, int v) { set_ints(f, obj, name, &v, 1); }

/* Rewrites element k (of `size` bytes, memory type `type`) of a dataset. */
static void poke(hid_t f, const char *path, int64_t k, hid_t type, const void *v, size_t size) {
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  hid_t sp = H5Dget_space(d);
  int64_t n = H5Sget_simple_extent_npoints(sp);
  unsigned char *buf = malloc((size_t)n * size);
  QT_ASSERT(d >= 0 && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0, "read %s", path);
  memcpy(buf + (size_t)k * size, v, size);
  QT_ASSERT(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0, "write %s", path);
  free(buf);
  H5Sclose(sp);
  H5Dclose(d);
}
static void poke_f32(hid_t f, const char *path, int64_t k, float v) { poke(f, path, k, H5T_NATIVE_FLOAT, &v, sizeof v); }
static void poke_i32(hid_t f, const char *path, int64_t k, int v) { poke(f, path, k, H5T_NATIVE_INT, &v, sizeof v); }

/* Replaces /tensors/<name> with a float dataset of another shape (same attributes). */
static void reshape_tensor(hid_t f, const char *name, int ndim, const hsize_t *dims, int index, int node) {
  char path[256];
  snprintf(path, sizeof path, "/tensors/%s", name);
  QT_ASSERT(H5Ldelete(f, path, H5P_DEFAULT) >= 0, "delete %s", path);
  hsize_t n = 1;
  for (int d = 0; d < ndim; d++) n *= dims[d];
  float *zeros = calloc((size_t)n, sizeof(float));
  QT_ASSERT(H5LTmake_dataset_float(f, path, ndim, dims, zeros) >= 0, "make %s", path);
  free(zeros);
  set_int(f, path, "index", index);
  set_int(f, path, "node", node);
  set_int(f, path, "is_buffer", 0);
}

static void del(hid_t f, const char *path) { QT_ASSERT(H5Ldelete(f, path, H5P_DEFAULT) >= 0, "delete %s", path); }

static void e_format(hid_t f) { qdq_set_str(f, "/", "format", "onnx"); }
static void e_no_format(hid_t f) { QT_ASSERT(H5Adelete(f, "format") >= 0, "delete format"); }
static void e_version(hid_t f) { set_int(f, "/", "format_version", 2); }
static void e_unknown_op(hid_t f) { qdq_set_str(f, "/nodes/0003_conv1", "op", "sigmoid2"); }
static void e_prepared_op(hid_t f) { qdq_set_str(f, "/nodes/0004_relu1", "op", "fake_quant"); }
static void e_value_range(hid_t f) { set_int(f, "/nodes/0009_fc", "inputs", 999); }
static void e_value_order(hid_t f) { set_int(f, "/nodes/0003_conv1", "inputs", 7); }
static void e_output_range(hid_t f) { set_int(f, "/", "output", -3); }
static void e_too_many_inputs(hid_t f) {
  int in[5] = {0, 0, 0, 0, 0};
  set_ints(f, "/nodes/0004_relu1", "inputs", in, 5);
}
static void e_add_arity(hid_t f) {
  int in[2] = {3, 3};
  set_ints(f, "/nodes/0004_relu1", "inputs", in, 2);
}
static void e_dequant_input(hid_t f) { set_int(f, "/nodes/0002_input.dequantize", "inputs", 0); }
static void e_int_input(hid_t f) { set_int(f, "/nodes/0003_conv1", "inputs", 1); }
static void e_conv_not_4d(hid_t f) {
  hsize_t d[2] = {4, 27};
  reshape_tensor(f, "conv1.weight", 2, d, 0, 3);
}
static void e_linear_features(hid_t f) {
  hsize_t d[2] = {10, 63};
  reshape_tensor(f, "fc.weight", 2, d, 2, 9);
}
static void e_bias_shape(hid_t f) {
  hsize_t d[1] = {5};
  reshape_tensor(f, "conv1.bias", 1, d, 1, 3);
}
static void e_kernel_attr(hid_t f) { set_int(f, "/nodes/0003_conv1", "kernel_h", 5); }
/* /input_preprocessing for the 8x8x3 input: a valid group, then one flaw at a time. */
static void input_pre(hid_t f, const int *shape, float std0, int with_mean) {
  hid_t g = H5Gcreate2(f, "input_preprocessing", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  QT_ASSERT(g >= 0, "create /input_preprocessing");
  H5Gclose(g);
  const char *obj = "/input_preprocessing";
  const float mean[3] = {0.5f, 0.25f, 0.125f}, std[3] = {std0, 0.5f, 0.25f}, raw[3] = {0.0f, 255.0f, 255.0f};
  qdq_set_str(f, obj, "layout", "NHWC");
  set_ints(f, obj, "shape", shape, 3);
  QT_ASSERT(H5LTset_attribute_float(f, obj, "raw_min", &raw[0], 1) >= 0 &&
                H5LTset_attribute_float(f, obj, "raw_max", &raw[1], 1) >= 0 &&
                H5LTset_attribute_float(f, obj, "divisor", &raw[2], 1) >= 0 &&
                (!with_mean || H5LTset_attribute_float(f, obj, "mean", mean, 3) >= 0) &&
                H5LTset_attribute_float(f, obj, "std", std, 3) >= 0,
            "set %s", obj);
}
static const int input_shape[3] = {8, 8, 3}, wrong_shape[3] = {8, 8, 1};
static void e_pre_std(hid_t f) { input_pre(f, input_shape, 0.0f, 1); }
static void e_pre_shape(hid_t f) { input_pre(f, wrong_shape, 1.0f, 1); }
static void e_pre_mean(hid_t f) { input_pre(f, input_shape, 1.0f, 0); }

static void e_pool_stride(hid_t f) { set_int(f, "/nodes/0007_pool1", "stride_h", 0); }
static void e_value_shape(hid_t f) {
  qdq_set_value_dim(f, 3, 2, 5); /* conv1's output: 8x8x5 */
  qdq_set_value_dim(f, 4, 2, 5); /* relu1 follows it */
}
static void e_weight_int_range(hid_t f) { poke_i32(f, "/quant/weight/conv1/weight_int", 5, 100); }
static void e_weight_int_shape(hid_t f) {
  del(f, "/quant/weight/fc/weight_int");
  hsize_t d[2] = {64, 10};
  int zeros[640] = {0};
  QT_ASSERT(H5LTmake_dataset_int(f, "/quant/weight/fc/weight_int", 2, d, zeros) >= 0, "make weight_int");
}
static void e_scale_nan(hid_t f) { poke_f32(f, "/quant/weight/conv1/scale", 2, NAN); }
static void e_tensor_nan(hid_t f) { poke_f32(f, "/tensors/fc.bias", 4, NAN); }
static void e_scale_inf(hid_t f) { poke_f32(f, "/quant/activation/relu1.quantize/scale", 0, INFINITY); }
static void e_scale_zero(hid_t f) { poke_f32(f, "/quant/activation/fc.dequantize/scale", 0, 0.0f); }
static void e_scale_negative(hid_t f) { poke_f32(f, "/quant/weight/fc/scale", 9, -0.5f); }
static void e_zero_point(hid_t f) { poke_i32(f, "/quant/activation/input.quantize/zero_point", 0, 256); }
static void e_qrange(hid_t f) { set_int(f, "/quant/weight/conv1", "qmax", 300); }
static void e_bits(hid_t f) { set_int(f, "/quant/weight/conv1", "bits", 40); }
static void e_channels(hid_t f) { set_int(f, "/quant/weight/fc", "channels", 9); }
static void e_axis(hid_t f) { set_int(f, "/quant/weight/fc", "axis", 1); }
static void e_missing_scale(hid_t f) { del(f, "/quant/weight/conv1/scale"); }
static void e_missing_zp(hid_t f) { del(f, "/quant/activation/fc.quantize/zero_point"); }
static void e_missing_weight_int(hid_t f) { del(f, "/quant/weight/fc/weight_int"); }
static void e_missing_values(hid_t f) { del(f, "/values/shape"); }
static void e_missing_tensor(hid_t f) {
  del(f, "/tensors/fc.bias");
  set_int(f, "/", "n_tensors", 3);
}
static void e_missing_node(hid_t f) { del(f, "/nodes/0007_pool1"); }
static void e_missing_attr(hid_t f) { QT_ASSERT(H5Adelete_by_name(f, "/nodes/0003_conv1", "stride_h", H5P_DEFAULT) >= 0, "x"); }
static void e_missing_record(hid_t f) { del(f, "/quant/activation/relu1.quantize"); }
static void e_orphan_record(hid_t f) {
  QT_ASSERT(H5Ocopy(f, "/quant/activation/fc.quantize", f, "/quant/activation/ghost", H5P_DEFAULT, H5P_DEFAULT) >= 0, "copy");
}
static void e_record_on_relu(hid_t f) {
  QT_ASSERT(H5Ocopy(f, "/quant/weight/conv1", f, "/quant/weight/relu1", H5P_DEFAULT, H5P_DEFAULT) >= 0, "copy");
  set_int(f, "/quant/weight/relu1", "node", 4);
}
static void e_float_as_int(hid_t f) {
  float v = 1.5f;
  QT_ASSERT(H5LTset_attribute_float(f, "/nodes/0003_conv1", "groups", &v, 1) >= 0, "set groups");
}
static void e_tensor_owner(hid_t f) { set_int(f, "/tensors/fc.bias", "node", 3); }
static void e_long_name(hid_t f) {
  char name[200];
  memset(name, 'x', sizeof name - 1);
  name[sizeof name - 1] = 0;
  qdq_set_str(f, "/nodes/0004_relu1", "name", name);
}

/* Attributes as h5py writes them: variable-length UTF-8 strings, int64 integers. */
static void set_vlen_str(hid_t f, const char *obj, const char *name, const char *v) {
  QT_ASSERT(H5Adelete_by_name(f, obj, name, H5P_DEFAULT) >= 0, "delete %s %s", obj, name);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate_by_name(f, obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  QT_ASSERT(a >= 0 && H5Awrite(a, t, &v) >= 0, "write %s %s", obj, name);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
}
static void set_i64(hid_t f, const char *obj, const char *name, long long v) {
  QT_ASSERT(H5Adelete_by_name(f, obj, name, H5P_DEFAULT) >= 0, "delete %s %s", obj, name);
  QT_ASSERT(H5LTset_attribute_long_long(f, obj, name, &v, 1) >= 0, "write %s %s", obj, name);
}
static void e_foreign_writer(hid_t f) {
  set_vlen_str(f, "/nodes/0003_conv1", "op", "conv2d");
  set_vlen_str(f, "/nodes/0009_fc", "weight", "fc.weight");
  set_vlen_str(f, "/", "format", "qt-qdq-graph");
  set_i64(f, "/nodes/0003_conv1", "kernel_h", 3);
  set_i64(f, "/quant/weight/fc", "qmin", -8);
}
/* A file from before prepared graphs existed: no root attribute `kind` (means qdq). */
static void e_no_kind(hid_t f) { QT_ASSERT(H5Adelete(f, "kind") >= 0, "delete kind"); }
static void e_kind_prepared(hid_t f) { qdq_set_str(f, "/", "kind", "prepared"); }
/* An empty graph name loaded, and its ONNX export (the graph's name) failed onnx.checker. */
static void e_empty_name(hid_t f) { qdq_set_str(f, "/", "name", ""); }

static void e_vlen_too_long(hid_t f) {
  char name[100];
  memset(name, 'y', sizeof name - 1);
  name[sizeof name - 1] = 0;
  set_vlen_str(f, "/nodes/0004_relu1", "name", name);
}

/* A chunked float dataset of the given shape whose chunks are never written: a few hundred
 * bytes in the file, any size declared (it reads as zeros). */
static void sparse_tensor(hid_t f, const char *path, int ndim, const hsize_t *dims, int index, int node) {
  hsize_t chunk[4];
  for (int d = 0; d < ndim; d++) chunk[d] = dims[d] < 64 ? dims[d] : 64;
  hid_t sp = H5Screate_simple(ndim, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  QT_ASSERT(H5Pset_chunk(dcpl, ndim, chunk) >= 0, "chunk");
  hid_t d = H5Dcreate2(f, path, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  QT_ASSERT(d >= 0, "create %s", path);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
  set_int(f, path, "index", index);
  set_int(f, path, "node", node);
  set_int(f, path, "is_buffer", 0);
}
/* An extra 16384 x 16384 tensor (1 GiB declared, nothing stored) that no node uses: once read
 * before anything was validated (6.3 GB for a few such tensors). */
static void e_unused_huge(hid_t f) {
  int n = 0;
  QT_ASSERT(H5LTget_attribute_int(f, "/", "n_tensors", &n) >= 0, "n_tensors");
  const hsize_t dims[2] = {16384, 16384};
  sparse_tensor(f, "/tensors/conv1.extra", 2, dims, n, 3);
  set_int(f, "/", "n_tensors", n + 1);
}
/* An extra (written) tensor that no node uses. */
static void e_unused(hid_t f) {
  int n = 0;
  QT_ASSERT(H5LTget_attribute_int(f, "/", "n_tensors", &n) >= 0, "n_tensors");
  const hsize_t dims[1] = {4};
  const float v[4] = {1, 2, 3, 4};
  QT_ASSERT(H5LTmake_dataset_float(f, "/tensors/conv1.extra", 1, dims, v) >= 0, "make conv1.extra");
  set_int(f, "/tensors/conv1.extra", "index", n);
  set_int(f, "/tensors/conv1.extra", "node", 3);
  set_int(f, "/tensors/conv1.extra", "is_buffer", 0);
  set_int(f, "/", "n_tensors", n + 1);
}
/* conv1's weight declared with its shape but never written. */
static void e_sparse_weight(hid_t f) {
  del(f, "/tensors/conv1.weight");
  const hsize_t dims[4] = {4, 3, 3, 3};
  sparse_tensor(f, "/tensors/conv1.weight", 4, dims, 0, 3);
}

/* The edited file must load and equal the graph the base file holds. */
static void expect_load_same(const char *what, qdq_edit_fn edit, const qt_graph *want) {
  char path[256], err[QT_ERR_LEN] = "";
  snprintf(path, sizeof path, "qdq_ok_%s.h5", what);
  qdq_copy_edited(BASE, path, edit, what);
  qt_graph *g = qt_qdq_load(path, err);
  if (!g) qt_test_fail("%s: %s", what, err);
  else qdq_same_graph(what, want, g);
  qt_graph_free(g);
  unlink(path);
}

static void save_errors(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qdq_small_graph(NULL);
  if (qt_qdq_save("/nonexistent_dir_qdq/x.h5", g, err) == 0 || !strstr(err, "'/nonexistent_dir_qdq/x.h5'") ||
      !strstr(err, "temporary file"))
    qt_test_fail("save into a missing directory: '%s'", err);

  /* A refused save leaves the existing file as it was. */
  long len0 = 0, len1 = 0;
  unsigned char *before = qdq_read_bytes(BASE, &len0);
  qt_node *conv = &g->nodes[qt_graph_find_node(g, "conv1")];
  conv->wq->qweight[3] = 64;
  if (qt_qdq_save(BASE, g, err) == 0 || !strstr(err, "node 3 'conv1'") || !strstr(err, "integer weight 3 = 64"))
    qt_test_fail("save with an integer weight outside [qmin, qmax]: '%s'", err);
  conv->wq->qweight[3] = 0;
  conv->wq->scale[1] = 0.0f;
  if (qt_qdq_save(BASE, g, err) == 0 || !strstr(err, "scale[1] = 0"))
    qt_test_fail("save with a zero scale: '%s'", err);
  conv->wq->scale[1] = 0.01f;
  float *w = qt_graph_tensor_data(g, conv->param[QT_P_WEIGHT]);
  const float w7 = w[7];
  w[7] = -INFINITY; /* a diverged training's weight */
  if (qt_qdq_save(BASE, g, err) == 0 || !strstr(err, "tensor 'conv1.weight'[7] is Inf"))
    qt_test_fail("save with an infinite weight: '%s'", err);
  w[7] = w7;
  int32_t *qw = conv->wq->qweight;
  conv->wq->qweight = NULL;
  if (qt_qdq_save(BASE, g, err) == 0 || !strstr(err, "without integer weights"))
    qt_test_fail("save of fake-quant weights: '%s'", err);
  conv->wq->qweight = qw;
  conv->op = QT_OP_FAKE_QUANT;
  if (qt_qdq_save(BASE, g, err) == 0 || !strstr(err, "prepared graphs"))
    qt_test_fail("save of a prepared op: '%s'", err);
  conv->op = QT_OP_CONV2D;
  unsigned char *after = qdq_read_bytes(BASE, &len1);
  if (len0 != len1 || memcmp(before, after, (size_t)len0) != 0) qt_test_fail("a refused save changed %s", BASE);
  QT_CHECK(!qt_test_temp_left(BASE));
  free(before);
  free(after);
  qt_graph_free(g);
}

/* Each edit of the base file, and what the load error must say (the message also names the file). */
static const qdq_error_case load_errors[] = {
    {"format", e_format, "format is 'onnx', want 'qt-qdq-graph'"},
    {"no_format", e_no_format, "no 'format' attribute"},
    {"version", e_version, "format version 2"},
    {"unknown_op", e_unknown_op, "node 3 'conv1': unknown op 'sigmoid2'"},
    {"prepared_op", e_prepared_op, "node 4 'relu1': op 'fake_quant' belongs to prepared graphs"},
    {"kind_prepared", e_kind_prepared, "node 1 'input.quantize': op 'quantize' belongs to Q/DQ graphs"},
    {"value_range", e_value_range, "node 9 'fc': input value id 999 out of range (12 values)"},
    {"value_order", e_value_order, "node 3 'conv1': input value 7 is produced by a later node"},
    {"output_range", e_output_range, "graph output value id -3 out of range (12 values)"},
    {"too_many_inputs", e_too_many_inputs, "'inputs' has 5 elements"},
    {"arity", e_add_arity, "node 4 'relu1': op 'relu' takes 1 input(s), has 2"},
    {"dequant_input", e_dequant_input, "dequantize reads 'input', which is not the output of a quantize"},
    {"int_input", e_int_input, "node 3 'conv1': reads the integer output of quantize 'input.quantize'"},
    {"conv_not_4d", e_conv_not_4d, "node 3 'conv1': weight 'conv1.weight' is 2-D, conv2d wants 4-D"},
    {"linear_features", e_linear_features, "weight 'fc.weight' takes 63 features, input 'flatten' has 64"},
    {"bias_shape", e_bias_shape, "tensor 'conv1.bias' has shape (5), want (4)"},
    {"kernel_attr", e_kernel_attr, "has a 3x3 kernel, the attributes say 5x3"},
    {"pre_std", e_pre_std, "input preprocessing of graph qdq_small: channel 0: mean 0.5, std 0, expected finite values and std > 0"},
    {"pre_shape", e_pre_shape, "/input_preprocessing: shape (8, 8, 1), expected the input's (8, 8, 3)"},
    {"pre_mean", e_pre_mean, "/input_preprocessing: missing attribute 'mean'"},
    {"pool_stride", e_pool_stride, "node 7 'pool1': max_pool2d needs a square kernel"},
    {"value_shape", e_value_shape, "output value 'conv1' has shape (8, 8, 5), op 'conv2d' computes (8, 8, 4)"},
    {"weight_int_range", e_weight_int_range, "node 3 'conv1': integer weight 5 = 100 outside [qmin -64, qmax 63]"},
    {"weight_int_shape", e_weight_int_shape, "'weight_int' has shape (64, 10), want (10, 64)"},
    {"scale_nan", e_scale_nan, "node 3 'conv1': weight quantization: scale[2] = nan is not a finite number > 0"},
    {"scale_inf", e_scale_inf, "scale[0] = inf"},
    {"tensor_nan", e_tensor_nan, "tensor 'fc.bias'[4] is NaN: a Q/DQ graph holds finite values only"},
    {"scale_zero", e_scale_zero, "node 11 'fc.dequantize': activation quantization: scale[0] = 0"},
    {"scale_negative", e_scale_negative, "scale[9] = -0.5"},
    {"zero_point", e_zero_point, "zero_point[0] = 256 outside [qmin 0, qmax 255]"},
    {"qrange", e_qrange, "[qmin -64, qmax 300] is not a range within 8-bit signed"},
    {"bits", e_bits, "bits 40 outside 2..16"},
    {"channels", e_channels, "/quant/weight/fc: dataset 'scale' has shape (10), want (9)"},
    {"axis", e_axis, "/quant/weight/fc: axis 1, want 0"},
    {"missing_scale", e_missing_scale, "/quant/weight/conv1: missing dataset 'scale'"},
    {"missing_zp", e_missing_zp, "/quant/activation/fc.quantize: missing dataset 'zero_point'"},
    {"missing_weight_int", e_missing_weight_int, "/quant/weight/fc: missing dataset 'weight_int'"},
    {"missing_values", e_missing_values, "/values: missing dataset 'shape'"},
    {"missing_tensor", e_missing_tensor, "node 9 'fc': bias tensor 'fc.bias' is not in /tensors"},
    {"missing_node", e_missing_node, "/nodes holds 11 groups, attribute n_nodes says 12"},
    {"missing_attr", e_missing_attr, "/nodes/0003_conv1: missing attribute 'stride_h'"},
    {"missing_record", e_missing_record, "node 5 'relu1.quantize': quantize without an activation quantization record"},
    {"orphan_record", e_orphan_record, "/quant/activation/ghost: a record for no node"},
    {"record_on_relu", e_record_on_relu, "node 4 'relu1' (relu) has no weight to quantize"},
    {"float_as_int", e_float_as_int, "attribute 'groups' is not an integer"},
    {"tensor_owner", e_tensor_owner, "/tensors/fc.bias: the name must be '<owner node>.<suffix>'"},
    {"long_name", e_long_name, "attribute 'name' is longer than 63 characters"},
    {"vlen_too_long", e_vlen_too_long, "attribute 'name' is longer than 63 characters"},
    {"unused_huge", e_unused_huge,
     "/tensors: dataset 'conv1.extra' declares shape (16384, 16384) (1073741824 bytes) but stores 0 bytes"},
    {"unused", e_unused, "/tensors/conv1.extra: no slot of its owner node 3 'conv1' names it"},
    {"empty_name", e_empty_name, "/: attribute 'name' is empty (the graph's name)"},
    {"sparse_weight", e_sparse_weight,
     "/tensors: dataset 'conv1.weight' declares shape (4, 3, 3, 3) (432 bytes) but stores 0 bytes"},
};

int main(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  char err[QT_ERR_LEN];
  qt_graph *g = qdq_small_graph(NULL);
  QT_ASSERT(qt_qdq_save(BASE, g, err) == 0, "%s", err);
  qt_graph_free(g);
  g = qt_qdq_load(BASE, err);
  QT_CHECK(g != NULL); /* the base file itself is fine */
  qt_graph_free(g);

  g = qt_qdq_load("qdq_err_missing.h5", err);
  if (g || !strstr(err, "qdq_err_missing.h5") || !strstr(err, "No such file"))
    qt_test_fail("missing file: '%s'", err);
  qdq_write_bytes("qdq_err_text.h5", (const unsigned char *)"not a graph\n", 12);
  g = qt_qdq_load("qdq_err_text.h5", err);
  if (g || !strstr(err, "qdq_err_text.h5") || !strstr(err, "not a readable HDF5 file"))
    qt_test_fail("text file: '%s'", err);
  unlink("qdq_err_text.h5");
  long len = 0;
  unsigned char *bytes = qdq_read_bytes(BASE, &len);
  qdq_write_bytes("qdq_err_half.h5", bytes, len / 2);
  free(bytes);
  g = qt_qdq_load("qdq_err_half.h5", err);
  if (g || !strstr(err, "qdq_err_half.h5") || !strstr(err, "truncated"))
    qt_test_fail("file cut at half: '%s'", err);
  unlink("qdq_err_half.h5");

  qdq_expect_load_errors(BASE, "qdq_err_", load_errors, (int)(sizeof load_errors / sizeof load_errors[0]));
  g = qdq_small_graph(NULL);
  expect_load_same("foreign_writer", e_foreign_writer, g);
  expect_load_same("no_kind", e_no_kind, g);
  qt_graph_free(g);
  save_errors();
  unlink(BASE);
  return qt_test_finish();
}
