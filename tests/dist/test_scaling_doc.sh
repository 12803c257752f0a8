#!/bin/sh
# docs/scaling.md embeds the output of scripts/scaling_estimate.py between its
# "BEGIN/END scaling_estimate.py output" markers; this fails when the two differ (an input of the
# script changed without regenerating the document, or a number in the document was edited by
# hand). Regenerate with the command the document names. Needs only /usr/bin/python3.
#   sh tests/dist/test_scaling_doc.sh [SOURCE_DIR]
set -u
src=${1:-${QT_SOURCE_DIR:-$(dirname "$0")/../..}}
py=${PYTHON:-/usr/bin/python3}
doc=$src/docs/scaling.md
tmp=${TMPDIR:-/tmp}/test_scaling_doc.$$
trap 'rm -f "$tmp".doc "$tmp".new' EXIT INT TERM

[ -f "$doc" ] || { echo "FAIL: $doc not found"; exit 1; }
begin=$(grep -c '^<!-- BEGIN scaling_estimate.py output -->$' "$doc")
end=$(grep -c '^<!-- END scaling_estimate.py output -->$' "$doc")
if [ "$begin" != 1 ] || [ "$end" != 1 ]; then
  echo "FAIL: $doc needs exactly one BEGIN and one END scaling_estimate.py marker (found $begin, $end)"
  exit 1
fi
sed -n '/^<!-- BEGIN scaling_estimate.py output -->$/,/^<!-- END scaling_estimate.py output -->$/p' "$doc" |
  sed '1d;$d' >"$tmp".doc
if ! "$py" "$src/scripts/scaling_estimate.py" >"$tmp".new; then
  echo "FAIL: scripts/scaling_estimate.py failed"
  exit 1
fi
if [ ! -s "$tmp".new ] || ! grep -q '^| 512 | 100G |' "$tmp".new; then
  echo "FAIL: scripts/scaling_estimate.py printed no estimate tables"
  exit 1
fi
if ! diff -u "$tmp".doc "$tmp".new; then
  echo "FAIL: the tables in docs/scaling.md differ from scripts/scaling_estimate.py's output (above: - document, + script)."
  echo "Regenerate the block between the markers with: /usr/bin/python3 scripts/scaling_estimate.py"
  exit 1
fi
echo "PASS: docs/scaling.md holds scripts/scaling_estimate.py's current output ($(wc -l <"$tmp".new) lines)"
