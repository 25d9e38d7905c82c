#!/usr/bin/env python3
"""convnets' CPU inference engines against ONNX Runtime and OpenVINO from Python, same run (issue 35).

For each arch (random weights; speed does not depend on them) and precision:
`convnets --threads T bench infer --engine torch,openvino --fold-bn` against
the ONNX graph `convnets export --fold-bn --dynamic-batch` writes, run by ONNX
Runtime (CPU EP, fp32; it has no CPU bf16 path) and by OpenVINO from Python
with the precision pinned (INFERENCE_PRECISION_HINT f32 or bf16). INT8: the QDQ graph of
`convnets export --int8` timed by `convnets bench infer --checkpoint G.onnx --engine openvino` (INT8
kernels; LibTorch runs no ONNX) and by both runtimes from Python; `int8-silu-float` is the same with
`--int8-silu float` (SiLUs in float after their conv: OpenVINO's form). Median of
--repeat rounds, the sides interleaved within each round (this VM's speed
drifts); each peer cell is the median latency of its timed runs.

    .venv/bin/python bench/cpu_engines.py --convnets build/convnets [--archs resnet50,gpunet-0] [--threads 2]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_runtimes import onnxruntime_runner, openvino_runner, time_runs  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--archs", default="resnet50,gpunet-0")
    ap.add_argument("--precisions", default="fp32,bf16,int8")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    batches = [int(b) for b in a.batch_sizes.split(",")]
    cells = {}  # (arch, precision, side, batch) -> [img/s per round]
    with tempfile.TemporaryDirectory() as d:
        for arch in a.archs.split(","):
            weights, onnx = os.path.join(d, arch + ".safetensors"), os.path.join(d, arch + ".onnx")
            subprocess.run([a.convnets, "models", "--arch", arch, "--save", weights], check=True, capture_output=True)
            subprocess.run([a.convnets, "export", "--checkpoint", weights, "--arch", arch, "--format", "onnx",
                            "--fold-bn", "--dynamic-batch", "-o", onnx], check=True, capture_output=True)
            # INT8: the QDQ graph `export --int8` writes (uint8 activations, 7-bit weights, calibrated on
            # synthetic images as issue 22's figures), timed through `bench infer --checkpoint`.
            int8 = {}
            for precision in a.precisions.split(","):
                if precision.startswith("int8"):
                    int8[precision] = os.path.join(d, arch + "_" + precision + ".onnx")
                    silu = ["--int8-silu", "float"] if precision == "int8-silu-float" else []
                    subprocess.run([a.convnets, "export", "--checkpoint", weights, "--arch", arch, "--format", "onnx",
                                    "--dynamic-batch", "--int8", "--int8-reduce-range", "--calibration", "synthetic:32",
                                    "--calibration-images", "32", "-o", int8[precision]] + silu, check=True,
                                   capture_output=True)
            size = json.loads(subprocess.run([a.convnets, "models", "--arch", arch, "--json"], check=True,
                                             capture_output=True, text=True).stdout)
            size = (size[0] if isinstance(size, list) else size)["input_size"]
            for _ in range(a.repeat):
                for precision in a.precisions.split(","):
                    out = os.path.join(d, "c.json")
                    model = (["--checkpoint", int8[precision], "--engine", "openvino", "--precision", "fp32"]
                             if precision in int8 else
                             ["--arch", arch, "--engine", "torch,openvino", "--fold-bn", "--precision", precision])
                    subprocess.run([a.convnets, "--threads", str(a.threads), "bench", "infer", "--device", "cpu"] +
                                   model + ["--batch-sizes", a.batch_sizes, "--warmup", str(a.warmup),
                                            "--iterations", str(a.iterations), "--json", out], check=True,
                                   capture_output=True)
                    for row in json.load(open(out))["rows"]:
                        cells.setdefault((arch, precision, "convnets " + row["engine"], row["batch"]),
                                         []).append(row["images_per_s"])
                    graph = int8.get(precision, onnx)
                    peers = {"OpenVINO (Python)": lambda: openvino_runner(
                        graph, a.threads, "bf16" if precision == "bf16" else "f32")}
                    if precision != "bf16":
                        peers["ONNX Runtime"] = lambda: onnxruntime_runner(graph, a.threads)
                    for name, make in peers.items():
                        runner = make()
                        for b in batches:
                            x = np.random.default_rng(0).standard_normal((b, 3, size, size), dtype=np.float32)
                            s = time_runs(runner(x), a.warmup, a.iterations)
                            cells.setdefault((arch, precision, name, b), []).append(b / s)
    import openvino
    import onnxruntime
    print("CPU engines, %d threads, %s, %s; OpenVINO %s, ONNX Runtime %s; median of %d rounds" % (
        a.threads, platform.processor() or platform.machine(), time.strftime("%Y-%m-%d"), openvino.__version__,
        onnxruntime.__version__, a.repeat))
    print("\n| arch | precision | side | " + " | ".join("batch %d img/s" % b for b in batches) + " |")
    print("|---|---|---|" + "---:|" * len(batches))
    record = []
    for arch in a.archs.split(","):
        for precision in a.precisions.split(","):
            sides = sorted({k[2] for k in cells if k[0] == arch and k[1] == precision})
            for side in sides:
                values = [statistics.median(cells[(arch, precision, side, b)]) for b in batches]
                print("| %s | %s | %s | %s |" % (arch, precision, side, " | ".join("%.1f" % v for v in values)))
                record.append({"arch": arch, "precision": precision, "side": side,
                               "images_per_s": dict(zip(map(str, batches), values)),
                               "rounds": {str(b): cells[(arch, precision, side, b)] for b in batches}})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "rows": record}, f, indent=2)


if __name__ == "__main__":
    main()
