#!/usr/bin/python3
"""Rough lengths and cyclomatic complexity (1 + if/for/while/case/&&/||/?) of the top-level
functions of C files, longest first: /usr/bin/python3 scripts/function_sizes.py train/*.c
(TOP=N rows, default 15)."""
import re, sys
def funcs(path):
    s = open(path).read()
    # strip comments and strings
    s2 = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), s, flags=re.S)
    s2 = re.sub(r'//[^\n]*', '', s2)
    s2 = re.sub(r'"(\\.|[^"\\])*"', '""', s2)
    s2 = re.sub(r"'(\\.|[^'\\])*'", "''", s2)
    i = 0; depth = 0; start = None; out = []
    lines = s2.split('\n')
    pos_line = 0
    for ln, line in enumerate(lines, 1):
        for ch in line:
            if ch == '{':
                if depth == 0: start = ln
                depth += 1
            elif ch == '}':
                depth -= 1
                if depth == 0 and start:
                    body = '\n'.join(lines[start-1:ln])
                    # name: search backwards for identifier followed by (
                    head = '\n'.join(lines[max(0,start-4):start])
                    m = re.findall(r'(\w+)\s*\([^;{]*\)\s*\{?\s*$', head, flags=re.S)
                    if m and re.search(r'\)\s*\{', head.split('\n')[-1] + '{') :
                        cc = 1 + len(re.findall(r'\b(if|for|while|case)\b|&&|\|\||\?', body))
                        out.append((ln - start + 1, cc, m[-1], path, start))
                    start = None
    return out
allf = []
for p in sys.argv[1:]:
    allf += funcs(p)
allf.sort(reverse=True)
for n, cc, name, p, st in allf[:int(__import__('os').environ.get('TOP', '15'))]:
    print("%4d lines  cc %3d  %s  %s:%d" % (n, cc, name, p, st))
