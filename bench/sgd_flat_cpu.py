#!/usr/bin/env python3
"""SGD step over ResNet-50's parameters on the CPU: per tensor, one op per group over a flat buffer, and 1 MiB slices of it.

The three variants use the ATen ops convnets' Sgd calls (add with alpha,
mul_, add_), momentum 0.875, weight decay on conv/fc weights only. Prints the
median step time of 5 rounds of 10 steps each, the variants interleaved.
"""
import time

import torch
import torchvision

torch.manual_seed(0)
params = [p.detach() for p in torchvision.models.resnet50().parameters()]
grads = [torch.randn_like(p) for p in params]
moms = [torch.zeros_like(p) for p in params]
decays = [1.0 / 32768 if p.dim() > 1 else 0.0 for p in params]
n = sum(p.numel() for p in params)
k = sum(p.numel() for p in params if p.dim() > 1)
flat_p, flat_g, flat_m = torch.zeros(n), torch.randn(n), torch.zeros(n)
GROUPS = ((0, k, 1.0 / 32768), (k, n, 0.0))


def sgd(p, g, m, wd):
    d = g.add(p, alpha=wd) if wd else g
    m.mul_(0.875).add_(d)
    p.add_(m, alpha=-0.1)


def per_tensor():
    for p, g, m, wd in zip(params, grads, moms, decays):
        sgd(p, g, m, wd)


def whole_buffer():
    for a, b, wd in GROUPS:
        sgd(flat_p[a:b], flat_g[a:b], flat_m[a:b], wd)


def sliced(chunk=1 << 18):
    for a, b, wd in GROUPS:
        for s in range(a, b, chunk):
            e = min(b, s + chunk)
            sgd(flat_p[s:e], flat_g[s:e], flat_m[s:e], wd)


variants = (per_tensor, whole_buffer, sliced)
times = {f.__name__: [] for f in variants}
for f in variants:
    f()
for _ in range(5):
    for f in variants:
        t = time.perf_counter()
        for _ in range(10):
            f()
        times[f.__name__].append((time.perf_counter() - t) / 10 * 1e3)
print("torch %s, %d threads, %d parameters" % (torch.__version__, torch.get_num_threads(), n))
for name, v in times.items():
    print("%-13s median %.1f ms" % (name, sorted(v)[2]))
