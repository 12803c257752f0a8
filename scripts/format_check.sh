#!/bin/bash
# The library's C as .clang-format says: clang-format --dry-run --Werror over every .c and .h of
# the library's folders (the layers of scripts/include_graph.py; not tests/, fuzz/, bench/). Exit 1
# with clang-format's diagnostics when a file differs; clang-format -i FILE formats it.
set -euo pipefail
cd "$(dirname "$0")/.."
files=(base/*.[ch] config/*.[ch] dist/*.[ch] quant/*.[ch] data/*.[ch] optim/*.[ch] autograd/*.[ch] nn/*.[ch]
       qat/*.[ch] onnx/*.[ch] backend/*.[ch] eval/*.[ch] train/*.[ch] cli/*.[ch])
clang-format --dry-run --Werror "${files[@]}"
echo "format_check: ${#files[@]} files as .clang-format says ($(clang-format --version | head -1))"
