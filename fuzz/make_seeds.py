"""Writes the IDX, HDF5 and config seeds of the fuzz corpora (fuzz/README.md) into OUT/<target>/.

IDX: the first images and labels of Fashion-MNIST (the dataset-fashion-mnist package), raw and
gzip'd, plus small synthetic files; each input is the images file, the separator, the labels
file (fuzz_idx.c). HDF5: small image/label files written with h5py as users write them
(several integer label types and shapes, chunked and compressed datasets, the latest file
format). Config: the example configs of experiments/, some followed by command-line overrides
(fuzz_config.c). Run by fuzz/make_seeds.sh with /usr/bin/python3 (h5py, numpy)."""
import gzip
import os
import re
import struct
import sys

import h5py
import numpy as np

SEP = b"@@QTFUZZ@@"
FASHION = "/usr/share/datasets/fashion-mnist"


def write(out, target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, mtime=0)


def idx_images(images):
    n, h, w = images.shape
    return struct.pack(">IIII", 0x803, n, h, w) + images.astype(np.uint8).tobytes()


def idx_labels(labels):
    return struct.pack(">II", 0x801, len(labels)) + labels.astype(np.uint8).tobytes()


def idx_seeds(out):
    with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
        f.read(16)
        images = np.frombuffer(f.read(3 * 784), np.uint8).reshape(3, 28, 28)
    with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        labels = np.frombuffer(f.read(3), np.uint8)
    im, lb = idx_images(images), idx_labels(labels)
    write(out, "idx", "fashion3_raw", im + SEP + lb)
    write(out, "idx", "fashion3_gz", gz(im) + SEP + gz(lb))
    write(out, "idx", "fashion3_gz_images_raw_labels", gz(im) + SEP + lb)
    small = np.arange(2 * 3 * 2, dtype=np.uint8).reshape(2, 3, 2) * 20
    write(out, "idx", "small_2x3x2", idx_images(small) + SEP + idx_labels(np.array([9, 0])))
    write(out, "idx", "small_trailing_byte", idx_images(small) + b"\x00" + SEP + idx_labels(np.array([1, 2])))
    write(out, "idx", "small_truncated_gz", gz(idx_images(small))[:-6] + SEP + gz(idx_labels(np.array([1, 2]))))
    write(out, "idx", "labels_as_images", idx_labels(np.array([1, 2])) + SEP + idx_images(small))


def h5_seed(out, name, images, labels, libver="earliest", **dataset_args):
    path = os.path.join(out, "hdf5", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w", libver=libver) as f:
        f.create_dataset("images", data=images, track_times=False, **dataset_args)
        if labels is not None:
            f.create_dataset("labels", data=labels, track_times=False, **dataset_args)


def hdf5_seeds(out):
    rng = np.random.default_rng(0)
    img = lambda *shape: rng.integers(0, 256, shape, dtype=np.uint8)
    h5_seed(out, "nhw_int64.h5", img(3, 4, 4), np.array([0, 2, 1], np.int64))
    h5_seed(out, "nhwc_int32_n1.h5", img(2, 3, 3, 3), np.array([[1], [0]], np.int32))
    h5_seed(out, "nhwc4_uint8_labels.h5", img(2, 2, 2, 4), np.array([5, 3], np.uint8))
    h5_seed(out, "chunked_gzip_fletcher.h5", img(4, 2, 2, 1), np.array([0, 1, 0, 1], np.int16), chunks=True,
            compression="gzip", fletcher32=True)
    h5_seed(out, "latest_format.h5", img(2, 3, 2), np.array([1, 1], np.uint32), libver="latest")
    h5_seed(out, "float_labels.h5", img(2, 2, 2), np.array([0.0, 1.0], np.float32))
    h5_seed(out, "no_labels.h5", img(2, 2, 2), None)
    path = os.path.join(out, "hdf5", "images_group.h5")
    with h5py.File(path, "w") as f:
        f.create_group("images").attrs["note"] = "a group where a dataset belongs"
        f.create_dataset("labels", data=np.array([0], np.int64), track_times=False)


def config_seeds(out, root):
    ex = os.path.join(root, "experiments")
    for name in sorted(os.listdir(ex)):
        if name.endswith(".ini") and name != "accel_fictional.ini":
            with open(os.path.join(ex, name), "rb") as f:
                write(out, "config", name, f.read())
    with open(os.path.join(ex, "fashion_cnn_qat_w4a4.ini"), "rb") as f:
        qat = f.read()
    write(out, "config", "qat_with_overrides", qat + SEP + b"train.epochs=3" + SEP + b"quant.layer_overrides = conv1=w8a8;fc2=fp32"
          + SEP + b"quant.freeze_bn_after=0.5")
    write(out, "config", "empty_with_overrides", SEP + b"model.name=res_cnn" + SEP + b"data.format=hdf5" + SEP
          + b"data.train_path=/x.h5" + SEP + b"data.test_path=/y.h5")
    write(out, "config", "ptq_analysis_overrides", b"[quant]\nmode = ptq\n[analysis]\nlayer_sqnr = yes\n" + SEP
          + b"analysis.calibration_methods=minmax,mse" + SEP + b"analysis.mixed_precision_k=0,1,2")
    write(out, "config", "dialect", b"; comment\n# comment\n[train]\n  epochs: 2 ; inline\nlr = 1e-3\n"
          b"nesterov = On\n\n[output]\ndir = runs/a b\n")


def dict_entry(tok):
    return '"' + "".join(c if 32 <= ord(c) < 127 and c not in '\\"' else "\\x%02X" % ord(c) for c in tok) + '"'


def config_dict(keys_text, path):
    """fuzz/dict/config.dict from `qat_train --keys`: sections, keys and enum values of the
    schema, plus INI syntax, booleans, numbers and the input separator."""
    toks = ["[", "]", "=", ":", ";", "#", " ;", "\n", "\r\n", "\t", SEP.decode(), "true", "false", "yes", "no",
            "on", "off", "On", "TRUE", "0", "1", "-1", "+1", "1e-3", "1e308", "nan", "inf", "-inf", "0x10", "010",
            "2147483647", "2147483648", "-2147483649", "99.99", "50", "0.5", "/", ".", ",", "w8a8", "w4a4", "w2a8",
            "w0a0", "a8", "=fp32", "conv1", "fc2", "relu1"]
    for line in keys_text.splitlines():
        m = re.match(r"^\[(\w+)\]", line)
        if m:
            toks += ["[" + m.group(1) + "]", m.group(1)]
            continue
        m = re.match(r"^(\w+)\s*=", line)
        if m:
            toks.append(m.group(1))
            choices = re.search(r"\(([\w|]+\|[\w|]+)\)\s*$", line)
            if choices:
                toks += choices.group(1).split("|")
    seen, lines = set(), []
    for t in toks:
        if t not in seen:
            seen.add(t)
            lines.append(dict_entry(t))
    with open(path, "w") as f:
        f.write("# libFuzzer dictionary of fuzz_config: INI syntax, the qat_train schema (sections, keys and\n"
                "# enum values from `qat_train --keys`), booleans, numbers, the input separator.\n"
                "# Generated by fuzz/make_seeds.sh (fuzz/make_seeds.py); regenerate when the schema changes.\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: make_seeds.py OUT_DIR REPO_ROOT KEYS_FILE  (KEYS_FILE: the output of qat_train --keys)")
    idx_seeds(sys.argv[1])
    hdf5_seeds(sys.argv[1])
    config_seeds(sys.argv[1], sys.argv[2])
    with open(sys.argv[3]) as f:
        config_dict(f.read(), os.path.join(sys.argv[2], "fuzz", "dict", "config.dict"))
