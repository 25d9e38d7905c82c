#!/usr/bin/env python3
"""CPU training throughput: convnets vs PyTorch (the project's .venv torch) on the same network, recipe and data.

Network: ResNet-8 (He et al. 2015 sec. 4.2, n = 1, 1x1 projection shortcuts),
channels-last, on Debian's Fashion-MNIST (28x28, gray expanded to 3 channels as
convnets does). Recipe pieces on both sides: SGD momentum 0.9 + Nesterov,
weight decay 5e-5 on conv/linear weights only, label smoothing 0.1, per-step
warmup + cosine LR, random horizontal flip, batch 128, 2 intra-op threads.

PyTorch is measured two ways, and the faster one is the peer:
  * "dataloader": torch.utils.data.DataLoader (1 worker, like convnets' one
    loader thread) over the uint8 images with per-sample flip + normalise;
  * "in-memory": the whole set as one normalised tensor, flips done per batch,
    no DataLoader: the least Python overhead PyTorch can have;
  * with --compile also "compile": the in-memory loop on torch.compile(model)
    (Inductor's CPU code; compiling happens in the warm-up steps).
convnets: `convnets train --recipe fashion-mnist-resnet8 --prof STEPS --training-only`.
Every side times steps [warmup, warmup + steps) from its own per-step clock
(convnets: DLLogger timestamps); runs alternate, median of --repeat; the ratio is the median of the
per-round ratios.

    .venv/bin/python bench/train_cpu.py --convnets build/convnets [--steps 200] [--repeat 3] [--precision bf16]
    .venv/bin/python bench/train_cpu.py --convnets build/convnets --baseline OLD/convnets --no-pytorch --repeat 5
"""
import argparse
import gzip
import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FASHION = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet8(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1, self.layer2, self.layer3 = Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def load_fashion():
    def read(name, offset):
        with gzip.open(os.path.join(FASHION, name)) as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)
    x = read("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    y = read("train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    return torch.from_numpy(x.copy()), torch.from_numpy(y)


class FlipNormalize(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i].float().div_(255).sub_(MEAN).div_(STD).unsqueeze(0).expand(3, 28, 28)
        if torch.rand(()) < 0.5:
            img = img.flip(2)
        return img, self.y[i]


def pytorch_rate(mode, steps, warmup, precision="fp32", batch=128):
    torch.set_num_threads(2)
    torch.manual_seed(0)
    x, y = load_fashion()
    model = ResNet8().to(memory_format=torch.channels_last)
    forward = torch.compile(model) if mode == "compile" else model
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-5}, {"params": rest, "weight_decay": 0.0}],
                          lr=0.2, momentum=0.9, nesterov=True)
    per_epoch = len(y) // batch
    total, warm = 8 * per_epoch, per_epoch // 2
    model.train()
    if mode == "dataloader":
        loader = torch.utils.data.DataLoader(FlipNormalize(x, y), batch_size=batch, shuffle=True, drop_last=True,
                                             num_workers=1)
        batches = iter(loader)
    else:
        xs = x.float().div(255).sub(MEAN).div(STD).unsqueeze(1)
        perm = torch.randperm(len(y))

        def gen():
            for b in range(per_epoch):
                idx = perm[b * batch:(b + 1) * batch]
                images = xs[idx]
                flip = torch.rand(batch) < 0.5
                images = torch.where(flip[:, None, None, None], images.flip(3), images)
                yield images.expand(-1, 3, -1, -1), y[idx]
        batches = gen()
    t0 = None
    for step in range(warmup + steps):
        if step == warmup:
            t0 = time.perf_counter()
        images, labels = next(batches)
        images = images.contiguous(memory_format=torch.channels_last)
        lr = 0.2 * (step + 1) / warm if step < warm else \
            0.1 * (1 + math.cos(math.pi * (step - warm) / (total - warm)))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        # bf16 as PyTorch's AMP recipe has it on the CPU: autocast over the
        # forward and the loss, fp32 master weights, no loss scaling.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(forward(images), labels, label_smoothing=0.1)
        loss.backward()
        opt.step()
    return steps * batch / (time.perf_counter() - t0)


def convnets_rate(binary, steps, warmup, precision="fp32", freq=10):
    with tempfile.TemporaryDirectory() as ws:
        subprocess.run([binary, "--threads", "2", "train", "--recipe", "fashion-mnist-resnet8", "--training-only",
                        "--prof", str(warmup + steps), "--print-freq", str(freq), "--precision", precision,
                        "--workspace", ws],
                       check=True, capture_output=True, text=True)
        stamps = {}
        with open(os.path.join(ws, "log.json")) as f:
            for line in f:
                r = json.loads(line[5:])
                if isinstance(r.get("step"), list) and len(r["step"]) == 2:
                    stamps[r["step"][1]] = float(r["timestamp"])
    return steps * 128 / (stamps[warmup + steps] - stamps[warmup])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: convnets --precision bf16 against torch.autocast('cpu', torch.bfloat16); needs a "
                         "CPU with native bf16 (AVX512_BF16 or AMX)")
    ap.add_argument("--compile", action="store_true", help="also time PyTorch with torch.compile(model)")
    ap.add_argument("--baseline", help="another convnets binary (e.g. the commit before a change), timed in each round")
    ap.add_argument("--no-pytorch", action="store_true", help="time the convnets binaries only")
    a = ap.parse_args()
    if a.steps % 10 or a.warmup % 10:
        ap.error("--steps and --warmup must be multiples of 10 (convnets logs every 10th step: --print-freq 10)")
    rates = {"convnets": []}
    if a.baseline:
        rates["convnets baseline"] = []
    if not a.no_pytorch:
        rates.update({"pytorch dataloader": [], "pytorch in-memory": []})
        if a.compile:
            rates["pytorch compile"] = []
    for r in range(a.repeat):
        # Which build goes first alternates, so neither always gets the warmer machine.
        builds = [("convnets", a.convnets)] + ([("convnets baseline", a.baseline)] if a.baseline else [])
        for name, binary in (builds if r % 2 == 0 else builds[::-1]):
            rates[name].append(convnets_rate(binary, a.steps, a.warmup, a.precision))
        if not a.no_pytorch:
            for mode in ("dataloader", "in-memory") + (("compile",) if a.compile else ()):
                rates["pytorch " + mode].append(pytorch_rate(mode, a.steps, a.warmup, a.precision))
    med = {k: statistics.median(v) for k, v in rates.items()}
    version = subprocess.run([a.convnets, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{version}")
    print(f"# ResNet-8 on Fashion-MNIST, {a.precision}, batch 128, {a.steps} timed steps after {a.warmup}, median of {a.repeat}")
    for k, v in rates.items():
        print(f"{k:20s} {med[k]:8.0f} img/s   runs: {', '.join(f'{x:.0f}' for x in v)}")
    # The VM's speed drifts by tens of percent within minutes, so a ratio of
    # medians taken minutes apart mixes phases; the ratio within each round
    # (sides run back to back) is the figure to trust, its median the summary.
    if a.baseline:
        per_round = [n / b for n, b in zip(rates["convnets"], rates["convnets baseline"])]
        print(f"ratio convnets / baseline: median of rounds {statistics.median(per_round):.3f}x "
              f"(rounds: {', '.join(f'{r:.3f}' for r in per_round)})")
    if a.no_pytorch:
        return
    eager = [max(d, m) for d, m in zip(rates["pytorch dataloader"], rates["pytorch in-memory"])]
    per_round = [c / e for c, e in zip(rates["convnets"], eager)]
    print(f"ratio convnets / fastest PyTorch eager: median of rounds {statistics.median(per_round):.2f}x "
          f"(rounds: {', '.join(f'{r:.2f}' for r in per_round)}); of medians "
          f"{med['convnets'] / max(med['pytorch dataloader'], med['pytorch in-memory']):.2f}x")
    if a.compile:
        per_round = [c / k for c, k in zip(rates["convnets"], rates["pytorch compile"])]
        print(f"ratio convnets / PyTorch torch.compile: median of rounds {statistics.median(per_round):.2f}x "
              f"(rounds: {', '.join(f'{r:.2f}' for r in per_round)}); of medians "
              f"{med['convnets'] / med['pytorch compile']:.2f}x")


if __name__ == "__main__":
    main()
