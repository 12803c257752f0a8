/* The job's processes over MPI (dist.h), and the one-process stand-ins without it. */
#include "dist/dist.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef QT_HAVE_MPI
#include <mpi.h>
#endif

static int world_rank = 0, world_size = 1, joined = 0;
#ifdef QT_HAVE_MPI
/* The bucketed sums' two stages, each on a communicator of its own: a process posts the
 * scatters in bucket order (its caller's) and the gathers in bucket order too, but the two
 * interleave differently on different processes, and collectives on one communicator must come
 * in the same order everywhere. */
static MPI_Comm comm_scatter = MPI_COMM_NULL, comm_gather = MPI_COMM_NULL;
static int n_pending; /* buckets posted and not finished */
static void buckets_release(void);
#endif

int qt_dist_built_with_mpi(void) {
#ifdef QT_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

/* The size an MPI launcher announced in the environment: Open MPI's mpirun, PMIx launchers
 * (Open MPI 4+, Slurm), MPICH's Hydra (PMI). 0 when no launcher started this process. */
static int launcher_size(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v) > 0 ? atoi(v) : 1;
  }
  return getenv("PMIX_RANK") ? 1 : 0;
}

int qt_dist_init(int *argc, char ***argv, char *err) {
  QT_ASSERT(!joined, "qt_dist_init called twice");
  const int announced = launcher_size();
  if (announced == 0) return 0;
#ifdef QT_HAVE_MPI
  int provided = 0;
  /* The training loop calls MPI from its main thread only (the loader thread never does). */
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return qt_err(err, "MPI_Init failed (started by an MPI launcher for %d processes)", announced);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_scatter);
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_gather);
  joined = 1;
  return 0;
#else
  (void)argc;
  (void)argv;
  if (announced > 1)
    return qt_err(err,
                  "started by an MPI launcher for %d processes, but this build has no MPI (install libopenmpi-dev "
                  "and reconfigure): each process would train alone",
                  announced);
  return 0;
#endif
}

void qt_dist_finalize(void) {
#ifdef QT_HAVE_MPI
  if (joined) {
    QT_ASSERT(n_pending == 0, "dist: leaving the job with %d bucketed sums unfinished (qt_dist_sum_wait_all)",
              n_pending);
    MPI_Comm_free(&comm_scatter);
    MPI_Comm_free(&comm_gather);
    buckets_release();
    MPI_Finalize();
  }
#endif
  joined = 0;
  world_rank = 0;
  world_size = 1;
}

int qt_dist_rank(void) { return world_rank; }
int qt_dist_size(void) { return world_size; }

#ifdef QT_HAVE_MPI
/* Elements per collective call: MPI counts are ints, and smaller rounds bound the scratch. */
#define ROUND_ELEMS ((int64_t)1 << 22)

/* out[i] = the sum of copies[k * n + i] over k = 0..R-1, added in rank order in double and rounded
 * once: the one definition of the job's sum, whichever way the copies were gathered. */
static void add_copies(void *out, const void *copies, int R, int64_t n, int is_double) {
  for (int64_t i = 0; i < n; i++) {
    double s = 0;
    if (is_double)
      for (int k = 0; k < R; k++) s += ((const double *)copies)[(size_t)k * (size_t)n + (size_t)i];
    else
      for (int k = 0; k < R; k++) s += (double)((const float *)copies)[(size_t)k * (size_t)n + (size_t)i];
    if (is_double)
      ((double *)out)[i] = s;
    else
      ((float *)out)[i] = (float)s;
  }
}

/* The fixed-order sum of one round of n elements of size esize (float or double): the segment
 * k of every process's buffer goes to process k, which adds the size copies in rank order in
 * double and rounds once; then every process gathers every segment. */
static void sum_round(void *buf, int64_t n, int is_double) {
  const int R = world_size, me = world_rank;
  const size_t esize = is_double ? sizeof(double) : sizeof(float);
  const MPI_Datatype type = is_double ? MPI_DOUBLE : MPI_FLOAT;
  int *counts = malloc(4 * (size_t)R * sizeof *counts);
  QT_ASSERT(counts, "dist: out of memory");
  int *displs = counts + R, *rcounts = counts + 2 * R, *rdispls = counts + 3 * R;
  for (int k = 0; k < R; k++) {
    const int64_t a = n * k / R, b = n * (k + 1) / R;
    counts[k] = (int)(b - a);
    displs[k] = (int)a;
  }
  const int mine = (int)(n * (me + 1) / R - n * me / R); /* = counts[me] */
  for (int k = 0; k < R; k++) {
    rcounts[k] = mine;
    rdispls[k] = k * mine;
  }
  char *recv = malloc((size_t)R * (size_t)(mine > 0 ? mine : 1) * esize);
  QT_ASSERT(recv, "dist: out of memory for a reduction of %lld elements", (long long)n);
  MPI_Alltoallv(buf, counts, displs, type, recv, rcounts, rdispls, type, MPI_COMM_WORLD);
  add_copies((char *)buf + (size_t)displs[me] * esize, recv, R, mine, is_double);
  MPI_Allgatherv(MPI_IN_PLACE, 0, type, buf, counts, displs, type, MPI_COMM_WORLD);
  free(recv);
  free(counts);
}

static int64_t n_small_sums;

/* A small sum: every process gathers every copy and adds them (add_copies) as sum_round adds a
 * segment's copies: the same bits on every process. */
static void sum_small(void *buf, int64_t n, int is_double) {
  const int R = world_size;
  const size_t esize = is_double ? sizeof(double) : sizeof(float);
  const MPI_Datatype type = is_double ? MPI_DOUBLE : MPI_FLOAT;
  char *all = malloc((size_t)R * (size_t)n * esize);
  QT_ASSERT(all, "dist: out of memory for a reduction of %lld elements", (long long)n);
  MPI_Allgather(buf, (int)n, type, all, (int)n, type, MPI_COMM_WORLD);
  add_copies(buf, all, R, n, is_double);
  free(all);
  n_small_sums++;
}

static void sum_any(void *buf, int64_t n, int is_double) {
  const size_t esize = is_double ? sizeof(double) : sizeof(float);
  if ((size_t)n * esize * (size_t)world_size <= QT_DIST_SMALL_SUM_BYTES) {
    sum_small(buf, n, is_double);
    return;
  }
  for (int64_t at = 0; at < n; at += ROUND_ELEMS)
    sum_round((char *)buf + (size_t)at * esize, n - at < ROUND_ELEMS ? n - at : ROUND_ELEMS, is_double);
}
#endif

/* ---- bucketed sums ---------------------------------------------------------------------------- */
#ifdef QT_HAVE_MPI
/* A bucket is summed in the two stages of sum_round (or, when small, in sum_small's one
 * all-gather and the in-order add) with non-blocking collectives; its stage advances in bucket
 * order (the gathers must be posted in the same order on every process). */
typedef struct {
  float *buf;
  int64_t n;
  int small; /* one all-gather of every copy, then the add (sum_small) */
  int stage; /* 0: scatter (or small all-gather) posted; 1: added, gather posted; 2: done */
  MPI_Request req;
  int *counts; /* 4 * size: counts, displs, rcounts, rdispls (sum_round's) */
  float *recv; /* the copies to add: size * (this process's segment, or n when small) */
} bucket;

static bucket *buckets;
static int cap_buckets;
static int n_added, n_done; /* buckets[0 .. n_added) have passed stage 0, [0 .. n_done) are done */

static void bucket_post(float *buf, int64_t n) {
  const int R = world_size, me = world_rank;
  if (n_pending == cap_buckets) {
    cap_buckets = cap_buckets ? 2 * cap_buckets : 16;
    buckets = realloc(buckets, (size_t)cap_buckets * sizeof *buckets);
    QT_ASSERT(buckets, "dist: out of memory for %d bucketed sums", cap_buckets);
  }
  bucket *b = &buckets[n_pending++];
  memset(b, 0, sizeof *b);
  b->buf = buf;
  b->n = n;
  b->small = (size_t)n * sizeof(float) * (size_t)R <= QT_DIST_SMALL_SUM_BYTES;
  if (b->small) {
    b->recv = malloc((size_t)R * (size_t)n * sizeof(float));
    QT_ASSERT(b->recv, "dist: out of memory for a reduction of %lld elements", (long long)n);
    MPI_Iallgather(buf, (int)n, MPI_FLOAT, b->recv, (int)n, MPI_FLOAT, comm_scatter, &b->req);
    return;
  }
  b->counts = malloc(4 * (size_t)R * sizeof *b->counts);
  QT_ASSERT(b->counts, "dist: out of memory");
  int *counts = b->counts, *displs = counts + R, *rcounts = counts + 2 * R, *rdispls = counts + 3 * R;
  for (int k = 0; k < R; k++) {
    const int64_t a = n * k / R, e = n * (k + 1) / R;
    counts[k] = (int)(e - a);
    displs[k] = (int)a;
  }
  const int mine = counts[me];
  for (int k = 0; k < R; k++) {
    rcounts[k] = mine;
    rdispls[k] = k * mine;
  }
  b->recv = malloc((size_t)R * (size_t)(mine > 0 ? mine : 1) * sizeof(float));
  QT_ASSERT(b->recv, "dist: out of memory for a reduction of %lld elements", (long long)n);
  MPI_Ialltoallv(buf, counts, displs, MPI_FLOAT, b->recv, rcounts, rdispls, MPI_FLOAT, comm_scatter, &b->req);
}

/* Stage 0 of bucket b is complete: add the copies (as sum_small or sum_round do) and, for a
 * segmented bucket, post the gather. */
static void bucket_add(bucket *b) {
  const int R = world_size, me = world_rank;
  if (b->small) {
    add_copies(b->buf, b->recv, R, b->n, 0);
    b->stage = 2;
  } else {
    const int *counts = b->counts, *displs = counts + R;
    add_copies(b->buf + displs[me], b->recv, R, counts[me], 0);
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, b->buf, counts, displs, MPI_FLOAT, comm_gather, &b->req);
    b->stage = 1;
  }
  free(b->recv);
  b->recv = NULL;
}

static void buckets_release(void) {
  free(buckets);
  buckets = NULL;
  cap_buckets = 0;
}

/* Whether b's pending collective has completed (wait: after waiting for it). */
static int bucket_test(bucket *b, int wait) {
  int done = 1;
  if (wait)
    MPI_Wait(&b->req, MPI_STATUS_IGNORE);
  else
    MPI_Test(&b->req, &done, MPI_STATUS_IGNORE);
  return done;
}

/* Moves the posted buckets on, in bucket order: each whose stage 0 has completed is added and its
 * gather posted, up to the first still under way; then the gathers are finished up to the first
 * still under way (every MPI_Test also lets Open MPI move the other transfers). wait: waits for
 * each instead, so that all are done on return. */
static void buckets_advance(int wait) {
  while (n_added < n_pending && bucket_test(&buckets[n_added], wait)) bucket_add(&buckets[n_added++]);
  while (n_done < n_added && (buckets[n_done].stage == 2 || bucket_test(&buckets[n_done], wait)))
    buckets[n_done++].stage = 2;
}
#endif

void qt_dist_sum_begin(float *buf, int64_t n) {
#ifdef QT_HAVE_MPI
  if (world_size == 1) return;
  for (int64_t at = 0; at < n; at += ROUND_ELEMS) bucket_post(buf + at, n - at < ROUND_ELEMS ? n - at : ROUND_ELEMS);
#else
  (void)buf;
  (void)n;
#endif
}

void qt_dist_sum_progress(void) {
#ifdef QT_HAVE_MPI
  if (n_pending > 0) buckets_advance(0);
#endif
}

void qt_dist_sum_wait_all(void) {
#ifdef QT_HAVE_MPI
  if (n_pending == 0) return;
  buckets_advance(1);
  QT_ASSERT(n_done == n_pending, "dist: %d of %d bucketed sums unfinished after waiting", n_pending - n_done,
            n_pending);
  for (int i = 0; i < n_pending; i++) free(buckets[i].counts);
  n_pending = n_added = n_done = 0;
#endif
}

int64_t qt_dist_small_sums(void) {
#ifdef QT_HAVE_MPI
  return n_small_sums;
#else
  return 0;
#endif
}

/* Sums buf (n floats, or doubles) over the ranks, in place; nothing on one rank. */
static void sum_in_place(void *buf, int64_t n, int is_double) {
#ifdef QT_HAVE_MPI
  if (world_size > 1 && n > 0) sum_any(buf, n, is_double);
#else
  (void)buf;
  (void)n;
  (void)is_double;
#endif
}

void qt_dist_sum_f32(float *buf, int64_t n) { sum_in_place(buf, n, 0); }

void qt_dist_sum_f64(double *buf, int64_t n) { sum_in_place(buf, n, 1); }

void qt_dist_allgather(const void *send, size_t bytes, void *recv) {
  if (world_size == 1) {
    if (recv != send) memmove(recv, send, bytes);
    return;
  }
#ifdef QT_HAVE_MPI
  QT_ASSERT(bytes <= (size_t)1 << 30, "dist: all-gather of %zu bytes per process", bytes);
  MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
#endif
}

void qt_dist_broadcast(void *buf, size_t bytes, int root) {
  QT_ASSERT(root >= 0 && root < world_size, "dist: broadcast from rank %d of %d", root, world_size);
#ifdef QT_HAVE_MPI
  if (world_size == 1) return;
  const size_t round = (size_t)1 << 30;
  for (size_t at = 0; at < bytes; at += round)
    MPI_Bcast((char *)buf + at, (int)(bytes - at < round ? bytes - at : round), MPI_BYTE, root, MPI_COMM_WORLD);
#else
  (void)buf;
  (void)bytes;
#endif
}

void qt_dist_barrier(void) {
#ifdef QT_HAVE_MPI
  if (world_size > 1) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

static void batch_allgather_f64(const double *send, int64_t n, double *recv) {
  qt_dist_allgather(send, (size_t)n * sizeof(double), recv);
}

const qt_batch_sync *qt_dist_batch_sync(void) {
  static qt_batch_sync world;
  world = (qt_batch_sync){
      .size = world_size, .rank = world_rank, .allgather_f64 = batch_allgather_f64, .sum_f64 = qt_dist_sum_f64};
  return &world;
}

void qt_dist_abort(int exit_code, const char *fmt, ...) {
  char msg[QT_ERR_LEN + 256];
  QT_VFORMAT(msg, fmt);
  fprintf(stderr, "%s\n", msg); /* one write: the launcher forwards whole lines */
  fflush(stderr);
#ifdef QT_HAVE_MPI
  if (joined) MPI_Abort(MPI_COMM_WORLD, exit_code);
#endif
  exit(exit_code);
}

uint64_t qt_dist_hash(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

int qt_dist_first_differing(uint64_t h, uint64_t *theirs, uint64_t *zeros) {
  if (world_size == 1) return -1;
  uint64_t *all = malloc((size_t)world_size * sizeof *all);
  QT_ASSERT(all, "out of memory");
  qt_dist_allgather(&h, sizeof h, all);
  int other = -1;
  for (int r = 1; r < world_size && other < 0; r++)
    if (all[r] != all[0]) other = r;
  if (other >= 0 && theirs) *theirs = all[other];
  if (other >= 0 && zeros) *zeros = all[0];
  free(all);
  return other;
}
