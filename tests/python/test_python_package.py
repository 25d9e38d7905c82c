"""The Python package `convnets` (issue 34) against the command line it fronts.

The loader yields exactly the batches `convnets bench data --save-batches` writes for the same options, seed
and epoch (folder, augmentation, evaluation, IDX, ranks); `convnets.load(...).predict` equals `convnets
classify --json`, the loader + model loop gives `convnets eval`'s top-1, `models()` and `export()` equal their
commands. Python behaviour: exceptions of the matching type naming the file or argument, KeyboardInterrupt
during iteration, threads and memory freed, the GIL released, help() text, and `pip install` into a second
virtual environment.
"""
import collections
import gc
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)
import warnings

import numpy as np
import torch
from PIL import Image

BUILD_PYTHON = os.environ["CONVNETS_PYTHONPATH"]  # this build's staged package, not an installed one
sys.path.insert(0, BUILD_PYTHON)
import convnets  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hostile_input import png_bomb  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
SOURCE = os.environ["CONVNETS_SOURCE_DIR"]
IMAGENET_LIKE = os.environ["CONVNETS_IMAGENET_LIKE"]
FASHION = "/usr/share/datasets/fashion-mnist"


def cli(*args, timeout=600, check=True):
    r = runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"convnets {' '.join(args)}: {r.stdout}{r.stderr}"
    return r


def read_saved(path):
    """The safetensors file `bench data --save-batches` wrote, as {key: tensor} (torch reads the format itself)."""
    sys.path.insert(0, os.path.join(SOURCE, "tools"))
    import pth2safetensors
    return pth2safetensors.read_safetensors(path)[0]


def threads():
    return len(os.listdir("/proc/self/task"))


def threads_after_exit(expected, timeout=5.0):
    """threads() once it equals `expected`, or at `timeout`: pthread_join returns when the kernel clears the
    thread's id, a moment before it leaves /proc/self/task (seen under load: one task for up to about 50 ms)."""
    deadline = time.monotonic() + timeout
    while threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads()


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def shift(img, dy, dx):
    """img moved so that out[y, x] = img[y + dy, x + dx], zeros where that falls outside."""
    h, w = img.shape
    out = torch.zeros_like(img)
    out[max(0, -dy):min(h, h - dy), max(0, -dx):min(w, w - dx)] = \
        img[max(0, dy):min(h, h + dy), max(0, dx):min(w, w + dx)]
    return out


class SameBatchesAsTheCli(unittest.TestCase):
    """For the same options, seed and epoch, Python's batches are the CLI loader's, bit for bit."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="convnets-py-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def compare(self, source, cli_args, **kwargs):
        out = os.path.join(self.tmp, "batches.safetensors")
        cli("bench", "data", source, "--save-batches", out, "--json", *cli_args)
        saved = read_saved(out)
        keys = sorted({k.split(".", 1)[1] for k in saved if k.startswith("images.")},
                      key=lambda k: tuple(map(int, k.split("."))))
        self.assertGreater(len(keys), 2)
        epochs = sorted({int(k.split(".")[0]) for k in keys})
        loader = convnets.data.Loader(source, **kwargs)
        seen = 0
        for epoch in epochs:
            loader.set_epoch(epoch)
            for number, (images, labels) in enumerate(loader):
                key = f"{epoch}.{number}"
                if "images." + key not in saved:
                    break
                self.assertTrue(torch.equal(images, saved["images." + key]), key)
                self.assertTrue(torch.equal(labels, saved["labels." + key]), key)
                seen += 1
        self.assertEqual(seen, len(keys))
        return loader

    def test_training_folder_with_randaugment_and_random_interpolation(self):
        self.compare(IMAGENET_LIKE, ["--train", "--seed", "7", "--batch-size", "16", "--images", "400", "--workers", "1",
                                     "--augment", "rand-m9-mstd0.5", "--interpolation", "random", "--image-size", "96"],
                     train=True, seed=7, batch_size=16, workers=2, augment="rand-m9-mstd0.5",
                     interpolation="random", image_size=96, drop_last=False)

    def test_evaluation_folder_bicubic(self):
        loader = self.compare(IMAGENET_LIKE, ["--eval", "--batch-size", "16", "--images", "60", "--workers", "2",
                                              "--interpolation", "bicubic", "--image-size", "128"],
                              train=False, batch_size=16, workers=1, interpolation="bicubic", image_size=128)
        self.assertEqual(loader.classes, sorted(os.listdir(os.path.join(IMAGENET_LIKE, "val"))))

    def test_webdataset_shards_training_rank_1_of_2(self):
        # Shards stream (shard order, per-rank stretch, shuffle buffer): the same order must come out of both.
        shards = os.path.join(self.tmp, "shards")
        cli("pack", IMAGENET_LIKE, "-o", shards, "--shard-size", "2MB", "--shuffle", "--quiet")
        loader = self.compare(shards, ["--train", "--seed", "4", "--batch-size", "16", "--images", "160", "--workers",
                                       "2", "--image-size", "64", "--rank", "1", "--world-size", "2"],
                              train=True, seed=4, batch_size=16, workers=1, image_size=64, rank=1, world_size=2,
                              drop_last=False)
        self.assertEqual(loader.classes, sorted(os.listdir(os.path.join(IMAGENET_LIKE, "train"))))

    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_idx_training_shard_of_rank_1_of_2(self):
        loader = self.compare(FASHION, ["--train", "--seed", "3", "--batch-size", "64", "--images", "512", "--workers", "1",
                                        "--image-size", "28", "--drop-last", "--rank", "1", "--world-size", "2"],
                              train=True, seed=3, batch_size=64, workers=1, image_size=28, rank=1, world_size=2)
        self.assertEqual(loader.classes, fixtures.fashion_class_names())
        self.assertEqual(loader.channels, 1)
        self.assertEqual(len(loader), 60000 // 64 // 2)

    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_idx_training_with_crop_padding_is_the_clis_and_a_shift_of_the_unpadded(self):
        args = ["--train", "--seed", "5", "--batch-size", "64", "--images", "256", "--workers", "2",
                "--image-size", "28", "--drop-last"]
        padded = self.compare(FASHION, args + ["--crop-padding", "3"], train=True, seed=5, batch_size=64, workers=1,
                              image_size=28, crop_padding=3)
        # The shift is drawn after the crop and flip, so with the same seed each
        # padded image is its unpadded twin moved by at most 3 px, zeros shifted in.
        plain = convnets.data.Loader(FASHION, train=True, seed=5, batch_size=64, workers=1, image_size=28)
        padded.set_epoch(0)
        plain.set_epoch(0)
        shifts = set()
        for (a, _), (b, _) in zip(padded, plain):
            for x, y in zip(a[..., 0].long(), b[..., 0].long()):
                found = [(dy, dx) for dy in range(-3, 4) for dx in range(-3, 4)
                         if torch.equal(x, shift(y, dy, dx))]
                self.assertTrue(found, "a padded image is no shift of the unpadded one")
                shifts.add(found[0])
            if len(shifts) == 49:
                break
        self.assertEqual(len(shifts), 49)  # every offset in [-3, 3]^2 occurs

    def test_erasing_boxes_are_filled_where_the_cli_drew_them(self):
        out = os.path.join(self.tmp, "erase.safetensors")
        cli("bench", "data", IMAGENET_LIKE, "--save-batches", out, "--json", "--train", "--seed", "5", "--batch-size",
            "8", "--images", "16", "--workers", "1", "--image-size", "64", "--reprob", "0.9")
        saved = read_saved(out)
        loader = convnets.data.Loader(IMAGENET_LIKE, seed=5, batch_size=8, workers=1, image_size=64, reprob=0.9,
                                      remode="const", normalize=True, drop_last=False)
        images, labels = next(iter(loader))
        mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        expected = (saved["images.0.0"].permute(0, 3, 1, 2).float() / 255 - mean) / std
        boxes = saved["erase.0.0"]
        mask = torch.zeros(8, 1, 64, 64, dtype=torch.bool)
        for b in range(8):
            top, left, h, w = boxes[b, 0].tolist()
            mask[b, 0, top:top + h, left:left + w] = True
        self.assertGreater(int(mask.sum()), 0)
        self.assertTrue(torch.equal(images[mask.expand_as(images)], torch.zeros(int(mask.sum()) * 3)))
        torch.testing.assert_close(images[~mask.expand_as(images)], expected[~mask.expand_as(expected)],
                                   rtol=0, atol=1e-5)
        self.assertTrue(torch.equal(labels, saved["labels.0.0"]))


class LoaderBehaviour(unittest.TestCase):
    def test_ranks_interleave_into_the_single_process_order(self):
        kw = dict(train=True, seed=11, batch_size=8, workers=1, image_size=32)
        one = [y for _, y in convnets.data.Loader(IMAGENET_LIKE, rank=0, world_size=1, **kw)]
        r0 = [y for _, y in convnets.data.Loader(IMAGENET_LIKE, rank=0, world_size=2, **kw)]
        r1 = [y for _, y in convnets.data.Loader(IMAGENET_LIKE, rank=1, world_size=2, **kw)]
        self.assertEqual(len(r0), len(r1))
        for k in range(len(r0)):
            self.assertTrue(torch.equal(r0[k], one[2 * k]))
            self.assertTrue(torch.equal(r1[k], one[2 * k + 1]))

    def test_epochs_length_classes_and_stats(self):
        loader = convnets.data.Loader(IMAGENET_LIKE, batch_size=64, workers=2, image_size=32, seed=1)
        n = sum(len(os.listdir(os.path.join(IMAGENET_LIKE, "train", c)))
                for c in os.listdir(os.path.join(IMAGENET_LIKE, "train")))
        self.assertEqual(len(loader), n // 64)  # training drops the last partial batch by default
        self.assertEqual(len(convnets.data.Loader(IMAGENET_LIKE, batch_size=64, train=False, image_size=32)),
                         -(-len([1 for c in os.listdir(os.path.join(IMAGENET_LIKE, "val"))
                                 for _ in os.listdir(os.path.join(IMAGENET_LIKE, "val", c))]) // 64))
        first = [y for _, y in loader]
        self.assertEqual(loader.epoch, 0)
        second = [y for _, y in loader]  # the next pass is the next epoch
        self.assertEqual(loader.epoch, 1)
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(first, second)))
        loader.set_epoch(0)
        again = [y for _, y in loader]
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(first, again)))
        stats = loader.stats
        self.assertEqual((stats["epoch"], stats["images"], stats["bad_images"]), (0, len(loader) * 64, 0))
        self.assertGreater(stats["decode_s"], 0)
        self.assertEqual(len(first), len(loader))
        self.assertIn("batches per epoch", repr(loader))
        with self.assertRaisesRegex(ValueError, "set_epoch"):
            loader.set_epoch(-1)

    def test_normalised_output_in_the_dtype_and_layout_asked(self):
        raw = convnets.data.Loader(IMAGENET_LIKE, train=False, batch_size=4, image_size=48)
        x, _ = next(iter(raw))
        self.assertEqual((x.dtype, tuple(x.shape)), (torch.uint8, (4, 48, 48, 3)))
        self.assertEqual(x.is_pinned(), torch.cuda.is_available())
        mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
        for dtype, fmt in [(torch.float32, torch.channels_last), (torch.bfloat16, torch.contiguous_format)]:
            norm = convnets.data.Loader(IMAGENET_LIKE, train=False, batch_size=4, image_size=48, normalize=True,
                                        dtype=dtype, memory_format=fmt, mean=mean, std=std)
            y, _ = next(iter(norm))
            self.assertEqual((y.dtype, tuple(y.shape)), (dtype, (4, 3, 48, 48)))
            self.assertTrue(y.is_contiguous(memory_format=fmt))
            ref = (x.permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
            torch.testing.assert_close(y.float(), ref.to(dtype).float(), rtol=0, atol=1e-5 if dtype == torch.float32 else 0.02)

    def test_a_bad_file_is_skipped_with_a_warning_and_listed(self):
        tmp = tempfile.mkdtemp(prefix="convnets-py-bad-")
        try:
            for c in ("a", "b"):
                os.makedirs(os.path.join(tmp, c))
                for i in range(4):
                    Image.new("RGB", (40, 30), (60 * i, 20, 200)).save(os.path.join(tmp, c, f"{i}.jpg"))
            broken = os.path.join(tmp, "a", "1.jpg")
            with open(broken, "r+b") as f:
                f.truncate(100)
            bomb = os.path.join(tmp, "b", "bomb.png")
            png_bomb(bomb)
            loader = convnets.data.Loader(tmp, batch_size=3, workers=1, image_size=16, train=False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                batches = list(loader)
            self.assertEqual(sum(len(y) for _, y in batches), 9)
            messages = [str(w.message) for w in caught if issubclass(w.category, convnets.BadImageWarning)]
            self.assertEqual(len(messages), 2, messages)
            self.assertTrue(any(broken in m for m in messages), messages)
            self.assertTrue(any(bomb in m and "exceeds the limit" in m for m in messages), messages)
            self.assertEqual(sorted(loader.bad_files), sorted([broken, bomb]))
            self.assertEqual(loader.stats["bad_images"], 2)

            # bad_images="fail": the matching exception, naming the file; the interpreter goes on.
            strict = convnets.data.Loader(tmp, batch_size=3, workers=1, image_size=16, train=False,
                                          bad_images="fail")
            with self.assertRaises(convnets.BadImageError) as e:
                list(strict)
            self.assertIsInstance(e.exception, OSError)
            self.assertNotIsInstance(e.exception, convnets.ImageTooLargeError)
            self.assertIn(broken, str(e.exception))
            os.remove(broken)
            with self.assertRaises(convnets.ImageTooLargeError) as e:
                list(convnets.data.Loader(tmp, batch_size=3, workers=1, image_size=16, train=False, bad_images="fail"))
            self.assertIn(bomb, str(e.exception))
            self.assertIn("100000x100000", str(e.exception))
            # Without the limit the header passes and the missing data is what fails.
            with self.assertRaises(convnets.BadImageError) as e:
                list(convnets.data.Loader(tmp, batch_size=3, workers=1, image_size=16, train=False,
                                          bad_images="fail", max_image_pixels=0))
            self.assertIn(bomb, str(e.exception))
            # Other loaders still work.
            self.assertEqual(len(list(convnets.data.Loader(IMAGENET_LIKE, batch_size=8, image_size=16))), 320 // 8)
        finally:
            shutil.rmtree(tmp)

    def test_bad_arguments_raise_the_matching_exception_naming_them(self):
        missing = os.path.join(tempfile.gettempdir(), "convnets-no-such-folder")
        with self.assertRaises(FileNotFoundError) as e:
            convnets.data.Loader(missing)
        self.assertIn(missing, str(e.exception))
        cases = [(dict(batch_size=-3), "batch_size must be at least 1, got -3"),
                 (dict(image_size=0), "image_size"),
                 (dict(workers=-1), "workers"),
                 (dict(rank=2, world_size=2), "rank must be in 0..1, got 2"),
                 (dict(interpolation="lanczos"), "interpolation 'lanczos'"),
                 (dict(train=False, interpolation="random"), "interpolation 'random'"),
                 (dict(bad_images="ignore"), "bad_images 'ignore'"),
                 (dict(augment="rand-x9"), "rand-x9"),
                 (dict(reprob=0.5), "reprob"),
                 (dict(reprob=1.5, normalize=True), "reprob must be in [0, 1]"),
                 (dict(max_image_pixels=-1), "max_image_pixels"),
                 (dict(image_size=32, crop_padding=32), "crop_padding must be in 0..31"),
                 (dict(train=False, crop_padding=2), "crop_padding must be 0 for evaluation"),
                 (dict(device="tpu"), "device 'tpu'"),
                 (dict(split="test"), "split 'test'")]
        for kwargs, text in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(ValueError) as e:
                    convnets.data.Loader(IMAGENET_LIKE, **kwargs)
                self.assertIn(text, str(e.exception))
        with self.assertRaises(TypeError):
            convnets.data.Loader(IMAGENET_LIKE, batch_size="64")
        with self.assertRaises(TypeError):
            convnets.data.Loader(IMAGENET_LIKE, dtype="float16")
        with self.assertRaises(TypeError):
            convnets.data.Loader(IMAGENET_LIKE, 64)  # keyword-only, as the CLI's flags are named
        with self.assertRaises(ValueError):
            one_class = os.path.join(IMAGENET_LIKE, "train", sorted(os.listdir(os.path.join(IMAGENET_LIKE, "train")))[0])
            convnets.data.Loader(one_class)  # images, but no class folders
        loader = convnets.data.Loader(IMAGENET_LIKE, batch_size=8, image_size=16)
        loader.close()
        with self.assertRaisesRegex(ValueError, "closed"):
            iter(loader)

    def test_threads_and_memory_are_freed_when_loaders_are_dropped(self):
        gc.collect()
        before = threads()
        sizes = []
        for epoch in range(20):
            loader = convnets.data.Loader(IMAGENET_LIKE, batch_size=32, workers=2, image_size=64, seed=epoch)
            self.assertEqual(threads(), before + 2)
            for k, (x, y) in enumerate(loader):
                if k == 2:
                    break  # in the middle of an epoch, with batches in flight
            del loader, x, y
            self.assertEqual(threads_after_exit(before), before)
            sizes.append(rss_mib())
        # The first epochs settle the allocator's pools; after that nothing accumulates.
        self.assertLess(sizes[-1] - sizes[4], 16, sizes)
        with convnets.data.Loader(IMAGENET_LIKE, batch_size=8, workers=2, image_size=16) as loader:
            next(iter(loader))
        self.assertTrue(loader.closed)
        self.assertEqual(threads_after_exit(before), before)

    def test_the_gil_is_released_while_workers_decode(self):
        loader = convnets.data.Loader(IMAGENET_LIKE, batch_size=64, workers=1, image_size=224, seed=2)
        count, stop = [0], threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        # The spinner's own rate while the main thread sleeps (the GIL released for sure) is the yardstick: the
        # absolute count depends on the machine and on what else runs, the ratio does not.
        start = time.perf_counter()
        time.sleep(0.5)
        slept = time.perf_counter() - start
        free_rate = count[0] / slept
        count[0] = 0
        start = time.perf_counter()
        for _ in loader:
            pass
        elapsed = time.perf_counter() - start
        stop.set()
        t.join()
        # A loader that held the GIL while it waited would leave the spinner only Python's switch intervals between
        # batches (about 5 ms of each batch's hundreds); one that releases it leaves the spinner most of the wait.
        self.assertGreater(count[0], 0.3 * free_rate * elapsed, (count[0], free_rate, elapsed))

    def test_keyboard_interrupt_stops_the_workers_and_the_interpreter_goes_on(self):
        script = textwrap.dedent(f"""
            import os, signal, sys, threading, time
            sys.path.insert(0, {BUILD_PYTHON!r})
            import convnets
            # Batches of 256 images at 1024 px take seconds each on one worker.
            loader = convnets.data.Loader({IMAGENET_LIKE!r}, batch_size=256, workers=1, image_size=1024)
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            start = time.perf_counter()
            try:
                for batch in loader:
                    print("a batch arrived first", flush=True)
            except KeyboardInterrupt:
                waited = time.perf_counter() - start
                cpu0 = time.process_time()
                time.sleep(1.0)
                idle_cpu = time.process_time() - cpu0
                print(f"interrupted after {{waited:.2f}} s; cpu while idle {{idle_cpu:.3f}} s", flush=True)
            ok = convnets.data.Loader({IMAGENET_LIKE!r}, batch_size=16, workers=1, image_size=32)
            print("next loader", len(list(ok)), "batches", flush=True)
            loader.close()
            print("done", flush=True)
        """)
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("a batch arrived first", r.stdout)
        line = [l for l in r.stdout.splitlines() if l.startswith("interrupted")][0]
        waited, idle_cpu = float(line.split()[2]), float(line.split()[-2])
        self.assertLess(waited, 1.5, line)   # 0.5 s to the signal; a batch would take far longer
        self.assertLess(idle_cpu, 0.25, line)  # the worker stopped decoding
        self.assertIn("next loader 20 batches", r.stdout)
        self.assertIn("done", r.stdout)

    def test_help_reads_like_the_readme(self):
        import pydoc
        text = pydoc.render_doc(convnets.data.Loader, renderer=pydoc.plaintext)
        for word in ("batch_size", "set_epoch", "DistributedSampler", "bad_images", "max_image_pixels",
                     "torch.channels_last", "KeyboardInterrupt", "RandomResizedCrop"):
            self.assertIn(word, text)
        for f in ("__init__.py", "data.py", "_convnets.pyi", "py.typed"):
            self.assertTrue(os.path.exists(os.path.join(BUILD_PYTHON, "convnets", f)), f)
        self.assertIn("predict", pydoc.render_doc(convnets.Model, renderer=pydoc.plaintext))
        self.assertIn("convnets classify", convnets.load.__doc__ + convnets.Model.__doc__)


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
class Checkpoints(unittest.TestCase):
    """A checkpoint trained by the CLI, used from Python: the same answers as classify, eval and export."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-py-ckpt-")
        cls.ckpt = fixtures.fashion_resnet8()  # the suite's trained ResNet-8 with its EMA, read only
        # Test images as PNG files, plus one file that is not an image.
        import gzip
        with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
            images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:60]
        cls.pngs = []
        for i, im in enumerate(images):
            path = os.path.join(cls.tmp, f"t{i:03d}.png")
            Image.fromarray(im, mode="L").save(path)
            cls.pngs.append(path)
        cls.junk = os.path.join(cls.tmp, "junk.png")
        with open(cls.junk, "w") as f:
            f.write("not a png")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_torch_save_files_are_read_in_cpp_and_their_pickles_never_run(self):
        # The fixture's weights as PyTorch's ecosystem saves them: torchvision's bare state dict, DLE's
        # checkpoint (DataParallel names, epoch, optimizer), timm's (argparse arguments beside the weights).
        import argparse
        sys.path.insert(0, os.path.join(SOURCE, "tools"))
        from pth2safetensors import read_safetensors
        tensors, _ = read_safetensors(self.ckpt)
        weights = collections.OrderedDict((k[len("model."):], v) for k, v in tensors.items() if k.startswith("model."))
        momentum = {k: torch.zeros_like(v) for k, v in weights.items() if v.is_floating_point()}
        files = {
            "torchvision.pth": weights,
            "dle.pth.tar": {"epoch": 3, "arch": "resnet8", "best_prec1": 91.5,
                            "state_dict": collections.OrderedDict(("module." + k, v) for k, v in weights.items()),
                            "optimizer": {"state": momentum, "param_groups": [{"lr": 0.1}]}},
            "timm.pth.tar": {"epoch": 1, "arch": "resnet8", "state_dict": weights, "metric": 0.8,
                             "args": argparse.Namespace(lr=0.1, model="resnet8", amp=True)},
        }
        # A normalised batch: a plain weights file brings the arch's preprocessing, not the checkpoint's.
        x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        expected = convnets.load(self.ckpt, device="cpu", engine="torch")(x)
        for name, obj in files.items():
            path = os.path.join(self.tmp, name)
            torch.save(obj, path)
            with self.subTest(file=name):
                model = convnets.load(path, device="cpu", engine="torch", arch="resnet8", num_classes=10)
                torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
                out = os.path.join(self.tmp, name + ".safetensors")
                cli("export", "--checkpoint", path, "--arch", "resnet8", "-o", out)
                exported, _ = read_safetensors(out)
                self.assertEqual(list(exported), list(weights))
                for k, v in weights.items():
                    self.assertTrue(torch.equal(exported[k], v), k)

        # A pickle that would run code names its class and runs nothing.
        marker = os.path.join(self.tmp, "ran")

        class Payload:
            def __reduce__(self):
                return (os.system, ("touch " + marker,))

        evil = os.path.join(self.tmp, "evil.pth")
        torch.save({"state_dict": weights, "note": Payload()}, evil)
        with self.assertRaisesRegex(ValueError, r"evil\.pth: the class (posix|os)\.system is not one convnets reads"):
            convnets.load(evil, arch="resnet8", num_classes=10)
        r = cli("export", "--checkpoint", evil, "--arch", "resnet8", "-o", evil + ".safetensors", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("system is not one convnets reads", r.stderr)
        self.assertFalse(os.path.exists(marker))
        self.assertFalse(os.path.exists(evil + ".safetensors"))
        # The pre-1.6 format and a file without a state dict are named for what they are.
        legacy = os.path.join(self.tmp, "legacy.pth")
        torch.save(weights, legacy, _use_new_zipfile_serialization=False)
        with self.assertRaisesRegex(ValueError, "legacy.pth: a torch.save file in the legacy format"):
            convnets.load(legacy, arch="resnet8", num_classes=10)
        other = os.path.join(self.tmp, "other.pth")
        torch.save({"epoch": 1, "losses": [1.0, 0.5]}, other)
        with self.assertRaisesRegex(ValueError, "other.pth: no state dict in it .*holds: epoch, losses"):
            convnets.load(other, arch="resnet8", num_classes=10)

    def test_hostile_torch_save_files_are_clear_errors(self):
        # Each a ValueError naming the file from Python and exit status 1 from the CLI: never a crash.
        import zipfile
        weights = collections.OrderedDict(w=torch.arange(1000, dtype=torch.float32))
        good = os.path.join(self.tmp, "good.pth")
        torch.save(weights, good)
        with zipfile.ZipFile(good) as z:
            records = {i.filename: z.read(i) for i in z.infolist()}
        pkl = next(n for n in records if n.endswith("/data.pkl"))
        storage = next(n for n in records if re.search(r"/data/\d+$", n))

        def rewritten(name, **replace):
            path = os.path.join(self.tmp, name)
            with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
                for n, data in records.items():
                    z.writestr(n, replace.get(n, data))
            return path

        # Lists nested 10^6 deep (PROTO 2, n EMPTY_LISTs, n - 1 APPENDs, STOP): destroying them recursively
        # overflowed the stack from about 5 x 10^5.
        n = 1_000_000
        deep = rewritten("deep.pth", **{pkl: b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."})
        short = rewritten("short-storage.pth", **{storage: records[storage][:400]})  # 100 of its 1000 floats
        truncated = os.path.join(self.tmp, "truncated.pth")
        with open(good, "rb") as f, open(truncated, "wb") as out:
            out.write(f.read()[:700])
        for path, message in ((deep, "no state dict in it"),
                              (short, "holds 400 bytes, not 1000 elements of 4"),
                              (truncated, "not a readable torch.save archive")):
            with self.subTest(file=os.path.basename(path)):
                with self.assertRaisesRegex(ValueError, re.escape(path) + ".*" + message):
                    convnets.load(path, arch="resnet8", num_classes=10)
                r = cli("classify", self.pngs[0], "--arch", "resnet8", "--weights", path, check=False)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(message, r.stderr)

    def test_a_dle_checkpoint_resumes_at_its_epoch_with_its_momentum_and_ema(self):
        # DLE main.py's checkpoint.pth.tar as its Checkpointer writes it: DDP's `module.` names, torch.optim.SGD's
        # state_dict over DLE's two param groups (parameters named *bn*, then the rest), epoch = epochs done,
        # best_prec1, and state_dict_ema (--use-ema).
        sys.path.insert(0, os.path.join(SOURCE, "tools"))
        from pth2safetensors import read_safetensors
        tensors, _ = read_safetensors(self.ckpt)
        weights = collections.OrderedDict((k[len("model."):], v) for k, v in tensors.items() if k.startswith("model."))
        ema = collections.OrderedDict((k[len("ema."):], v) for k, v in tensors.items() if k.startswith("ema."))
        buffers = ("running_mean", "running_var", "num_batches_tracked")
        params = collections.OrderedDict((k, torch.nn.Parameter(v.clone())) for k, v in weights.items()
                                         if not k.endswith(buffers))
        bn = [p for k, p in params.items() if "bn" in k]
        rest = [p for k, p in params.items() if "bn" not in k]
        self.assertTrue(bn and rest and any("downsample" in k for k in params))  # both groups, a BN outside *bn*
        sgd = torch.optim.SGD([{"params": bn, "weight_decay": 0}, {"params": rest, "weight_decay": 5e-5}],
                              lr=0.1, momentum=0.875)
        g = torch.Generator().manual_seed(3)
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=g)
        sgd.step()  # a buffer per parameter, each its own values
        state = collections.OrderedDict((k, params[k].detach() if k in params else v) for k, v in weights.items())
        buffer_of = {k: sgd.state[p]["momentum_buffer"] for k, p in params.items()}
        optimizer = sgd.state_dict()
        still = {"state": {}, "param_groups": optimizer["param_groups"]}  # no step taken: no buffers yet
        dle = lambda opt: {"epoch": 2, "best_prec1": 99.25, "optimizer": opt,  # noqa: E731
                           "state_dict": collections.OrderedDict(("module." + k, v) for k, v in state.items()),
                           "state_dict_ema": collections.OrderedDict(("module." + k, v) for k, v in ema.items())}
        moving, resting = os.path.join(self.tmp, "dle-moving.pth.tar"), os.path.join(self.tmp, "dle-resting.pth.tar")
        torch.save(dle(optimizer), moving)
        torch.save(dle(still), resting)
        # Its EMA is read where weights are read.
        x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(convnets.load(moving, arch="resnet8", ema=True, device="cpu", engine="torch")(x),
                                   convnets.load(self.ckpt, ema=True, device="cpu", engine="torch")(x), rtol=0, atol=0)
        # One step of epoch 3 from each. The same weights and batch give the same gradient, so the momentum
        # after the step differs by exactly 0.875 x the buffer the file brought.
        after = {}
        for name, path in (("moving", moving), ("resting", resting)):
            ws = os.path.join(self.tmp, "resume-" + name)
            r = cli("train", FASHION, "--arch", "resnet8", "--resume", path, "--epochs", "3", "--prof", "1",
                    "--batch-size", "64", "--max-train-images", "512", "--max-val-images", "64", "--momentum", "0.875",
                    "--wd", "5e-5", "--lr", "0.1", "--warmup", "0", "--ema", "0.9", "--workspace", ws)
            self.assertIn(f"resume: {path} is DLE's checkpoint after epoch 2 (best top-1 99.25); its weights, "
                          "momentum, EMA continue as resnet8", r.stdout)
            self.assertIn("epoch 3/3 train", r.stdout)
            self.assertNotIn("epoch 1/3", r.stdout + r.stderr)
            saved, meta = read_safetensors(os.path.join(ws, "last.safetensors"))
            record = json.loads(meta["convnets"])
            self.assertEqual((record["epoch"], record["step_in_epoch"], record["step"]), (2, 1, 2 * 8 + 1))
            self.assertEqual(record["best_top1"], 99.25)  # 64 images after one step do not beat it
            after[name] = saved
        for k, buffer in buffer_of.items():
            key = "optimizer.momentum." + k
            torch.testing.assert_close(after["moving"][key] - after["resting"][key], 0.875 * buffer,
                                       rtol=1e-5, atol=1e-5, msg=key)
        # DLE's --optimizer rmsprop (torch.optim.RMSprop): its square_avg continues in convnets' rmsprop. One step
        # from the file's state and one from none: the same gradient, so the averages differ by alpha x the file's.
        rms = torch.optim.RMSprop([{"params": bn, "weight_decay": 0}, {"params": rest, "weight_decay": 5e-5}],
                                  lr=0.1, alpha=0.9, eps=1e-3, momentum=0.9)
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=g)
        rms.step()
        square_of = {k: rms.state[p]["square_avg"].clone() for k, p in params.items()}
        rms_files = {"moving": os.path.join(self.tmp, "dle-rmsprop.pth.tar"),
                     "resting": os.path.join(self.tmp, "dle-rmsprop-resting.pth.tar")}
        torch.save(dle(rms.state_dict()), rms_files["moving"])
        torch.save(dle({"state": {}, "param_groups": rms.state_dict()["param_groups"]}), rms_files["resting"])
        squares = {}
        for name, path in rms_files.items():
            ws = os.path.join(self.tmp, "resume-rmsprop-" + name)
            r = cli("train", FASHION, "--arch", "resnet8", "--resume", path, "--optimizer", "rmsprop",
                    "--rmsprop-alpha", "0.9", "--rmsprop-eps", "1e-3", "--momentum", "0.9", "--epochs", "3",
                    "--prof", "1", "--batch-size", "64", "--max-train-images", "512", "--max-val-images", "64",
                    "--wd", "5e-5", "--lr", "0.1", "--warmup", "0", "--ema", "0.9", "--workspace", ws)
            squares[name], _ = read_safetensors(os.path.join(ws, "last.safetensors"))
        for k, square in square_of.items():
            key = "optimizer.square_avg." + k
            torch.testing.assert_close(squares["moving"][key] - squares["resting"][key], 0.9 * square,
                                       rtol=1e-4, atol=1e-7, msg=key)
        # DLE's early stopping after a resume: its checkpoint keeps best_prec1 but not the epoch, so the count starts
        # with this run, as DLE's own counter does at each launch (99.25 % is not beaten in one epoch).
        r = cli("train", FASHION, "--arch", "resnet8", "--resume", moving, "--epochs", "5", "--early-stopping-patience",
                "1", "--batch-size", "64", "--max-train-images", "512", "--max-val-images", "64", "--momentum", "0.875",
                "--wd", "5e-5", "--lr", "0.1", "--warmup", "0", "--ema", "0.9",
                "--workspace", os.path.join(self.tmp, "resume-early-stop"))
        self.assertIn("early stopping: top-1 has not improved for 1 epoch (best 99.25% before this run; "
                      "--early-stopping-patience 1), stopped at epoch 3/5", r.stdout)
        r = cli("train", FASHION, "--arch", "resnet8", "--resume", rms_files["moving"], "--epochs", "3", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("was trained with --optimizer rmsprop, this run uses sgd", r.stderr)
        # A DLE file with another optimizer's state, or weights alone, is named for what it is.
        centered = torch.optim.RMSprop([{"params": bn}, {"params": rest}], lr=0.1, centered=True)
        centered.step()
        odd = os.path.join(self.tmp, "dle-centered.pth.tar")
        torch.save(dle(centered.state_dict()), odd)
        r = cli("train", FASHION, "--arch", "resnet8", "--resume", odd, "--optimizer", "rmsprop", "--epochs", "3",
                check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"{odd}: its optimizer state holds 'grad_avg', not torch.optim.SGD's momentum_buffer or a (not "
                      "centered) torch.optim.RMSprop's square_avg", r.stderr)
        plain = os.path.join(self.tmp, "dle-weights.pth")
        torch.save(state, plain)
        r = cli("train", FASHION, "--arch", "resnet8", "--resume", plain, "--epochs", "3", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"{plain}: not a DLE training checkpoint", r.stderr)

    def test_a_torchvision_pth_classifies_with_arch_and_imagenet_names(self):
        # torchvision's own file layout (torch.save of its state_dict), 1000 classes read off the classifier.
        import torchvision
        torch.manual_seed(0)
        reference = torchvision.models.resnet18().eval()
        pth = os.path.join(self.tmp, "resnet18-random.pth")
        torch.save(reference.state_dict(), pth)
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        model = convnets.load(pth, arch="resnet18", device="cpu", engine="torch")
        self.assertEqual(model.num_classes, 1000)
        with torch.no_grad():
            torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-4)
        self.assertEqual(model.classes[:3], ["tench", "goldfish", "great white shark"])
        self.assertEqual(len(set(model.classes)), 1000)
        r = cli("classify", self.pngs[0], "--arch", "resnet18", "--weights", pth, "--json", "--top-k", "2",
                "--engine", "torch")
        top = json.loads(r.stdout)["results"][0]["top"]
        self.assertEqual([t["class"] for t in top], [model.classes[t["index"]] for t in top])
        r = cli("classify", self.pngs[0], "--weights", pth, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is a plain weights file; name its --arch", r.stderr)
        # A forced key layout is used as named, and one the arch lacks is named with those it has, in each
        # front's own spelling.
        torch.testing.assert_close(convnets.load(pth, arch="resnet18", key_layout="torchvision", device="cpu",
                                                 engine="torch")(x), model(x), rtol=0, atol=0)
        with self.assertRaisesRegex(ValueError, r"^key_layout='gpunet': resnet18's weights files come as "
                                                r"torchvision \| timm \| dle \(or auto\)"):
            convnets.load(pth, arch="resnet18", key_layout="gpunet")
        r = cli("classify", self.pngs[0], "--arch", "resnet18", "--weights", pth, "--key-layout", "gpunet",
                check=False)
        self.assertIn("error: --key-layout gpunet: resnet18's weights files come as torchvision | timm | dle",
                      r.stderr)

    def test_predict_equals_classify_json(self):
        paths = self.pngs[:40] + [self.junk]
        for ema in (False, True):
            with self.subTest(ema=ema):
                r = cli("classify", *paths, "--checkpoint", self.ckpt, "--json", "--top-k", "3", "--batch-size", "16",
                        *(["--ema"] if ema else []), check=False)
                self.assertEqual(r.returncode, 1, r.stderr)  # the junk file
                expected = json.loads(r.stdout)["results"]
                model = convnets.load(self.ckpt, ema=ema, device="cpu")
                got = model.predict(paths, top_k=3, batch_size=16)
                self.assertEqual(len(got), len(expected))
                for g, e in zip(got, expected):
                    self.assertEqual(g["path"], e["path"])
                    self.assertEqual(g.get("error"), e.get("error"))
                    self.assertEqual([t["index"] for t in g.get("top", [])], [t["index"] for t in e.get("top", [])])
                    self.assertEqual([t["class"] for t in g.get("top", [])], [t["class"] for t in e.get("top", [])])
                    for a, b in zip(g.get("top", []), e.get("top", [])):
                        self.assertAlmostEqual(a["probability"], b["probability"], places=6)
                self.assertIn("junk.png", got[-1]["error"])
                self.assertEqual(model.weights, "ema" if ema else "model")

    def test_loader_and_model_give_evals_top1(self):
        r = cli("eval", FASHION, "--checkpoint", self.ckpt, "--max-images", "1000", "--json", "--batch-size", "100")
        top1 = json.loads(r.stdout)["val.top1"]
        model = convnets.load(self.ckpt, device="cpu")
        pre = model.preprocessing
        self.assertEqual((model.arch, model.num_classes, pre["input_size"]), ("resnet8", 10, 28))
        self.assertEqual(model.classes, fixtures.fashion_class_names())
        loader = convnets.data.Loader(FASHION, train=False, batch_size=100, image_size=pre["input_size"],
                                      crop_ratio=pre["crop_ratio"], max_images=1000, workers=2)
        correct = 0
        for images, labels in loader:
            logits = model(images)
            self.assertEqual((logits.dtype, tuple(logits.shape)), (torch.float32, (len(labels), 10)))
            correct += int((logits.argmax(1) == labels).sum())
        self.assertAlmostEqual(100.0 * correct / 1000, top1, places=6)
        # A normalised float batch gives the same logits as the uint8 one.
        normed = convnets.data.Loader(FASHION, train=False, batch_size=50, image_size=28, crop_ratio=1.0,
                                      normalize=True, mean=pre["mean"], std=pre["std"], max_images=50)
        raw = convnets.data.Loader(FASHION, train=False, batch_size=50, image_size=28, crop_ratio=1.0, max_images=50)
        torch.testing.assert_close(model(next(iter(normed))[0]), model(next(iter(raw))[0]), rtol=1e-5, atol=1e-5)
        with self.assertRaisesRegex(ValueError, "expected a batch of uint8"):
            model(torch.zeros(2, 28, 28))
        # The CUDA graphs' options are checked here too (where no GPU would use them), named as Python spells them.
        with self.assertRaisesRegex(ValueError, "graph_batch_sizes: expected ascending positive batch sizes"):
            convnets.load(self.ckpt, device="cpu", graph_batch_sizes=[8, 4])
        with self.assertRaisesRegex(ValueError, "graph_memory_mb must be positive"):
            convnets.load(self.ckpt, device="cpu", graph_memory_mb=0)
        # fused_conv is the CUDA graphs' (with BN folded); the keyword is taken everywhere, the answer the same.
        batch = next(iter(raw))[0]
        folded = convnets.load(self.ckpt, device="cpu", fold_bn=True, fused_conv=False)
        torch.testing.assert_close(folded(batch), model(batch), rtol=1e-4, atol=1e-4)

    def test_per_class_results_are_numpys_from_the_same_predictions(self):
        # The predictions from Python (the package's loader and model, as above), every figure from NumPy: the
        # confusion matrix and scikit-learn's per-class definitions (zero_division=0).
        csv_path = os.path.join(self.tmp, "per-class.csv")
        r = cli("eval", FASHION, "--checkpoint", self.ckpt, "--max-images", "1000", "--json", "--batch-size", "100",
                "--per-class", "--per-class-csv", csv_path)
        out = json.loads(r.stdout)
        model = convnets.load(self.ckpt, device="cpu")
        loader = convnets.data.Loader(FASHION, train=False, batch_size=100, image_size=28, crop_ratio=1.0,
                                      max_images=1000, workers=2)
        labels, top5 = [], []
        for images, y in loader:
            labels.append(y.numpy())
            top5.append(model(images).topk(5, 1).indices.numpy())
        labels, top5 = np.concatenate(labels), np.concatenate(top5)
        confusion = np.zeros((10, 10), np.int64)
        np.add.at(confusion, (labels, top5[:, 0]), 1)
        self.assertEqual(out["confusion"], confusion.tolist())
        support, predicted, correct = confusion.sum(1), confusion.sum(0), np.diag(confusion)
        hits5 = np.bincount(labels[(top5 == labels[:, None]).any(1)], minlength=10)
        pct = lambda a, b: np.where(b > 0, 100.0 * a / np.maximum(b, 1), 0.0)  # noqa: E731
        recall, precision = pct(correct, support), pct(correct, predicted)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-300), 0.0)
        rows = out["per_class"]
        self.assertEqual([row["class"] for row in rows], model.classes)
        self.assertEqual([row["images"] for row in rows], support.tolist())
        for key, want in [("top1", recall), ("top5", pct(hits5, support)), ("precision", precision),
                          ("recall", recall), ("f1", f1)]:
            np.testing.assert_allclose([row[key] for row in rows], want, rtol=1e-12, atol=1e-12, err_msg=key)
        self.assertAlmostEqual(float(np.average(recall, weights=support)), out["val.top1"], places=9)
        # The CSV holds the same, a row per true class: its figures, then its confusion-matrix row.
        import csv
        with open(csv_path, newline="") as f:
            table = list(csv.reader(f))
        self.assertEqual(table[0][:7], ["class", "images", "top1", "top5", "precision", "recall", "f1"])
        self.assertEqual(table[0][7:], [f"predicted {c}" for c in model.classes])
        self.assertEqual([[int(v) for v in row[7:]] for row in table[1:]], confusion.tolist())
        np.testing.assert_allclose([[float(v) for v in row[2:7]] for row in table[1:]],
                                   np.stack([recall, pct(hits5, support), precision, recall, f1], 1), atol=5e-5)
        # The text report names the most confused pair first.
        text = cli("eval", FASHION, "--checkpoint", self.ckpt, "--max-images", "1000", "--batch-size", "100",
                   "--per-class").stdout
        off = confusion - np.diag(correct)
        t, p = np.unravel_index(np.argmax(off), off.shape)
        names = model.classes
        self.assertIn(f"most confused (true -> predicted: images)\n  {names[t]} -> {names[p]}: {off[t, p]}\n", text)
        # `report --eval` draws them beside the training run's charts: a cell per non-zero count, its count in
        # its tooltip, and the per-class table.
        results, page = os.path.join(self.tmp, "eval.json"), os.path.join(self.tmp, "report.html")
        with open(results, "w") as f:
            f.write(r.stdout)
        run = os.path.dirname(self.ckpt)  # the fixture's workspace: its log.json
        cli("report", run, "--eval", results, "-o", page)
        with open(page, encoding="utf-8") as f:
            html = f.read()
        self.assertIn("Top-5 accuracy", html)
        self.assertIn(">Confusion matrix</text>", html)
        matrix = html[html.index(">Confusion matrix</text>"):]
        matrix = matrix[:matrix.index("</svg>")]
        self.assertEqual(matrix.count("<rect x="), int((confusion > 0).sum()) + 1)  # and the frame
        self.assertIn(f">{confusion[t, p]}</text>", matrix)  # the counts are written in the cells
        self.assertIn(f"<title>{names[t]} -> {names[p]}: {off[t, p]} images (", html)
        self.assertIn(f"<tr><td>{names[t]}</td><td>{support[t]}</td><td>", html)
        # Results without the per-class part are refused by name, before any page is written.
        bare = os.path.join(self.tmp, "bare.json")
        with open(bare, "w") as f:
            json.dump({"val.top1": 1.0}, f)
        bad = cli("report", run, "--eval", bare, "-o", os.path.join(self.tmp, "none.html"), check=False)
        self.assertEqual(bad.returncode, 1)
        self.assertIn(f"--eval {bare} holds no per-class results", bad.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "none.html")))

    def test_export_writes_what_the_command_writes(self):
        for fmt, name, extra in [("safetensors", "w.safetensors", {}), ("onnx", "m.onnx", {"fold_bn": True})]:
            with self.subTest(format=fmt):
                a, b = os.path.join(self.tmp, "cli-" + name), os.path.join(self.tmp, "py-" + name)
                cli("export", "--checkpoint", self.ckpt, "-o", a, "--format", fmt,
                    *(["--fold-bn"] if extra else []))
                line = convnets.export(self.ckpt, b, format=fmt, **extra)
                self.assertIn(b, line)
                with open(a, "rb") as fa, open(b, "rb") as fb:
                    self.assertEqual(fa.read(), fb.read())
        # A Triton repository entry: the same three files, byte for byte, from the same settings.
        flags = dict(model_name="m", max_batch_size=16, preferred_batch_sizes=[4, 8], max_queue_delay_us=50,
                     engine_count_per_device=2, backend_accelerator="trt", trt_precision="fp32")
        repos = [os.path.join(self.tmp, "cli-repo"), os.path.join(self.tmp, "py-repo")]
        cli("export", "--checkpoint", self.ckpt, "-o", repos[0], "--format", "triton", "--model-name", "m",
            "--max-batch-size", "16", "--preferred-batch-sizes", "4,8", "--max-queue-delay-us", "50",
            "--engine-count-per-device", "2", "--backend-accelerator", "trt", "--trt-precision", "fp32")
        self.assertIn(repos[1], convnets.export(self.ckpt, repos[1], format="triton", **flags))
        written = sorted(os.path.relpath(os.path.join(d, f), repos[0]) for d, _, fs in os.walk(repos[0]) for f in fs)
        self.assertEqual(len(written), 7)  # the graph's entry, the DALI step and the ensemble
        for name in written:
            with open(os.path.join(repos[0], name), "rb") as fa, open(os.path.join(repos[1], name), "rb") as fb:
                self.assertEqual(fa.read(), fb.read(), name)
        with open(os.path.join(repos[1], "m", "config.pbtxt")) as f:
            self.assertIn('parameters { key: "precision_mode" value: "FP32" }', f.read())
        with self.assertRaisesRegex(ValueError, "already exists; nothing was overwritten"):
            convnets.export(self.ckpt, repos[1], format="triton", **flags)
        # Triton's OpenVINO backend: the same config from the keyword as from the flag.
        cli("export", "--checkpoint", self.ckpt, "-o", repos[0], "--format", "triton", "--model-name", "ov",
            "--backend", "openvino", "--instance-kind", "cpu", "--preprocessing", "none")
        convnets.export(self.ckpt, repos[1], format="triton", model_name="ov", backend="openvino", instance_kind="cpu",
                        preprocessing="none")
        with open(os.path.join(repos[0], "ov", "config.pbtxt")) as fa, open(os.path.join(repos[1], "ov", "config.pbtxt")) as fb:
            text = fa.read()
            self.assertEqual(text, fb.read())
        self.assertIn('backend: "openvino"', text)
        with self.assertRaisesRegex(ValueError, "--backend openvino needs --instance-kind cpu"):
            convnets.export(self.ckpt, os.path.join(self.tmp, "ov-gpu"), format="triton", backend="openvino")
        with self.assertRaisesRegex(ValueError, "--format 'tflite'"):
            convnets.export(self.ckpt, os.path.join(self.tmp, "x"), format="tflite")
        with self.assertRaisesRegex(ValueError, "--int8 needs calibration images"):
            convnets.export(self.ckpt, os.path.join(self.tmp, "x.onnx"), format="onnx", int8=True)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "x.onnx")))

    def test_models_lists_what_the_command_lists(self):
        self.assertEqual(convnets.models(), json.loads(cli("models", "--json").stdout))

    def test_bad_checkpoints(self):
        with self.assertRaises(FileNotFoundError) as e:
            convnets.load(os.path.join(self.tmp, "none.safetensors"))
        self.assertIn("none.safetensors", str(e.exception))
        with self.assertRaisesRegex(ValueError, "junk.png"):
            convnets.load(self.junk)
        with self.assertRaisesRegex(ValueError, r"^precision='amp' needs a CUDA GPU"):
            convnets.load(self.ckpt, device="cpu", precision="amp")  # fp16 autocast is CUDA's

    def test_errors_name_the_keyword_arguments_with_the_declared_values(self):
        # One declaration per option (src/core/options.h): the same list as the CLI's, spelt as Python's.
        choices = convnets._convnets.choices()
        cases = [(dict(engine="tensorrt"), "engine 'tensorrt': expected " + " | ".join(choices["engine"])),
                 (dict(precision="fp64"), "precision 'fp64': expected " + " | ".join(choices["precision"])),
                 (dict(memory_format="nchwc"), "memory_format 'nchwc': expected nhwc | nchw"),
                 (dict(device="tpu"), "device 'tpu': expected auto | cpu | cuda")]
        for kwargs, message in cases:
            with self.subTest(**kwargs), self.assertRaises(ValueError) as e:
                convnets.load(self.ckpt, **kwargs)
            self.assertEqual(str(e.exception).splitlines()[0], message)
        out = os.path.join(self.tmp, "silu.onnx")
        with self.assertRaisesRegex(ValueError, r"^int8_silu 'sigmoid': expected ops \| float"):
            convnets.export(self.ckpt, out, format="onnx", int8=True, int8_silu="sigmoid")
        self.assertFalse(os.path.exists(out))
        # The CLI says the same of the same value in its own spelling.
        r = cli("classify", "--checkpoint", self.ckpt, "--engine", "tensorrt", self.junk, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--engine", r.stderr)
        self.assertIn("tensorrt", r.stderr)

    def test_the_documented_values_are_the_declared_ones(self):
        import re

        def described(doc, option):
            """The Args entry of `option`: its line and the indented lines under it."""
            m = re.search(r"^( *)%s: (.*(?:\n\1 +.*)*)" % option, doc, re.M)
            self.assertIsNotNone(m, option)
            return m.group(2)

        choices = convnets._convnets.choices()
        for option in ("precision", "engine", "device", "memory_format"):
            for value in choices[option]:
                self.assertIn('"%s"' % value, described(convnets.load.__doc__, option), option)
        for option, key in (("remode", "remode"), ("bad_images", "bad_images"),
                            ("interpolation", "train_interpolation")):
            for value in choices[key]:
                self.assertIn('"%s"' % value, described(convnets.data.Loader.__doc__, option), option)

    def test_loader_defaults_are_the_libraries(self):
        import inspect
        library = convnets._convnets.PipelineOptions()
        params = inspect.signature(convnets.data.Loader.__init__).parameters
        shared = [name for name in params if hasattr(library, name)]
        self.assertGreaterEqual(len(shared), 16)
        for name in shared:
            if params[name].default is not None:  # None: decided from other arguments, as documented
                self.assertEqual(params[name].default, getattr(library, name), name)


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device here: scripts/gpu.sh runs this on the GPU machine")
class Cuda(unittest.TestCase):
    """device="cuda": the uint8 batch crosses to the GPU and is normalised there as on the CPU."""

    def test_normalised_on_the_device_equals_the_cpu_path(self):
        for dtype, atol in [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)]:
            with self.subTest(dtype=dtype):
                kw = dict(train=True, seed=4, batch_size=8, image_size=64, workers=1, dtype=dtype, reprob=0.5,
                          remode="const")
                x, y = next(iter(convnets.data.Loader(IMAGENET_LIKE, device="cuda", **kw)))
                xc, yc = next(iter(convnets.data.Loader(IMAGENET_LIKE, normalize=True, **kw)))
                self.assertEqual((x.device.type, y.device.type, x.dtype), ("cuda", "cuda", dtype))
                self.assertTrue(x.is_contiguous(memory_format=torch.channels_last))
                torch.testing.assert_close(x.float().cpu(), xc.float(), rtol=0, atol=atol)
                self.assertTrue(torch.equal(y.cpu(), yc))
        raw, _ = next(iter(convnets.data.Loader(IMAGENET_LIKE, batch_size=4, image_size=32)))
        self.assertTrue(raw.is_pinned())


class PipInstall(unittest.TestCase):
    """A wheel built in the project's .venv (`pip wheel --no-build-isolation`, reusing this build), installed by pip
    into a second, new virtual environment that holds the same torch: the .venv's installed distributions linked
    in, nothing of the build tree (no build/python, no LD_LIBRARY_PATH). The package, convnets.load, the command
    and the OpenVINO engine work there, with the run paths the wheel's binaries carry."""

    def test_wheel_installs_and_runs_in_another_venv(self):
        ckpt = fixtures.fashion_resnet8()
        tmp = tempfile.mkdtemp(prefix="convnets-venv-")
        try:
            wheels = os.path.join(tmp, "wheels")
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                "--no-index", "-w", wheels, "--config-settings",
                                f"build-dir={os.path.dirname(BUILD_PYTHON)}", SOURCE],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            [wheel] = os.listdir(wheels)
            venv = os.path.join(tmp, "v")
            # Without a pip of its own (ensurepip's copy took 6 s): the project's pip installs into it, run by its
            # interpreter (pip --python).
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", venv], check=True)
            py = os.path.join(venv, "bin", "python")
            pip = [sys.executable, "-m", "pip", "--python", py]
            site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            # The same torch, openvino and their dependencies: the project's installed distributions, linked. Not
            # its .pth files (one puts build/python on the path) nor its pip.
            project_site = os.path.dirname(os.path.dirname(torch.__file__))
            own = set(os.listdir(site))
            for name in os.listdir(project_site):
                if name.endswith(".pth") or name in own or name.startswith(("convnets", "pip")):
                    continue
                os.symlink(os.path.join(project_site, name), os.path.join(site, name))
            clean = {k: v for k, v in os.environ.items()
                     if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "CONVNETS_PYTHONPATH")}
            # Its requirements are met by what is there: no --no-deps.
            r = subprocess.run([*pip, "install", "--no-index", os.path.join(wheels, wheel)],
                               capture_output=True, text=True, timeout=600, env=clean)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([*pip, "show", "convnets"], capture_output=True, text=True, env=clean)
            requires = [line for line in r.stdout.splitlines() if line.startswith("Requires:")]
            self.assertEqual(requires, ["Requires: openvino, torch"], r.stdout)
            # No run path into the building .venv: each is relative to the binary.
            installed = [os.path.join(site, "convnets", f) for f in os.listdir(os.path.join(site, "convnets"))
                         if f.endswith(".so")] + [os.path.join(venv, "bin", "convnets")]
            for binary in installed:
                dynamic = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, check=True).stdout
                paths = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "PATH)" in line]
                self.assertEqual(len(paths), 1, dynamic)
                self.assertTrue(all(p.startswith("$ORIGIN/") for p in paths[0].split(":")), (binary, paths))
            # The package and its model from there: the same logits as this build's, on OpenVINO too.
            x = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(2))
            inputs, logits = os.path.join(tmp, "x.pt"), os.path.join(tmp, "y.pt")
            torch.save(x, inputs)
            probe = textwrap.dedent(f"""
                import convnets, torch
                print(convnets.__file__)
                x = torch.load({inputs!r})
                y = {{e: convnets.load({ckpt!r}, device="cpu", engine=e)(x) for e in ("torch", "openvino")}}
                torch.save(y, {logits!r})
            """)
            r = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=tmp, env=clean)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.split()[0].startswith(site), r.stdout)
            got = torch.load(logits)
            for engine, y in got.items():
                expected = convnets.load(ckpt, device="cpu", engine=engine)(x)
                torch.testing.assert_close(y, expected, rtol=0, atol=0, msg=engine)
            # The command, with the OpenVINO engine: classify's answers equal this build's.
            image = os.path.join(tmp, "shirt.png")
            Image.fromarray(np.arange(28 * 28, dtype=np.uint8).reshape(28, 28), mode="L").save(image)
            args = ["classify", image, "--checkpoint", ckpt, "--engine", "openvino", "--json"]
            r = subprocess.run([os.path.join(venv, "bin", "convnets"), *args], capture_output=True, text=True,
                               env=clean)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["results"], json.loads(cli(*args).stdout)["results"])
            r = subprocess.run([os.path.join(venv, "bin", "convnets"), "--version"], capture_output=True, text=True,
                               env=clean)
            self.assertEqual(r.stdout, runner.run([BIN, "--version"], capture_output=True, text=True).stdout)
            # Without --no-build-isolation pip's build environment has no torch: said, not a traceback maze.
            r = subprocess.run([*pip, "install", "--no-deps", "--no-index", SOURCE],
                               capture_output=True, text=True, timeout=600, env=clean)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("--no-build-isolation", r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main()
