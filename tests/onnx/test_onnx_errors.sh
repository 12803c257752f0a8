#!/bin/bash
# qat_train with model.onnx on bad input: a missing, truncated or non-ONNX file, an unsupported
# op, unsupported attributes (dilation 2, auto_pad, asymmetric pads), a dynamic input
# shape the data contradicts (in the image size a Gemm was built for, and in the channels), a
# missing initializer, an initializer holding fewer values than its dims, a BN parameter of the
# wrong size, hostile external-data references, IR versions and opsets past the range read, and
# model.name given too. Each exits 2 with a message naming the file, the node
# (op type and opset) and what is wrong, before any training: no checkpoint is written.
# The bad models are made by tests/onnx/make_onnx_models.py (the external-data ones by
# tests/onnx/make_torch2_models.py); hostile ones (nesting 100,000 deep, an
# unnamed graph input) by tests/onnx/make_hostile_onnx.py at test time, and variants of the vision
# transformer by tests/onnx/make_bad_vit.py (and one it imports as the original: the same run).
# Usage: test_onnx_errors.sh path/to/qat_train SOURCE_DIR
set -u
BIN="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$SRC" || exit 1
fail=0
B=tests/onnx/bad
printf '[train]\nepochs = 1\n[data]\ntrain_limit = 512\ntest_limit = 256\n[output]\nprogress = none\n' > "$T/ok.ini"

# expect NAME PATTERN... -- MODEL [overrides...]: exit 2, every pattern in stderr, no checkpoint
# (run through RUNNER, e.g. timeout, when set)
RUNNER=()
expect() {
  local name="$1"; shift
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  local model="$1"; shift
  "${RUNNER[@]}" "$BIN" "$T/ok.ini" "model.onnx=$model" "output.dir=$T/$name" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne 2 ]; then
    echo "$name: exit $rc, want 2; stderr:"; cat "$T/err"; fail=1; return
  fi
  for p in "${pats[@]}"; do
    grep -qF -- "$p" "$T/err" || { echo "$name: stderr lacks '$p':"; cat "$T/err"; fail=1; }
  done
  [ -e "$T/$name/checkpoint.h5" ] && { echo "$name: a checkpoint was written"; fail=1; }
}

head -c 20000 tests/onnx/models/mobilenet.onnx > "$T/truncated.onnx"
head -c 100 tests/onnx/models/fashion_mlp.onnx > "$T/truncated_head.onnx"
: > "$T/empty.onnx"

expect missing_file "onnx: $T/nope.onnx" "cannot open" -- "$T/nope.onnx"
expect truncated "onnx: $T/truncated.onnx" "not a readable ONNX model" "truncated" -- "$T/truncated.onnx"
expect truncated_head "$T/truncated_head.onnx" "not a readable ONNX model" -- "$T/truncated_head.onnx"
expect empty "$T/empty.onnx" "not an ONNX model" -- "$T/empty.onnx"
# hostile files (tests/onnx/make_hostile_onnx.py): nesting 100,000 deep refused before protobuf-c's
# recursive unpack (it ran out of stack: exit 139), and a graph input without a name
/usr/bin/python3 tests/onnx/make_hostile_onnx.py "$T" > /dev/null || { echo "make_hostile_onnx.py failed"; fail=1; }
expect nest "$T/nest.onnx" "nested deeper than 64 levels" "onnx.GraphProto" -- "$T/nest.onnx"
expect seq_nest "$T/seq_nest.onnx" "nested deeper than 64 levels" "onnx.TypeProto.Sequence" -- "$T/seq_nest.onnx"
expect unnamed_input "$T/unnamed_input.onnx" "graph input 0 has no name" -- "$T/unnamed_input.onnx"
# what onnx.checker refuses: 10,000 inputs to a Relu, an initializer name twice, a negative
# dimension; a node name with terminal escapes printed with them escaped
expect many_inputs "node '#0' (Relu, opset 13): 10000 inputs; Relu takes 1 to 1" -- "$T/many_inputs.onnx"
expect dup_init "initializer 'w' is defined twice" -- "$T/dup_init.onnx"
expect neg_dims "initializer 'w': dimension 0 is -1 (negative)" -- "$T/neg_dims.onnx"
expect escape_name "node '\x1b[31mred\x1b[0m' (Softplus, opset 13)" -- "$T/escape_name.onnx"
grep -q $'\x1b' "$T/err" && { echo "escape_name: stderr holds a raw escape character"; fail=1; }
# a Mul of an activation by a constant tensor
expect mul_const "node 'scale' (Mul, opset 13)" "Mul of 'x' (an activation) and 'w' (a constant): only Mul of two activations" -- "$T/mul_const.onnx"
# a Div by 1, not the x / sqrt(2) that starts a GELU
expect div_one "node 'div' (Div, opset 13)" "only an activation divided by a constant is supported" -- "$T/div_one.onnx"
# a Concat of images along H
expect concat_h "node 'cat' (Concat, opset 13)" "Concat along axis 2; only along channels" -- "$T/concat_h.onnx"
# an AveragePool in ceil mode whose last window hangs over (28 -> 14; floor mode: 13)
expect avgpool_ceil "node 'pool' (AveragePool, opset 13)" "ceil_mode = 1 where the last window hangs over is supported for MaxPool only" -- "$T/avgpool_ceil.onnx"
expect resize_one "node 'up' (Resize, opset 13)" "only [1, 1, 2, 2] (upsampling by 2) is supported" -- "$T/resize_one.onnx"
# a Transpose that is not a channel shuffle's, a Split along H
expect transpose_hw "node 'swap' (Transpose, opset 13)" "Transpose is supported only as a channel shuffle's" -- "$T/transpose_hw.onnx"
expect split_h "node 'halves' (Split, opset 13)" "Split along axis 2: only along channels (axis 1)" -- "$T/split_h.onnx"
# the vision transformer with its attention scaled by 0.5, its Softmax over axis 2, and the mean
# of its tokens keeping their axis; variants of mha_vit.onnx (tests/onnx/make_bad_vit.py)
/usr/bin/python3 tests/onnx/make_bad_vit.py "$T" > /dev/null || { echo "make_bad_vit.py failed"; fail=1; }
expect vit_scale "node '/blocks/blocks.0/attn/Softmax' (Softmax, opset 17)" "the attention scores are scaled by 0.5; only by 1 / sqrt(8)" -- "$T/vit_scale.onnx"
expect vit_softmax_axis "(Softmax, opset 17)" "Softmax is supported only over the last axis of attention scores" -- "$T/vit_softmax_axis.onnx"
expect vit_mean_keepdims "node '/ReduceMean' (ReduceMean, opset 17)" "only over T (axes [1], keepdims 0)" -- "$T/vit_mean_keepdims.onnx"
# nn.MultiheadAttention's packed projections transposed the wrong way, and a fourth of its three
expect mha_pack_perm "node '/blocks/blocks.0/self_attention/Transpose_2' (Transpose, opset 17)" \
  "Transpose [3, 2, 1, 0, 4] of '/blocks/blocks.0/self_attention/Unsqueeze_2_output_0' [1, 49, batch, 3, 32], a step of multi-head attention: not one of its transposes" \
  -- "$T/mha_pack_perm.onnx"
expect mha_gather3 "node '/blocks/blocks.0/self_attention/Gather_3' (Gather, opset 17)" \
  "only of q, k or v (a scalar index 0, 1 or 2 along axis 0) from the packed projections [3, T, N, C]" -- "$T/mha_gather3.onnx"
# torchvision's ViT with its class token after the tokens, and its head reading token 1
expect mha_cls_after "node '/Concat_2' (Concat, opset 17)" "only of a class token [N, 1, C] (a learned [1, 1, C] Expand'ed) before tokens" \
  -- "$T/mha_cls_after.onnx"
expect mha_token1 "node '/Gather_4' (Gather, opset 17)" "only of the first token (index 0 along axis 1)" -- "$T/mha_token1.onnx"
# ... and with its MatMul weights read through Transpose nodes (torch's export without constant
# folding): imported as vit.onnx itself, the same one-epoch run (one thread) to the last digit
for m in tests/onnx/models/vit.onnx "$T/vit_transposed.onnx"; do
  OMP_NUM_THREADS=1 "$BIN" "$T/ok.ini" "model.onnx=$m" train.threads=1 data.train_limit=256 data.test_limit=128 \
    "output.dir=$T/same_$(basename "$m" .onnx)" >/dev/null 2>"$T/err" || { echo "$m: exit $?:"; cat "$T/err"; fail=1; }
done
# (epoch, lr, losses and accuracies; not the timing columns)
cut -d, -f1-6 "$T/same_vit/metrics.csv" > "$T/m1"; cut -d, -f1-6 "$T/same_vit_transposed/metrics.csv" > "$T/m2"
if ! cmp -s "$T/m1" "$T/m2" || [ "$(wc -l < "$T/m1")" -lt 2 ]; then
  echo "vit_transposed: its run differs from vit.onnx's:"; cat "$T/same_vit/metrics.csv" "$T/same_vit_transposed/metrics.csv"; fail=1
fi
# import is linear in the model's size: 100,000 nodes, and 8,000 nodes of one name (their IR
# names were found by linear scans, cubic in the repeated name: over a minute), each walked to
# the refusal at their end (the output is an image), within a bound far above the time they take
RUNNER=(timeout 60)
expect relu_100000 "the graph output 'y' is an image" -- "$T/relu_100000.onnx"
expect relu_same_8000 "the graph output 'y' is an image" -- "$T/relu_same_8000.onnx"
RUNNER=()
expect not_onnx "onnx: README.md" "not a readable ONNX model" -- README.md
expect unsupported_op "$B/unsupported_op.onnx" "node '/base/relu/Softplus'" "(Softplus, opset 13)" \
  "op type not supported" -- $B/unsupported_op.onnx
expect dilation2 "$B/dilation2.onnx" "node '/conv/Conv' (Conv, opset 13)" "dilations [2, 2] are not supported" \
  -- $B/dilation2.onnx
expect auto_pad "$B/auto_pad.onnx" "node '/conv/Conv' (Conv, opset 13)" "auto_pad = 'SAME_UPPER'" -- $B/auto_pad.onnx
expect asymmetric_pad "$B/asymmetric_pad.onnx" "node '/conv/Conv' (Conv, opset 13)" "asymmetric pads [0, 0, 1, 1]" \
  -- $B/asymmetric_pad.onnx
# dynamic height and width taken from Fashion-MNIST's 28x28 images: the Gemm was built for 16x16
expect dynamic_hw "$B/dynamic_hw.onnx" "node '/fc/Gemm' (Gemm, opset 13)" "'fc.weight' [10, 32] takes 32 input features" \
  "has 98" "dynamic dims were taken from the data" -- $B/dynamic_hw.onnx
# dynamic height and width, but 3 channels: the data's 1-channel images contradict it
expect rgb_dynamic "model rgb_dynamic" "input 'input' [batch, 3, height, width] (NCHW)" "takes 28x28x3 images" \
  "data.idx gives 28x28x1" -- $B/rgb_dynamic.onnx
expect missing_initializer "$B/missing_initializer.onnx" "node '/conv/Conv' (Conv, opset 13)" \
  "the weight 'conv.weight' is missing" -- $B/missing_initializer.onnx
expect short_initializer "$B/short_initializer.onnx" "node '/fc/Gemm' (Gemm, opset 13)" \
  "'fc.weight' has dims [10, 98] (980 values) but holds 979 values" -- $B/short_initializer.onnx
expect bn_size "$B/bn_size.onnx" "node '/bn/BatchNormalization' (BatchNormalization, opset 13)" \
  "the scale 'bn.weight' has dims [3], expected [4]" -- $B/bn_size.onnx
# external data (tests/onnx/make_torch2_models.py): the weight of ext_ok.onnx lives in
# ext_data.bin; each hostile reference is refused naming the tensor and the location, and nothing
# outside the model's directory is read. Accepted files stop later, at the 4x4 input the data
# contradicts: that message shows the import succeeded.
expect ext_absolute "tensor 'conv.weight': external data '/etc/passwd': an absolute path" -- $B/ext_absolute.onnx
mkdir -p "$T/up/models" && cp $B/ext_dotdot.onnx "$T/up/models/" && cp $B/ext_data.bin "$T/up/ext_secret.bin"
expect ext_dotdot "external data '../ext_secret.bin': a '..' component" -- "$T/up/models/ext_dotdot.onnx"
expect ext_dotdot_reentry "external data '../bad/ext_data.bin': a '..' component" -- $B/ext_dotdot_reentry.onnx
expect ext_past_end "external data 'ext_data.bin': bytes 100 to 172 are past the end of the file (160 bytes)" \
  -- $B/ext_past_end.onnx
expect ext_length "external data 'ext_data.bin': length 68, but the tensor's 18 values take 72 bytes" -- $B/ext_length.onnx
expect ext_missing "external data 'ext_missing.bin': cannot open" "No such file" -- $B/ext_missing.onnx
expect ext_inline "tensor 'conv.weight': external data 'ext_data.bin': the tensor is stored externally but also" \
  "holds data in the model file" -- $B/ext_inline.onnx
mkdir -p "$T/outside" "$T/link_out" "$T/link_in/sub" && cp $B/ext_data.bin "$T/outside/ext_data.bin"
cp $B/ext_ok.onnx "$T/link_out/" && ln -s "$T/outside/ext_data.bin" "$T/link_out/ext_data.bin"
expect ext_symlink_out "external data 'ext_data.bin': resolves to $T/outside/ext_data.bin, outside the model's directory" \
  -- "$T/link_out/ext_ok.onnx"
cp $B/ext_ok.onnx "$T/link_in/" && cp $B/ext_data.bin "$T/link_in/sub/data.bin" && ln -s sub/data.bin "$T/link_in/ext_data.bin"
expect ext_symlink_in "model ext_ok (model.onnx $T/link_in/ext_ok.onnx" "takes 4x4x1 images" -- "$T/link_in/ext_ok.onnx"
expect ext_ok "model ext_ok (model.onnx $B/ext_ok.onnx" "takes 4x4x1 images" -- $B/ext_ok.onnx
# torch 2.x's files outside the range read: IR version 11, opset 23
"${QT_PYTHON:-.venv/bin/python}" - "$T" <<'PY' || { echo "making the IR 11 / opset 23 files failed"; fail=1; }
import sys, onnx
m = onnx.load("tests/onnx/models/forms_opset22.onnx")
m.ir_version = 11
onnx.save(m, sys.argv[1] + "/ir11.onnx")
m = onnx.load("tests/onnx/models/forms_opset22.onnx")
m.opset_import[0].version = 23
onnx.save(m, sys.argv[1] + "/opset23.onnx")
PY
expect ir11 "$T/ir11.onnx: IR version 11 is not supported (6 to 10" -- "$T/ir11.onnx"
expect opset23 "$T/opset23.onnx: opset 23 of the default domain is not supported (11 to 22)" -- "$T/opset23.onnx"
# A Dropout that drops in training (ratio not 0; from opset 12 training_mode true) becomes a
# dropout node of the graph (model.dot shows it); one that is the identity (no training_mode, or
# ratio 0) is dropped; a ratio of 1 is refused
"${QT_PYTHON:-.venv/bin/python}" - "$T" <<'PY' || { echo "making the Dropout files failed"; fail=1; }
import sys, numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
def drop_model(path, ratio, training, opset=13):
    inits = [numpy_helper.from_array(np.full((10, 784), 0.01, np.float32), "fc.weight"),
             numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias")]
    if opset < 12:  # ratio an attribute, no training_mode
        drop = helper.make_node("Dropout", ["x"], ["d"], name="/drop/Dropout", ratio=ratio)
    else:
        inits.append(numpy_helper.from_array(np.array(ratio, np.float32), "ratio"))
        ins = ["x", "ratio"]
        if training is not None:
            inits.append(numpy_helper.from_array(np.array(training), "training_mode"))
            ins.append("training_mode")
        drop = helper.make_node("Dropout", ins, ["d"], name="/drop/Dropout")
    nodes = [drop,
             helper.make_node("Flatten", ["d"], ["f"], name="/Flatten", axis=1),
             helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
drop_model(sys.argv[1] + "/drop_train.onnx", 0.5, True)
drop_model(sys.argv[1] + "/drop_eval.onnx", 0.5, None)
drop_model(sys.argv[1] + "/drop_zero.onnx", 0.0, True)
drop_model(sys.argv[1] + "/drop_train_opset11.onnx", 0.5, None, 11)
drop_model(sys.argv[1] + "/drop_zero_opset11.onnx", 0.0, None, 11)
drop_model(sys.argv[1] + "/drop_one.onnx", 1.0, True)
PY
for m in drop_train drop_eval drop_zero drop_train_opset11 drop_zero_opset11; do
  "$BIN" "$T/ok.ini" "model.onnx=$T/$m.onnx" "output.dir=$T/$m" >/dev/null 2>"$T/err" || { echo "$m: exit $?:"; cat "$T/err"; fail=1; }
  n=$(grep -cF 'label="drop\ndropout' "$T/$m/model.dot")
  want=0; case $m in drop_train*) want=1 ;; esac
  [ "$n" -eq $want ] || { echo "$m: $n dropout nodes in model.dot, want $want:"; cat "$T/$m/model.dot"; fail=1; }
done
expect drop_one "node '/drop/Dropout' (Dropout, opset 13): ratio 1 is not in [0, 1)" -- "$T/drop_one.onnx"
expect name_and_onnx "model.name = res_cnn (override) and model.onnx" "both name the model" \
  -- tests/onnx/models/res_cnn.onnx model.name=res_cnn
# a quantized run's fp32 recipe must train the same model
printf '[model]\nname = fashion_cnn\n' > "$T/fp32.ini"
expect recipe_model "quant.fp32_config '$T/fp32.ini' trains model.name fashion_cnn" \
  "this run quantizes model.onnx tests/onnx/models/mobilenet.onnx" -- tests/onnx/models/mobilenet.onnx \
  quant.mode=qat "quant.fp32_checkpoint=$T/fp32/checkpoint.h5" "quant.fp32_config=$T/fp32.ini"

[ $fail -eq 0 ] || exit 1
