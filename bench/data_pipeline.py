#!/usr/bin/env python3
"""Input-pipeline benchmark: convnets vs torchvision on the same JPEG files, same worker count, same run.

torchvision side: ImageFolder (PIL open + convert("RGB")) + RandomResizedCrop(224)
+ RandomHorizontalFlip + PILToTensor (uint8) for train, Resize(256) + CenterCrop(224)
+ PILToTensor for eval, through a DataLoader with num_workers = N. convnets side:
`convnets bench data --json` with --workers N. Both time the same number of images
after one warm-up batch per worker; images/s per worker is the per-core figure
when N <= the CPU count.

With --augment POLICY (e.g. rand-m9-mstd0.5) a third mode, train-aug, runs GPUNet's
training transform: the peer is timm 0.5.4's own (transforms_imagenet_train with
interpolation random, the RandAugment policy and random erasing --reprob, mode
pixel), in its prefetcher form as GPUNet's train.py uses it (ToNumpy; normalising
and erasing happen on the GPU) and, for reference, without the prefetcher
(ToTensor + Normalize + RandomErasing in the worker). convnets: `bench data
--augment POLICY --train-interpolation random --reprob P` (the erasing boxes are
drawn on the loader threads, the fill runs on the training device).

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


def timm_transform(policy, reprob, prefetcher, size=224):
    from timm.data.transforms_factory import transforms_imagenet_train
    return transforms_imagenet_train(size, interpolation="random", auto_augment=policy, re_prob=reprob,
                                     re_mode="pixel", use_prefetcher=prefetcher)


def default_transform(mode, size):
    if mode == "train":
        return transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                   transforms.PILToTensor()])
    return transforms.Compose([transforms.Resize(int(size / 0.875)), transforms.CenterCrop(size),
                               transforms.PILToTensor()])


def torchvision_rate(root, mode, workers, batch, images, size=224, tf=None):
    tf = tf or default_transform(mode, size)
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


def convnets_rate(binary, root, mode, workers, batch, images, extra=()):
    out = subprocess.run([binary, "bench", "data", root, "--" + mode, "--workers", str(workers), "--batch-size",
                          str(batch), "--images", str(images), "--json", *extra], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--data", required=True, help="folder with train/ and val/ (scripts/make_imagenet_like.py)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell, alternating the two; the median is shown")
    ap.add_argument("--augment", default="", help="also the train-aug mode with this timm RandAugment policy")
    ap.add_argument("--reprob", type=float, default=0.2)
    ap.add_argument("--modes", default="train,eval")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("# %s, %d CPUs, torch %s, torchvision %s, PIL %s" % (
        platform.platform(), os.cpu_count(), torch.__version__, torchvision.__version__,
        __import__("PIL").__version__))
    print("| mode | workers | torchvision img/s | per worker | convnets img/s | per worker | speed-up | "
          "convnets decode ms | transform ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    modes = a.modes.split(",") + (["train-aug"] if a.augment else [])
    for mode in modes:
        root = os.path.join(a.data, "val" if mode == "eval" else "train")
        for n in [int(x) for x in a.workers.split(",")]:
            tvs, cns, heavy = [], [], []
            for _ in range(a.repeat):  # interleaved, so drift on a shared machine hits both sides
                if mode == "train-aug":
                    tvs.append(torchvision_rate(root, mode, n, a.batch_size, a.images,
                                                tf=timm_transform(a.augment, a.reprob, True)))
                    heavy.append(torchvision_rate(root, mode, n, a.batch_size, a.images,
                                                  tf=timm_transform(a.augment, a.reprob, False)))
                    cns.append(convnets_rate(a.convnets, a.data, "train", n, a.batch_size, a.images,
                                             ["--augment", a.augment, "--train-interpolation", "random",
                                              "--reprob", str(a.reprob)]))
                else:
                    tvs.append(torchvision_rate(root, mode, n, a.batch_size, a.images))
                    cns.append(convnets_rate(a.convnets, a.data, mode, n, a.batch_size, a.images))
            if heavy:
                print("# train-aug, %d workers: timm without the prefetcher (normalise + erasing in the worker) "
                      "%.0f img/s" % (n, sorted(heavy)[len(heavy) // 2]))
            tv = sorted(tvs)[len(tvs) // 2]
            cn = sorted(cns, key=lambda c: c["images_per_s"])[len(cns) // 2]
            r = cn["images_per_s"]
            print("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.2fx | %.3f | %.3f |" % (
                mode, n, tv, tv / n, r, r / n, r / tv, cn["decode_ms"], cn["transform_ms"]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
