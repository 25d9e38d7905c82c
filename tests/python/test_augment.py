"""Augmentation against its references: each Pillow operation exactly, RandAugment's and random erasing's
random choices against timm 0.5.4's statistically, and bicubic resizing against torchvision.

Needs CONVNETS_PROBE (tests/data_probe) and CONVNETS_IMAGENET_LIKE.
"""
import glob
import math
import os
import random
import subprocess
import tempfile
import unittest
from collections import Counter

import numpy as np
from PIL import Image, ImageEnhance, ImageOps
from stats_helpers import ks_bound, ks_statistic

PROBE = os.environ["CONVNETS_PROBE"]
DATA = os.environ["CONVNETS_IMAGENET_LIKE"]


def run_probe(lines):
    r = subprocess.run([PROBE, "batch"], input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("data_probe failed: " + r.stderr)


def test_images():
    """A photo-like crop and a small random image (every value occurs: exercises the LUT edges)."""
    f = sorted(glob.glob(os.path.join(DATA, "train", "*", "*.JPEG")))[3]
    with Image.open(f) as im:
        photo = im.convert("RGB").resize((97, 83), Image.BILINEAR)
    noise = Image.fromarray(np.random.RandomState(0).randint(0, 256, (40, 52, 3), dtype=np.uint8))
    return [photo, noise]


# Each case: (probe op, args, resample, the Pillow call). FILL is timm's ImageNet mean colour.
FILL = (124, 116, 104)
RESAMPLE = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def pil_cases():
    cases = []
    for r in ("bilinear", "bicubic", "nearest"):
        for a in [(1, 0.27, 0, 0, 1, 0), (1, 0, 0, -0.3, 1, 0), (1, 0, 31.7, 0, 1, 0), (1, 0, 0, 0, 1, -12.0),
                  (1, 0, -25, 0, 1, 0), (0.9, 0.1, 3.3, -0.2, 1.1, -2.5)]:
            cases.append(("affine", a, r, lambda im, a=a, r=r: im.transform(im.size, Image.AFFINE, a, RESAMPLE[r],
                                                                            fillcolor=FILL)))
        for deg in (27.0, -13.4, 90.0, 180.0, 270.0, 0.0, 3.0, -360.5):
            cases.append(("rotate", (deg,), r, lambda im, d=deg, r=r: im.rotate(d, RESAMPLE[r], fillcolor=FILL)))
    cases += [("autocontrast", (0,), "bilinear", ImageOps.autocontrast),
              ("equalize", (0,), "bilinear", ImageOps.equalize),
              ("invert", (0,), "bilinear", ImageOps.invert)]
    for bits in (1, 3, 4, 7, 8):
        cases.append(("posterize", (bits,), "bilinear", lambda im, b=bits: ImageOps.posterize(im, b)))
    for t in (0, 76.8, 128, 230, 256):
        cases.append(("solarize", (t,), "bilinear", lambda im, t=t: ImageOps.solarize(im, t)))
    for add in (0, 33, 99, 110):
        lut = [min(255, i + add) if i < 128 else i for i in range(256)]
        cases.append(("solarize_add", (add,), "bilinear", lambda im, lut=lut: im.point(lut * 3)))
    for factor in (0.0, 0.1, 0.28, 1.0, 1.18, 1.72, 1.9, 2.6):
        for name, cls in (("color", ImageEnhance.Color), ("contrast", ImageEnhance.Contrast),
                          ("brightness", ImageEnhance.Brightness), ("sharpness", ImageEnhance.Sharpness)):
            cases.append((name, (factor,), "bilinear", lambda im, c=cls, f=factor: c(im).enhance(f)))
    return cases


class PillowOps(unittest.TestCase):
    def test_each_op_equals_pillow(self):
        images, cases = test_images(), pil_cases()
        with tempfile.TemporaryDirectory() as d:
            lines, expected = [], []
            for i, im in enumerate(images):
                src = os.path.join(d, "in%d.ppm" % i)
                im.save(src)
                for k, (op, args, r, ref) in enumerate(cases):
                    out = os.path.join(d, "out%d_%d.ppm" % (i, k))
                    lines.append("augop %s %s %s %s %s %s" % (src, op, ",".join(str(a) for a in args), r,
                                                            ",".join(str(c) for c in FILL), out))
                    expected.append((out, ref(im), op, args, r, im.size))
            run_probe(lines)
            worst = {}
            for out, ref, op, args, r, size in expected:
                with Image.open(out) as o:
                    ours = np.asarray(o.convert("RGB")).astype(np.int32)
                diff = int(np.abs(ours - np.asarray(ref).astype(np.int32)).max())
                worst[op] = max(worst.get(op, 0), diff)
                self.assertEqual(diff, 0, "%s%s %s on %s: max |convnets - Pillow| = %d" % (op, args, r, size, diff))
        print("Pillow ops, %d cases x %d images: max difference per op %s" % (len(cases), len(images), worst))

    def test_each_op_equals_pillow_on_grey_images(self):
        # One-channel images (Fashion-MNIST's) take the scalar paths: Pillow's mode "L" operations.
        im = test_images()[0].convert("L")
        fill = 124
        cases = [("affine", (1, 0.27, 0, 0, 1, 0), "bicubic", lambda i: i.transform(i.size, Image.AFFINE,
                                                                                   (1, 0.27, 0, 0, 1, 0),
                                                                                   Image.BICUBIC, fillcolor=fill)),
                 ("affine", (1, 0, 31.7, 0, 1, 0), "bilinear", lambda i: i.transform(i.size, Image.AFFINE,
                                                                                    (1, 0, 31.7, 0, 1, 0),
                                                                                    Image.BILINEAR, fillcolor=fill)),
                 ("rotate", (-13.4,), "nearest", lambda i: i.rotate(-13.4, Image.NEAREST, fillcolor=fill)),
                 ("rotate", (27.0,), "bicubic", lambda i: i.rotate(27.0, Image.BICUBIC, fillcolor=fill)),
                 ("autocontrast", (0,), "bilinear", ImageOps.autocontrast),
                 ("equalize", (0,), "bilinear", ImageOps.equalize),
                 ("posterize", (3,), "bilinear", lambda i: ImageOps.posterize(i, 3)),
                 ("solarize_add", (99,), "bilinear",
                  lambda i: i.point([min(255, v + 99) if v < 128 else v for v in range(256)]))]
        for factor in (0.28, 1.72):
            for name, cls in (("color", ImageEnhance.Color), ("contrast", ImageEnhance.Contrast),
                              ("brightness", ImageEnhance.Brightness), ("sharpness", ImageEnhance.Sharpness)):
                cases.append((name, (factor,), "bilinear", lambda i, c=cls, f=factor: c(i).enhance(f)))
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "in.pgm")
            im.save(src)
            lines = ["augop %s %s %s %s %d,%d,%d %s" % (src, op, ",".join(str(a) for a in args), r, fill, fill, fill,
                                                      os.path.join(d, "%d.pgm" % k))
                     for k, (op, args, r, _) in enumerate(cases)]
            run_probe(lines)
            for k, (op, args, r, ref) in enumerate(cases):
                with Image.open(os.path.join(d, "%d.pgm" % k)) as o:
                    self.assertEqual(o.mode, "L")
                    ours = np.asarray(o).astype(np.int32)
                diff = int(np.abs(ours - np.asarray(ref(im)).astype(np.int32)).max())
                self.assertEqual(diff, 0, "%s%s %s on a grey image: max |convnets - Pillow| = %d" % (op, args, r, diff))

    def test_posterize_zero_bits_is_black(self):
        # timm's Posterize keeps int(m / 10 * 4) bits: 0 below m = 2.5, which Pillow <= 9.5 (GPUNet's) made
        # black; Pillow 13 refuses 0 bits, so the reference here is the black image itself.
        im = test_images()[1]
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "in.ppm"), os.path.join(d, "out.ppm")
            im.save(src)
            run_probe(["augop %s posterize 0 bilinear 0,0,0 %s" % (src, out)])
            with Image.open(out) as o:
                self.assertEqual(int(np.asarray(o).max()), 0)


class TimmDistributions(unittest.TestCase):
    """convnets' choices follow timm 0.5.4's: timm's own RandAugment and RandomErasing are traced here."""
    N = 4000

    def ours(self, policy):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "t.txt")
            run_probe(["augtrace %s %d 7 24 %s" % (policy, self.N, out)])
            with open(out) as f:
                text = f.read()
        images = [[(l.split()[0], float(l.split()[1])) for l in block.strip().splitlines() if l.strip()]
                  for block in text.split("--\n")[:-1]]
        self.assertEqual(len(images), self.N)
        return images

    def timm(self, policy):
        from timm.data import auto_augment as aa
        random.seed(3)
        np.random.seed(3)
        t = aa.rand_augment_transform(policy, {"img_mean": FILL})
        images = []
        for op in t.ops:  # record what each op is called with instead of running Pillow
            def call(img, *args, _op=op, **kw):
                images[-1].append((_op.name, float(args[0]) if args else 0.0))
                return img
            op.aug_fn = call
        img = Image.new("RGB", (24, 24))
        for _ in range(self.N):
            images.append([])
            t(img)
        return images

    def compare(self, policy, names):
        ours, ref = self.ours(policy), self.timm(policy)
        for label, a, b in (("ops per image", [len(x) for x in ours], [len(x) for x in ref]),):
            ca, cb = Counter(a), Counter(b)
            for k in set(ca) | set(cb):  # binomial(2, 0.5): 1/4, 1/2, 1/4
                self.assertLess(abs(ca[k] - cb[k]) / self.N, 0.03, (label, k, ca, cb))
        oa = Counter(name for x in ours for name, _ in x)
        ob = Counter(name.replace("Increasing", "") for x in ref for name, _ in x)
        self.assertEqual(set(oa), set(names))
        self.assertEqual(set(ob), set(names))
        total_a, total_b = sum(oa.values()), sum(ob.values())
        for n in names:  # each op 1/15 of the applied ones
            self.assertLess(abs(oa[n] / total_a - ob[n] / total_b), 0.02, (n, oa[n], ob[n]))
        for n in ("Rotate", "ShearX", "TranslateYRel", "Color", "Solarize", "Posterize", "SolarizeAdd"):
            a = np.array([v for x in ours for name, v in x if name == n])
            b = np.array([v for x in ref for name, v in x if name.replace("Increasing", "") == n])
            d = ks_statistic(a, b)
            self.assertLess(d, 1.2 * ks_bound(len(a), len(b)), (n, d))
        return ours, ref

    def test_rand_m9_mstd05(self):
        names = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
                 "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
        ours, _ = self.compare("rand-m9-mstd0.5", names)
        rot = np.array([v for x in ours for n, v in x if n == "Rotate"])
        self.assertAlmostEqual(float(np.mean(rot > 0)), 0.5, delta=0.06)  # the random sign
        self.assertLessEqual(float(np.abs(rot).max()), 30.0)

    def test_rand_increasing(self):
        names = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
                 "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
        self.compare("rand-m7-n3-mstd1-inc1", names)

    def test_autoaugment_follows_dle_policy_table(self):
        # DLE's ImageNet policy: a uniform sub-policy, then each op with its probability. Expected count of each
        # op per image = sum over sub-policies of p / 25.
        table = [("Equalize", .8, "ShearY", .8), ("Color", .4, "Equalize", .6), ("Color", .4, "Rotate", .6),
                 ("Solarize", .8, "Equalize", .4), ("Solarize", .4, "Solarize", .6), ("Color", .2, "Equalize", .8),
                 ("Equalize", .4, "SolarizeAdd", .8), ("ShearX", .2, "Rotate", .6), ("Color", .6, "Equalize", 1.),
                 ("Invert", .4, "Rotate", .6), ("Equalize", 1., "ShearY", .6), ("Color", .4, "Equalize", .6),
                 ("Posterize", .4, "AutoContrast", .4), ("Solarize", .6, "Color", .6), ("Solarize", .2, "Rotate", .8),
                 ("Rotate", 1., "TranslateY", .8), ("ShearX", 0., "Solarize", .8), ("ShearY", .8, "Color", .6),
                 ("Color", 1., "Rotate", .6), ("Equalize", .8, "Equalize", 0.), ("Equalize", 1., "AutoContrast", .6),
                 ("ShearY", .4, "SolarizeAdd", .6), ("Posterize", .8, "Solarize", .6), ("Solarize", .6, "Equalize", .6),
                 ("Color", .8, "Rotate", .4)]
        expected = Counter()
        for o1, p1, o2, p2 in table:
            expected[o1] += p1 / 25
            expected[o2] += p2 / 25
        ours = self.ours("autoaugment")
        counts = Counter(name for x in ours for name, _ in x)
        self.assertEqual(set(counts), {k for k, v in expected.items() if v > 0})
        for op, e in expected.items():
            sd = math.sqrt(e / self.N)  # Poisson-like bound on the per-image mean
            self.assertLess(abs(counts[op] / self.N - e), 4 * sd + 0.005, (op, counts[op] / self.N, e))

    def test_random_erasing_boxes(self):
        import torch
        from timm.data.random_erasing import RandomErasing
        random.seed(5)
        re = RandomErasing(probability=0.25, mode="const", device="cpu")
        ref = []
        for _ in range(self.N):
            x = torch.ones(1, 3, 40, 40)
            re(x)
            hit = (x[0, 0] == 0).nonzero()
            ref.append((0, 0, 0, 0) if len(hit) == 0 else
                       (int(hit[:, 0].min()), int(hit[:, 1].min()), int(hit[:, 0].max() - hit[:, 0].min() + 1),
                        int(hit[:, 1].max() - hit[:, 1].min() + 1)))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "e.txt")
            run_probe(["erase %d 11 40 0.25 %s" % (self.N, out)])
            with open(out) as f:
                ours = [tuple(int(v) for v in l.split()) for l in f.read().splitlines()]
        ours_hit = [b for b in ours if b[2] > 0]
        ref_hit = [b for b in ref if b[2] > 0]
        self.assertAlmostEqual(len(ours_hit) / self.N, 0.25, delta=0.025)
        self.assertAlmostEqual(len(ours_hit) / self.N, len(ref_hit) / self.N, delta=0.03)
        for i, label in ((2, "height"), (3, "width"), (0, "top")):
            a = np.array([b[i] for b in ours_hit], float)
            b = np.array([b[i] for b in ref_hit], float)
            d = ks_statistic(a, b)
            self.assertLess(d, 1.2 * ks_bound(len(a), len(b)), (label, d))
        for t, l, h, w in ours_hit:
            self.assertTrue(0 < h < 40 and 0 < w < 40 and t + h <= 40 and l + w <= 40)
        # The mean erased area: U(0.02, 1/3) of the image, so about 0.177 x 1600 px (boxes that fit).
        self.assertAlmostEqual(np.mean([h * w for _, _, h, w in ours_hit]) / 1600,
                               np.mean([h * w for _, _, h, w in ref_hit]) / 1600, delta=0.015)


if __name__ == "__main__":
    unittest.main()
