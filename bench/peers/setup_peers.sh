#!/usr/bin/env bash
# Makes bench/peers/.venv: the peer frameworks (PyTorch 2.x, torchao, ExecuTorch, ONNX Runtime,
# and, as far as they install, AIMET, Brevitas and NNCF) from PyPI, pinned by
# requirements-peers.txt (used as a pip constraints file).
#
#   bash bench/peers/setup_peers.sh            # idempotent: a second run only checks
#   PYTHON=/path/to/python3 bash bench/peers/setup_peers.sh
#
# The interpreter is the python3 first on PATH (PYTHON overrides it). The core set (torch,
# torchvision, torchao, executorch, onnxruntime, onnx, numpy, h5py) must install; each optional
# package is installed on its own afterwards and its outcome (installed and importable, or the
# error) goes into .venv/install_report.json. `pip freeze` is written to .venv/pip_freeze.txt.
# Also installs Debian's dataset-fashion-mnist when /usr/share/datasets/fashion-mnist/ is missing.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
REQ="$HERE/requirements-peers.txt"
PYTHON="${PYTHON:-$(command -v python3 || true)}"
CORE=(torch torchvision torchao executorch onnxruntime onnx onnxscript onnx-ir numpy h5py)
# package name -> module imported to prove it works
declare -A OPTIONAL_IMPORT=([aimet-torch]=aimet_torch [brevitas]=brevitas [nncf]=nncf)
OPTIONAL=(aimet-torch brevitas nncf)

if [ -z "$PYTHON" ]; then
  echo "setup_peers: no python3 on PATH (set PYTHON=...)" >&2
  exit 1
fi

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "setup_peers: installing Debian's dataset-fashion-mnist"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist || { echo "setup_peers: apt-get failed" >&2; exit 1; }
  else
    echo "setup_peers: run as root, or apt-get install dataset-fashion-mnist" >&2
    exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_peers: creating $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv "$VENV" || { echo "setup_peers: venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check --no-input)
mkdir -p "$VENV/logs"

echo "setup_peers: core set: ${CORE[*]}"
if ! "${PIP[@]}" install -c "$REQ" "${CORE[@]}" > "$VENV/logs/core.log" 2>&1; then
  tail -30 "$VENV/logs/core.log" >&2
  echo "setup_peers: the core set failed to install (log: $VENV/logs/core.log)" >&2
  exit 1
fi

for pkg in "${OPTIONAL[@]}"; do
  log="$VENV/logs/$pkg.log"
  echo "setup_peers: optional: $pkg"
  if "${PIP[@]}" install -c "$REQ" "$pkg" > "$log" 2>&1; then
    echo "installed" > "$VENV/logs/$pkg.status"
    if ! "$VPY" -c "import ${OPTIONAL_IMPORT[$pkg]}" >> "$log" 2>&1; then
      echo "import_failed" > "$VENV/logs/$pkg.status"
    fi
  else
    echo "install_failed" > "$VENV/logs/$pkg.status"
  fi
  echo "  -> $(cat "$VENV/logs/$pkg.status")"
done

"${PIP[@]}" freeze > "$VENV/pip_freeze.txt"

# The report: every package of requirements-peers.txt, its pinned and installed versions, and for
# the optional ones the install outcome with the tail of the log when it failed.
"$VPY" - "$REQ" "$VENV" "${OPTIONAL[@]}" <<'PY'
import json, os, sys, platform
from importlib import metadata
req, venv, optional = sys.argv[1], sys.argv[2], sys.argv[3:]
pins = {}
for line in open(req):
    line = line.split("#", 1)[0].strip()
    if "==" in line:
        name, ver = line.split("==", 1)
        pins[name.strip()] = ver.strip()
report = {"python": sys.version.split()[0], "python_executable": os.path.realpath(sys.executable),
          "platform": platform.platform(), "packages": {}}
for name, pin in pins.items():
    try:
        got = metadata.version(name)
    except metadata.PackageNotFoundError:
        got = None
    entry = {"pinned": pin, "installed": got, "optional": name in optional}
    if name in optional:
        status_file = os.path.join(venv, "logs", name + ".status")
        log_file = os.path.join(venv, "logs", name + ".log")
        entry["status"] = open(status_file).read().strip() if os.path.exists(status_file) else "not_tried"
        if entry["status"] != "installed" and os.path.exists(log_file):
            lines = [l.rstrip() for l in open(log_file, errors="replace") if l.strip()]
            errs = [l for l in lines if "error" in l.lower()]
            entry["error"] = "\n".join((errs or lines)[-12:])
    else:
        entry["status"] = "installed" if got == pin else ("installed %s" % got if got else "missing")
    report["packages"][name] = entry
with open(os.path.join(venv, "install_report.json"), "w") as f:
    json.dump(report, f, indent=1)
for name, e in report["packages"].items():
    print("  %-14s pinned %-8s installed %-10s %s" % (name, e["pinned"], e["installed"], e["status"]))
PY
echo "setup_peers: done ($VENV/install_report.json, $VENV/pip_freeze.txt)"
