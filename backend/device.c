/* The device (backend.h, qt_device): one handle over the three runtimes, the oneDNN int8 lowering
 * (lower.c), the XNNPACK lowering (xnnpack.c) and the accelerator simulator (accel.c), each
 * behind a small table of operations. Reading an intermediate value deploys the same graph a
 * second time with that value as its output (every runtime deploys every node as before and
 * also returns that value). */
#include <stdlib.h>
#include <string.h>

#include "backend/runtimes.h"

/* What a runtime provides; impl is its own handle (qt_lowered, qt_accel). */
typedef struct {
  void *(*open)(const qt_graph *g, const qt_backend_desc *d, char *err);
  void (*free)(void *impl);
  int (*run)(void *impl, float *out, const float *input, int n, char *err);
  int (*partition_count)(const void *impl);
  qt_partition_kind (*partition)(const void *impl, int i, const char **nodes, const char **detail);
  void (*report)(const void *impl, FILE *f);
  /* 1 / 0 / -1 as qt_device_node_on_backend; NULL: derived from the partitions */
  int (*node_on_backend)(const void *impl, const char *name, const char **reason);
} runtime_ops;

/* A runtime's table: open_call deploys g (it may use g, d and err), the functions, which take
 * the runtime's own handle type, behind void *; node_fn may be NULL. */
#define RUNTIME(pre, open_call, free_fn, run_fn, count_fn, partition_fn, report_fn, node_fn)                \
  static void *pre##_open(const qt_graph *g, const qt_backend_desc *d, char *err) {                         \
    (void)d;                                                                                                \
    return open_call;                                                                                       \
  }                                                                                                         \
  static void pre##_free(void *m) { free_fn(m); }                                                           \
  static int pre##_run(void *m, float *out, const float *input, int n, char *err) {                         \
    return run_fn(m, out, input, n, err);                                                                   \
  }                                                                                                         \
  static int pre##_partition_count(const void *m) { return count_fn(m); }                                   \
  static qt_partition_kind pre##_partition(const void *m, int i, const char **nodes, const char **detail) { \
    return partition_fn(m, i, nodes, detail);                                                               \
  }                                                                                                         \
  static void pre##_report(const void *m, FILE *f) { report_fn(m, f); }                                     \
  static const runtime_ops pre##_ops = {pre##_open,      pre##_free,   pre##_run, pre##_partition_count,    \
                                        pre##_partition, pre##_report, node_fn};

static int accel_node(const void *a, const char *name, const char **reason) {
  return qt_accel_node_on_accel(a, name, reason);
}

RUNTIME(onednn, qt_lower(g, err), qt_lowered_free, qt_lowered_run, qt_lowered_partition_count, qt_lowered_partition,
        qt_lowered_report, NULL)
RUNTIME(accel, qt_accel_partition(g, d, err), qt_accel_free, qt_accel_run, qt_accel_partition_count,
        qt_accel_partition_get, qt_accel_report, accel_node)
RUNTIME(xnnpack, qt_xnnpack_lower(g, err), qt_xnnpack_free, qt_xnnpack_run, qt_xnnpack_partition_count,
        qt_xnnpack_partition, qt_xnnpack_report, NULL)

/* ---- the device -------------------------------------------------------------------------------- */
struct qt_device {
  const runtime_ops *ops;
  void *impl;
  qt_backend_desc desc;
  const qt_graph *g;
  /* the last intermediate value read: the graph with that value as its output, deployed */
  qt_graph probe_view;
  void *probe;
  int probe_value;
};

qt_device *qt_device_open(const qt_graph *g, const qt_backend_desc *d, char *err) {
  qt_device *dev = calloc(1, sizeof *dev);
  QT_ASSERT(dev, "out of memory");
  if (d)
    dev->desc = *d;
  else
    qt_backend_desc_onednn_cpu(&dev->desc, QT_ISA_AUTO);
  dev->ops = dev->desc.onednn_runtime ? &onednn_ops : dev->desc.xnnpack_runtime ? &xnnpack_ops : &accel_ops;
  dev->g = g;
  dev->probe_value = -1;
  if (!(dev->impl = dev->ops->open(g, &dev->desc, err))) {
    free(dev);
    return NULL;
  }
  return dev;
}

void qt_device_free(qt_device *dev) {
  if (!dev) return;
  if (dev->probe) dev->ops->free(dev->probe);
  dev->ops->free(dev->impl);
  free(dev);
}

const qt_backend_desc *qt_device_desc(const qt_device *dev) { return &dev->desc; }
const qt_graph *qt_device_graph(const qt_device *dev) { return dev->g; }

int qt_device_run(qt_device *dev, float *out, const float *input, int n, char *err) {
  return dev->ops->run(dev->impl, out, input, n, err);
}

int64_t qt_device_output_numel(const qt_device *dev) { return qt_value_numel(&dev->g->values[dev->g->output]); }

void qt_device_input_shape(const qt_device *dev, int *h, int *w, int *c) {
  const qt_value *v = &dev->g->values[dev->g->input];
  *h = (int)v->shape[0];
  *w = (int)v->shape[1];
  *c = (int)v->shape[2];
}

/* The value named name (a value, else a node's output), or -1. A quantize's output (integers)
 * is read through its dequantize: the same integers, dequantized. */
static int find_value(const qt_graph *g, const char *name) {
  int v = -1;
  for (int k = 0; k < g->n_values && v < 0; k++)
    if (strcmp(g->values[k].name, name) == 0) v = k;
  if (v < 0) {
    const int i = qt_graph_find_node(g, name);
    v = i >= 0 ? g->nodes[i].output : -1;
  }
  if (v >= 0 && v != g->input && g->nodes[g->values[v].producer].op == QT_OP_QUANTIZE)
    for (int i = 0; i < g->n_nodes; i++)
      if (g->nodes[i].op == QT_OP_DEQUANTIZE && g->nodes[i].inputs[0] == v) return g->nodes[i].output;
  return v;
}

int64_t qt_device_value_numel(const qt_device *dev, const char *name) {
  const int v = find_value(dev->g, name);
  return v < 0 ? -1 : qt_value_numel(&dev->g->values[v]);
}

int qt_device_read_value(qt_device *dev, const char *name, float *out, const float *input, int n, char *err) {
  const int v = find_value(dev->g, name);
  if (v < 0)
    return qt_err(err, "device %s: graph %s has no value or node named '%s'", dev->desc.name, dev->g->name, name);
  if (v == dev->g->output) return qt_device_run(dev, out, input, n, err);
  if (v == dev->g->input) {
    memcpy(out, input, (size_t)(qt_value_numel(&dev->g->values[v]) * n) * sizeof(float));
    return 0;
  }
  if (v != dev->probe_value) {
    if (dev->probe) dev->ops->free(dev->probe);
    dev->probe = NULL;
    dev->probe_value = -1;
    dev->probe_view = *dev->g;
    dev->probe_view.output = v;
    if (!(dev->probe = dev->ops->open(&dev->probe_view, &dev->desc, err))) return -1;
    dev->probe_value = v;
  }
  return dev->ops->run(dev->probe, out, input, n, err);
}

int qt_device_partition_count(const qt_device *dev) { return dev->ops->partition_count(dev->impl); }

qt_partition_kind qt_device_partition(const qt_device *dev, int i, const char **nodes, const char **detail) {
  return dev->ops->partition(dev->impl, i, nodes, detail);
}

int qt_device_count(const qt_device *dev, qt_partition_kind k) {
  int c = 0;
  for (int i = 0; i < qt_device_partition_count(dev); i++) c += qt_device_partition(dev, i, NULL, NULL) == k;
  return c;
}

/* Whether "a -> b -> c" lists name. */
static int lists_node(const char *nodes, const char *name) {
  const size_t len = strlen(name);
  for (const char *p = nodes; (p = strstr(p, name)) != NULL; p++)
    if ((p == nodes || p[-1] == ' ') && (p[len] == 0 || p[len] == ' ')) return 1;
  return 0;
}

int qt_device_node_on_backend(const qt_device *dev, const char *name, const char **reason) {
  if (dev->ops->node_on_backend) return dev->ops->node_on_backend(dev->impl, name, reason);
  if (qt_graph_find_node(dev->g, name) < 0) return -1;
  if (reason) *reason = "";
  for (int i = 0; i < qt_device_partition_count(dev); i++) {
    const char *nodes, *detail;
    const qt_partition_kind k = qt_device_partition(dev, i, &nodes, &detail);
    if (!lists_node(nodes, name)) continue;
    if (k == QT_PART_FALLBACK && reason) *reason = detail;
    return k != QT_PART_FALLBACK;
  }
  return 1;
}

void qt_device_report(const qt_device *dev, FILE *f) { dev->ops->report(dev->impl, f); }
