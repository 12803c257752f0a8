/* Q/DQ file robustness: 80 (or $QT_QDQ_FUZZ_VARIANTS) corrupted copies of each of two saved graphs, a Q/DQ graph and
 * a prepared (QAT, conv_bn) graph (random byte flips, zeroed and random blocks, truncations at
 * random lengths) each either load (and then equal the original graph and run) or fail with a
 * message naming the file; none crashes (run under ASan/UBSan with -DQT_SANITIZE=ON). Counts of
 * each outcome are printed with QT_TEST_VERBOSE set. */
#include <hdf5.h>
#include <unistd.h>

#include "tests/qdq/qdq_common.h"

static uint64_t rng_state;
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void fuzz(const char *name, qt_graph *g) {
  char err[QT_ERR_LEN];
  const char *base = "qdq_fuzz_base.h5", *path = "qdq_fuzz_case.h5";
  QT_ASSERT(qt_qdq_save(base, g, err) == 0, "%s", err);
  qt_set_observers(g, 0); /* as a loaded graph has them */
  long len = 0;
  unsigned char *orig = qdq_read_bytes(base, &len);
  unsigned char *buf = malloc((size_t)len);
  int loaded = 0, refused = 0;
  const int variants = getenv("QT_QDQ_FUZZ_VARIANTS") ? atoi(getenv("QT_QDQ_FUZZ_VARIANTS")) : 80;
  for (int v = 0; v < variants; v++) {
    rng_state = 0xF0220000ull + (uint64_t)v;
    memcpy(buf, orig, (size_t)len);
    long n = len;
    const int mode = v % 4;
    if (mode == 0) { /* flip 1..8 random bits */
      int flips = 1 + (int)(rng() % 8);
      for (int k = 0; k < flips; k++) buf[rng() % (uint64_t)len] ^= (unsigned char)(1u << (rng() % 8));
    } else if (mode == 1) { /* zero a block */
      long at = (long)(rng() % (uint64_t)len), size = 1 + (long)(rng() % 64);
      for (long k = at; k < at + size && k < len; k++) buf[k] = 0;
    } else if (mode == 2) { /* random bytes over a block */
      long at = (long)(rng() % (uint64_t)len), size = 1 + (long)(rng() % 16);
      for (long k = at; k < at + size && k < len; k++) buf[k] = (unsigned char)rng();
    } else { /* truncate */
      n = (long)(rng() % (uint64_t)len);
    }
    qdq_write_bytes(path, buf, n);
    err[0] = 0;
    qt_graph *h = qt_qdq_load(path, err);
    if (h) {
      loaded++;
      /* Every byte that matters is checksummed: a file that loads is the original graph. */
      char what[96];
      snprintf(what, sizeof what, "%s variant %d (mode %d)", name, v, mode);
      qdq_same_graph(what, g, h);
      qdq_check_same_outputs(what, g, h, 2, (uint64_t)v);
      qt_graph_free(h);
    } else {
      refused++;
      if (!strstr(err, path)) qt_test_fail("%s variant %d: message '%s' does not name the file", name, v, err);
    }
    if (getenv("QT_TEST_VERBOSE")) fprintf(stderr, "%s variant %2d mode %d: %s\n", name, v, mode, h ? "loaded" : err);
    ssize_t open_ids = H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open_ids != 0) qt_test_fail("%s variant %d: %zd HDF5 objects left open after the load", name, v, open_ids);
  }
  if (getenv("QT_TEST_VERBOSE")) fprintf(stderr, "%s: %d loaded, %d refused\n", name, loaded, refused);
  QT_CHECK(refused > 0);
  free(buf);
  free(orig);
  unlink(path);
  unlink(base);
}

int main(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  /* No HDF5 free lists: freed blocks go back to malloc, so a leak is reported where it was
   * really allocated (lsan_hdf5.supp names HDF5's own leak on corrupt object headers). */
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
  qt_graph *g = qdq_small_graph(NULL);
  fuzz("qdq", g);
  qt_graph_free(g);
  qt_graph *f = qdq_small_fp32_graph();
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  g = qdq_prepared_graph(f, &qc, QT_PREPARE_QAT, 2, 3);
  qt_graph_free(f);
  if (g) fuzz("prepared", g);
  qt_graph_free(g);
  return qt_test_finish();
}
