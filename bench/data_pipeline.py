#!/usr/bin/env python3
"""Input-pipeline benchmark: convnets vs torchvision on the same JPEG files, same worker count, same run.

torchvision side: ImageFolder (PIL open + convert("RGB")) + RandomResizedCrop(224)
+ RandomHorizontalFlip + PILToTensor (uint8) for train, Resize(256) + CenterCrop(224)
+ PILToTensor for eval, through a DataLoader with num_workers = N. convnets side:
`convnets bench data --json` with --workers N. Both time the same number of images
after one warm-up batch per worker; images/s per worker is the per-core figure
when N <= the CPU count.

    .venv/bin/python bench/data_pipeline.py --convnets build/convnets --data DIR [--workers 1,2] [--images 2000]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch
import torchvision
from torchvision import datasets, transforms


def torchvision_rate(root, mode, workers, batch, images, size=224):
    if mode == "train":
        tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                 transforms.PILToTensor()])
    else:
        tf = transforms.Compose([transforms.Resize(int(size / 0.875)), transforms.CenterCrop(size),
                                 transforms.PILToTensor()])
    ds = datasets.ImageFolder(root, tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=(mode == "train"), num_workers=workers,
                                         drop_last=False, persistent_workers=True)
    warmup, seen, timed, t0 = workers, 0, 0, time.perf_counter()
    while timed < images:
        for x, _ in loader:
            seen += 1
            if seen == warmup:
                t0 = time.perf_counter()
            elif seen > warmup:
                timed += x.shape[0]
            if timed >= images:
                break
    return timed / (time.perf_counter() - t0)


def convnets_rate(binary, root, mode, workers, batch, images):
    out = subprocess.run([binary, "bench", "data", root, "--" + mode, "--workers", str(workers), "--batch-size",
                          str(batch), "--images", str(images), "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--data", required=True, help="folder with train/ and val/ (scripts/make_imagenet_like.py)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell, alternating the two; the median is shown")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("# %s, %d CPUs, torch %s, torchvision %s, PIL %s" % (
        platform.platform(), os.cpu_count(), torch.__version__, torchvision.__version__,
        __import__("PIL").__version__))
    print("| mode | workers | torchvision img/s | per worker | convnets img/s | per worker | speed-up | "
          "convnets decode ms | transform ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in ("train", "eval"):
        root = os.path.join(a.data, "train" if mode == "train" else "val")
        for n in [int(x) for x in a.workers.split(",")]:
            tvs, cns = [], []
            for _ in range(a.repeat):  # interleaved, so drift on a shared machine hits both sides
                tvs.append(torchvision_rate(root, mode, n, a.batch_size, a.images))
                cns.append(convnets_rate(a.convnets, a.data, mode, n, a.batch_size, a.images))
            tv = sorted(tvs)[len(tvs) // 2]
            cn = sorted(cns, key=lambda c: c["images_per_s"])[len(cns) // 2]
            r = cn["images_per_s"]
            print("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.2fx | %.3f | %.3f |" % (
                mode, n, tv, tv / n, r, r / n, r / tv, cn["decode_ms"], cn["transform_ms"]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
