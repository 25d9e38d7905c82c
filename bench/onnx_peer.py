#!/usr/bin/env python3
"""ONNX Runtime as a peer of `convnets bench infer`: convnets' own exported graph, run on the CPU by onnxruntime.

The graph comes from `convnets export --format onnx --dynamic-batch`, so both
sides run the same network and weights. ONNX Runtime gets its full graph
optimisation (it fuses BN into the convolutions itself) and a pre-normalised
float32 NCHW input: its best case, without the uint8 normalisation convnets
times inside each iteration. Latency: one synchronous run per batch, nearest-
rank percentiles as convnets'. Writes the JSON schema convnets bench writes,
so bench/compare.py puts it beside convnets and PyTorch.

    .venv/bin/python bench/onnx_peer.py rn50.onnx --batch-sizes 1,16 --threads 2 --json ort.json
"""
import argparse
import json
import sys
import time

import numpy as np
import onnxruntime as ort


def percentile(values, q):
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q / 100.0 * len(s) // 1)) - 1))
    return s[k]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="an ONNX file from `convnets export --format onnx --dynamic-batch`")
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (convnets: --threads)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--arch", default="resnet50", help="recorded in the JSON")
    p.add_argument("--opt-level", choices=["disable", "basic", "extended", "all"], default="all",
                   help="ONNX Runtime graph optimisation (to see how much of its lead is graph fusion)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)

    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[a.opt_level]
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = inp.shape  # [batch, 3, H, W], batch symbolic
    if len(shape) != 4 or not isinstance(shape[2], int):
        sys.exit("onnx_peer: %s: expected an NCHW input with a fixed size, got %s" % (a.model, shape))
    if isinstance(shape[0], int):
        sys.exit("onnx_peer: %s has a static batch of %d; export it with --dynamic-batch" % (a.model, shape[0]))
    rng = np.random.default_rng(0)
    rows = []
    for b in (int(x) for x in a.batch_sizes.split(",")):
        x = rng.standard_normal((b, shape[1], shape[2], shape[3]), dtype=np.float32)
        for _ in range(a.warmup):
            sess.run(None, {inp.name: x})
        times = []
        start = time.perf_counter()
        for _ in range(a.iterations):
            t0 = time.perf_counter()
            sess.run(None, {inp.name: x})
            times.append((time.perf_counter() - t0) * 1e3)
        seconds = time.perf_counter() - start
        row = {"batch": b, "fits": True, "images_per_s": b * a.iterations / seconds,
               "mean_ms": seconds * 1e3 / a.iterations}
        for q in (50, 90, 95, 99):
            row["p%d_ms" % q] = percentile(times, q)
        rows.append(row)
        print("onnxruntime infer fp32 batch %d: %.1f img/s, %.2f ms" % (b, row["images_per_s"], row["mean_ms"]))
    result = {"tool": "onnxruntime", "mode": "infer", "arch": a.arch, "precision": "fp32",
              "memory_format": "nchw", "image_size": shape[2], "device": "cpu (%d threads)" % a.threads,
              "onnxruntime_version": ort.__version__, "opt_level": a.opt_level, "warmup": a.warmup, "iterations": a.iterations, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
