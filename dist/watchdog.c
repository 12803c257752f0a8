/* The job's watchdog (dist.h): a thread that ends this process when the training loop has not
 * moved for too long. MPI collectives have no timeout: when a host drops off the network without
 * its connections being closed (a cable, a switch, a frozen machine), the other processes wait
 * in their next collective for ever, and so does mpirun. The thread sees the loop's heartbeats
 * (qt_dist_watchdog_beat, an atomic store) and, after the limit without one, prints which process
 * and where, and exits with status 1; mpirun then ends the job (or, cut off from that process's
 * host as well, every process's own watchdog does). */
#include "dist/dist.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_t thread;
static int running;
static atomic_int stop;
static _Atomic double last_beat, slowest; /* seconds (CLOCK_MONOTONIC); the longest gap between beats */
static double floor_s;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double watchdog_limit(double timeout, double slowest_gap) {
  const double scaled = QT_DIST_WATCHDOG_GAPS * slowest_gap;
  return scaled > timeout ? scaled : timeout;
}

static void *watch(void *arg) {
  (void)arg;
  const struct timespec tick = {0, 200 * 1000 * 1000};
  while (!atomic_load(&stop)) {
    nanosleep(&tick, NULL);
    const double idle = now_s() - atomic_load(&last_beat), limit = watchdog_limit(floor_s, atomic_load(&slowest));
    if (!atomic_load(&stop) && idle > limit) {
      fprintf(stderr,
              "process %d of %d: no progress in data-parallel training for %.0f s (limit %.0f s: dist.timeout, or %d "
              "times the slowest step so far): another process or its host is lost, or a collective hangs; ending "
              "this process\n",
              qt_dist_rank(), qt_dist_size(), idle, limit, QT_DIST_WATCHDOG_GAPS);
      fflush(stderr);
      _exit(1);
    }
  }
  return NULL;
}

void qt_dist_watchdog_start(double timeout) {
  if (running || timeout <= 0 || qt_dist_size() < 2) return;
  floor_s = timeout;
  atomic_store(&stop, 0);
  atomic_store(&slowest, 0.0);
  atomic_store(&last_beat, now_s());
  running = pthread_create(&thread, NULL, watch, NULL) == 0;
  if (!running) fprintf(stderr, "warning: the dist.timeout watchdog could not start; a lost host will hang the job\n");
}

void qt_dist_watchdog_beat(void) {
  if (!running) return;
  const double t = now_s(), gap = t - atomic_load(&last_beat);
  if (gap > atomic_load(&slowest)) atomic_store(&slowest, gap);
  atomic_store(&last_beat, t);
}

void qt_dist_watchdog_stop(void) {
  if (!running) return;
  atomic_store(&stop, 1);
  pthread_join(thread, NULL);
  running = 0;
}
