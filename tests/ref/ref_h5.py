"""The flat reference files of tests/ref/ (quant.h5, adaround.h5): named float32 / int32 arrays
written in sorted order, gzip-compressed from 256 elements on, datasets without timestamps,
atomically (a .tmp file renamed), with the generating script and the torch version as attributes
(a rerun writes the same contents; the root group's header times still differ). Imported by the make_ref_*.py scripts beside it."""
import os

import h5py
import numpy as np


def put(data, name, arr, dtype=np.float32):
    """data[name] = arr (a torch tensor or array-like) as a C-ordered copy of dtype."""
    if hasattr(arr, "detach"):
        arr = arr.detach().numpy()
    data[name] = np.array(arr, dtype=dtype, copy=True, order="C")


def write(path, data, generator, torch_version):
    tmp = path + ".tmp"
    with h5py.File(tmp, "w", libver="latest") as f:
        f.attrs["generator"] = generator.encode()
        f.attrs["torch_version"] = str(torch_version).encode()
        for name in sorted(data):
            arr = data[name]
            if arr.size >= 256:
                f.create_dataset(name, data=arr, compression="gzip", compression_opts=9, shuffle=True,
                                 track_times=False)
            else:
                f.create_dataset(name, data=arr, track_times=False)
    os.replace(tmp, path)
    print("wrote %s (%d datasets, %d bytes)" % (path, len(data), os.path.getsize(path)))
