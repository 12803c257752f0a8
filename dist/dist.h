/* Processes working on one job (data-parallel training under `mpirun`): the one place that talks
 * to MPI. Every call works without MPI too: a build without it, or a program not started by an
 * MPI launcher, is one process of rank 0 in a world of size 1, and then every collective below
 * returns at once without touching its buffers (so single-process runs compute exactly what they
 * computed before this module existed).
 *
 * Reproducible reductions: the sums below never use MPI's reduction operators (whose order of
 * additions MPI leaves to the implementation, and which may depend on the algorithm it picks for
 * a message size). Each element is summed by exactly one process, over the processes' values in
 * rank order, in double, then rounded once and sent to everyone (reduce-scatter by all-to-all,
 * then all-gather: the traffic of a ring all-reduce, 2(N-1)/N of the buffer per process). The
 * result is therefore identical on every process and from run to run for a given number of
 * processes; it differs from a one-process sum only by float reordering.
 *
 * Failures of the transport are fatal (MPI's default error handler ends the job with its message). */
#ifndef QT_DIST_H
#define QT_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Whether this build has MPI at all. */
int qt_dist_built_with_mpi(void);

/* Joins the job when an MPI launcher started this process (mpirun / mpiexec / srun with PMIx:
 * the launcher's environment variables say so); otherwise does nothing and the world is this
 * process alone. Call once, first thing in main. 0, or -1 with err (an MPI launcher but a build
 * without MPI: N copies would each train alone, which is refused). */
int qt_dist_init(int *argc, char ***argv, char *err);
/* Leaves the job (after the last collective); nothing without MPI. */
void qt_dist_finalize(void);

int qt_dist_rank(void); /* 0 .. size-1 */
int qt_dist_size(void); /* 1 without MPI */

/* buf (n) = the elementwise sum of every process's buf, in the fixed order described above. */
void qt_dist_sum_f32(float *buf, int64_t n);
void qt_dist_sum_f64(double *buf, int64_t n);
/* Sums whose copies from every process total at most QT_DIST_SMALL_SUM_BYTES (SyncBN's per-channel
 * sums, observer statistics) take one all-gather and add the copies in rank order in double on
 * every process: the same bits as the segmented path, in about log2(size) message latencies
 * instead of that path's 2 (size - 1) (docs/scaling.md). qt_dist_small_sums counts them. */
#define QT_DIST_SMALL_SUM_BYTES ((size_t)64 << 10)
int64_t qt_dist_small_sums(void);
/* The same sum in buckets, started without waiting (gradients summed while the backward is still
 * running): qt_dist_sum_begin posts the sum of buf (n), which must stay untouched until
 * qt_dist_sum_wait_all has returned; qt_dist_sum_progress lets the posted sums move (Open MPI
 * moves data only inside MPI calls: call it often while computing); qt_dist_sum_wait_all
 * finishes every posted sum. Each element is summed as qt_dist_sum_f32 sums it (over the
 * processes' values in rank order, in double, rounded once), so a slab summed in buckets, however
 * it is cut, holds the bits qt_dist_sum_f32 of the whole slab gives. Every process must post the
 * same buckets in the same order; other collectives may come in between (the buckets travel on
 * communicators of their own). Without MPI or with one process every call returns at once. */
void qt_dist_sum_begin(float *buf, int64_t n);
void qt_dist_sum_progress(void);
void qt_dist_sum_wait_all(void);

/* recv (size * bytes) = every process's send (bytes), in rank order, on every process. */
void qt_dist_allgather(const void *send, size_t bytes, void *recv);
/* buf (bytes) on every process = root's buf. */
void qt_dist_broadcast(void *buf, size_t bytes, int root);
void qt_dist_barrier(void);

/* The job's processes as a qt_batch_sync (base.h), for a batch split across all of them (the
 * ctx of data-parallel training: SyncBN, synchronized observers). Size 1 without MPI. */
const qt_batch_sync *qt_dist_batch_sync(void);

/* Prints the message to stderr and ends every process of the job with exit_code (MPI_Abort), or,
 * without MPI, this process with exit(exit_code). */
void qt_dist_abort(int exit_code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

/* The watchdog of a training loop under mpirun (dist/watchdog.c). MPI collectives have no timeout:
 * a host lost without its connections closing (a network partition) leaves every other process
 * waiting for ever. qt_dist_watchdog_start(timeout) starts a thread (nothing alone, or with
 * timeout <= 0) that ends this process with status 1 and a message naming it when no
 * qt_dist_watchdog_beat came for the timeout, or for QT_DIST_WATCHDOG_GAPS times the longest gap
 * between beats so far (the slowest step) when that is longer, so that a model whose steps take
 * minutes is not cut short. qt_dist_watchdog_stop ends the thread (before work that not every
 * process does). */
#define QT_DIST_WATCHDOG_GAPS 10
void qt_dist_watchdog_start(double timeout);
void qt_dist_watchdog_beat(void);
void qt_dist_watchdog_stop(void);

/* 64-bit FNV-1a of n bytes, continuing from h (start with QT_DIST_HASH_INIT): checksums that
 * processes compare to find state that drifted apart. */
#define QT_DIST_HASH_INIT 0xcbf29ce484222325ull
uint64_t qt_dist_hash(uint64_t h, const void *data, size_t n);
/* Collective: the lowest process whose h differs from process 0's, or -1 when every process holds
 * the same (always -1 alone). theirs and zeros (either may be NULL) receive that process's h and
 * process 0's. */
int qt_dist_first_differing(uint64_t h, uint64_t *theirs, uint64_t *zeros);

#endif
