/* Q/DQ file round trip: a hand-built convert graph and a graph using every fp32 op are saved,
 * loaded and compared field by field (nodes, names, attributes, values, tensors bit for bit,
 * quantization records, integer weights) and by forward outputs on random data (bit-identical).
 * Saving is deterministic (same graph -> same bytes; the loaded graph saves to the same bytes),
 * integer weights use the narrowest storage type, and no temporary file is left behind.
 * Keeps qdq_small.h5, qdq_all_ops.h5 and their _io.h5 files (input, output) for read_qdq.py. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <unistd.h>

#include "tests/qdq/qdq_common.h"

static void roundtrip(const char *path, qt_graph *g) {
  char err[QT_ERR_LEN];
  if (qt_qdq_save(path, g, err)) {
    qt_test_fail("save %s: %s", path, err);
    return;
  }
  QT_CHECK(!qt_test_temp_left(path));
  qt_graph *h = qt_qdq_load(path, err);
  if (!h) {
    qt_test_fail("load %s: %s", path, err);
    return;
  }
  qdq_same_graph(path, g, h);
  qdq_check_same_outputs(path, g, h, 5, 123);
  qdq_expect_no_times(path);

  /* Deterministic bytes: the loaded graph saves to exactly the same file. */
  char again[512];
  snprintf(again, sizeof again, "%s.again.h5", path);
  if (qt_qdq_save(again, h, err)) qt_test_fail("second save %s: %s", again, err);
  long la = 0, lb = 0;
  unsigned char *a = qdq_read_bytes(path, &la), *b = qdq_read_bytes(again, &lb);
  if (la != lb || memcmp(a, b, (size_t)la) != 0)
    qt_test_fail("%s: saving the loaded graph gives different bytes (%ld vs %ld)", path, la, lb);
  free(a);
  free(b);
  unlink(again);
  qt_graph_free(h);
}

/* Storage type of /quant/weight/<node>/weight_int. */
static void expect_weight_storage(const char *path, const char *node, hid_t want, const char *want_name) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  char dpath[256];
  snprintf(dpath, sizeof dpath, "/quant/weight/%s/weight_int", node);
  hid_t d = f < 0 ? -1 : H5Dopen2(f, dpath, H5P_DEFAULT);
  hid_t t = d < 0 ? -1 : H5Dget_type(d);
  if (t < 0 || H5Tequal(t, want) <= 0) qt_test_fail("%s %s: weight_int is not stored as %s", path, dpath, want_name);
  if (t >= 0) H5Tclose(t);
  if (d >= 0) H5Dclose(d);
  if (f >= 0) H5Fclose(f);
}

int main(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  qt_graph *g = qdq_small_graph(NULL);
  roundtrip("qdq_small.h5", g);
  expect_weight_storage("qdq_small.h5", "conv1", H5T_STD_I8LE, "int8");
  expect_weight_storage("qdq_small.h5", "fc", H5T_STD_I8LE, "int8 (4-bit values)");
  qdq_write_io("qdq_small_io.h5", g, 77); /* for read_qdq.py */

  /* Same graph, same bytes. */
  char err[QT_ERR_LEN];
  QT_CHECK(qt_qdq_save("qdq_small_2.h5", g, err) == 0);
  long la = 0, lb = 0;
  unsigned char *a = qdq_read_bytes("qdq_small.h5", &la), *b = qdq_read_bytes("qdq_small_2.h5", &lb);
  if (la != lb || memcmp(a, b, (size_t)la) != 0) qt_test_fail("two saves of one graph differ");
  free(a);
  free(b);
  unlink("qdq_small_2.h5");
  qt_graph_free(g);

  /* Unsigned affine 8-bit weights -> uint8; 12-bit -> int16; 16-bit unsigned -> int32. */
  const struct {
    const char *path;
    qt_qspec spec;
    hid_t storage;
    const char *storage_name;
  } wide[] = {
      {"qdq_small_u8.h5", qdq_spec(8, 0, 0, 255, 0, 1), H5T_STD_U8LE, "uint8"},
      {"qdq_small_s12.h5", qdq_spec(12, 1, -2048, 2047, 1, 0), H5T_STD_I16LE, "int16"},
      {"qdq_small_u16.h5", qdq_spec(16, 0, 0, 65535, 0, 1), H5T_STD_I32LE, "int32"},
  };
  for (int k = 0; k < 3; k++) {
    g = qdq_small_graph(&wide[k].spec);
    roundtrip(wide[k].path, g);
    expect_weight_storage(wide[k].path, "fc", wide[k].storage, wide[k].storage_name);
    qt_graph_free(g);
    unlink(wide[k].path);
  }

  g = qdq_all_ops_graph();
  roundtrip("qdq_all_ops.h5", g);
  qdq_write_io("qdq_all_ops_io.h5", g, 77);
  qt_graph_free(g);
  return qt_test_finish();
}
