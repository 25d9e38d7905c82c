#!/usr/bin/env python3
"""Build an ImageNet-like JPEG set from the real photographs shipped in Debian's python3-skimage.

Each class is one source photograph; each image is a random crop of it, resized
to about 500x375 (a fifth of them portrait), re-encoded as quality-90 JPEG the
way ImageNet's files mostly are (baseline, 4:2:0), with a few grayscale and
progressive files mixed in. Output: OUT/train/<class>/*.JPEG and OUT/val/...
Deterministic for a given --seed.

    .venv/bin/python scripts/make_imagenet_like.py OUT [--train-per-class 32] [--val-per-class 8] [--sources DIR]
"""
import argparse
import os
import random
import sys

from PIL import Image

# Bundled with the Debian package (no download): photographs, not charts.
SOURCES = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg",
           "retina.jpg", "motorcycle_left.png", "ihc.png", "camera.png", "coins.png"]
# Read as files, so any interpreter with Pillow will do (the project's .venv has no skimage).
DEBIAN_SKIMAGE_DATA = "/usr/lib/python3/dist-packages/skimage/data"


def skimage_data_dir():
    missing = [n for n in SOURCES if not os.path.isfile(os.path.join(DEBIAN_SKIMAGE_DATA, n))]
    if missing:
        sys.exit("make_imagenet_like.py: %s not found in %s: install Debian's python3-skimage "
                 "(scripts/setup.sh does), or give --sources DIR" % (", ".join(missing), DEBIAN_SKIMAGE_DATA))
    return DEBIAN_SKIMAGE_DATA


def make_image(src, rng):
    w, h = src.size
    frac = rng.uniform(0.55, 1.0)
    cw, ch = max(16, int(w * frac)), max(16, int(h * frac))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    out_w, out_h = (375, 500) if rng.random() < 0.2 else (500, 375)
    jitter = rng.uniform(0.9, 1.1)
    out_w, out_h = int(out_w * jitter), int(out_h * jitter)
    img = src.crop((x, y, x + cw, y + ch)).resize((out_w, out_h), Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--train-per-class", type=int, default=32)
    ap.add_argument("--val-per-class", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sources", help="folder holding the source photographs (default: python3-skimage's data); "
                    "scripts/gpu.sh carries a copy to the GPU machine, which has no skimage")
    a = ap.parse_args()
    data_dir = a.sources or skimage_data_dir()
    rng = random.Random(a.seed)
    count = 0
    for c, name in enumerate(SOURCES):
        src = Image.open(os.path.join(data_dir, name)).convert("RGB")
        cls = "n%08d_%s" % (c, os.path.splitext(name)[0])
        for split, n in (("train", a.train_per_class), ("val", a.val_per_class)):
            folder = os.path.join(a.out, split, cls)
            os.makedirs(folder, exist_ok=True)
            for k in range(n):
                img = make_image(src, rng)
                kind = rng.random()
                path = os.path.join(folder, "%s_%04d.JPEG" % (cls, k))
                if kind < 0.05:
                    img.convert("L").save(path, quality=90)
                elif kind < 0.10:
                    img.save(path, quality=90, progressive=True)
                else:
                    img.save(path, quality=90)
                count += 1
    print("make_imagenet_like: wrote %d JPEGs in %d classes to %s" % (count, len(SOURCES), a.out))


if __name__ == "__main__":
    main()
