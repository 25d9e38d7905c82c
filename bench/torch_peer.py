#!/usr/bin/env python3
"""The PyTorch peer of `convnets bench train|infer`: torchvision models on synthetic data, same recipe pieces.

Training: SGD (momentum 0.875, weight decay 1/32768 on conv/fc weights only, as
DLE; fused=True on CUDA: one kernel per step, PyTorch's fastest SGD), label
smoothing 0.1, channels_last, cuDNN benchmark mode, and per precision: amp =
autocast fp16 + GradScaler, bf16 = autocast bf16, tf32 = TF32 matmul/conv, fp32.
Eager, or with --compile torch.compile(model) in --compile-mode (default,
reduce-overhead: CUDA graphs, max-autotune: each kernel's Triton and cuBLAS
candidates benchmarked, with CUDA graphs, max-autotune-no-cudagraphs); each
row's first_step_s is the first step alone, compilation included. Inference: eval mode,
inference_mode, autocast, a synchronised forward per batch for latency.
--profile FILE: after the timed iterations of the last batch size, more steps
under torch.profiler, as a Chrome trace (bench/profile_families.py).
The input is the same as convnets': a uint8 NHWC batch on the device,
normalised every iteration. Writes the JSON schema convnets bench writes.
"""
import argparse
import json
import sys
import time

import torch
import torchvision

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["train", "infer"])
    p.add_argument("--arch", default="resnet50", help="torchvision model name")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "amp", "bf16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--memory-format", default="nhwc", choices=["nhwc", "nchw"])
    p.add_argument("--batch-sizes", default="256")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2.x)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile's backend (inductor, what is timed; eager: graph capture only, the dry run's)")
    p.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile's mode (inductor's; another backend has none and runs its own)")
    p.add_argument("--profile", help="Chrome trace of --profile-steps more steps after the last batch size's timing")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (convnets: --threads; 0: torch's default)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def percentile(values, q):
    # Nearest rank, as convnets' train::percentile.
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q / 100.0 * len(s) // 1)) - 1))
    return s[k]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile(path, steps, device, iteration):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            iteration()
        sync(device)
    prof.export_chrome_trace(path)


def measure(a, device, batch):
    fmt = torch.channels_last if a.memory_format == "nhwc" else torch.contiguous_format
    torch.manual_seed(0)
    model = torchvision.models.__dict__[a.arch](num_classes=a.num_classes).to(device, memory_format=fmt)
    images = torch.randint(0, 256, (batch, a.image_size, a.image_size, 3), dtype=torch.uint8, device=device)
    labels = torch.randint(0, a.num_classes, (batch,), device=device)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    autocast_dtype = {"amp": torch.float16, "bf16": torch.bfloat16}.get(a.precision)

    def normalised():
        return ((images.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=fmt)

    def autocast():
        return torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)

    compile_mode = result_mode(a)
    if a.compile:
        model = torch.compile(model, backend=a.compile_backend, mode=compile_mode)
    # reduce-overhead's and max-autotune's CUDA graphs reuse their output memory: each step tells them a new
    # iteration begins.
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if not (a.compile and compile_mode in ("reduce-overhead", "max-autotune")):
        mark_step = None
    times = []
    if a.mode == "train":
        decay = [p for p in model.parameters() if p.dim() > 1]
        no_decay = [p for p in model.parameters() if p.dim() <= 1]
        opt = torch.optim.SGD([{"params": decay, "weight_decay": 1.0 / 32768}, {"params": no_decay, "weight_decay": 0}],
                              lr=0.1, momentum=0.875, fused=device.type == "cuda")
        scaler = torch.amp.GradScaler(device.type, enabled=a.precision == "amp")
        loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
        model.train()

        def iteration():
            if mark_step:
                mark_step()
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(model(normalised()), labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        sync_each = False
    else:
        model.eval()

        def iteration():
            if mark_step:
                mark_step()
            with torch.inference_mode(), autocast():
                model(normalised())
        sync_each = True

    # The first step alone: under torch.compile it holds the compilation (and max-autotune's benchmarking of its
    # candidate kernels), what a user waits before the first step trains.
    t0 = time.perf_counter()
    iteration()
    sync(device)
    first_step_s = time.perf_counter() - t0
    for _ in range(a.warmup - 1):
        iteration()
    sync(device)
    start = time.perf_counter()
    for _ in range(a.iterations):
        t0 = time.perf_counter()
        iteration()
        if sync_each:
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
    sync(device)
    seconds = time.perf_counter() - start
    row = {"batch": batch, "fits": True, "images_per_s": batch * a.iterations / seconds,
           "mean_ms": seconds * 1e3 / a.iterations}
    if a.mode == "train":
        row["data_backend"] = "synthetic"  # as convnets' train rows; infer rows have no data backend
        row["first_step_s"] = first_step_s  # as convnets' train rows, whose first step holds the step tuner
    if a.profile and batch == int(a.batch_sizes.split(",")[-1]):
        profile(a.profile, a.profile_steps, device, iteration)
    if times:
        row["engine"] = "pytorch"  # the infer rows' schema names the engine (convnets: torch or openvino)
        for q in (50, 90, 95, 99):
            row["p%d_ms" % q] = percentile(times, q)
    return row


def result_mode(a):
    return a.compile_mode if a.compile_backend == "inductor" else "default"


def main(argv=None):
    a = parse_args(argv)
    device = torch.device(a.device)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.precision != "fp32" and device.type != "cuda":
        sys.exit("torch_peer: --precision %s needs CUDA" % a.precision)
    if a.compile and not hasattr(torch, "compile"):
        sys.exit("torch_peer: --compile needs PyTorch 2.x (this is %s)" % torch.__version__)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    rows = [measure(a, device, int(b)) for b in a.batch_sizes.split(",")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "%d threads" % torch.get_num_threads()
    tool = "pytorch-eager"
    if a.compile:
        tool = "pytorch-compile" + ("" if result_mode(a) == "default" else "-" + result_mode(a))
    result = {"tool": tool, "mode": a.mode, "arch": a.arch,
              "precision": a.precision, "memory_format": a.memory_format, "image_size": a.image_size,
              "device": "%s (%s)" % (device, name), "torch_version": torch.__version__,
              "torchvision_version": torchvision.__version__, "warmup": a.warmup, "iterations": a.iterations,
              "command": " ".join(["python3", "bench/torch_peer.py"] + list(argv if argv is not None else sys.argv[1:])),
              "rows": rows}
    if a.compile:
        result["compile_backend"] = a.compile_backend
        result["compile_mode"] = result_mode(a)
    if device.type == "cuda" and a.mode == "train":
        result["optimizer"] = "SGD(fused=True)"
    for r in rows:
        print("%s %s %s batch %d: %.1f img/s, %.2f ms%s" % (
            result["tool"], a.mode, a.precision, r["batch"], r["images_per_s"], r["mean_ms"],
            "; first step %.1f s" % r["first_step_s"] if "first_step_s" in r else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
