"""Helpers shared by the Python benchmarks in bench/ (imported from the script's folder)."""
import subprocess


class BestOf:
    """The best images/s of each labelled measurement over repeated runs (other processes only
    ever slow a measurement down), with the accuracy measured beside it: best maps a label to
    (images/s, accuracy); order lists the labels as first seen."""

    def __init__(self):
        self.best = {}
        self.order = []

    def keep(self, label, ips, accuracy):
        if label not in self.best:
            self.order.append(label)
        if label not in self.best or ips > self.best[label][0]:
            self.best[label] = (ips, accuracy)


def torch_version():
    """PyTorch's version, or None (saying the comparison is skipped) when it is not installed;
    warns when OpenBLAS is missing, since PyTorch's linear layers then run on reference BLAS.
    Asked of a child process: importing torch here would grow this process by some 150 MB, and a
    contender started from it afterwards would report that as its own peak RSS (Linux keeps
    ru_maxrss across fork and execve)."""
    p = subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"], capture_output=True,
                       text=True)
    if p.returncode != 0:
        print("PyTorch not installed (apt-get install python3-torch): comparison skipped")
        return None
    blas = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "libopenblas0-pthread"], capture_output=True,
                          text=True).stdout
    if "installed" not in blas:
        print("warning: libopenblas0-pthread is not installed: PyTorch's linear layers run on reference BLAS")
    return p.stdout.strip().splitlines()[-1]
