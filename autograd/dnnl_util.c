/* Shared oneDNN engine, stream and checked helpers (see dnnl_util.h). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "autograd/dnnl_util.h"
#include "base/base.h"

#include <oneapi/dnnl/dnnl_debug.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

void qt_dnnl_check_status(dnnl_status_t st, const char *expr, const char *file, int line) {
  if (st == dnnl_success) return;
  qt_panic(file, line, "oneDNN call failed with %s: %s", dnnl_status2str(st), expr);
}

void qt_dnnl_die(const char *file, int line, const char *msg) { qt_panic(file, line, "%s", msg); }

static void release_engine(void) {
  if (g_stream) dnnl_stream_destroy(g_stream);
  if (g_engine) dnnl_engine_destroy(g_engine);
  g_stream = NULL;
  g_engine = NULL;
}

dnnl_engine_t qt_dnnl_engine(void) {
  if (!g_engine) {
    QT_DNNL_CHECK(dnnl_engine_create(&g_engine, dnnl_cpu, 0));
    QT_DNNL_CHECK(dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags));
    atexit(release_engine);
  }
  return g_engine;
}

dnnl_stream_t qt_dnnl_stream(void) {
  qt_dnnl_engine();
  return g_stream;
}

/* The implementations oneDNN picked, one entry per distinct (primitive kind, propagation,
 * implementation), in creation order. Primitives are created by the thread that runs the ops
 * (never inside a parallel region), so the table needs no lock. */
#define QT_DNNL_KERNELS_MAX 32
static struct { char what[64], impl[64]; } g_kernels[QT_DNNL_KERNELS_MAX];
static int g_nkernels;
static char g_kernels_text[QT_DNNL_KERNELS_MAX * 130];

static void record_kernel(const_dnnl_primitive_desc_t pd) {
  dnnl_primitive_kind_t kind;
  dnnl_prop_kind_t prop = dnnl_prop_kind_undef;
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_primitive_kind, 0, &kind) != dnnl_success || kind == dnnl_reorder)
    return;
  if (dnnl_primitive_desc_query(pd, dnnl_query_prop_kind, 0, &prop) != dnnl_success) prop = dnnl_prop_kind_undef;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) impl = "?";
  char what[64];
  if (prop == dnnl_prop_kind_undef)
    snprintf(what, sizeof what, "%s", dnnl_prim_kind2str(kind));
  else
    snprintf(what, sizeof what, "%s %s", dnnl_prim_kind2str(kind), dnnl_prop_kind2str(prop));
  for (int i = 0; i < g_nkernels; i++)
    if (!strcmp(g_kernels[i].what, what) && !strcmp(g_kernels[i].impl, impl)) return;
  if (g_nkernels == QT_DNNL_KERNELS_MAX) return;
  snprintf(g_kernels[g_nkernels].what, sizeof g_kernels[0].what, "%s", what);
  snprintf(g_kernels[g_nkernels].impl, sizeof g_kernels[0].impl, "%s", impl);
  g_nkernels++;
}

const char *qt_dnnl_kernels_used(void) {
  size_t at = 0;
  g_kernels_text[0] = 0;
  for (int i = 0; i < g_nkernels && at < sizeof g_kernels_text; i++)
    at += (size_t)snprintf(g_kernels_text + at, sizeof g_kernels_text - at, "%s%s: %s", i ? ", " : "",
                           g_kernels[i].what, g_kernels[i].impl);
  return g_kernels_text;
}

dnnl_primitive_t qt_dnnl_primitive_create(const_dnnl_primitive_desc_t pd) {
  dnnl_primitive_t prim = NULL;
  QT_DNNL_CHECK(dnnl_primitive_create(&prim, pd));
  record_kernel(pd);
  return prim;
}

dnnl_memory_t qt_dnnl_memory_unbound(const dnnl_memory_desc_t *md) {
  dnnl_memory_t mem = NULL;
  QT_DNNL_CHECK(dnnl_memory_create(&mem, md, qt_dnnl_engine(), DNNL_MEMORY_NONE));
  return mem;
}

dnnl_memory_t qt_dnnl_memory_owned(const dnnl_memory_desc_t *md) {
  dnnl_memory_t mem = NULL;
  QT_DNNL_CHECK(dnnl_memory_create(&mem, md, qt_dnnl_engine(), DNNL_MEMORY_ALLOCATE));
  return mem;
}

void qt_dnnl_memory_bind(dnnl_memory_t mem, const void *data) {
  QT_DNNL_CHECK(dnnl_memory_set_data_handle(mem, (void *)data));
}

dnnl_memory_desc_t qt_dnnl_md(int ndims, const dnnl_dim_t *dims, dnnl_format_tag_t tag) {
  dnnl_memory_desc_t md;
  QT_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&md, ndims, dims, dnnl_f32, tag));
  return md;
}

dnnl_primitive_t qt_dnnl_reorder_create(const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst, int accumulate) {
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  if (accumulate) {
    QT_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    QT_DNNL_CHECK(dnnl_post_ops_create(&ops));
    QT_DNNL_CHECK(dnnl_post_ops_append_sum(ops, 1.0f));
    QT_DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
  }
  dnnl_primitive_desc_t pd = NULL;
  dnnl_engine_t eng = qt_dnnl_engine();
  QT_DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, src, eng, dst, eng, attr));
  dnnl_primitive_t prim = qt_dnnl_primitive_create(pd);
  QT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  if (ops) QT_DNNL_CHECK(dnnl_post_ops_destroy(ops));
  if (attr) QT_DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  return prim;
}

void qt_dnnl_reorder_run(dnnl_primitive_t reorder, dnnl_memory_t src, dnnl_memory_t dst) {
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  qt_dnnl_execute(reorder, 2, args);
}

void qt_dnnl_execute(dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args) {
  dnnl_stream_t stream = qt_dnnl_stream();
  QT_DNNL_CHECK(dnnl_primitive_execute(prim, stream, nargs, args));
  QT_DNNL_CHECK(dnnl_stream_wait(stream));
}

void qt_dnnl_primitive_destroy(dnnl_primitive_t *prim) {
  if (*prim) QT_DNNL_CHECK(dnnl_primitive_destroy(*prim));
  *prim = NULL;
}

void qt_dnnl_memory_destroy(dnnl_memory_t *mem) {
  if (*mem) QT_DNNL_CHECK(dnnl_memory_destroy(*mem));
  *mem = NULL;
}

void qt_dnnl_unmap(void **buf, size_t *len) {
  if (*buf) munmap(*buf, *len);
  *buf = NULL;
  *len = 0;
}

void *qt_dnnl_mapped(void **buf, size_t *len, size_t bytes) {
  if (bytes > *len) {
    qt_dnnl_unmap(buf, len);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) qt_dnnl_die(__FILE__, __LINE__, "out of memory for the conv2d scratch buffers");
    *buf = p;
    *len = bytes;
  }
  return *buf;
}
