#!/bin/bash
# Outputs written where another user may have planted links: every file goes through a fresh
# temporary file that mkstemp creates (never through "<out>.tmp", which a planted symlink could
# redirect to a file of the victim's), the run's lock refuses a symlink (even a dangling one,
# whose target O_CREAT would create), an output directory that another user owns and may write
# to is refused, and an output that is the same file as an input is refused. For each planted
# link the test checks that its target is byte for byte untouched (and a dangling one's target
# still absent). Usage: test_hostile_paths.sh BIN_DIR SOURCE_DIR
set -u
BIN="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$SRC" || exit 1
fail=0
qdq=fuzz/corpus/qdq/tiny_ptq_w8a8.h5

# victim NAME: a file of someone else's, to be left as it is
victim() { printf 'precious %s\n' "$1" > "$T/victim_$1"; cp "$T/victim_$1" "$T/victim_$1.orig"; }
untouched() {
  cmp -s "$T/victim_$1" "$T/victim_$1.orig" || { echo "FAIL $2: the link's target victim_$1 was written"; fail=1; }
}

# 1. qat_export through a planted OUT.onnx.tmp link
victim onnx
ln -s "$T/victim_onnx" "$T/out.onnx.tmp"
"$BIN/qat_export" "$qdq" "$T/out.onnx" --quiet > "$T/log" 2>&1 || { echo "FAIL export: $(cat "$T/log")"; fail=1; }
untouched onnx "qat_export with out.onnx.tmp planted"
[ -f "$T/out.onnx" ] && [ ! -L "$T/out.onnx" ] || { echo "FAIL export: out.onnx is not a regular file"; fail=1; }
ls "$T"/out.onnx.tmp.* > /dev/null 2>&1 && { echo "FAIL export: a temporary file was left behind"; fail=1; }

# 2. a training run's outputs through planted links in its output folder
mkdir "$T/run"
for f in checkpoint.h5 metrics.csv summary.json model.dot; do
  victim "$f"
  ln -s "$T/victim_$f" "$T/run/$f.tmp"
done
run=(experiments/fashion_mlp_fp32.ini train.epochs=1 data.train_limit=512 data.test_limit=256 output.progress=none)
if ! "$BIN/qat_train" "${run[@]}" "output.dir=$T/run" > "$T/log" 2>&1; then
  echo "FAIL run with planted links: $(tail -3 "$T/log")"; fail=1
fi
for f in checkpoint.h5 metrics.csv summary.json model.dot; do
  untouched "$f" "qat_train with run/$f.tmp planted"
  [ -f "$T/run/$f" ] && [ ! -L "$T/run/$f" ] || { echo "FAIL run: $f is not a regular file"; fail=1; }
done

# 3. a dangling .lock link: refused (exit 2), its target not created
mkdir "$T/run2"
ln -s "$T/created_by_lock" "$T/run2/.lock"
"$BIN/qat_train" "${run[@]}" "output.dir=$T/run2" > "$T/log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "is a symbolic link" "$T/log" || { echo "FAIL dangling .lock: exit $rc: $(cat "$T/log")"; fail=1; }
[ -e "$T/created_by_lock" ] && { echo "FAIL dangling .lock: its target was created"; fail=1; }

# 4. an output folder that another user owns and others may write to: refused, nothing written
if [ "$(id -u)" -eq 0 ]; then
  mkdir "$T/shared" && chown nobody "$T/shared" && chmod 0777 "$T/shared"
  "$BIN/qat_train" "${run[@]}" "output.dir=$T/shared" > "$T/log" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "belongs to another user" "$T/log" ||
    { echo "FAIL foreign writable output.dir: exit $rc: $(cat "$T/log")"; fail=1; }
  [ -z "$(ls -A "$T/shared")" ] || { echo "FAIL foreign output.dir: written: $(ls -A "$T/shared")"; fail=1; }
  chmod 0755 "$T/shared"  # owned by another user but writable only by it: accepted (root writes there)
  "$BIN/qat_train" "${run[@]}" "output.dir=$T/shared" > "$T/log" 2>&1 ||
    { echo "FAIL foreign read-only-for-others output.dir refused: $(tail -3 "$T/log")"; fail=1; }
else
  echo "FAIL: run as root (CI does): the foreign-directory case needs chown"; fail=1
fi

# 5. an output that is an input: refused, the input unchanged
cp "$qdq" "$T/model.h5" && cp "$qdq" "$T/model.h5.orig"
"$BIN/qat_export" "$T/model.h5" "$T/model.h5" > "$T/log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "same file" "$T/log" || { echo "FAIL qat_export X X: exit $rc: $(cat "$T/log")"; fail=1; }
ln -s "$T/model.h5" "$T/alias.onnx"
"$BIN/qat_export" "$T/model.h5" "$T/alias.onnx" > "$T/log" 2>&1
rc=$?
[ $rc -eq 2 ] || { echo "FAIL qat_export X link-to-X: exit $rc: $(cat "$T/log")"; fail=1; }
"$BIN/qat_report" "$T/model.h5" --images 64 --no-timing --write-outputs "$T/model.h5" > "$T/log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "input file" "$T/log" || { echo "FAIL qat_report --write-outputs X: exit $rc: $(cat "$T/log")"; fail=1; }
cmp -s "$T/model.h5" "$T/model.h5.orig" || { echo "FAIL: the input model.h5 changed"; fail=1; }

[ $fail -eq 0 ] && echo "hostile paths: all refused or written safely"
exit $fail
