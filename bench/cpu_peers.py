#!/usr/bin/env python3
"""Same-run CPU ratios of convnets against its peers, on ResNet-50.

Training at 64x64 (batch 32): `convnets bench train` against bench/torch_peer.py,
eager and torch.compile. Inference at 224x224 (batch 1 and 16): `convnets bench
infer`, plain and with --fold-bn, against torch_peer.py eager and ONNX Runtime
running convnets' own exported graph (bench/onnx_peer.py). Every side is its
own process with the same intra-op thread count; the sides alternate, --repeat
rounds; each cell shows the median, each ratio the median of the per-round
ratios (this VM's speed drifts by 20% within minutes, so only same-round
ratios mean anything).

    .venv/bin/python bench/cpu_peers.py --convnets build/convnets [--threads 2] [--repeat 3]
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

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, path):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("cpu_peers: %s failed:\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--train-iterations", type=int, default=8)
    ap.add_argument("--infer-iterations", type=int, default=20)
    a = ap.parse_args()
    py, bin_, t = sys.executable, a.convnets, str(a.threads)
    peer = [py, os.path.join(HERE, "torch_peer.py")]
    train = ["--arch", "resnet50", "--image-size", "64", "--batch-sizes", "32", "--device", "cpu",
             "--warmup", "3", "--iterations", str(a.train_iterations)]
    infer = ["--arch", "resnet50", "--batch-sizes", "1,16", "--device", "cpu",
             "--warmup", "3", "--iterations", str(a.infer_iterations)]
    with tempfile.TemporaryDirectory() as d:
        j = lambda name: os.path.join(d, name + ".json")  # noqa: E731
        weights, graph = os.path.join(d, "rn50.safetensors"), os.path.join(d, "rn50.onnx")
        for cmd in ([bin_, "models", "--arch", "resnet50", "--seed", "0", "--save", weights],
                    [bin_, "export", "--checkpoint", weights, "--arch", "resnet50", "--format", "onnx",
                     "--dynamic-batch", "-o", graph]):
            subprocess.run(cmd, check=True, capture_output=True)
        sides = {
            "train": {
                "convnets": lambda: run_json([bin_, "--threads", t, "bench", "train", *train, "--json", j("c")], j("c")),
                "pytorch eager": lambda: run_json([*peer, "train", *train, "--threads", t, "--json", j("e")], j("e")),
                "pytorch compile": lambda: run_json([*peer, "train", *train, "--threads", t, "--compile",
                                                     "--json", j("k")], j("k")),
            },
            "infer": {
                "convnets": lambda: run_json([bin_, "--threads", t, "bench", "infer", *infer, "--json", j("c")], j("c")),
                "convnets --fold-bn": lambda: run_json([bin_, "--threads", t, "bench", "infer", *infer, "--fold-bn",
                                                        "--json", j("f")], j("f")),
                "pytorch eager": lambda: run_json([*peer, "infer", *infer, "--threads", t, "--json", j("e")], j("e")),
                "onnxruntime": lambda: run_json([py, os.path.join(HERE, "onnx_peer.py"), graph, "--batch-sizes", "1,16",
                                                 "--threads", t, "--warmup", "3", "--iterations",
                                                 str(a.infer_iterations), "--json", j("o")], j("o")),
            },
        }
        results = {mode: {name: [] for name in s} for mode, s in sides.items()}
        versions = {}
        for _ in range(a.repeat):
            for mode, s in sides.items():
                for name, fn in s.items():
                    out = fn()
                    results[mode][name].append({r["batch"]: r for r in out["rows"]})
                    for k in ("engine", "torch_version", "onnxruntime_version"):
                        if k in out:
                            versions[k] = out[k]
    version = subprocess.run([bin_, "--version"], capture_output=True, text=True).stdout.strip()
    print("# %s, %s, %d CPUs, %d threads per side, median of %d alternating rounds" %
          (time.strftime("%Y-%m-%d %H:%M"), platform.node(), os.cpu_count(), a.threads, a.repeat))
    print("# %s; peers: torch %s, onnxruntime %s" % (version, versions.get("torch_version"),
                                                     versions.get("onnxruntime_version")))

    def med(mode, name, batch, key):
        return statistics.median(r[batch][key] for r in results[mode][name])

    # Ratios are taken within each round (sides back to back), then the median:
    # a ratio of medians would mix the VM's fast and slow phases.
    def ratio(mode, num, den, batch):
        return statistics.median(a[batch]["images_per_s"] / b[batch]["images_per_s"]
                                 for a, b in zip(results[mode][num], results[mode][den]))

    names = list(sides["train"])
    print("\nResNet-50 training step, 64x64, batch 32, fp32")
    print("| side | img/s | runs | convnets / side |\n|---|---:|---|---:|")
    for n in names:
        v = med("train", n, 32, "images_per_s")
        runs = ", ".join("%.1f" % r[32]["images_per_s"] for r in results["train"][n])
        print("| %s | %.1f | %s | %.2fx |" % (n, v, runs, ratio("train", "convnets", n, 32)))
    names = list(sides["infer"])
    for b in (1, 16):
        print("\nResNet-50 inference, 224x224, batch %d, fp32" % b)
        print("| side | img/s | mean ms | p50 ms | p90 ms | runs (img/s) | convnets / side | folded / side |")
        print("|---|---:|---:|---:|---:|---|---:|---:|")
        for n in names:
            v = med("infer", n, b, "images_per_s")
            runs = ", ".join("%.1f" % r[b]["images_per_s"] for r in results["infer"][n])
            print("| %s | %.1f | %.1f | %.1f | %.1f | %s | %.2fx | %.2fx |" % (
                n, v, med("infer", n, b, "mean_ms"), med("infer", n, b, "p50_ms"), med("infer", n, b, "p90_ms"),
                runs, ratio("infer", "convnets", n, b), ratio("infer", "convnets --fold-bn", n, b)))


if __name__ == "__main__":
    main()
