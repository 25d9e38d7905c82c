#!/usr/bin/env python3
"""Float vs INT8 inference of convnets' exported ONNX graphs in ONNX Runtime and OpenVINO (CPU), same run.

Each model runs in each runtime at each batch size: warm-up runs, then timed
synchronous runs on one fixed random input (the graphs' speed does not depend
on the values). Prints a table and, with --json, writes the figures:
median ms per batch and images/s, and for each runtime and batch the ratio
of every later model's images/s to the first model's (put the float graph first).

    .venv/bin/python bench/int8_runtimes.py rn50_fp32.onnx rn50_int8.onnx --batch-sizes 1,16 --threads 2
"""
import argparse
import json
import platform
import statistics
import time

import numpy as np


def time_runs(fn, warmup, iterations):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def onnxruntime_runner(path, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda x: (lambda: sess.run(None, {name: x}))


def openvino_runner(path, threads, precision=None):
    """precision None: OpenVINO's own choice (bf16 on CPUs with native bf16); "f32" or "bf16" pins it."""
    import openvino as ov
    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = core.compile_model(core.read_model(path), "CPU", config)
    request = compiled.create_infer_request()
    return lambda x: (lambda: request.infer({0: x}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="ONNX files with a dynamic batch; the first is the baseline")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--runtimes", default="onnxruntime,openvino")
    ap.add_argument("--json")
    a = ap.parse_args()
    import onnxruntime
    import openvino
    runners = {"onnxruntime": onnxruntime_runner, "openvino": openvino_runner}
    rng = np.random.default_rng(0)
    results = []
    for rt in a.runtimes.split(","):
        for path in a.models:
            make = runners[rt](path, a.threads)
            for b in map(int, a.batch_sizes.split(",")):
                x = rng.standard_normal((b, 3, a.image_size, a.image_size), dtype=np.float32)
                s = time_runs(make(x), a.warmup, a.iterations)
                results.append({"runtime": rt, "model": path, "batch": b, "ms": s * 1e3, "images_per_s": b / s})
                print(f"{rt:12s} {path:40s} batch {b:3d}  {s * 1e3:9.1f} ms  {b / s:8.1f} img/s", flush=True)
    ratios = []
    for r in results:
        base = next(x for x in results if x["runtime"] == r["runtime"] and x["batch"] == r["batch"]
                    and x["model"] == a.models[0])
        if r["model"] != a.models[0]:
            ratios.append({"runtime": r["runtime"], "batch": r["batch"], "model": r["model"],
                           "speedup": r["images_per_s"] / base["images_per_s"]})
            print(f"{r['runtime']:12s} batch {r['batch']:3d}: {r['model']} is "
                  f"{r['images_per_s'] / base['images_per_s']:.2f}x {a.models[0]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "ratios": ratios, "threads": a.threads, "machine": platform.processor()
                       or platform.machine(), "onnxruntime": onnxruntime.__version__,
                       "openvino": openvino.__version__}, f, indent=2)


if __name__ == "__main__":
    main()
