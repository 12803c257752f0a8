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
    warns when OpenBLAS is missing, since PyTorch's linear layers then run on reference BLAS."""
    try:
        import torch
    except ImportError:
        print("PyTorch not installed (apt-get install python3-torch): comparison skipped")
        return None
    blas = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "libopenblas0-pthread"], capture_output=True,
                          text=True).stdout
    if "installed" not in blas:
        print("warning: libopenblas0-pthread is not installed: PyTorch's linear layers run on reference BLAS")
    return torch.__version__
