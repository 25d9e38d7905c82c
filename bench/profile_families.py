#!/usr/bin/env python3
"""Where a training step's GPU time goes: the kernels of Chrome traces (Kineto's, from `convnets bench train
--profile` and bench/torch_peer.py --profile) summed per kernel family, side by side, per step.

Families are told apart by kernel name (cuDNN's, ATen's, cuBLAS's, convnets' own), the first pattern that matches
winning; kernels launched inside a profiler annotation whose name says optimizer are the optimizer's whatever their
name (PyTorch's Optimizer.step, and convnets' own annotations where the step runs eagerly; a replayed CUDA graph
has none, and its optimizer kernels fall to the elementwise family). The table is what the step's fusions are sized
from: convolutions forward, dgrad and wgrad; batch norm forward and backward; ReLU; the residual add; then "the rest":
max-pool forward and backward, the average pool, the loss, loss scaling, the optimizer, the input's normalisation,
layout changes, memsets and fills, copies and casts, other elementwise kernels, each of whose kernels is then listed
by name with its time and launches a step, until 99 % of the rest is named.

  profile_families.py NAME=TRACE.json [NAME=TRACE.json ...] --steps N [--json OUT]
"""
import argparse
import json
import re
import sys

# (family, pattern over the kernel's name), in order: the first match decides. cuDNN's batch-norm kernels come
# before the ReLU ("batchnorm_relu_bwtr"), the convolution directions before the generic GEMM and convolution names.
FAMILIES = [
    ("conv wgrad", r"wgrad|backward_filter|bwd_filter|wgrad_alg|conv2d_grad_weight"),
    ("conv dgrad", r"dgrad|backward_data|bwd_data"),
    ("BN forward", r"bn_fw|fwtr|batch_norm_collect_statistics|batch_norm_transform_input|batch_norm_elemt|"
                   r"batch_norm_reduce|welford|bn_fwd|batchnorm_fw|norm_fwd"),
    ("BN backward", r"bn_bw|bwtr|batch_norm_backward|batchnorm_bw|norm_bwd|bn_bwd"),
    ("conv fprop", r"fprop|convolve|conv_fwd|conv2d_fwd|implicit_gemm|winograd|cutlass.*conv|xmma.*conv"),
    ("max-pool backward", r"max_pool.*backward|maxpool.*backward|MaxPool.*Backward|max_pool_backward"),
    ("max-pool forward", r"max_pool|maxpool|MaxPool"),
    ("avg-pool", r"avg_pool|AvgPool|adaptive_avg"),
    ("loss", r"softmax|nll_loss|cross_entropy|log_softmax|label_smooth"),
    ("loss scaling", r"non_finite|amp_update_scale|unscale|_amp_foreach"),
    ("optimizer", r"multi_tensor_apply|fused_sgd|_fused_sgd|sgd"),
    ("input normalisation", r"normali[sz]e"),
    ("ReLU", r"threshold|clamp_min|clamp_scalar|relu"),
    ("residual add", r"addcmul|AddFunctor|CUDAFunctor_add|add_kernel"),
    ("fc GEMM", r"gemm|cublas|cutlass|nvjet|sm\d+_xmma|ampere_|hopper_|splitK|gemv"),
    ("layout", r"nchwToNhwc|nhwcToNchw|tensorTransform|transpose"),
    ("memsets, fills", r"fill|memset|zero"),
    ("copies, casts", r"copy|cast|convert|memcpy"),
    ("elementwise, other", r"elementwise|vectorized|unrolled|reduce_kernel|Functor"),
]
# What the fusions of issue 58 and 67 attack; the rest is listed kernel by kernel.
FUSED_FAMILIES = {"conv wgrad", "conv dgrad", "conv fprop", "BN forward", "BN backward", "ReLU", "residual add"}
COMPILED = [(f, re.compile(p, re.IGNORECASE)) for f, p in FAMILIES]
OTHER = "other"
ORDER = [f for f, _ in FAMILIES] + [OTHER]


def family(name):
    for f, pattern in COMPILED:
        if pattern.search(name):
            return f
    return OTHER


def load_events(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def summarise(path, steps):
    """{family: microseconds per step}, the GPU's busy time per step, the trace's wall span per step, kernel count."""
    events = load_events(path)
    gpu = [e for e in events if e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")]
    optimizer = [(e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") == "gpu_user_annotation" and re.search(r"optimi[sz]er|\bstep\b", e.get("name", ""),
                                                                         re.IGNORECASE)]
    totals = {f: 0.0 for f in ORDER}
    kernels = {}  # name -> [microseconds, launches] of the kernels outside FUSED_FAMILIES
    for e in gpu:
        start = e["ts"]
        if e.get("cat") in ("gpu_memset", "Memset"):
            f = "memsets, fills"
        elif e.get("cat") in ("gpu_memcpy", "Memcpy"):
            f = "copies, casts"
        elif any(a <= start < b for a, b in optimizer):
            f = "optimizer"
        else:
            f = family(e.get("name", ""))
        totals[f] += float(e.get("dur", 0))
        if f not in FUSED_FAMILIES:
            k = kernels.setdefault("%s: %s" % (f, e.get("name", "?")), [0.0, 0])
            k[0] += float(e.get("dur", 0))
            k[1] += 1
    span = 0.0
    if events:
        span = max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events)
    per_step = {f: v / steps for f, v in totals.items()}
    rest = sorted(((us / steps, n / steps, name) for name, (us, n) in kernels.items()), reverse=True)
    return per_step, sum(totals.values()) / steps, span / steps, len(gpu), rest


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", metavar="NAME=TRACE", help="a column's name and its Chrome trace")
    p.add_argument("--steps", type=int, required=True, help="training steps each trace holds (--profile-steps)")
    p.add_argument("--json", help="also write the table as JSON here")
    a = p.parse_args(argv)
    if a.steps < 1:
        sys.exit("profile_families: --steps must be at least 1")
    columns = []
    for spec in a.traces:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            sys.exit("profile_families: expected NAME=TRACE.json, got %r" % spec)
        try:
            columns.append((name,) + summarise(path, a.steps))
        except (OSError, ValueError, KeyError) as e:
            sys.exit("profile_families: %s: not a readable Chrome trace (%s)" % (path, e))
    print("GPU time per training step (ms) by kernel family, %d profiled steps each:" % a.steps)
    print("| family | " + " | ".join("%s ms | %%" % c[0] for c in columns) + " |")
    print("|:---|" + "---:|---:|" * len(columns))
    for f in ORDER:
        if all(c[1][f] == 0 for c in columns):
            continue
        cells = []
        for _, per_step, busy, _, _, _ in columns:
            cells += ["%.2f" % (per_step[f] / 1e3), "%.1f" % (100 * per_step[f] / busy if busy else 0)]
        print("| %s | %s |" % (f, " | ".join(cells)))
    print("| **GPU busy** | " + " | ".join("**%.2f** | 100" % (c[2] / 1e3) for c in columns) + " |")
    print("| wall (trace span) | " + " | ".join("%.2f | " % (c[3] / 1e3) for c in columns) + " |")
    print("| kernels and copies | " + " | ".join("%d | " % c[4] for c in columns) + " |")
    for name, _, _, _, count, _ in columns:
        if count == 0:
            print("note: %s has no GPU kernels (a CPU run, or the profiler saw none): nothing to classify" % name)
    # The rest, named: every kernel outside the fused families, largest first, until 99 % of the rest is named.
    for name, _, busy, _, _, rest in columns:
        total = sum(r[0] for r in rest)
        if total <= 0:
            continue
        print("\n%s: the rest (%.2f ms a step, %.1f %% of GPU busy), kernel by kernel:" % (
            name, total / 1e3, 100 * total / busy if busy else 0))
        print("| family: kernel | ms a step | launches a step |")
        print("|:---|---:|---:|")
        shown = 0.0
        for us, launches, kernel in rest:
            if shown >= 0.99 * total:
                print("| (%d more kernels) | %.3f | |" % (sum(1 for r in rest) - rest.index((us, launches, kernel)),
                                                        (total - shown) / 1e3))
                break
            print("| %s | %.3f | %.1f |" % (kernel if len(kernel) <= 140 else kernel[:137] + "...", us / 1e3,
                                            launches))
            shown += us
    if a.json:
        out = {"steps": a.steps, "columns": [
            {"name": n, "ms_per_step": {f: v / 1e3 for f, v in per_step.items() if v}, "gpu_busy_ms": busy / 1e3,
             "wall_ms": wall / 1e3, "kernels": count,
             "rest": [{"kernel": k, "ms_per_step": us / 1e3, "launches_per_step": l} for us, l, k in rest]}
            for n, per_step, busy, wall, count, rest in columns]}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
