#!/usr/bin/env python3
"""GPUNet in plain PyTorch, written from shared/reference/GPUNET_SPEC.md: the peer for convnets' GPUNet.

Independent of convnets' C++ builder: it reads DLE's JSON layer lists itself
and reproduces DLE's module names, so a state_dict from `convnets models
--save` loads into it with strict=True. Used two ways:

  * tests/python/test_gpunet_cli.py: logits of both implementations on the same
    weights and input (CPU, the .venv's torch);
  * the GPU benchmark: batch-1 fp16 latency in PyTorch eager next to
    `convnets bench infer`, e.g.
      python3 bench/gpunet_reference.py --config gpunet-0.json --latency --batch-size 1 --precision fp16
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch
from torch import nn


def make_divisible(v, divisor=8, min_value=8, round_limit=0.9):
    r = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if r < round_limit * v:
        r += divisor
    return r


def act_layer(name):
    if name == "swish":
        return nn.SiLU()
    if name == "relu":
        return nn.ReLU()
    raise ValueError(f"unknown act {name!r}")


def drop_path(x, p, training):
    if not training or p == 0:
        return x
    keep = 1 - p
    mask = x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(keep).div_(keep)
    return x * mask


class SqueezeExcite(nn.Module):
    def __init__(self, mid, rd, act):
        super().__init__()
        self.conv_reduce = nn.Conv2d(mid, rd, 1, bias=True)
        self.act1 = act_layer(act)
        self.conv_expand = nn.Conv2d(rd, mid, 1, bias=True)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.conv_expand(self.act1(self.conv_reduce(s))))


class ConvBnAct(nn.Module):
    def __init__(self, c):
        super().__init__()
        k, s = c["kernel_size"], c["stride"]
        self.conv = nn.Conv2d(c["num_in_channels"], c["num_out_channels"], k, s, ((s - 1) + (k - 1)) // 2, bias=False)
        self.bn1 = nn.BatchNorm2d(c["num_out_channels"], eps=1e-3)
        self.act1 = act_layer(c["act"])

    def forward(self, x):
        return self.act1(self.bn1(self.conv(x)))


class InvertedResidual(nn.Module):
    def __init__(self, c, rate):
        super().__init__()
        i, o, k, s, e = c["num_in_channels"], c["num_out_channels"], c["kernel_size"], c["stride"], c["expansion"]
        mid = make_divisible(i * e)
        self.residual = s == 1 and i == o
        self.rate = rate
        self.conv_pw = nn.Conv2d(i, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid, eps=1e-3)
        self.act1 = act_layer(c["act"])
        self.conv_dw = nn.Conv2d(mid, mid, k, s, ((s - 1) + (k - 1)) // 2, groups=mid, bias=False)
        self.bn2 = nn.BatchNorm2d(mid, eps=1e-3)
        self.act2 = act_layer(c["act"])
        self.se = SqueezeExcite(mid, round(mid * (0.25 / e)), c["act"]) if c["use_se"] else nn.Identity()
        self.conv_pwl = nn.Conv2d(mid, o, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(o, eps=1e-3)

    def forward(self, x):
        y = self.act1(self.bn1(self.conv_pw(x)))
        y = self.act2(self.bn2(self.conv_dw(y)))
        y = self.bn3(self.conv_pwl(self.se(y)))
        return drop_path(y, self.rate, self.training) + x if self.residual else y


class EdgeResidual(nn.Module):
    def __init__(self, c, rate):
        super().__init__()
        i, o, k, s, e = c["num_in_channels"], c["num_out_channels"], c["kernel_size"], c["stride"], c["expansion"]
        mid = make_divisible(i * e)
        self.residual = s == 1 and i == o
        self.rate = rate
        # DLE's "same" padding request degrades to padding 0 whenever stride > 1 (spec 2.3).
        pad = (k - 1) // 2 if s == 1 and (k - 1) % 2 == 0 else 0
        self.conv_exp = nn.Conv2d(i, mid, k, s, pad, bias=False)
        self.bn1 = nn.BatchNorm2d(mid, eps=1e-3)
        self.act1 = act_layer(c["act"])
        self.se = SqueezeExcite(mid, round(mid * (0.25 / e)), c["act"]) if c["use_se"] else nn.Identity()
        self.conv_pwl = nn.Conv2d(mid, o, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(o, eps=1e-3)

    def forward(self, x):
        y = self.act1(self.bn1(self.conv_exp(x)))
        y = self.bn2(self.conv_pwl(self.se(y)))
        return drop_path(y, self.rate, self.training) + x if self.residual else y


class NetBlock(nn.Module):
    """A block whose state lives in a Sequential called `net` (heads, tails) or `body` (distill irb)."""

    def __init__(self, attr, layers, residual=False):
        super().__init__()
        self.attr = attr
        setattr(self, attr, nn.Sequential(*layers))
        self.residual = residual

    def forward(self, x):
        y = getattr(self, self.attr)(x)
        return y + x if self.residual else y


def head(c, eps, act, large):
    i, o = c["num_in_channels"], c["num_out_channels"]
    layers = [nn.Conv2d(i, o, 3, 2, 1, bias=False), nn.BatchNorm2d(o, eps=eps), act]
    if large:
        for _ in range(2):
            layers += [nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o, eps=eps), nn.ReLU()]
    return NetBlock("net", layers)


def tail(c, distill, num_classes, dropout):
    i, o = c["num_in_channels"], c["num_out_channels"]
    if distill:
        layers = [nn.Conv2d(i, 1152, 1, bias=False), nn.BatchNorm2d(1152), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                  nn.Conv2d(1152, o, 1, bias=False), nn.ReLU(), nn.Flatten(), nn.Dropout(dropout),
                  nn.Linear(o, num_classes)]
    else:
        layers = [nn.Conv2d(i, o, 1, bias=False), nn.BatchNorm2d(o, eps=1e-3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                  nn.Flatten(), nn.Dropout(dropout), nn.Linear(o, num_classes)]
    return NetBlock("net", layers)


def distill_irb(c):
    i, o, k, s, e, g = (c["num_in_channels"], c["num_out_channels"], c["kernel_size"], c["stride"],
                        int(c["expansion"]), c["groups"])
    mid = i * e
    layers = [nn.Conv2d(i, mid, 1, groups=g, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
              nn.Conv2d(mid, mid, k, s, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
              nn.Conv2d(mid, o, 1, groups=g, bias=False), nn.BatchNorm2d(o)]
    return NetBlock("body", layers, residual=s == 1 and i == o)


class GPUNet(nn.Module):
    def __init__(self, config, num_classes=None, drop_path_rate=0.2, dropout=0.2):
        super().__init__()
        data = config[0]
        assert data["layer_type"] == "data"
        distill = data["distill"]
        self.img_resolution = data["img_resolution"]
        self.network = nn.Sequential()
        for j, c in enumerate(config[1:], start=1):
            t = c["layer_type"]
            n = j + 1
            rate = 0.0 if distill else drop_path_rate * j / (len(config) - 1)
            classes = num_classes or c.get("num_classes")
            if distill:
                if t in ("head", "head_large"):
                    name, block = "head:", head(c, 1e-5, nn.ReLU(), t == "head_large")
                elif t == "irb":
                    name, block = f"stage: {c['stage']} irb{n}", distill_irb(c)
                elif t == "tail":
                    name, block = "tail:", tail(c, True, classes, dropout)
                else:
                    raise NotImplementedError(t)
            else:
                if t == "head":
                    name, block = f"head: {n}", head(c, 1e-3, act_layer(c.get("act", "swish")), False)
                elif t == "conv":
                    name, block = f"stage: {c['stage']} layer{n}", ConvBnAct(c)
                elif t == "irb":
                    name, block = f"stage: {c['stage']} layer{n}", InvertedResidual(c, rate)
                elif t == "fused_irb":
                    name, block = f"stage: {c['stage']} layer{n}", EdgeResidual(c, rate)
                elif t == "tail":
                    name, block = f" layer{n}", tail(c, False, classes, dropout)
                else:
                    raise NotImplementedError(t)
            self.network.add_module(name, block)

    def forward(self, x):
        return self.network(x)


def latency(model, batch, size, precision, iterations, warmup, device, memory_format, compile_mode=None):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    fmt = torch.channels_last if memory_format == "nhwc" else torch.contiguous_format
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=fmt)
    model = model.to(device).eval().to(memory_format=fmt)
    mark_step = None
    if compile_mode:
        model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
        # reduce-overhead replays CUDA graphs that reuse their output memory: each pass says a new one begins.
        if compile_mode == "reduce-overhead":
            mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    # fp32 takes no autocast context at all: CPU autocast accepts only bf16 and fp16.
    cast = torch.autocast(device, dtype=dtype) if precision != "fp32" else contextlib.nullcontext()
    with torch.no_grad(), cast:
        for i in range(warmup + iterations):
            sync()
            t0 = time.perf_counter()
            if mark_step:
                mark_step()
            model(x)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    mean = sum(times) / len(times)
    times.sort()
    return mean * 1e3, times[len(times) // 2] * 1e3, times[int(math.ceil(0.9 * len(times))) - 1] * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="GPUNet JSON (DLE's file or `convnets models --definition`)")
    p.add_argument("--latency", action="store_true", help="measure eval latency (median and p90 ms)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--memory-format", default="nhwc", choices=["nhwc", "nchw"])
    p.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (0: torch's default)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune"],
                   help="torch.compile the network in this mode first (inductor)")
    p.add_argument("--json", help="also write the latency as `convnets bench infer`'s JSON (bench/compare.py reads it)")
    a = p.parse_args()
    with open(a.config) as f:
        model = GPUNet(json.load(f))
    params = sum(t.numel() for t in model.parameters())
    out = {"config": a.config, "params": params, "img_resolution": model.img_resolution}
    if a.latency:
        torch.backends.cudnn.benchmark = True
        if a.threads > 0:
            torch.set_num_threads(a.threads)
        mean, med, p90 = latency(model, a.batch_size, model.img_resolution, a.precision, a.iterations, a.warmup,
                                 a.device, a.memory_format, a.compile_mode)
        out.update({"device": a.device, "threads": torch.get_num_threads(), "memory_format": a.memory_format,
                    "batch_size": a.batch_size,
                    "precision": a.precision, "mean_ms": mean, "median_ms": med, "p90_ms": p90,
                    "torch": torch.__version__})
    print(json.dumps(out))
    if a.json:
        if not a.latency:
            sys.exit("gpunet_reference: --json writes the --latency figures; add --latency")
        # convnets' amp is fp16 autocast, which this runs for --precision fp16.
        precision = {"fp16": "amp", "bf16": "bf16", "fp32": "fp32"}[a.precision]
        tool = "pytorch-eager" if not a.compile_mode else "pytorch-compile" + (
            "" if a.compile_mode == "default" else "-" + a.compile_mode)
        row = {"batch": a.batch_size, "fits": True, "engine": "pytorch",
               "images_per_s": a.batch_size * 1e3 / mean, "mean_ms": mean, "p50_ms": med, "p90_ms": p90}
        result = {"tool": tool, "mode": "infer", "arch": os.path.splitext(os.path.basename(a.config))[0],
                  "precision": precision, "image_size": model.img_resolution, "device": a.device,
                  "torch_version": torch.__version__, "warmup": a.warmup, "iterations": a.iterations,
                  "command": " ".join(["python3", "bench/gpunet_reference.py"] + sys.argv[1:]), "rows": [row]}
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
