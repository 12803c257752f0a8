#!/bin/bash
# Builds the libFuzzer targets of fuzz/ with clang (build-fuzz/, -DQT_FUZZ=ON: ASan + UBSan +
# coverage) and runs each for a bounded time, one after the other; fails (exit 1) on any crash,
# sanitizer report, leak, timeout or out-of-memory, after copying the input that caused it into
# fuzz/regressions/<target>/ (commit it: the normal build replays that folder as a CTest test).
# Prints per target: executions, executions per second, coverage (libFuzzer's cov: covered edges,
# ft: features), corpus size and peak RSS. Installs clang, libclang-rt-14-dev (libFuzzer) and
# libomp-14-dev when missing; the build's own packages come from scripts/setup.sh.
#
# Usage (as root on Debian 12): bash scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# Environment: QT_FUZZ_TARGETS="qdq checkpoint" runs a subset (default: all six);
#   QT_FUZZ_RUNS=N stops a target after N executions (SECONDS stays the cap);
#   QT_FUZZ_TIMEOUT (s per input, default 20), QT_FUZZ_RSS_MB (default 2048),
#   QT_FUZZ_JOBS (build parallelism, default 2).
# Each target's new inputs accumulate in build-fuzz/corpus/<target>/ (seeded from fuzz/corpus/
# and fuzz/regressions/); its log is build-fuzz/logs/<target>.log. After a clean run the whole
# corpus is replayed once more with precise leak checks (see below; build-fuzz/logs/<t>.replay.log).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: bash scripts/fuzz.sh [SECONDS_PER_TARGET]   (a positive integer, default 60)" >&2
  exit 2
fi
targets=${QT_FUZZ_TARGETS:-config idx hdf5 folder qdq checkpoint}
timeout=${QT_FUZZ_TIMEOUT:-20}
rss_mb=${QT_FUZZ_RSS_MB:-2048}
runs=${QT_FUZZ_RUNS:--1}

PACKAGES=(clang libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "fuzz: building build-fuzz/ (clang, -DQT_FUZZ=ON)"
CC=clang cmake -S . -B build-fuzz -DQT_FUZZ=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-fuzz -j"${QT_FUZZ_JOBS:-2}" >build-fuzz/build.log 2>&1 || { tail -40 build-fuzz/build.log; exit 1; }

# Leaks are findings. During the campaign HDF5's allocations are not judged (its frames need the
# slow unwinder: fuzz/lsan_campaign.supp); afterwards the whole corpus is replayed with the slow
# unwinder and only HDF5's known leak suppressed (fuzz/lsan.supp). An 8 MB quarantine instead of
# 256 MB: HDF5 frees and re-allocates its 1 MB metadata cache on every file open, and a large
# quarantine turns that into fresh mappings and page faults (twice the time per execution).
# A huge malloc returns NULL, as glibc's does, instead of being a finding: HDF5 asks for sizes it
# read from corrupt metadata (25 GB, 2^54 bytes) and handles the failure; the RSS limit catches
# memory actually used, and our own code aborts naming a failed allocation.
campaign_asan=quarantine_size_mb=8:detect_leaks=1:allocator_may_return_null=1
replay_asan=$campaign_asan:fast_unwind_on_malloc=0
no_malloc_limit=-malloc_limit_mb=2147483647
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE

# Replays files one process per batch of 100 with precise leak checking; prints the files that
# fail alone (a leak, a crash) and returns 1 when there are any.
replay_leaks() {
  local bin=$1 log=$2 bad=0
  shift 2
  local files=("$@") i
  for ((i = 0; i < ${#files[@]}; i += 100)); do
    local batch=("${files[@]:i:100}")
    ASAN_OPTIONS=$replay_asan LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp \
      "$bin" -timeout="$timeout" -rss_limit_mb="$rss_mb" $no_malloc_limit "${batch[@]}" >>"$log" 2>&1 && continue
    local f
    for f in "${batch[@]}"; do
      ASAN_OPTIONS=$replay_asan LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp \
        "$bin" -timeout="$timeout" -rss_limit_mb="$rss_mb" $no_malloc_limit "$f" >>"$log" 2>&1 || { echo "$f"; bad=1; }
    done
  done
  return $bad
}

status=0
rows=()
for t in $targets; do
  bin=build-fuzz/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target '$t' (have: config idx hdf5 folder qdq checkpoint)" >&2; exit 2; }
  work=build-fuzz/corpus/$t artifacts=build-fuzz/artifacts/$t/ log=build-fuzz/logs/$t.log
  mkdir -p "$work" "$artifacts" build-fuzz/logs fuzz/regressions/$t
  rm -f "$artifacts"* 2>/dev/null || true
  echo "fuzz: $t for ${seconds} s"
  rc=0
  ASAN_OPTIONS=$campaign_asan LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan_campaign.supp \
    "$bin" -max_total_time="$seconds" -runs="$runs" -timeout="$timeout" -rss_limit_mb="$rss_mb" \
    $no_malloc_limit -dict=fuzz/dict/$t.dict -artifact_prefix="$artifacts" -print_final_stats=1 \
    "$work" fuzz/corpus/$t fuzz/regressions/$t >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  result=ok
  found=$(ls "$artifacts" 2>/dev/null || true)
  if [ "$rc" -eq 0 ] && [ -z "$found" ]; then
    mapfile -t files < <(find "$work" fuzz/regressions/$t -type f ! -name '.*' | sort)
    echo "fuzz: $t: replaying its ${#files[@]} corpus inputs with precise leak checks"
    mapfile -t leaking < <(replay_leaks "$bin" build-fuzz/logs/$t.replay.log "${files[@]}" || true)
    for f in "${leaking[@]}"; do
      [ -n "$f" ] || continue
      cp "$f" "$artifacts"replay-"$(basename "$f")"
      rc=1
    done
    found=$(ls "$artifacts" 2>/dev/null || true)
    [ "$rc" -eq 0 ] || log=build-fuzz/logs/$t.replay.log
  fi
  if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    status=1
    result="FAILED (exit $rc)"
    for f in $found; do
      cp "$artifacts$f" "fuzz/regressions/$t/$f"
      result="$result, kept fuzz/regressions/$t/$f"
    done
    echo "fuzz: $t failed; the end of $log:" >&2
    grep -E "ERROR|SUMMARY|panic|abort|==[0-9]+==|runtime error|Test unit written|#[0-9]+ " "$log" | tail -25 >&2 || tail -25 "$log" >&2
  fi
  rows+=("$(printf '%-11s %12s %9s %7s %8s %11s %8s  %s' "$t" "${execs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" \
            "${corp:-?}" "${rss:-?}" "$result")")
done

echo
printf '%-11s %12s %9s %7s %8s %11s %8s  %s\n' target executions exec/s "cov" ft corpus rss_mb result
printf '%s\n' "${rows[@]}"
echo "(cov: edges covered, ft: coverage features, as libFuzzer counts them at the end of the run)"
exit $status
