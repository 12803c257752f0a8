"""Helpers shared by the Python benchmarks in bench/ (imported from the script's folder)."""
import subprocess


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
