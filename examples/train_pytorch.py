#!/usr/bin/env python3
"""An ordinary PyTorch training loop fed by convnets' C++ data loader.

The model, optimizer, loss and schedule are plain PyTorch (torchvision's ResNets, or any nn.Module: see
build_model); only the data comes from `convnets.data.Loader`, which decodes and augments on C++ threads and
hands over batches normalised in the requested dtype and memory format. The default trains torchvision's
ResNet-18 on Debian's Fashion-MNIST (README: the accuracy and time it reaches):

    .venv/bin/python examples/train_pytorch.py                              # Fashion-MNIST, ResNet-18, CPU
    .venv/bin/python examples/train_pytorch.py data/ --arch resnet50 --image-size 224 --device cuda --compile
    .venv/bin/python examples/train_pytorch.py data/ --arch resnet50 --device cuda --amp      # fp16 batches, autocast
    .venv/bin/python examples/train_pytorch.py data/ --loader torchvision ...   # the same loop on torchvision's loader
    .venv/bin/torchrun --nproc-per-node 2 examples/train_pytorch.py        # data-parallel: each rank its shard

Under torchrun the loop is DistributedDataParallel (NCCL on GPUs, Gloo on CPUs) and the loader takes its rank
and world size from torch.distributed, so every process loads only its own shard.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision

import convnets

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# Fashion-MNIST's pixel statistics (the fashion-mnist-resnet8 recipe's); ImageNet's for anything else.
FASHION_MEAN, FASHION_STD = [0.2860] * 3, [0.3530] * 3
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", default=FASHION_MNIST,
                   help="what `convnets train` takes: an image folder with train/ and val/, an IDX folder, ...")
    p.add_argument("--arch", default="resnet18", help="a torchvision.models builder (resnet18, resnet50, ...)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--lr", type=float, default=0.2, help="peak learning rate per 256 images (scaled linearly)")
    p.add_argument("--weight-decay", type=float, default=5e-5)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--image-size", type=int, default=0, help="default: 28 for IDX data, else 224")
    p.add_argument("--workers", type=int, default=0, help="loader threads per process (0: the CPUs / processes)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for the model's kernels per process (0: the CPUs / processes)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--amp", action="store_true",
                   help="mixed precision: fp16 autocast and a GradScaler on CUDA (bf16 autocast on the CPU), the loader "
                        "handing over batches in that dtype")
    p.add_argument("--loader", default="convnets", choices=["convnets", "torchvision", "synthetic"],
                   help="where the training batches come from: convnets.data.Loader (this example's point); "
                        "torchvision's ImageFolder + DataLoader with the same crop and flip (what the loop would use "
                        "without convnets, to compare); or one random batch on the device, reused (the step alone). "
                        "Validation always reads through convnets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-train-images", type=int, default=0, help="use only the first N (0: all)")
    p.add_argument("--max-val-images", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0, help="stop after N training steps (a quick check)")
    p.add_argument("--json", help="write the summary (accuracy, losses, times) to this file (rank 0)")
    return p.parse_args()


def build_model(arch, num_classes):
    """Any nn.Module taking [B, 3, H, W] works here; torchvision's builders by name."""
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)


def main():
    args = parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        if args.device == "cuda":
            args.device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    workers = args.workers or max(1, (os.cpu_count() or 1) // world)
    if device.type == "cpu":
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))

    # The data: convnets decodes and augments on `workers` C++ threads and normalises (on the GPU when
    # device is CUDA) into channels-last float batches; rank and world size come from torch.distributed.
    probe = convnets.data.Loader(args.data, batch_size=1, workers=1, max_images=1, rank=0, world_size=1)
    grayscale_idx = probe.channels == 1
    probe.close()
    size = args.image_size or (28 if grayscale_idx else 224)
    mean, std = (FASHION_MEAN, FASHION_STD) if grayscale_idx else (IMAGENET_MEAN, IMAGENET_STD)
    amp_dtype = (torch.float16 if device.type == "cuda" else torch.bfloat16) if args.amp else None
    common = dict(batch_size=args.batch_size, image_size=size, workers=workers, device=device, normalize=True,
                  mean=mean, std=std, memory_format=torch.channels_last, dtype=amp_dtype or torch.float32)
    # Small grayscale images train on flips alone (as the fashion-mnist-resnet8 recipe); photos on
    # RandomResizedCrop + flip. Evaluation: the whole 28 px image, or resize + centre crop.
    train_loader = convnets.data.Loader(args.data, train=True, seed=args.seed, max_images=args.max_train_images,
                                        crop_scale_min=1.0 if grayscale_idx else 0.08, **common)
    val_loader = convnets.data.Loader(args.data, train=False, max_images=args.max_val_images,
                                      crop_ratio=1.0 if grayscale_idx else 0.875, **common)
    batches_of = training_batches(args, train_loader, size, mean, std, device, amp_dtype, workers)
    if rank == 0:
        print(f"data: {train_loader.dataset}; {val_loader.dataset}; training batches from {args.loader}")
    print(f"rank {rank}/{world}: {len(train_loader)} batches per epoch ({train_loader.num_samples} samples), "
          f"validation {val_loader.num_samples} samples, {train_loader.workers} loader threads", flush=True)

    model = build_model(args.arch, len(train_loader.classes)).to(device, memory_format=torch.channels_last)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        model = torch.compile(model)
    lr = args.lr * args.batch_size * world / 256
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]  # BN and biases, as DLE's recipe
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": args.weight_decay},
                                 {"params": no_decay, "weight_decay": 0}], lr=lr, momentum=0.9, nesterov=True)
    steps = args.epochs * len(train_loader)
    warmup = min(len(train_loader) // 2, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))))
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and device.type == "cuda")

    losses, start, step, train_seconds, trained = [], time.perf_counter(), 0, 0.0, 0
    for epoch in range(args.epochs):
        model.train()
        epoch_loss, batches, t0 = 0.0, 0, time.perf_counter()
        for images, labels in batches_of(epoch):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            losses.append(loss.item())
            epoch_loss += losses[-1]
            batches += 1
            step += 1
            if args.max_steps and step >= args.max_steps:
                break
        epoch_seconds = time.perf_counter() - t0
        train_seconds += epoch_seconds
        trained += batches * args.batch_size * world
        top1 = evaluate(model, val_loader, device, distributed, amp_dtype)
        if rank == 0:
            stats = train_loader.stats
            loader_note = (f" (loader per image: decode {1e6 * stats['decode_s'] / max(1, stats['images']):.1f} us, "
                           f"transform {1e6 * stats['transform_s'] / max(1, stats['images']):.1f} us)"
                           if args.loader == "convnets" else "")
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {epoch_loss / max(1, batches):.4f}, "
                  f"val top-1 {top1:.2f} %, {batches * args.batch_size * world / epoch_seconds:.0f} img/s training"
                  f"{loader_note}", flush=True)
        if args.max_steps and step >= args.max_steps:
            break
    seconds = time.perf_counter() - start
    summary = {"arch": args.arch, "data": args.data, "epochs": epoch + 1, "steps": step, "world_size": world,
               "loader": args.loader, "amp": args.amp, "batch_size": args.batch_size,
               "top1": top1, "seconds": seconds, "train_img_per_s": trained / max(train_seconds, 1e-9),
               "first_losses": losses[:5], "last_losses": losses[-5:],
               "torch": torch.__version__, "convnets": convnets.__version__}
    if rank == 0:
        print(json.dumps(summary), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
    if distributed:
        dist.destroy_process_group()


def training_batches(args, convnets_loader, size, mean, std, device, amp_dtype, workers):
    """epoch -> an iterable of (images, labels) on `device`: channels-last, normalised, in the autocast dtype."""
    if args.loader == "convnets":
        def epoch_batches(epoch):
            convnets_loader.set_epoch(epoch)  # DistributedSampler's convention: a new shuffle per epoch
            return convnets_loader
        return epoch_batches
    if args.loader == "synthetic":
        gen = torch.Generator().manual_seed(args.seed)
        images = torch.randn(args.batch_size, 3, size, size, generator=gen).to(
            device, dtype=amp_dtype or torch.float32, memory_format=torch.channels_last)
        labels = torch.randint(0, len(convnets_loader.classes), (args.batch_size,), generator=gen).to(device)
        return lambda epoch: ((images, labels) for _ in range(len(convnets_loader)))
    # torchvision: what this loop is written with when convnets is not there (an image folder's train/ split).
    import torchvision.transforms as T
    root = os.path.join(args.data, "train")
    if not os.path.isdir(root):
        raise SystemExit(f"--loader torchvision reads an image folder with a train/ split; {args.data} has none")
    transform = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
    dataset = torchvision.datasets.ImageFolder(root, transform=transform)
    if args.max_train_images:
        dataset = torch.utils.data.Subset(dataset, range(min(args.max_train_images, len(dataset))))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                                         pin_memory=device.type == "cuda", drop_last=True,
                                         persistent_workers=workers > 0)

    def epoch_batches(epoch):
        for images, labels in loader:
            yield (images.to(device, dtype=amp_dtype or torch.float32, memory_format=torch.channels_last,
                             non_blocking=True), labels.to(device, non_blocking=True))
    return epoch_batches


@torch.no_grad()
def evaluate(model, loader, device, distributed, amp_dtype=None):
    """Top-1 over the whole validation set: each rank its share (every image once), the counts summed."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for images, labels in loader:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            counts[0] += (model(images).argmax(1) == labels).sum()
        counts[1] += labels.numel()
    if distributed:
        dist.all_reduce(counts)
    return 100.0 * (counts[0] / counts[1]).item()


if __name__ == "__main__":
    main()
