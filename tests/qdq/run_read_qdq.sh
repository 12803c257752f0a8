#!/bin/sh
# Runs read_qdq.py (h5py + numpy, no torch) on the files the C tests keep: prints each graph
# and checks its reference interpreter against the C executor's outputs. Exit 77 (skipped)
# when /usr/bin/python3 or its h5py is missing.
# usage: run_read_qdq.sh READ_QDQ_PY FILE_STEM...
py=/usr/bin/python3
script=$1
shift
if ! [ -x "$py" ] || ! "$py" -c 'import h5py, numpy' 2>/dev/null; then
  echo "skipped: $py cannot import h5py and numpy"
  exit 77
fi
for stem in "$@"; do
  "$py" "$script" "$stem.h5" --io "${stem}_io.h5" || { echo "read_qdq.py failed on $stem.h5"; exit 1; }
done
