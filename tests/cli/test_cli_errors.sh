#!/bin/bash
# qat_train's configuration errors: each has its own message naming file, line and key, and a
# non-zero exit; nothing is trained. Usage: test_cli_errors.sh path/to/qat_train
set -u
BIN="$1"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
# Whether an atomic write of $1 left its temporary file ("$1.tmp*", made by mkstemp) beside it.
temp_left() { compgen -G "$1.tmp*" >/dev/null; }

# expect NAME EXPECTED_STATUS PATTERN... -- ARGS...
expect() {
  local name="$1" status="$2"; shift 2
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  "$BIN" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne "$status" ]; then
    echo "$name: exit $rc, want $status; stderr:"; cat "$T/err"; fail=1; return
  fi
  for p in "${pats[@]}"; do
    if ! grep -qF -- "$p" "$T/err"; then
      echo "$name: stderr lacks '$p':"; cat "$T/err"; fail=1
    fi
  done
}

printf '[train]\nepochs = 1\n' > "$T/ok.ini"
printf '[train]\nepocs = 1\n' > "$T/misspelled.ini"
printf '[model]\nname = fashion_cnn\n[train]\nbatch_size = ten\n' > "$T/badvalue.ini"
printf '[trian]\nepochs = 1\n' > "$T/badsection.ini"
printf '[model]\nname = fashion_rnn\n' > "$T/badenum.ini"

expect missing_file 2 "nope.ini" -- "$T/nope.ini"
expect misspelled_key 2 "misspelled.ini:2" "epocs" "epochs" -- "$T/misspelled.ini"
expect bad_value 2 "badvalue.ini:4" "batch_size" "ten" "integer" -- "$T/badvalue.ini"
expect bad_section 2 "badsection.ini:1" "trian" -- "$T/badsection.ini"
expect bad_enum 2 "badenum.ini:2" "fashion_rnn" "fashion_cnn" -- "$T/badenum.ini"
expect bad_override 2 "train.epoch" "epochs" -- "$T/ok.ini" train.epoch=3
expect bad_override_value 2 "train.lr" "-1" -- "$T/ok.ini" train.lr=-1
expect no_args 2 "usage" --
expect bad_qat_init 2 "quant.qat_init" "calibration" -- "$T/ok.ini" quant.qat_init=ptq
# Settings that contradict each other: refused by the options resolver before any work (exit 2,
# no output directory created).
expect qat_init_vs_freeze 2 "freeze_observers_after" "qat_init = calibration" -- "$T/ok.ini" quant.mode=qat \
  quant.qat_init=calibration quant.freeze_observers_after=1 data.train_limit=256 data.test_limit=128 "output.dir=$T/run"
expect lsq_needs_qat 2 "quant.learnable_scale needs quant.mode = qat" -- "$T/ok.ini" quant.mode=ptq \
  quant.learnable_scale=true "output.dir=$T/run"
expect backend_needs_file 2 "quant.quantizer = backend needs quant.backend" -- "$T/ok.ini" quant.mode=ptq \
  quant.quantizer=backend "output.dir=$T/run"
expect hdf5_needs_paths 2 "data.format = hdf5 needs data.train_path and data.test_path" -- "$T/ok.ini" \
  data.format=hdf5 "output.dir=$T/run"
expect analysis_needs_ptq 2 "analysis.sensitivity is a PTQ debugging tool" -- "$T/ok.ini" analysis.sensitivity=true \
  "output.dir=$T/run"
expect percentile_50 2 "quant.percentile = 50" "(50, 100]" -- "$T/ok.ini" quant.mode=ptq \
  quant.activation_observer=histogram quant.activation_range=percentile quant.percentile=50 "output.dir=$T/run"
expect threads_1000 2 "train.threads = 1000" "cores" -- "$T/ok.ini" train.threads=1000 "output.dir=$T/run"
expect epochs_beyond_int 2 "train" "epochs" "[1, 100000]" "3000000000" -- "$T/ok.ini" train.epochs=3000000000
long_value="train.epochs=$(printf '0%.0s' $(seq 1 600))2"
expect override_too_long 2 "longer than" -- "$T/ok.ini" "$long_value" "output.dir=$T/run"
[ -e "$T/run" ] && { echo "a refused config created output.dir"; fail=1; }

# quant.layer_overrides that name no layer, give no bit width or set a layer twice (refused when
# the Quantizer sees the model, exit 2)
small=(data.train_limit=256 data.test_limit=128 quant.mode=ptq "output.dir=$T/ovr")
expect override_not_a_layer 2 "'relu1' is a relu node" -- "$T/ok.ini" "${small[@]}" "quant.layer_overrides=relu1=w8a8"
expect override_w0a0 2 "conv1=w0a0" "2..8" -- "$T/ok.ini" "${small[@]}" "quant.layer_overrides=conv1=w0a0"
expect override_twice 2 "'conv1' is set twice" -- "$T/ok.ini" "${small[@]}" "quant.layer_overrides=conv1=w8a8;conv1=fp32"
expect missing_data 2 "no_such_dir/train.gz" -- "$T/ok.ini" data.train_images=/no_such_dir/train.gz "output.dir=$T/run"
expect missing_scratch_dir 2 "scratch file in '/no_such_scratch'" "data.scratch_dir" -- "$T/ok.ini" \
  data.scratch_dir=/no_such_scratch "output.dir=$T/run"

# Data that contradicts itself or the model (exit 2): an HDF5 label of 2^31-1 (once overflowed
# the class count and aborted in cross-entropy), a label beyond the model's outputs, and an
# image-folder test split lacking one of the training split's classes (once shifted every label
# after it: 27% accuracy instead of 51%, exit 0).
/usr/bin/python3 - "$T" <<'PY' || { echo "python3 + h5py could not write the data cases"; fail=1; }
import sys, os, h5py, numpy as np
t = sys.argv[1]
rng = np.random.default_rng(0)
def h5(name, labels):
    with h5py.File(os.path.join(t, name), "w") as f:
        f["images"] = rng.integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
        f["labels"] = np.array(labels, dtype=np.int64)
h5("ok.h5", [i % 10 for i in range(64)])
h5("huge_label.h5", [1, 2, 2**31 - 1, 3])
h5("label_12.h5", [1, 2, 3, 12, 4])
import struct, zlib
def png(path, pixels):  # 28x28 8-bit grayscale
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\0" + bytes(row) for row in pixels)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 28, 28, 8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
for split, classes in (("train", "abc"), ("test", "ac")):
    for c in classes:
        os.makedirs(os.path.join(t, "folder", split, c))
        for k in range(4):
            png(os.path.join(t, "folder", split, c, "%d.png" % k), rng.integers(0, 256, (28, 28)).tolist())
PY
h5=(data.format=hdf5 train.epochs=1 "output.dir=$T/data_run")
expect hdf5_huge_label 2 "huge_label.h5" 'labels"[2]' "2147483647" -- "$T/ok.ini" "${h5[@]}" \
  "data.train_path=$T/huge_label.h5" "data.test_path=$T/ok.h5"
expect hdf5_label_12 2 "fashion_cnn has 10 outputs but image 3 of the data has label 12" -- "$T/ok.ini" "${h5[@]}" \
  "data.train_path=$T/ok.h5" "data.test_path=$T/label_12.h5"
expect folder_class_missing 2 "class folder 'b'" "missing from the test folder" -- "$T/ok.ini" data.format=folder \
  train.epochs=1 "data.train_path=$T/folder/train" "data.test_path=$T/folder/test" "output.dir=$T/data_run"

# A quantized run whose fp32 checkpoint is its own output.dir's checkpoint.h5 would overwrite it.
expect fp32_in_own_dir 2 "this run's own checkpoint" -- "$T/ok.ini" quant.mode=qat \
  "quant.fp32_checkpoint=$T/same/checkpoint.h5" "output.dir=$T/same"

# A full disk (a file-size limit of 2000 KiB, SIGXFSZ ignored so writes fail with EFBIG): the
# fp32 checkpoint (3.4 MB) and then model_qdq.h5 (2.2 MB; model_trained.h5, 1.8 MB, fits) fail
# to write: a message naming the file, exit 1, no half-written or temporary file, and no crash
# inside HDF5 at exit (once exit 139 after the right message).
full=(data.train_limit=256 data.test_limit=128 train.threads=1 output.progress=none)
(trap '' XFSZ; ulimit -f 2000; exec "$BIN" "$T/ok.ini" "${full[@]}" "output.dir=$T/full_fp32") > "$T/out" 2> "$T/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -qF "checkpoint: cannot write '$T/full_fp32/checkpoint.h5'" "$T/err" ||
   [ -e "$T/full_fp32/checkpoint.h5" ] || temp_left "$T/full_fp32/checkpoint.h5"; then
  echo "full_disk_checkpoint: exit $rc, want 1 with the checkpoint named and no file left; stderr:"; cat "$T/err"; fail=1
fi
"$BIN" "$T/ok.ini" "${full[@]}" "output.dir=$T/full_ok" > "$T/out" 2> "$T/err" || { echo "fp32 run failed"; cat "$T/err"; fail=1; }
(trap '' XFSZ; ulimit -f 2000; exec "$BIN" "$T/ok.ini" "${full[@]}" quant.mode=ptq \
  "quant.fp32_checkpoint=$T/full_ok/checkpoint.h5" "output.dir=$T/full_ptq") > "$T/out" 2> "$T/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -qF "qdq save '$T/full_ptq/model_qdq.h5': cannot write" "$T/err" ||
   [ -e "$T/full_ptq/model_qdq.h5" ] || temp_left "$T/full_ptq/model_qdq.h5" || [ ! -s "$T/full_ptq/model_trained.h5" ]; then
  echo "full_disk_qdq: exit $rc, want 1 with model_qdq.h5 named and no file left; stderr:"; cat "$T/err"; fail=1
fi

# An output file that is a symlink (here to /dev/null; /dev/stdout was once replaced by a regular
# file this way): refused with a message and exit 1, the link left as it was.
mkdir -p "$T/linked" && ln -s /dev/null "$T/linked/checkpoint.h5"
"$BIN" "$T/ok.ini" "${full[@]}" "output.dir=$T/linked" > "$T/out" 2> "$T/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -qF "'$T/linked/checkpoint.h5': it exists and is not a regular file (a symbolic link)" "$T/err" ||
   [ ! -L "$T/linked/checkpoint.h5" ] || temp_left "$T/linked/checkpoint.h5"; then
  echo "symlink_output: exit $rc, want 1 with the link named and kept; stderr:"; cat "$T/err"; fail=1
fi

# Two runs on one output.dir: the second is refused, naming the first's process.
"$BIN" "$T/ok.ini" data.train_limit=20000 data.test_limit=512 train.threads=1 output.progress=none \
  "output.dir=$T/busy" > "$T/first" 2>&1 &
first=$!
for _ in $(seq 1 200); do [ -e "$T/busy/.lock" ] && break; sleep 0.05; done
sleep 0.2 # the lock is taken right after the file is created
expect busy_dir 2 "is in use by another run (process $first)" -- "$T/ok.ini" train.threads=1 data.train_limit=256 \
  data.test_limit=128 "output.dir=$T/busy"
kill "$first" 2>/dev/null; wait "$first" 2>/dev/null

# A resume whose checkpoint holds more epochs than train.epochs asks for: refused (it wrote
# "epochs": 1000000 and exited 0), the checkpoint unchanged. A misspelled backend path: one
# message, not the error text formatted into itself.
"$BIN" "$T/ok.ini" "${full[@]}" train.epochs=2 "output.dir=$T/res" > "$T/out" 2>&1 || { echo "resume setup failed"; cat "$T/out"; fail=1; }
cp "$T/res/checkpoint.h5" "$T/res.orig"
expect resume_past_epochs 2 "holds 2 epochs, more than train.epochs = 1" -- "$T/ok.ini" "${full[@]}" train.epochs=1 \
  train.resume=true "output.dir=$T/res"
cmp -s "$T/res/checkpoint.h5" "$T/res.orig" || { echo "resume_past_epochs: the checkpoint changed"; fail=1; }
expect backend_dev_null 2 "quant.backend = /dev/null: " -- "$T/ok.ini" "${full[@]}" quant.mode=ptq \
  quant.quantizer=backend quant.backend=/dev/null "output.dir=$T/devnull"
[ "$(grep -o "quant.backend = /dev/null" "$T/err" | wc -l)" = 1 ] ||
  { echo "backend_dev_null: the message repeats itself:"; cat "$T/err" "$T/out" 2>/dev/null; fail=1; }

[ $fail -eq 0 ] || exit 1
