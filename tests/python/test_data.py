"""The data pipeline against PIL and torchvision: decoding, transforms, crop statistics, sampler order, CLI.

Needs CONVNETS_BIN, CONVNETS_PROBE (tests/data_probe) and CONVNETS_IMAGENET_LIKE (the
set scripts/make_imagenet_like.py writes; a CTest fixture builds it).
"""
import glob
import math
import os
import random
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import torch
from PIL import Image
from stats_helpers import ks_statistic
from torchvision import transforms
from torchvision.transforms import functional as F

import runner

PROBE = os.environ["CONVNETS_PROBE"]
BIN = os.environ["CONVNETS_BIN"]
DATA = os.environ["CONVNETS_IMAGENET_LIKE"]


def probe_many(jobs):
    """Runs probe commands in one process (LibTorch loads once); returns images or text."""
    with tempfile.TemporaryDirectory() as d:
        lines, outs = [], []
        for k, job in enumerate(jobs):
            out = os.path.join(d, "%d%s" % (k, ".txt" if job[0] in ("rrc", "sampler") else ".ppm"))
            lines.append(" ".join(str(a) for a in job) + " " + out)
            outs.append(out)
        r = subprocess.run([PROBE, "batch"], input="\n".join(lines) + "\n", capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError("data_probe failed: " + r.stderr)
        results = []
        for out in outs:
            if out.endswith(".txt"):
                with open(out) as f:
                    results.append(f.read())
            else:
                with Image.open(out) as im:
                    results.append(np.asarray(im.convert("RGB")).astype(np.int32))
        return results


def probe(*args):
    return probe_many([args])[0]


probe_image = probe


def pil_rgb(path):
    with Image.open(path) as im:
        return im.convert("RGB")


def some_files(n, split="train"):
    files = sorted(glob.glob(os.path.join(DATA, split, "*", "*.JPEG")))
    return files[:: max(1, len(files) // n)][:n]


class JpegDecode(unittest.TestCase):
    def test_full_scale_matches_pil(self):
        # Every grayscale and progressive file of the set, plus a spread of baseline ones.
        files, kinds = set(some_files(30) + some_files(10, "val")), set()
        for f in glob.glob(os.path.join(DATA, "*", "*", "*.JPEG")):
            with Image.open(f) as im:
                kind = (im.mode, bool(im.info.get("progressive") or im.info.get("progression")))
            if kind != ("RGB", False):
                files.add(f)
        files = sorted(files)
        for f in files:
            with Image.open(f) as im:
                kinds.add((im.mode, bool(im.info.get("progressive") or im.info.get("progression"))))
        self.assertIn(("L", False), kinds, "the set should include grayscale JPEGs")
        self.assertIn(("RGB", True), kinds, "the set should include progressive JPEGs")
        worst = 0
        for f, ours in zip(files, probe_many([("decode", f) for f in files])):
            ref = np.asarray(pil_rgb(f)).astype(np.int32)
            self.assertEqual(ours.shape, ref.shape, f)
            worst = max(worst, int(np.abs(ours - ref).max()))
        print("JPEG decode: %d files, max |convnets - PIL| = %d" % (len(files), worst))
        self.assertLessEqual(worst, 1)

    def test_cmyk_and_subsampling_variants_match_pil(self):
        src = pil_rgb(some_files(1)[0])
        with tempfile.TemporaryDirectory() as d:
            variants = {"cmyk": (src.convert("CMYK"), {}), "444": (src, {"subsampling": 0}),
                        "422": (src, {"subsampling": 1}), "q50": (src, {"quality": 50})}
            paths = [os.path.join(d, name + ".jpg") for name in variants]
            for path, (im, kw) in zip(paths, variants.values()):
                im.save(path, **kw)
            for name, path, ours in zip(variants, paths, probe_many([("decode", p) for p in paths])):
                self.assertLessEqual(np.abs(ours - np.asarray(pil_rgb(path)).astype(np.int32)).max(), 1, name)

    def test_region_decode_equals_crop_of_full_decode(self):
        f = some_files(1)[0]
        full = probe_image("decode", f)
        h, w = full.shape[:2]
        boxes = [(0, 0, w, h), (37, 51, 200, 150), (20, 10, 280, 290), (32, 16, 100, 100), (w - 90, h - 70, 90, 70),
                 (1, 0, 16, 9), (33, 17, 1, 1)]
        for box, region in zip(boxes, probe_many([("region", f) + b for b in boxes])):
            x, y, cw, ch = box
            np.testing.assert_array_equal(region, full[y:y + ch, x:x + cw], "region %r" % (box,))


class PngDecode(unittest.TestCase):
    def test_variants_match_pil_exactly(self):
        rgb = pil_rgb(some_files(1)[0]).resize((97, 61))
        a = np.asarray(rgb)
        with tempfile.TemporaryDirectory() as d:
            cases = {
                "rgb": rgb, "rgba": rgb.convert("RGBA"), "gray": rgb.convert("L"), "gray_alpha": rgb.convert("LA"),
                "palette": rgb.convert("P", palette=Image.ADAPTIVE, colors=37), "bilevel": rgb.convert("1"),
            }
            tr = rgb.convert("P", palette=Image.ADAPTIVE, colors=16)
            tr.info["transparency"] = 3
            cases["palette_trns"] = tr
            paths = [os.path.join(d, name + ".png") for name in cases]
            for path, im in zip(paths, cases.values()):
                im.save(path)
            for name, path, ours in zip(cases, paths, probe_many([("decode", p) for p in paths])):
                np.testing.assert_array_equal(ours, np.asarray(pil_rgb(path)).astype(np.int32), name)
            # 16-bit RGB: PIL keeps the high byte; write it by hand (PIL cannot save 16-bit RGB).
            path16 = os.path.join(d, "rgb16.png")
            write_png16(path16, a.astype(np.uint16) * 257 + 3)
            ours, ref = probe_image("decode", path16), np.asarray(pil_rgb(path16)).astype(np.int32)
            np.testing.assert_array_equal(ours, ref, "16-bit RGB")
            # 16-bit gray: PIL clips ("I;16" -> RGB saturates at 255); we keep the high byte.
            g16 = (np.asarray(rgb.convert("L")).astype(np.uint16) * 257)
            path16g = os.path.join(d, "gray16.png")
            Image.fromarray(g16.astype(np.uint16)).save(path16g)
            ours = probe_image("decode", path16g)
            np.testing.assert_array_equal(ours[..., 0], g16 >> 8)
            np.testing.assert_array_equal(ours[..., 2], g16 >> 8)


def write_png16(path, rgb16):
    import struct
    import zlib
    h, w, _ = rgb16.shape
    raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


class Transforms(unittest.TestCase):
    def test_eval_matches_torchvision(self):
        tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])
        files = sorted(glob.glob(os.path.join(DATA, "val", "*", "*.JPEG"))) + some_files(20)
        worst = 0
        for f, ours in zip(files, probe_many([("eval", f, 224, 0.875) for f in files])):
            worst = max(worst, int(np.abs(ours - np.asarray(tf(pil_rgb(f))).astype(np.int32)).max()))
        print("eval transform: %d images, max |convnets - torchvision| = %d" % (len(files), worst))
        self.assertLessEqual(worst, 2)

    def test_eval_other_sizes(self):
        f = some_files(1, "val")[0]
        cases = [(160, 0.95), (299, 0.875), (64, 1.0)]
        for (size, ratio), ours in zip(cases, probe_many([("eval", f, s, r) for s, r in cases])):
            tf = transforms.Compose([transforms.Resize(int(size / ratio)), transforms.CenterCrop(size)])
            ref = np.asarray(tf(pil_rgb(f))).astype(np.int32)
            self.assertLessEqual(np.abs(ours - ref).max(), 2, (size, ratio))

    def test_bicubic_eval_matches_torchvision(self):
        # GPUNet's eval transform: timm's Resize(floor(size / crop_pct), BICUBIC) + CenterCrop.
        files = some_files(6, "val") + some_files(4)
        cases = [(224, 0.875), (320, 1.0), (456, 1.0)]
        jobs = [("eval", f, s, r, "bicubic") for f in files for s, r in cases]
        results = iter(probe_many(jobs))
        worst = 0
        for f in files:
            for size, ratio in cases:
                tf = transforms.Compose([transforms.Resize(math.floor(size / ratio), F.InterpolationMode.BICUBIC),
                                         transforms.CenterCrop(size)])
                ours, ref = next(results), np.asarray(tf(pil_rgb(f))).astype(np.int32)
                worst = max(worst, int(np.abs(ours - ref).max()))
        print("bicubic eval: %d images x %d sizes, max |convnets - torchvision| = %d" % (len(files), len(cases), worst))
        self.assertLessEqual(worst, 2)

    def test_bicubic_crop_matches_pil_exactly(self):
        # Upscaling boxes exercise bicubic's negative lobes (sums clipped to 0..255).
        f = some_files(3)[1]
        img = pil_rgb(f)
        cases = [((10, 20, 300, 280), 0), ((16, 32, 33, 47), 1), ((0, 0, img.height, img.width), 0), ((3, 5, 9, 7), 0),
                 ((10, 20, 300, 100), 0)]
        jobs = [("crop", f) + box + (96, flip, 0, 1, "bicubic") for box, flip in cases]
        for ((top, left, h, w), flip), ours in zip(cases, probe_many(jobs)):
            ref = F.resized_crop(img, top, left, h, w, [96, 96], F.InterpolationMode.BICUBIC)
            ref = np.asarray(F.hflip(ref) if flip else ref).astype(np.int32)
            self.assertEqual(np.abs(ours - ref).max(), 0, (top, left, h, w))

    def test_crop_resize_flip_matches_pil(self):
        f = some_files(3)[2]
        img = pil_rgb(f)
        # (10, 20, 300, 100): the height shrinks by more than twice the width, so
        # Pillow 13 resizes vertically first.
        cases = [((10, 20, 300, 280), 0), ((0, 0, img.height, img.width), 1), ((5, 7, 100, 60), 1),
                 ((200, 100, 150, 390), 0), ((16, 32, 33, 47), 0), ((10, 20, 300, 100), 1)]
        jobs = []
        for box, flip in cases:
            for dct, pil in ((0, 1), (0, 0), (1, 0)):
                jobs.append(("crop", f) + box + (224, flip, dct, pil))
        results = iter(probe_many(jobs))
        for (top, left, h, w), flip in cases:
            ref = F.resized_crop(img, top, left, h, w, [224, 224])
            ref = np.asarray(F.hflip(ref) if flip else ref).astype(np.int32)
            exact, fast, dct = next(results), next(results), next(results)
            self.assertEqual(np.abs(exact - ref).max(), 0, "PIL order, full-scale decode")
            self.assertLessEqual(np.abs(fast - ref).max(), 2, "cheaper pass order: rounding only")
            # DCT-domain scaling approximates the full-scale crop.
            self.assertLess(np.abs(dct - ref).mean(), 3.0)


class RandomResizedCropDistribution(unittest.TestCase):
    N = 6000

    def torchvision_boxes(self, w, h, scale=(0.08, 1.0)):
        torch.manual_seed(1)
        img = Image.new("RGB", (w, h))
        return np.array([transforms.RandomResizedCrop.get_params(img, scale, (3 / 4, 4 / 3))
                         for _ in range(self.N)], dtype=np.float64)

    def ours(self, w, h, seed, scale_min=0.08):
        text = probe("rrc", w, h, self.N, seed, scale_min)
        return np.array([[int(v) for v in line.split()] for line in text.splitlines()], dtype=np.float64)

    def features(self, boxes, w, h):
        top, left, bh, bw = boxes.T
        return {"area": bh * bw / (w * h), "log_ratio": np.log(bw / bh), "width": bw, "height": bh,
                "top_frac": np.where(h > bh, top / np.maximum(h - bh, 1), 0.5),
                "left_frac": np.where(w > bw, left / np.maximum(w - bw, 1), 0.5)}

    def test_boxes_match_torchvision_statistically(self):
        # Two-sample Kolmogorov-Smirnov at alpha = 0.001: c(alpha) = 1.949.
        critical = 1.949 * math.sqrt(2.0 / self.N)
        for w, h in [(500, 375), (375, 500), (1000, 120)]:
            ref, ours = self.features(self.torchvision_boxes(w, h), w, h), self.features(self.ours(w, h, 7), w, h)
            for key in ref:
                d = ks_statistic(ours[key], ref[key])
                self.assertLess(d, critical, "%dx%d %s: KS D = %.4f" % (w, h, key, d))
        # The fallback (centre crop) must trigger as often as torchvision's on a
        # very elongated image, where most attempts fail.
        w, h = 2000, 50
        ref_boxes, our_boxes = self.torchvision_boxes(w, h), self.ours(w, h, 9)
        fb = lambda b: np.mean((b[:, 2] == h) & (b[:, 3] == round(h * 4 / 3)) & (b[:, 1] == (w - round(h * 4 / 3)) // 2))
        self.assertGreater(fb(ref_boxes), 0.05)
        self.assertLess(abs(fb(ref_boxes) - fb(our_boxes)), 4 * math.sqrt(fb(ref_boxes) / self.N) + 0.01)

    def test_detects_a_wrong_scale_range(self):
        # The statistic is sensitive: scale (0.2, 1) instead of (0.08, 1) is rejected.
        w, h = 500, 375
        ref = self.features(self.torchvision_boxes(w, h), w, h)
        wrong = self.features(self.ours(w, h, 7, 0.2), w, h)
        self.assertGreater(ks_statistic(wrong["area"], ref["area"]), 1.949 * math.sqrt(2.0 / self.N))


class Sampler(unittest.TestCase):
    def test_matches_distributed_sampler(self):
        from torch.utils.data.distributed import DistributedSampler
        configs = [(10, 3, 0, 0, 1, 0), (103, 4, 5, 2, 1, 0), (103, 4, 5, 2, 1, 1), (64, 8, 1, 7, 0, 0),
                   (7, 2, 3, 1, 1, 0), (5, 4, 0, 0, 1, 0)]
        cases = [(n, world, rank, seed, epoch, shuffle, drop)
                 for n, world, seed, epoch, shuffle, drop in configs for rank in range(world)]
        texts = probe_many([("sampler",) + c for c in cases])
        for case, text in zip(cases, texts):
            n, world, rank, seed, epoch, shuffle, drop = case
            s = DistributedSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=bool(shuffle),
                                   seed=seed, drop_last=bool(drop))
            s.set_epoch(epoch)
            self.assertEqual([int(v) for v in text.split()], list(s), case)
        # Across ranks, one epoch covers every index; padding repeats only the
        # first (world - n % world) of the permutation.
        for n, world, seed, epoch, shuffle, drop in configs:
            if drop:
                continue
            seen = [i for c, t in zip(cases, texts) if c[:2] == (n, world)
                    and c[3:] == (seed, epoch, shuffle, drop) for i in map(int, t.split())]
            self.assertEqual(set(seen), set(range(n)))
            self.assertEqual(len(seen), math.ceil(n / world) * world)


class BenchCli(unittest.TestCase):
    def run_cli(self, *args):
        return runner.run([BIN] + [str(a) for a in args], capture_output=True, text=True)

    def test_bench_data_reports_rate_and_times(self):
        r = self.run_cli("bench", "data", DATA, "--workers", 2, "--images", 200, "--batch-size", 16)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("image folder", r.stdout)
        self.assertRegex(r.stdout, r"images/s\s+\d+")
        self.assertRegex(r.stdout, r"decode \d+\.\d+ ms, transform \d+\.\d+ ms")
        r = self.run_cli("bench", "data", DATA, "--eval", "--workers", 1, "--images", 50, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        import json
        j = json.loads(r.stdout)
        self.assertEqual(j["mode"], "eval")
        self.assertGreater(j["images_per_s"], 0)
        self.assertIn("/val", j["dataset"])

    def test_bad_images_are_skipped_or_fail(self):
        with tempfile.TemporaryDirectory() as d:
            for c in ("a", "b"):
                os.makedirs(os.path.join(d, c))
                for f in some_files(6)[:5]:
                    shutil.copy(f, os.path.join(d, c))
            with open(some_files(1)[0], "rb") as f:
                good = f.read()
            bad = {"zero.jpg": b"", "truncated.jpg": good[: len(good) // 2], "text.jpg": b"hello, not an image\n",
                   "garbage.png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4}
            for name, data in bad.items():
                with open(os.path.join(d, "a", name), "wb") as f:
                    f.write(data)
            r = self.run_cli("bench", "data", d, "--workers", 2, "--images", 40, "--batch-size", 4)
            self.assertEqual(r.returncode, 0, r.stderr)
            for name in bad:
                self.assertEqual(r.stderr.count(os.path.join(d, "a", name)), 1, "%s reported once\n%s" % (name, r.stderr))
            self.assertRegex(r.stdout, r"epoch 0: \d+ bad images replaced")
            self.assertRegex(r.stdout, r"bad images\s+[1-9]")
            r = self.run_cli("bench", "data", d, "--workers", 2, "--images", 40, "--bad-images", "fail")
            self.assertEqual(r.returncode, 1)
            self.assertRegex(r.stderr, r"error: .*/a/(zero|truncated|text)\.jpg|garbage\.png")

    def test_bad_input_errors(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "empty_class"))
            os.makedirs(os.path.join(d, "full"))
            shutil.copy(some_files(1)[0], os.path.join(d, "full"))
            r = self.run_cli("bench", "data", d)
            self.assertEqual(r.returncode, 1)
            self.assertIn("empty_class", r.stderr)
            self.assertIn("has no images", r.stderr)
            lst = os.path.join(d, "list.txt")
            with open(lst, "w") as f:
                f.write("full/%s 0\nfull/x.jpg\n" % os.path.basename(some_files(1)[0]))
            r = self.run_cli("bench", "data", lst)
            self.assertEqual(r.returncode, 1)
            self.assertIn("list.txt:2", r.stderr)
            r = self.run_cli("bench", "data", os.path.join(d, "nothing"))
            self.assertEqual(r.returncode, 1)
            self.assertIn("no such file or directory", r.stderr)
            r = self.run_cli("bench", "data", DATA, "--bad-images", "ignore")
            self.assertEqual(r.returncode, 2)
            self.assertIn("--bad-images", r.stderr)


if __name__ == "__main__":
    unittest.main()
