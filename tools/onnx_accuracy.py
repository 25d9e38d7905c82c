#!/usr/bin/env python3
"""Top-1 of exported ONNX models measured in ONNX Runtime and OpenVINO, not in convnets.

Reads an IDX dataset (Fashion-MNIST's t10k-images/labels, e.g. Debian's
/usr/share/datasets/fashion-mnist), prepares each image as the model's
metadata says (convnets writes its preprocessing into the ONNX file: scale to
0..1, normalise by mean/std, grey replicated to 3 channels; IDX images are used
at their own size, so the input size must match), and runs every model in
both runtimes on the CPU. Prints one JSON object:

  {"images": N,
   "models": {"a.onnx": {"onnxruntime": {"top1": %, "predictions": ...}, "openvino": {...},
                         "agreement": % of images where both runtimes predict the same class}},
   ...}

with predictions left out unless --predictions. Usage:

    tools/onnx_accuracy.py --data /usr/share/datasets/fashion-mnist fp32.onnx int8.onnx

Models need a dynamic batch (export --dynamic-batch) or the batch given by --batch-size.
"""
import argparse
import gzip
import json
import os
import sys

import numpy as np


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndims = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndims).reshape(dims)


def find(folder, stem):
    for suffix in (".gz", ""):
        p = os.path.join(folder, stem + suffix)
        if os.path.exists(p):
            return p
    sys.exit(f"{folder}: no {stem}[.gz]")


def load_split(folder, split, limit):
    prefix = "t10k" if split == "test" else "train"
    images = read_idx(find(folder, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(folder, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return images, labels


def preprocess(images, meta):
    pre = json.loads(meta["preprocessing"])
    x = images.astype(np.float32) / 255.0
    x = x[:, None, :, :].repeat(3, axis=1)
    mean = np.array(pre["mean"], np.float32).reshape(1, 3, 1, 1)
    std = np.array(pre["std"], np.float32).reshape(1, 3, 1, 1)
    return np.ascontiguousarray((x - mean) / std)


def batches(x, size):
    for i in range(0, len(x), size):
        yield x[i:i + size]


def run_onnxruntime(path, x, batch, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: b})[0] for b in batches(x, batch)])


def run_openvino(path, x, batch, threads):
    import openvino as ov
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    out = []
    for b in batches(x, batch):
        out.append(request.infer({0: b})[compiled.output(0)].copy())
    return np.concatenate(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--data", required=True, help="IDX folder (t10k-*/train-* images and labels)")
    ap.add_argument("--split", default="test", choices=["test", "train"])
    ap.add_argument("--limit", type=int, default=0, help="first N images only (0: all)")
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runtimes", default="onnxruntime,openvino")
    ap.add_argument("--predictions", action="store_true", help="include each model's predicted classes")
    a = ap.parse_args()
    import onnx
    images, labels = load_split(a.data, a.split, a.limit)
    out = {"images": int(len(labels)), "models": {}}
    runners = {"onnxruntime": run_onnxruntime, "openvino": run_openvino}
    for path in a.models:
        meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
        x = preprocess(images, meta)
        result, predictions = {}, {}
        for rt in a.runtimes.split(","):
            logits = runners[rt](path, x, a.batch_size, a.threads)
            predictions[rt] = logits.argmax(1)
            result[rt] = {"top1": float((predictions[rt] == labels).mean() * 100)}
            if a.predictions:
                result[rt]["predictions"] = predictions[rt].tolist()
        if len(predictions) == 2:
            p, q = predictions.values()
            result["agreement"] = float((p == q).mean() * 100)
        out["models"][path] = result
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
