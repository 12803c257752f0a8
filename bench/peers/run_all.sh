#!/usr/bin/env bash
# Runs every peer benchmark and writes the report (bench/peers/README.md).
#
#   bash bench/peers/run_all.sh                 # the full set -> experiments/results/peers.{json,md}
#   bash bench/peers/run_all.sh --smoke         # tiny budgets, to prove it runs -> WORK/peers_smoke.{json,md}
#   bash bench/peers/run_all.sh --models fashion_cnn --seeds 0   # a slice of the full set
#
# Each run keeps its result files in WORK/results/<models>_seeds<seeds>/ (a rerun of the same
# slice replaces them); the report merges every slice there, the newest winning where two
# measured the same row, and says which models and seeds the full set still lacks.
#
# Options: --smoke, --models LIST, --seeds LIST (default 0,1,2; with --smoke 0), --work DIR (default bench/peers/work, with
# --smoke bench/peers/work/smoke: our fp32 checkpoints and runs, the scripts' JSON and logs),
# --out PREFIX (default experiments/results/peers; with --smoke WORK/peers_smoke), --skip LIST (any of pt2e,
# train_speed, int8_infer), --infer-skip LIST (int8_infer.py's parts to leave out: any of ours, ort,
# aimet, nncf, brevitas, speed; the report keeps their rows from the earlier slices), --base FILE
# (a report JSON written before, e.g. experiments/results/peers.json: its rows count as earlier
# slices, for a machine without the work folder they came from), --tag NAME (appended to the
# slice's folder name: a second slice of the same models and seeds, e.g. speed measured again,
# that does not replace the first one's results), --pt2e-args "ARGS" (more pt2e.py options, split at
# spaces, e.g. "--quantizers= --ptq-bits= --qat-bits w8a8": our QAT W8A8 rows alone). Needs
# bench/peers/setup_peers.sh's .venv and build/bin/qat_train (bash scripts/setup.sh). Run it with
# both cores idle: every figure is a time or comes from a training run that shares the machine.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="$HERE/.venv/bin/python"
SMOKE=0
FULL_MODELS="fashion_cnn,res_cnn,mobilenet_onnx"
FULL_SEEDS="0,1,2"
MODELS="$FULL_MODELS"
SEEDS=""
WORK=""
OUT=""
SKIP=""
INFER_SKIP=""
BASE=""
TAG=""
PT2E_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --models) MODELS="$2"; shift ;;
    --seeds) SEEDS="$2"; shift ;;
    --work) WORK="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --skip) SKIP="$2"; shift ;;
    --infer-skip) INFER_SKIP="$2"; shift ;;
    --base) BASE="$2"; shift ;;
    --tag) TAG="$2"; shift ;;
    --pt2e-args) read -r -a PT2E_EXTRA <<< "$2"; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run_all: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ ! -x "$PY" ]; then
  echo "run_all: $PY missing: run bash bench/peers/setup_peers.sh first" >&2
  exit 1
fi
if [ ! -x "$ROOT/build/bin/qat_train" ]; then
  echo "run_all: $ROOT/build/bin/qat_train missing: build it first (bash scripts/setup.sh)" >&2
  exit 1
fi
if [ -z "$WORK" ]; then
  if [ "$SMOKE" = 1 ]; then WORK="$HERE/work/smoke"; else WORK="$HERE/work"; fi
fi
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
if [ -z "$OUT" ]; then
  if [ "$SMOKE" = 1 ]; then OUT="$WORK/peers_smoke"; else OUT="$ROOT/experiments/results/peers"; fi
fi

if [ -z "$SEEDS" ]; then
  if [ "$SMOKE" = 1 ]; then SEEDS="0"; else SEEDS="$FULL_SEEDS"; fi
fi
RES="$WORK/results/$(printf '%s' "$MODELS" | tr ',' '+')_seeds$(printf '%s' "$SEEDS" | tr ',' '+')${TAG:+_$TAG}"
mkdir -p "$RES/logs"
COMMON=(--models "$MODELS" --seeds "$SEEDS" --work "$WORK")
if [ "$SMOKE" = 1 ]; then
  # tiny budgets: every code path, no meaningful figure
  PT2E_ARGS=("${COMMON[@]}" --train-limit 2000 --test-limit 1000 --fp32-epochs 1 --qat-epochs 1)
  TRAIN_ARGS=(--models "$MODELS" --images 1024 --rounds 1 --warmup 2)
  INFER_ARGS=("${COMMON[@]}" --train-limit 2000 --test-limit 1000 --fp32-epochs 1 --rounds 1 --repeat 1
              --latency-runs 50 --adaround-iterations 50)
  NOTE="SMOKE RUN on tiny budgets (2,000 training images, 1 epoch, 1,000 test images): it proves the scripts run; none of its figures is a benchmark result."
else
  PT2E_ARGS=("${COMMON[@]}")
  TRAIN_ARGS=(--models "$MODELS")
  INFER_ARGS=("${COMMON[@]}")
  NOTE=""
fi
PT2E_ARGS+=("${PT2E_EXTRA[@]}")
if [ -n "$INFER_SKIP" ]; then INFER_ARGS+=(--skip "$INFER_SKIP"); fi
REPORT_ARGS=(--work "$WORK" --out "$OUT")
[ -n "$BASE" ] && REPORT_ARGS+=(--base "$BASE")
if [ "$SMOKE" = 1 ]; then
  REPORT_ARGS+=(--note "$NOTE")
else
  REPORT_ARGS+=(--full-models "$FULL_MODELS" --full-seeds "$FULL_SEEDS")
fi

STEPS="$RES/steps.json"
[ -f "$STEPS" ] || echo "[]" > "$STEPS"
step() {  # step NAME COMMAND...: runs it with its log in RES/logs/NAME.log, records it in RES/steps.json
  local name="$1"; shift
  case ",$SKIP," in *",$name,"*) echo "== $name: skipped"; return 0 ;; esac
  echo "== $name: $*"
  rm -f "$RES/$name.json"  # no stale result from an earlier run of this slice
  local t0=$SECONDS rc
  "$@" > "$RES/logs/$name.log" 2>&1
  rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s (log: $RES/logs/$name.log)"
  "$PY" - "$STEPS" "$name" "$rc" "$((SECONDS - t0))" "$RES/logs/$name.log" "$ROOT" "$@" <<'PY'
import json, shlex, sys
path, name, rc, secs, log, root, argv = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7:]
steps = [s for s in json.load(open(path)) if s["name"] != name]  # a skipped step keeps its earlier record
lines = [l.rstrip() for l in open(log, errors="replace") if l.strip()]
steps.append({"name": name, "command": " ".join(shlex.quote(a.replace(root + "/", "")) for a in argv),
              "rc": rc, "seconds": secs, "log": log, "tail": "\n".join(lines[-8:]) if rc else ""})
json.dump(steps, open(path, "w"), indent=1)
PY
}

cd "$ROOT" || exit 1
step pt2e "$PY" "$HERE/pt2e.py" "${PT2E_ARGS[@]}" --out "$RES/pt2e.json"
step train_speed "$PY" "$HERE/train_speed.py" "${TRAIN_ARGS[@]}" --out "$RES/train_speed.json"
step int8_infer "$PY" "$HERE/int8_infer.py" "${INFER_ARGS[@]}" --out "$RES/int8_infer.json"
"$PY" "$HERE/report.py" "${REPORT_ARGS[@]}"
