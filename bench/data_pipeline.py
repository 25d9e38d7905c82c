#!/usr/bin/env python3
"""Input-pipeline benchmark: convnets (CLI and Python loader) vs NVIDIA DALI's CPU pipeline vs torchvision, same files, same run.

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
and erasing happen on the GPU). convnets: `bench data
--augment POLICY --train-interpolation random --reprob P` (the erasing boxes are
drawn on the loader threads, the fill runs on the training device).

convnets.data.Loader (the Python package, issue 34) runs in this process in a plain Python loop, as a training
script uses it, with uint8 NHWC output like the CLI's (in train-aug without the erasing boxes, whose fill
needs normalised output: the boxes alone cost next to nothing). NVIDIA DALI
(scripts/setup.sh installs it): see dali_rate; train-aug has no DALI side (DALI's RandAugment is not
timm's). Peers that cannot be imported are named in the output and left out.

    .venv/bin/python bench/data_pipeline.py --convnets build/convnets --data DIR [--workers 1,2] [--images 2000]
        [--peers cli,python,dali,torchvision] [--python-path build/python] [--json FILE]
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


def python_rate(root, mode, workers, batch, images, size=224, augment="", interpolation="bilinear"):
    """convnets.data.Loader in a Python loop, as a training script runs it (uint8 NHWC batches)."""
    import convnets
    loader = convnets.data.Loader(root, train=(mode != "eval"), batch_size=batch, image_size=size, workers=workers,
                                  drop_last=False, augment=augment, interpolation=interpolation)
    warmup, seen, timed, t0, epoch = workers, 0, 0, time.perf_counter(), 0
    while timed < images:
        loader.set_epoch(epoch)
        for x, _ in loader:
            seen += 1
            if seen == warmup:
                t0 = time.perf_counter()
            elif seen > warmup:
                timed += x.shape[0]
            if timed >= images:
                break
        epoch += 1
    rate = timed / (time.perf_counter() - t0)
    loader.close()
    return rate


def dali_rate(root, mode, threads, batch, images, size=224):
    """NVIDIA DALI's CPU pipeline (device_id=None) through DALIClassificationIterator, as a PyTorch script uses it.

    train: readers.file (shuffled) -> decoders.image_random_crop (area 0.08-1, ratio 3/4-4/3, 10 attempts) ->
    resize to size x size (linear, antialiased) -> crop_mirror_normalize (coin-flip mirror, uint8 HWC, no
    normalisation). eval: decoders.image -> resize shorter side to size / 0.875 -> centre crop, uint8 HWC.
    """
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=(mode == "train"), name="Reader")
        if mode == "train":
            x = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                              random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
            x = fn.resize(x, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=True)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            x = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            x = fn.resize(x, resize_shorter=int(size / 0.875), interp_type=types.INTERP_LINEAR, antialias=True)
            mirror = 0
        x = fn.crop_mirror_normalize(x, dtype=types.UINT8, output_layout="HWC", crop=(size, size), mirror=mirror)
        return x, labels

    p = pipe()
    p.build()
    it = DALIClassificationIterator(p, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                                    auto_reset=True)
    warmup, seen, timed, t0 = threads, 0, 0, time.perf_counter()
    while timed < images:
        for out in it:
            x = out[0]["data"]
            seen += 1
            if seen == warmup:
                t0 = time.perf_counter()
            elif seen > warmup:
                timed += x.shape[0]
            if timed >= images:
                break
    rate = timed / (time.perf_counter() - t0)
    del it, p
    return rate


def unavailable(name):
    """Why a peer cannot run here, or None."""
    try:
        if name == "python":
            import convnets  # noqa: F401
        elif name == "dali":
            import nvidia.dali  # noqa: F401
    except ImportError as e:
        how = "scripts/setup.sh builds it into .venv" if name == "python" else "scripts/setup.sh installs it"
        return "%s (%s)" % (e, how)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--data", required=True, help="folder with train/ and val/ (scripts/make_imagenet_like.py)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell, interleaved; the median is shown")
    ap.add_argument("--augment", default="", help="also the train-aug mode with this timm RandAugment policy")
    ap.add_argument("--reprob", type=float, default=0.2)
    ap.add_argument("--modes", default="train,eval")
    ap.add_argument("--peers", default="cli,python,dali,torchvision",
                    help="contenders: cli (convnets bench data), python (convnets.data.Loader), dali, torchvision")
    ap.add_argument("--python-path", help="put this folder first on sys.path for `import convnets` (e.g. build/python)")
    ap.add_argument("--json", help="also write every run's figures to this file")
    ap.add_argument("--pin", action="store_true",
                    help="run each cell on as many CPUs as it has workers (this process and every process and "
                         "thread it starts), so per-worker figures are per core with all overheads counted")
    a = ap.parse_args()
    if a.python_path:
        sys.path.insert(0, a.python_path)
    torch.set_num_threads(1)
    peers = a.peers.split(",")
    missing = {p: unavailable(p) for p in peers}
    versions = "torch %s, torchvision %s, PIL %s" % (torch.__version__, torchvision.__version__,
                                                    __import__("PIL").__version__)
    if "dali" in peers and not missing["dali"]:
        versions += ", DALI " + __import__("nvidia.dali").dali.__version__
    if "python" in peers and not missing["python"]:
        versions += ", convnets " + __import__("convnets").__version__
    print("# %s, %d CPUs, %s" % (platform.platform(), os.cpu_count(), versions))
    for p, why in missing.items():
        if why:
            print("# %s: not measured: %s" % (p, why))
    peers = [p for p in peers if not missing[p]]
    names = {"cli": "convnets CLI", "python": "convnets.data.Loader", "dali": "DALI CPU", "torchvision": "torchvision"}
    print("| mode | workers | " + " | ".join("%s img/s (per worker)" % names[p] for p in peers) + " | ratios |")
    print("|---|---|" + "---|" * len(peers) + "---|")
    modes = a.modes.split(",") + (["train-aug"] if a.augment else [])
    record = []
    for mode in modes:
        root = os.path.join(a.data, "val" if mode == "eval" else "train")
        for n in [int(x) for x in a.workers.split(",")]:
            runs = {p: [] for p in peers}
            cpus = os.sched_getaffinity(0)
            if a.pin:
                os.sched_setaffinity(0, sorted(cpus)[:n])
            for _ in range(a.repeat):  # interleaved, so drift on a shared machine hits every side
                for p in peers:
                    if p == "cli":
                        extra = ["--augment", a.augment, "--interpolation", "random", "--reprob",
                                 str(a.reprob)] if mode == "train-aug" else []
                        runs[p].append(convnets_rate(a.convnets, a.data, "eval" if mode == "eval" else "train", n,
                                                     a.batch_size, a.images, extra)["images_per_s"])
                    elif p == "python":
                        kw = dict(augment=a.augment, interpolation="random") if mode == "train-aug" else {}
                        runs[p].append(python_rate(root, mode, n, a.batch_size, a.images, **kw))
                    elif p == "dali":
                        if mode != "train-aug":  # DALI's RandAugment is its own, not timm's: no like-for-like
                            runs[p].append(dali_rate(root, mode, n, a.batch_size, a.images))
                    elif mode == "train-aug":
                        runs[p].append(torchvision_rate(root, mode, n, a.batch_size, a.images,
                                                        tf=timm_transform(a.augment, a.reprob, True)))
                    else:
                        runs[p].append(torchvision_rate(root, mode, n, a.batch_size, a.images))
            os.sched_setaffinity(0, cpus)
            med = {p: sorted(r)[len(r) // 2] for p, r in runs.items() if r}
            cells = ["%.0f (%.0f)" % (med[p], med[p] / n) if p in med else "-" for p in peers]
            ratios = []
            if "python" in med:
                for p, label in (("dali", "DALI"), ("torchvision", "torchvision"), ("cli", "CLI")):
                    if p in med:
                        ratios.append("%.2fx %s" % (med["python"] / med[p], label))
            print("| %s | %d | %s | Python loader: %s |" % (mode, n, " | ".join(cells), ", ".join(ratios) or "-"))
            sys.stdout.flush()
            record.append({"mode": mode, "workers": n, "pinned_cpus": n if a.pin else None, "runs": runs,
                           "median": med})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"platform": platform.platform(), "versions": versions, "batch_size": a.batch_size,
                       "images": a.images, "rows": record}, f, indent=2)


if __name__ == "__main__":
    main()
