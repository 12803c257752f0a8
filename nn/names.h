/* The graph's node-name index (names.c), private to nn/: a hash from node name to node index, so
 * that building a graph of n nodes (each name checked to be new) costs O(n), not O(n^2). */
#ifndef QT_NN_NAMES_H
#define QT_NN_NAMES_H

#include "nn/nn.h"

/* The index of the node named name, or -1. */
int qt_node_names_find(qt_graph *g, const char *name);
/* Records node (already in g->nodes) under its name. */
void qt_node_names_add(qt_graph *g, int node);
void qt_node_names_free(qt_graph *g);

#endif
