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
# Environment: QT_FUZZ_TARGETS="qdq checkpoint" runs a subset (default: all seven);
#   QT_FUZZ_RUNS=N stops a target after N executions (SECONDS stays the cap);
#   QT_FUZZ_SEED=S fixes libFuzzer's random seed (S, then S+1 for a restart; default: a new one
#   each run), so that a run goes through the same inputs on any machine as far as its time
#   lets it (CI fixes it: a gate should not fail at random on a bug nobody introduced);
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
targets=${QT_FUZZ_TARGETS:-config idx hdf5 folder qdq checkpoint onnx}
timeout=${QT_FUZZ_TIMEOUT:-20}
rss_mb=${QT_FUZZ_RSS_MB:-2048}
runs=${QT_FUZZ_RUNS:--1}
seed=${QT_FUZZ_SEED:-}
if [ -n "$seed" ] && ! [[ "$seed" =~ ^[0-9]+$ ]]; then
  echo "fuzz: QT_FUZZ_SEED must be a non-negative integer, not '$seed'" >&2
  exit 2
fi

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
# Allocations above 256 MB fail at once: readers size buffers from headers before reading (a
# 37-byte IDX header asked for 6.7 GB, a 126-byte PNG's IDAT length made stb_image realloc
# 164 MB), which costs nothing untouched but makes ASan write and clear the shadow of the whole
# block (seconds per input); the failure paths they take instead are real ones too.
campaign_asan=quarantine_size_mb=8:allocator_may_return_null=1:max_allocation_size_mb=256
replay_asan=$campaign_asan:detect_leaks=1:fast_unwind_on_malloc=0
no_malloc_limit=-malloc_limit_mb=2147483647
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE

# The first frame of a sanitizer report's first stack that is not the sanitizer runtime, an
# interceptor or libc: "hdf5" when it is inside libhdf5, else "ours". A crash there on memory
# HDF5 manages is a bug of HDF5 1.10.8 on a corrupt file (heap over-reads, null dereferences,
# frees of uninitialized pointers), which no reader of ours can prevent; it is kept in
# fuzz/hdf5-crashes/<target>/ and reported, and fuzzing goes on. Timeouts, out-of-memory and
# our own aborts (QT_ASSERT) are always ours.
classify() {
  awk '
    /ERROR: libFuzzer: (timeout|out-of-memory)/ { print "ours"; exit }
    /ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:/ { inreport = 1; next }
    inreport && /^ +#[0-9]+ / {
      fn = ($3 == "in") ? $4 : ""
      if (fn ~ /^(__interceptor_|__asan|__sanitizer|__lsan|__ubsan|fuzzer::|__mem|__str|mem(cpy|move|set|cmp)$|str|malloc$|calloc$|realloc$|free$)/ ||
          $0 ~ /libc\.so|sysdeps\//) next
      print ($0 ~ /libhdf5/ ? "hdf5" : "ours"); exit
    }' "$1" | head -1
}

# "kind: frame; frame; frame" of the first three HDF5 frames (function, or library offset), to
# keep one input per HDF5 bug.
hdf5_signature() {
  awk '
    /ERROR: AddressSanitizer: / && !kind { kind = $3 }
    /^ +#[0-9]+ / && /libhdf5/ && n < 3 {
      f = ($3 == "in") ? $4 : $3
      if (f ~ /\+0x/) { sub(/.*\+/, "+", f); sub(/\)$/, "", f) }
      sig = sig (n ? "; " : "") f
      n++
    }
    END { print kind ": " sig }' "$1"
}

# Replays files one process per batch of 100 with precise leak checks (the slow unwinder, only
# HDF5's own leaks suppressed). A batch that fails is replayed file by file; prints each failing
# file as "ours FILE" or, when HDF5 crashed inside itself (a fresh process can catch a bug of
# HDF5's the long campaign process did not), "hdf5 FILE LOG".
replay_corpus() {
  local bin=$1 log=$2 i f one
  shift 2
  local files=("$@")
  for ((i = 0; i < ${#files[@]}; i += 100)); do
    local batch=("${files[@]:i:100}")
    ASAN_OPTIONS=$replay_asan LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp \
      "$bin" -timeout="$timeout" -rss_limit_mb="$rss_mb" $no_malloc_limit "${batch[@]}" >>"$log" 2>&1 && continue
    for f in "${batch[@]}"; do
      one=$log.$(basename "$f")
      ASAN_OPTIONS=$replay_asan LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp \
        "$bin" -timeout="$timeout" -rss_limit_mb="$rss_mb" $no_malloc_limit "$f" >"$one" 2>&1 && { rm -f "$one"; continue; }
      if [ "$(classify "$one")" = hdf5 ]; then echo "hdf5 $f $one"; else echo "ours $f"; cat "$one" >>"$log"; fi
    done
  done
}

# Keeps input $2 of target $1 in fuzz/hdf5-crashes/ when its crash ($3, a log) has a new
# signature; prints what it did.
keep_hdf5_crash() {
  local t=$1 input=$2 log=$3 sig
  sig=$(hdf5_signature "$log")
  mkdir -p fuzz/hdf5-crashes/$t
  grep -qxF "$sig" fuzz/hdf5-crashes/$t/SIGNATURES 2>/dev/null && return 0
  cp "$input" fuzz/hdf5-crashes/$t/
  echo "$sig" >>fuzz/hdf5-crashes/$t/SIGNATURES
  echo "fuzz: $t: HDF5 crashed inside itself ($sig), kept fuzz/hdf5-crashes/$t/$(basename "$input")"
  hdf5_rows+=("$t: $sig  (fuzz/hdf5-crashes/$t/$(basename "$input"))")
}

status=0
rows=()
hdf5_rows=()
for t in $targets; do
  bin=build-fuzz/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target '$t' (have: config idx hdf5 folder qdq checkpoint onnx)" >&2; exit 2; }
  work=build-fuzz/corpus/$t artifacts=build-fuzz/artifacts/$t/
  mkdir -p "$work" "$artifacts" build-fuzz/logs fuzz/regressions/$t
  rm -f "$artifacts"* build-fuzz/logs/$t.* 2>/dev/null || true
  echo "fuzz: $t for ${seconds} s"
  rc=0 execs=0 left=$seconds round=0 hdf5_new=0 last="" rss=""
  # libFuzzer checks an input for leaks when it mallocs more than it frees; with HDF5's free
  # lists that is nearly every input of the HDF5 targets, and the scans made them 3.5 times
  # slower. Those targets are leak-checked by the corpus replay after the campaign instead.
  case $t in hdf5 | qdq | checkpoint) leaks=0 ;; *) leaks=1 ;; esac
  started=$(date +%s)
  # One libFuzzer run; when it stops on a crash inside HDF5, the next one takes the time left.
  while [ "$left" -gt 0 ]; do
    round=$((round + 1))
    log=build-fuzz/logs/$t.$round.log
    rc=0
    ASAN_OPTIONS=$campaign_asan:detect_leaks=$leaks LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan_campaign.supp \
      "$bin" -max_total_time="$left" -runs="$runs" -timeout="$timeout" -rss_limit_mb="$rss_mb" \
      ${seed:+-seed=$((seed + round - 1))} $no_malloc_limit -dict=fuzz/dict/$t.dict -artifact_prefix="$artifacts" -print_final_stats=1 \
      "$work" fuzz/corpus/$t fuzz/regressions/$t >"$log" 2>&1 || rc=$?
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$n" ] || n=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    execs=$((execs + ${n:-0}))
    r=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    [ -z "$r" ] || [ "${rss:-0}" -ge "$r" ] || rss=$r
    l=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
    [ -z "$l" ] || last=$l
    left=$((seconds - ($(date +%s) - started)))
    crash=$(ls "$artifacts" 2>/dev/null | grep -E '^(crash|leak)-' | head -1 || true)
    [ "$rc" -ne 0 ] && [ -n "$crash" ] && [ "$(classify "$log")" = hdf5 ] || break
    n_rows=${#hdf5_rows[@]}
    keep_hdf5_crash "$t" "$artifacts$crash" "$log"
    [ ${#hdf5_rows[@]} -eq "$n_rows" ] || hdf5_new=$((hdf5_new + 1))
    # An input of the corpus can crash HDF5 when it is loaded again (whether freed memory is
    # caught depends on the allocator's state): it leaves the corpus, or the next run would stop
    # on it at once. libFuzzer names corpus files by their SHA-1.
    sha=$(sha1sum <"$artifacts$crash" | cut -d' ' -f1)
    rm -f "$artifacts$crash" "$work/$sha"
    rc=0
    [ "$runs" -lt 0 ] || [ "$execs" -lt "$runs" ] || break
  done
  elapsed=$(($(date +%s) - started))
  speed=$((execs / (elapsed > 0 ? elapsed : 1)))
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  result=ok
  [ "$round" -eq 1 ] || result="ok ($((round - 1)) restarts after HDF5 crashes, $hdf5_new new)"
  # slow-unit-* files are libFuzzer's notes on slow inputs, not findings.
  found=$(ls "$artifacts" 2>/dev/null | grep -v '^slow-unit-' || true)
  if [ "$rc" -eq 0 ] && [ -z "$found" ]; then
    mapfile -t files < <(find "$work" fuzz/regressions/$t -type f ! -name '.*' | sort)
    echo "fuzz: $t: replaying its ${#files[@]} corpus inputs with precise leak checks"
    mapfile -t failing < <(replay_corpus "$bin" build-fuzz/logs/$t.replay.log "${files[@]}")
    for line in "${failing[@]}"; do
      read -r who f one <<<"$line"
      if [ "$who" = hdf5 ]; then
        keep_hdf5_crash "$t" "$f" "$one"
      elif [ -n "$f" ]; then
        cp "$f" "$artifacts"replay-"$(basename "$f")"
        rc=1
      fi
    done
    found=$(ls "$artifacts" 2>/dev/null | grep -v '^slow-unit-' || true)
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
  rows+=("$(printf '%-11s %12s %9s %7s %8s %11s %8s  %s' "$t" "$execs" "$speed" "${cov:-?}" "${ft:-?}" \
            "${corp:-?}" "${rss:-?}" "$result")")
done

echo
printf '%-11s %12s %9s %7s %8s %11s %8s  %s\n' target executions exec/s "cov" ft corpus rss_mb result
printf '%s\n' "${rows[@]}"
echo "(cov: edges covered, ft: coverage features, as libFuzzer counts them at the end of the run;"
echo " exec/s: executions over the target's fuzzing time, restarts included, the leak replay not)"
if [ ${#hdf5_rows[@]} -gt 0 ]; then
  echo "New crashes inside HDF5 1.10.8 on corrupt files (not failures of this run; see fuzz/hdf5-crashes/):"
  printf '  %s\n' "${hdf5_rows[@]}"
fi
exit $status
