/* Shared oneDNN plumbing for the kernels: one CPU engine and one stream for the process,
 * status checking that aborts on broken invariants, and small helpers to build and run
 * primitives. Kernels cache their primitives per shape; this module only owns the engine.
 * Not thread-safe: kernels are called from one thread at a time (oneDNN itself uses OpenMP
 * inside each call). Private to the autograd library. */
#ifndef QT_DNNL_UTIL_H
#define QT_DNNL_UTIL_H

#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>

/* Aborts with file:line, the failing expression and oneDNN's status name unless st is
 * dnnl_success. Every oneDNN call in the library goes through QT_DNNL_CHECK. */
void qt_dnnl_check_status(dnnl_status_t st, const char *expr, const char *file, int line);
#define QT_DNNL_CHECK(expr) qt_dnnl_check_status((expr), #expr, __FILE__, __LINE__)

/* Aborts with file:line and a message: for invariant violations that are not dnnl statuses. */
void qt_dnnl_die(const char *file, int line, const char *msg);

/* The process-wide CPU engine and its in-order stream, created on first use; an exit handler
 * destroys them. A module that caches primitives should call qt_dnnl_engine() before
 * registering its own exit handler, so its primitives are released first (handlers run in
 * reverse order). */
dnnl_engine_t qt_dnnl_engine(void);
dnnl_stream_t qt_dnnl_stream(void);

/* Creates the primitive for pd (aborting on failure); the primitive keeps its own copy of
 * the descriptor, so the caller may destroy pd afterwards. */
dnnl_primitive_t qt_dnnl_primitive_create(const_dnnl_primitive_desc_t pd);
/* The implementations oneDNN chose for the primitives created so far (reorders left out), e.g.
 * "convolution forward_training: brgconv:avx512_core, ...": what ran, for benchmark reports
 * (ONEDNN_MAX_CPU_ISA changes them). "" before the first. */
const char *qt_dnnl_kernels_used(void);

/* Memory object without a buffer (handle set per call) or with a library-owned buffer. */
dnnl_memory_t qt_dnnl_memory_unbound(const dnnl_memory_desc_t *md);
dnnl_memory_t qt_dnnl_memory_owned(const dnnl_memory_desc_t *md);
/* Points mem at a caller buffer; const inputs are passed cast, oneDNN only reads them. */
void qt_dnnl_memory_bind(dnnl_memory_t mem, const void *data);

/* Plain fp32 memory descriptor with the given dims and format tag. */
dnnl_memory_desc_t qt_dnnl_md(int ndims, const dnnl_dim_t *dims, dnnl_format_tag_t tag);

/* Reorder primitive from src to dst layout; accumulate != 0 adds into dst (sum post-op). */
dnnl_primitive_t qt_dnnl_reorder_create(const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst, int accumulate);
void qt_dnnl_reorder_run(dnnl_primitive_t reorder, dnnl_memory_t src, dnnl_memory_t dst);

/* Executes prim on the stream with nargs (arg, memory) pairs and waits for completion. */
void qt_dnnl_execute(dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args);

/* Scratch buffers shared between calls, mapped and unmapped directly, not malloc'd: glibc raises
 * its mmap threshold to the size of any mapped chunk free() returns, after which the process's
 * later large allocations come from the heap and stay resident when freed (the QAT W4A4 example's
 * peak RSS measured 147.4 MB with conv2d's buffers malloc'd, 141.3 before they existed, and 134.8
 * with MALLOC_MMAP_THRESHOLD_ fixed). qt_dnnl_mapped grows *buf (*len bytes) to at least bytes,
 * contents not kept, aborting when out of memory, and returns it; qt_dnnl_unmap unmaps it (NULL,
 * length 0). */
void *qt_dnnl_mapped(void **buf, size_t *len, size_t bytes);
void qt_dnnl_unmap(void **buf, size_t *len);

/* Destroys a primitive or memory object if non-NULL and clears the pointer. */
void qt_dnnl_primitive_destroy(dnnl_primitive_t *prim);
void qt_dnnl_memory_destroy(dnnl_memory_t *mem);

#endif
