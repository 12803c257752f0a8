/* The graph's node-name index (names.h): glibc's reentrant hash table (hsearch_r) over copies of
 * the names, rebuilt twice as large when half full. Nodes are only ever appended to a graph (by
 * the builder's new_node), so the index is the names of nodes 0 .. n_nodes - 1; a hit is still
 * checked against the node table, and a stale index is rebuilt from it. */
#define _GNU_SOURCE /* hsearch_r */
#include "nn/names.h"

#include <search.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct qt_node_names {
  struct hsearch_data h;
  size_t cap;  /* the table's size: at most cap / 2 names */
  char **keys; /* the names, owned */
  int n;       /* names recorded: nodes 0 .. n - 1 */
};

static void drop(struct qt_node_names *x) {
  hdestroy_r(&x->h);
  for (int i = 0; i < x->n; i++) free(x->keys[i]);
  free(x->keys);
  memset(x, 0, sizeof *x);
}

static void enter(struct qt_node_names *x, const char *name, int node) {
  char *key = strdup(name);
  QT_ASSERT(key, "out of memory");
  ENTRY e = {.key = key, .data = (void *)(intptr_t)(node + 1)}, *got = NULL;
  QT_ASSERT(hsearch_r(e, ENTER, &got, &x->h), "node name index full");
  x->keys[x->n++] = key; /* a repeated name (the builder refuses them) keeps its first node */
}

/* The index of nodes 0 .. g->n_nodes - 1 in a table of at least cap entries. */
static void rebuild(qt_graph *g, size_t cap) {
  if (!g->names) {
    g->names = calloc(1, sizeof *g->names);
    QT_ASSERT(g->names, "out of memory");
  }
  struct qt_node_names *x = g->names;
  drop(x);
  while (cap < 2 * (size_t)g->n_nodes + 2) cap *= 2;
  x->cap = cap;
  x->keys = malloc(cap / 2 * sizeof *x->keys);
  QT_ASSERT(x->keys && hcreate_r(cap, &x->h), "out of memory");
  for (int i = 0; i < g->n_nodes; i++) enter(x, g->nodes[i].name, i);
}

int qt_node_names_find(qt_graph *g, const char *name) {
  if (!g->names || g->names->n != g->n_nodes) rebuild(g, 64);
  for (int attempt = 0; attempt < 2; attempt++) {
    ENTRY want = {.key = (char *)name}, *got = NULL;
    if (!hsearch_r(want, FIND, &got, &g->names->h)) return -1;
    const int node = (int)(intptr_t)got->data - 1;
    if (node >= 0 && node < g->n_nodes && strcmp(g->nodes[node].name, name) == 0) return node;
    rebuild(g, g->names->cap); /* stale: the node table changed behind the index */
  }
  for (int i = 0; i < g->n_nodes; i++)
    if (strcmp(g->nodes[i].name, name) == 0) return i;
  return -1;
}

void qt_node_names_add(qt_graph *g, int node) {
  struct qt_node_names *x = g->names;
  if (!x || x->n != node || 2 * (size_t)(x->n + 1) > x->cap) {
    rebuild(g, x ? 2 * x->cap : 64); /* takes node in too */
    return;
  }
  enter(x, g->nodes[node].name, node);
}

void qt_node_names_free(qt_graph *g) {
  if (!g->names) return;
  drop(g->names);
  free(g->names);
  g->names = NULL;
}
