/* Partition lists (runtimes.h): the table of partitions the oneDNN and XNNPACK lowerings build
 * and report, and the names of the partition kinds (backend.h). */
#include <stdarg.h>
#include <stdlib.h>

#include "backend/runtimes.h"

const char *qt_partition_kind_name(qt_partition_kind k) {
  static const char *const names[] = {"int8", "fallback", "boundary"};
  _Static_assert(sizeof names / sizeof names[0] == QT_PART_COUNT, "partition kind names out of sync");
  return (unsigned)k < QT_PART_COUNT ? names[k] : "?";
}

void qt_part_add(qt_part_list *l, qt_partition_kind kind, const char *nodes, const char *fmt, ...) {
  l->parts = qt_grow(l->parts, &l->cap, l->n + 1, sizeof *l->parts, "a partition list");
  qt_part *p = &l->parts[l->n++];
  p->kind = kind;
  snprintf(p->nodes, sizeof p->nodes, "%s", nodes);
  QT_VFORMAT(p->detail, fmt);
}

qt_partition_kind qt_part_get(const qt_part_list *l, int i, const char **nodes, const char **detail) {
  QT_ASSERT(i >= 0 && i < l->n, "partition %d of %d", i, l->n);
  if (nodes) *nodes = l->parts[i].nodes;
  if (detail) *detail = l->parts[i].detail;
  return l->parts[i].kind;
}

int qt_part_count(const qt_part_list *l, qt_partition_kind k) {
  int c = 0;
  for (int i = 0; i < l->n; i++) c += l->parts[i].kind == k;
  return c;
}

void qt_part_print(const qt_part_list *l, FILE *f) {
  for (int i = 0; i < l->n; i++)
    fprintf(f, "  %2d %-8s %-60s %s\n", i, qt_partition_kind_name(l->parts[i].kind), l->parts[i].nodes,
            l->parts[i].detail);
}

void qt_part_list_free(qt_part_list *l) {
  free(l->parts);
  l->parts = NULL;
  l->n = l->cap = 0;
}
