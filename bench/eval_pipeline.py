#!/usr/bin/env python3
"""End-to-end evaluation of a JPEG folder on the CPU: `convnets eval DIR --engine openvino` against the
ordinary Python way, same folder, same model graph, same threads, same run (issue 35).

convnets: `convnets --threads T eval DIR --checkpoint W --engine openvino --fold-bn --precision P
--batch-size B --workers T --json`; its images/s counts from the first batch asked of the loader to the
last logits (the model is compiled before). The Python side is what a PyTorch user writes: torchvision
`ImageFolder` with Pillow and the checkpoint's own transforms (Resize(size / crop ratio), CenterCrop,
ToTensor, Normalize), a `torch.utils.data.DataLoader`, and the ONNX graph `convnets export --fold-bn
--dynamic-batch` wrote, run by OpenVINO from Python (precision pinned as convnets') and, in fp32, by
ONNX Runtime; timed from the first batch asked of the DataLoader to the last output. It is measured with
0 loader workers and with T (decoding beside the runtime's threads, as convnets does), and the faster is
the peer. The model's weights are random (`convnets models --save`): speed does not depend on them, and
both sides' top-1 is printed to show they saw the same images and labels.

    .venv/bin/python bench/eval_pipeline.py --convnets build/convnets --data /tmp/inet500/train \
        [--arch resnet50] [--precisions fp32,bf16] [--batch-size 16] [--threads 2] [--repeat 3]
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
from int8_runtimes import onnxruntime_runner, openvino_runner  # noqa: E402


def convnets_rate(a, weights, precision):
    r = subprocess.run([a.convnets, "--threads", str(a.threads), "eval", a.data, "--checkpoint", weights,
                        "--arch", a.arch, "--engine", "openvino", "--fold-bn", "--precision", precision,
                        "--batch-size", str(a.batch_size), "--workers", str(a.threads), "--json"],
                       check=True, capture_output=True, text=True)
    j = json.loads(r.stdout)
    return j["val.compute_ips"] if a.forward_only else j["val.total_ips"], j["val.top1"], j["images"]


def python_rate(a, runner, pre, workers):
    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    interpolation = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC}
    size = pre["input_size"]
    transform = T.Compose([T.Resize(int(size / pre["crop_ratio"]), interpolation[pre["interpolation"]]),
                           T.CenterCrop(size), T.ToTensor(), T.Normalize(pre["mean"], pre["std"])])
    loader = torch.utils.data.DataLoader(ImageFolder(a.data, transform), batch_size=a.batch_size,
                                         num_workers=workers)
    correct = images = 0
    start = time.perf_counter()
    for x, y in loader:
        logits = runner(x.numpy())
        correct += int((np.argmax(logits, 1) == y.numpy()).sum())
        images += len(y)
    return images / (time.perf_counter() - start), 100.0 * correct / images, images


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--data", required=True, help="a folder of class folders of JPEGs")
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--forward-only", action="store_true", help="convnets' forward-only images/s (diagnostic)")
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)  # the main process only batches and hands numpy arrays to the runtime
    cells = {}  # (precision, side) -> [(images/s, top-1, images)]
    with tempfile.TemporaryDirectory() as d:
        weights, onnx = os.path.join(d, "w.safetensors"), os.path.join(d, "m.onnx")
        classes = sum(os.path.isdir(os.path.join(a.data, c)) for c in os.listdir(a.data))
        subprocess.run([a.convnets, "models", "--arch", a.arch, "--num-classes", str(classes), "--save", weights],
                       check=True, capture_output=True)
        subprocess.run([a.convnets, "export", "--checkpoint", weights, "--arch", a.arch, "--format", "onnx",
                        "--fold-bn", "--dynamic-batch", "-o", onnx], check=True, capture_output=True)
        import onnx as onnx_lib
        meta = {p.key: p.value for p in onnx_lib.load(onnx, load_external_data=False).metadata_props}
        pre = json.loads(meta["preprocessing"])
        for _ in range(a.repeat):
            for precision in a.precisions.split(","):
                cells.setdefault((precision, "convnets eval --engine openvino"), []).append(
                    convnets_rate(a, weights, precision))
                runtimes = {"OpenVINO (Python)": lambda: openvino_runner(
                    onnx, a.threads, "bf16" if precision == "bf16" else "f32")}
                if precision == "fp32":
                    runtimes["ONNX Runtime"] = lambda: onnxruntime_runner(onnx, a.threads)
                for name, make in runtimes.items():
                    run = make()
                    runner = lambda x: run(x)()[0]  # noqa: E731 (ORT's list and OpenVINO's dict by index)
                    for workers in sorted({0, a.threads}):
                        cells.setdefault((precision, "torchvision + %s, %d workers" % (name, workers)), []).append(
                            python_rate(a, runner, pre, workers))
    import onnxruntime
    import openvino
    import torchvision
    import PIL
    version = subprocess.run([a.convnets, "--version"], capture_output=True, text=True).stdout.strip()
    print("# %s, %s, %d CPUs; %s; torch %s, torchvision %s, Pillow %s, OpenVINO %s, ONNX Runtime %s" % (
        time.strftime("%Y-%m-%d"), platform.node(), os.cpu_count(), version, torch.__version__,
        torchvision.__version__, PIL.__version__, openvino.__version__, onnxruntime.__version__))
    print("# %s, %s, batch %d, %d threads, median of %d rounds" % (a.arch, a.data, a.batch_size, a.threads,
                                                                   a.repeat))
    print("\n| precision | side | images/s | top-1 | images | rounds (images/s) |\n|---|---|---:|---:|---:|---|")
    record = []
    for precision in a.precisions.split(","):
        sides = [k[1] for k in cells if k[0] == precision]
        for side in sides:
            runs = cells[(precision, side)]
            ips = statistics.median(r[0] for r in runs)
            print("| %s | %s | %.1f | %.2f | %d | %s |" % (precision, side, ips, runs[0][1], runs[0][2],
                                                           ", ".join("%.1f" % r[0] for r in runs)))
            record.append({"precision": precision, "side": side, "images_per_s": ips, "top1": runs[0][1],
                           "rounds": [r[0] for r in runs]})
        # Per round: convnets against the fastest Python cell of that round.
        ours = cells[(precision, "convnets eval --engine openvino")]
        peers = [[r[0] for r in cells[(precision, s)]] for s in sides if not s.startswith("convnets")]
        ratios = [o[0] / max(p[i] for p in peers) for i, o in enumerate(ours)]
        print("| %s | ratio convnets / fastest Python, median of rounds | %.2fx | | | %s |" % (
            precision, statistics.median(ratios), ", ".join("%.2f" % r for r in ratios)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"arch": a.arch, "batch": a.batch_size, "threads": a.threads, "rows": record}, f, indent=2)


if __name__ == "__main__":
    main()
