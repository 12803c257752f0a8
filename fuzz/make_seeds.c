/* Writes the generated part of the fuzz seed corpora (fuzz/README.md) into OUT/<target>/:
 * Q/DQ files and checkpoints of the tiny models of fuzz_graphs.h, saved by the project's own
 * writers, and image-folder inputs (fuzz_folder.c's format) holding small PNG, JPEG, BMP, TGA,
 * HDR, GIF and PNM images. Run by fuzz/make_seeds.sh; the output is committed. Deterministic:
 * the same files on every run (except for oneDNN's ISA, which only the int8 kernels see). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include <stb_image_write.h>

#include "fuzz/fuzz_graphs.h"
#include "fuzz/fuzz_util.h"
#include "train/options.h"
#include "train/train.h"

static char out_dir[400];

static const char *out_path(const char *target, const char *name) {
  static char p[1024];
  snprintf(p, sizeof p, "%s/%s", out_dir, target);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/%s/%s", out_dir, target, name);
  return p;
}

/* ---- Q/DQ files and checkpoints ------------------------------------------------------------------ */

static void forward_n(qt_graph *g, qt_graph_mode mode, int passes) {
  qt_ctx *ctx = qt_ctx_create();
  qt_graph_set_mode(g, mode);
  for (int k = 0; k < passes; k++) QT_ASSERT(qt_fuzz_forward(g, ctx, 4 + k) == 0, "%s", g->error);
  qt_ctx_free(ctx);
}

/* fp32 g -> PTQ prepare (qc) -> calibrate -> convert -> OUT/qdq/<name>. */
static void qdq_ptq(const char *name, const qt_graph *g, const qt_quantizer_config *qc) {
  char err[QT_ERR_LEN];
  qt_graph *p = qt_fuzz_prepare(g, qc, QT_PREPARE_PTQ);
  forward_n(p, QT_MODE_CALIBRATE, 2);
  qt_set_observers(p, 0);
  qt_graph *c = qt_convert(p, err);
  QT_ASSERT(c, "%s", err);
  QT_ASSERT(qt_qdq_save(out_path("qdq", name), c, err) == 0, "%s", err);
  qt_graph_free(c);
  qt_graph_free(p);
}

/* fp32 g -> QAT prepare (qc) -> two training passes -> eval -> OUT/qdq/<name> (kind prepared). */
static void qdq_prepared(const char *name, const qt_graph *g, const qt_quantizer_config *qc) {
  char err[QT_ERR_LEN];
  qt_graph *p = qt_fuzz_prepare(g, qc, QT_PREPARE_QAT);
  forward_n(p, QT_MODE_TRAIN, 2);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  QT_ASSERT(qt_qdq_save(out_path("qdq", name), p, err) == 0, "%s", err);
  qt_graph_free(p);
}

static void checkpoint(const char *name, const qt_graph *g, qt_optim_kind kind, int with_optim, int epoch,
                       const char *config) {
  char err[QT_ERR_LEN];
  qt_optim_config oc = {
      .kind = kind, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  qt_optim *opt = qt_optim_create(&oc, g->n_params);
  QT_ASSERT(opt, "out of memory");
  /* Non-zero optimizer state: a few steps on made-up gradients. */
  float *params = malloc((size_t)g->n_params * sizeof(float)), *grads = malloc((size_t)g->n_params * sizeof(float));
  QT_ASSERT(params && grads, "out of memory");
  memcpy(params, g->params, (size_t)g->n_params * sizeof(float));
  for (int64_t i = 0; i < g->n_params; i++) grads[i] = (float)((i * 13) % 7) / 7.0f - 0.5f;
  for (int s = 0; s < 3; s++) qt_optim_step(opt, params, grads, 0.01f);
  qt_checkpoint_meta meta = {.epoch = epoch, .step = 3 * epoch, .seed = 42, .config_ini = (char *)config};
  QT_ASSERT(qt_checkpoint_save(out_path("checkpoint", name), g, with_optim ? opt : NULL, &meta, err) == 0, "%s", err);
  free(params);
  free(grads);
  qt_optim_free(opt);
}

static void model_seeds(void) {
  qt_graph *tiny = qt_fuzz_tiny_graph(), *all = qt_fuzz_all_ops_graph();
  qt_quantizer_config w8a8, w4a8, qat = qt_fuzz_qat_config();
  qt_quantizer_config_default(&w8a8);
  w4a8 = w8a8;
  w4a8.weight_bits = 4;
  char err[QT_ERR_LEN];
  const float mean[2] = {0.5f, 0.25f}, std[2] = {0.5f, 2.0f};
  QT_ASSERT(qt_graph_set_input_preprocessing(all, mean, std, 2, err) == 0, "%s", err);

  qdq_ptq("tiny_ptq_w8a8.h5", tiny, &w8a8);
  qdq_ptq("all_ops_ptq_w4a8.h5", all, &w4a8);
  qt_quantizer_config over = w8a8;
  QT_ASSERT(qt_parse_overrides(&over, "conv_b=fp32;head=w4a8", err) == 0, "%s", err);
  over.activation_observer = QT_OBSERVER_HISTOGRAM;
  over.activation_method = QT_RANGE_PERCENTILE;
  qdq_ptq("all_ops_ptq_overrides.h5", all, &over);
  qdq_prepared("tiny_qat_prepared.h5", tiny, &qat);
  qdq_prepared("all_ops_qat_prepared.h5", all, &w8a8);

  /* Checkpoints: fp32 (SGD state, or none), and the QAT-prepared tiny model (AdamW) as it
   * starts, after two training passes, and with observers and BN frozen. */
  static qt_options o;
  char *ini = NULL;
  QT_ASSERT(qt_options_load(NULL, NULL, 0, &o, err) == 0, "%s", err);
  ini = qt_options_to_ini(&o);
  checkpoint("fp32_sgd.h5", tiny, QT_OPTIM_SGD, 1, 2, "[train]\nepochs = 4\n");
  checkpoint("fp32_sgd_full_config.h5", tiny, QT_OPTIM_SGD, 1, 1, ini);
  checkpoint("fp32_no_optim.h5", tiny, QT_OPTIM_SGD, 0, 0, NULL);
  qt_graph *p = qt_fuzz_prepare(tiny, &qat, QT_PREPARE_QAT);
  checkpoint("qat_start.h5", p, QT_OPTIM_ADAMW, 1, 0, "[quant]\nmode = qat\n");
  forward_n(p, QT_MODE_TRAIN, 2);
  checkpoint("qat_trained.h5", p, QT_OPTIM_ADAMW, 1, 1, "[quant]\nmode = qat\n");
  qt_set_observers(p, 0);
  qt_freeze_bn(p, 1);
  checkpoint("qat_frozen.h5", p, QT_OPTIM_ADAMW, 1, 2, "[quant]\nmode = qat\n");
  qt_graph_free(p);
  free(ini);
  qt_graph_free(tiny);
  qt_graph_free(all);
}

/* ---- image folders ------------------------------------------------------------------------------- */

typedef struct {
  unsigned char *b;
  size_t n, cap;
} bytes;

static void put(bytes *o, const void *p, size_t n) {
  if (o->n + n > o->cap) {
    o->cap = (o->n + n) * 2 + 256;
    o->b = realloc(o->b, o->cap);
    QT_ASSERT(o->b, "out of memory");
  }
  memcpy(o->b + o->n, p, n);
  o->n += n;
}

static void put_func(void *ctx, void *data, int size) { put(ctx, data, (size_t)size); }

static void be32(bytes *o, uint32_t v) {
  const unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                              (unsigned char)v};
  put(o, b, 4);
}

static void png_chunk(bytes *o, const char *type, const unsigned char *data, size_t n) {
  be32(o, (uint32_t)n);
  const size_t at = o->n;
  put(o, type, 4);
  if (n) put(o, data, n);
  be32(o, (uint32_t)crc32(0, o->b + at, (uInt)(n + 4)));
}

/* A PNG stb_image_write cannot make: any bit depth and color type, a palette, Adam7 interlace.
 * Pixel samples are a fixed pattern; rows use filter type (row % 5) to reach every unfilter. */
static bytes png_by_hand(int w, int h, int depth, int color, int interlace) {
  static const int channels_of[7] = {1, 0, 3, 1, 2, 0, 4};
  const int ch = channels_of[color];
  bytes raw = {0}, o = {0};
  static const int x0[7] = {0, 4, 0, 2, 0, 1, 0}, y0[7] = {0, 0, 4, 0, 2, 0, 1}, dx[7] = {8, 8, 4, 4, 2, 2, 1},
                   dy[7] = {8, 8, 8, 4, 4, 2, 2};
  const int passes = interlace ? 7 : 1;
  for (int pass = 0; pass < passes; pass++) {
    const int pw = interlace ? (w - x0[pass] + dx[pass] - 1) / dx[pass] : w;
    const int ph = interlace ? (h - y0[pass] + dy[pass] - 1) / dy[pass] : h;
    if (pw <= 0 || ph <= 0) continue;
    const size_t row_bytes = ((size_t)pw * (size_t)ch * (size_t)depth + 7) / 8;
    for (int y = 0; y < ph; y++) {
      unsigned char f = (unsigned char)(y % 5);
      put(&raw, &f, 1);
      for (size_t k = 0; k < row_bytes; k++) {
        unsigned char v = (unsigned char)((k * 29 + (size_t)y * 53 + (size_t)pass * 7) & 0xff);
        if (color == 3 && depth == 8) v %= 4; /* inside the 4-entry palette */
        put(&raw, &v, 1);
      }
    }
  }
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  put(&o, sig, 8);
  const unsigned char ihdr[13] = {0,
                                  0,
                                  0,
                                  (unsigned char)w,
                                  0,
                                  0,
                                  0,
                                  (unsigned char)h,
                                  (unsigned char)depth,
                                  (unsigned char)color,
                                  0,
                                  0,
                                  (unsigned char)interlace};
  png_chunk(&o, "IHDR", ihdr, 13);
  if (color == 3) {
    static const unsigned char plte[12] = {0, 0, 0, 255, 0, 0, 0, 255, 0, 255, 255, 255};
    static const unsigned char trns[2] = {0, 128};
    png_chunk(&o, "PLTE", plte, 12);
    png_chunk(&o, "tRNS", trns, 2);
  }
  uLongf zn = compressBound((uLong)raw.n);
  unsigned char *z = malloc(zn);
  QT_ASSERT(z && compress2(z, &zn, raw.b, (uLong)raw.n, 9) == Z_OK, "zlib");
  png_chunk(&o, "IDAT", z, zn);
  png_chunk(&o, "IEND", NULL, 0);
  free(z);
  free(raw.b);
  return o;
}

typedef enum { IMG_PNG, IMG_JPG, IMG_BMP, IMG_TGA, IMG_HDR } img_kind;

/* A w x h image with comp channels in one of stb_image_write's formats. */
static bytes image(img_kind kind, int w, int h, int comp, int seed) {
  unsigned char px[16 * 16 * 4];
  float fx[16 * 16 * 4];
  for (int i = 0; i < w * h * comp; i++) {
    px[i] = (unsigned char)((i * 31 + seed * 17) & 0xff);
    fx[i] = (float)px[i] / 64.0f;
  }
  bytes o = {0};
  int ok = 0;
  switch (kind) {
    case IMG_PNG: ok = stbi_write_png_to_func(put_func, &o, w, h, comp, px, w * comp); break;
    case IMG_JPG: ok = stbi_write_jpg_to_func(put_func, &o, w, h, comp, px, 50); break;
    case IMG_BMP: ok = stbi_write_bmp_to_func(put_func, &o, w, h, comp, px); break;
    case IMG_TGA: ok = stbi_write_tga_to_func(put_func, &o, w, h, comp, px); break;
    case IMG_HDR: ok = stbi_write_hdr_to_func(put_func, &o, w, h, comp, fx); break;
  }
  QT_ASSERT(ok, "stb_image_write failed");
  return o;
}

static bytes literal(const void *p, size_t n) {
  bytes o = {0};
  put(&o, p, n);
  return o;
}

/* One fuzz_folder input: the channels byte, then each file as header byte + bytes. The files
 * are consumed (freed). */
static void folder_seed(const char *name, int channels, int n, const int *header, bytes *files) {
  bytes o = {0};
  unsigned char c = (unsigned char)(channels - 1);
  put(&o, &c, 1);
  for (int i = 0; i < n; i++) {
    if (i) put(&o, QT_FUZZ_SEP, QT_FUZZ_SEP_LEN);
    unsigned char h = (unsigned char)header[i];
    put(&o, &h, 1);
    put(&o, files[i].b, files[i].n);
    free(files[i].b);
  }
  FILE *f = fopen(out_path("folder", name), "wb");
  QT_ASSERT(f && fwrite(o.b, 1, o.n, f) == o.n && fclose(f) == 0, "writing %s", name);
  free(o.b);
}

/* Header byte: class | extension << 2 | kind << 4 (fuzz_folder.c). */
#define H(cls, ext, kind) ((cls) | (ext) << 2 | (kind) << 4)

static void folder_seeds(void) {
  static const unsigned char gif[] = {0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x02, 0x00, 0x02, 0x00, 0x80,
                                      0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0x21, 0xf9, 0x04,
                                      0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00, 0x02,
                                      0x00, 0x02, 0x00, 0x00, 0x02, 0x02, 0x84, 0x51, 0x00, 0x3b};
  static const char pgm[] = "P5\n3 2\n255\n\x10\x20\x30\x40\x50\x60";
  {
    bytes f[2] = {image(IMG_PNG, 4, 4, 1, 1), image(IMG_PNG, 4, 4, 1, 2)};
    folder_seed("gray_png_two_classes", 1, 2, (int[]){H(0, 0, 0), H(1, 0, 0)}, f);
  }
  {
    bytes f[3] = {image(IMG_PNG, 3, 2, 3, 3), image(IMG_JPG, 3, 2, 3, 4), image(IMG_JPG, 3, 2, 1, 5)};
    folder_seed("rgb_png_jpg_jpeg", 3, 3, (int[]){H(0, 0, 0), H(0, 1, 0), H(1, 2, 0)}, f);
  }
  {
    bytes f[2] = {image(IMG_PNG, 2, 2, 4, 6), image(IMG_PNG, 2, 2, 2, 7)};
    folder_seed("rgba_upper_case_ext", 4, 2, (int[]){H(2, 3, 0), H(3, 0, 0)}, f);
  }
  {
    bytes f[2] = {image(IMG_PNG, 4, 4, 1, 8), image(IMG_PNG, 3, 3, 1, 9)};
    folder_seed("size_mismatch", 1, 2, (int[]){H(0, 0, 0), H(1, 0, 0)}, f);
  }
  {
    bytes f[4] = {image(IMG_PNG, 2, 2, 3, 10), literal("hidden", 6), literal("notes", 5), literal("", 0)};
    folder_seed("ignored_entries", 3, 4, (int[]){H(0, 0, 0), H(0, 0, 1), H(0, 0, 2), H(0, 0, 3)}, f);
  }
  {
    bytes f[4] = {image(IMG_BMP, 2, 2, 3, 11), image(IMG_TGA, 2, 2, 3, 12), image(IMG_HDR, 2, 2, 3, 13),
                  image(IMG_BMP, 2, 2, 4, 14)};
    folder_seed("other_formats_named_png", 3, 4, (int[]){H(0, 0, 0), H(1, 1, 0), H(2, 0, 0), H(3, 2, 0)}, f);
  }
  {
    bytes f[2] = {literal(gif, sizeof gif), literal(pgm, sizeof pgm - 1)};
    folder_seed("gif_pgm", 1, 2, (int[]){H(0, 0, 0), H(1, 1, 0)}, f);
  }
  {
    bytes f[4] = {png_by_hand(5, 5, 16, 0, 0), png_by_hand(5, 5, 2, 3, 0), png_by_hand(5, 5, 8, 4, 1),
                  png_by_hand(5, 5, 8, 2, 1)};
    folder_seed("png_depths_palette_interlace", 2, 4, (int[]){H(0, 0, 0), H(1, 0, 0), H(2, 3, 0), H(3, 0, 0)}, f);
  }
  {
    bytes f[3] = {png_by_hand(4, 3, 1, 0, 0), png_by_hand(4, 3, 16, 6, 0), png_by_hand(4, 3, 8, 3, 1)};
    folder_seed("png_1bit_rgba16_palette_adam7", 4, 3, (int[]){H(0, 0, 0), H(0, 0, 0), H(1, 0, 0)}, f);
  }
  {
    bytes f[1] = {image(IMG_PNG, 1, 1, 1, 15)};
    folder_seed("one_pixel", 1, 1, (int[]){H(0, 0, 0)}, f);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT_DIR\n  writes the generated seeds into OUT_DIR/{qdq,checkpoint,folder}/\n", argv[0]);
    return 2;
  }
  snprintf(out_dir, sizeof out_dir, "%s", argv[1]);
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "make_seeds: cannot create %s: %s\n", out_dir, strerror(errno));
    return 1;
  }
  qt_fuzz_h5_init();
  model_seeds();
  folder_seeds();
  return 0;
}
