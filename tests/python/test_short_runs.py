"""Short runs (issue 37): `convnets train DATA --epochs 1` with the default recipe and with every built-in recipe,
and --holdout (validation on training samples, for tuning a recipe without the test split).

A one-epoch smoke test is what many users try first (DLE's main.py and timm's train.py run such a line). A recipe's
warm-up longer than the run shrinks with it, saying so; an explicit --warmup still wins. Each recipe runs one step of
one epoch on a tiny folder, on the CPU: --precision fp32 stands in for the GPU recipes' amp (refused on a CPU, naming
the flag), and the distilling GPUNet recipes run without their teacher (--enable-distill False: its weights are a
download the user provides).
"""
import json
import os
import shutil
import tempfile
import unittest

from PIL import Image

import runner

BIN = os.environ["CONVNETS_BIN"]
SOURCE = os.environ["CONVNETS_SOURCE_DIR"]


def convnets(*args, timeout=300):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


class ShortRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="convnets-short-")
        cls.data = os.path.join(cls.tmp.name, "tiny")
        for split, n in (("train", 4), ("val", 2)):
            for c, colour in (("a", (200, 40, 40)), ("b", (40, 40, 200))):
                os.makedirs(os.path.join(cls.data, split, c))
                for i in range(n):
                    Image.new("RGB", (40, 32), tuple(v + 9 * i for v in colour)).save(
                        os.path.join(cls.data, split, c, f"{i}.jpg"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def workspace(self, name):
        return os.path.join(self.tmp.name, "ws-" + name)

    def test_default_recipe_one_epoch_shrinks_the_warmup(self):
        ws = self.workspace("default")
        r = convnets("train", self.data, "--epochs", "1", "--batch-size", "2", "--prof", "1", "--workspace", ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--epochs 1 is not longer than the 8-epoch warm-up: warm-up shortened to 0 epochs "
                      "(the same 8/90 of the run)", r.stderr)
        self.assertIn("done: 1 steps", r.stdout)
        with open(os.path.join(ws, "config.json")) as f:
            self.assertEqual(json.load(f)["config"]["warmup"], 0)

    def test_per_step_warmup_keeps_its_share_and_print_config_shows_it(self):
        r = convnets("train", "--recipe", "resnet50-90ep", "--epochs", "3", "--lr-granularity", "step",
                     "--print-config")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertAlmostEqual(json.loads(r.stdout)["warmup"], 8 * 3 / 90)
        self.assertIn("warm-up shortened to 0.266667 epochs", r.stderr)

    def test_an_explicit_warmup_still_wins(self):
        r = convnets("train", self.data, "--epochs", "1", "--warmup", "2", "--workspace", self.workspace("explicit"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("--warmup must be at least 0 and less than --epochs (1), got 2", r.stderr)
        self.assertNotIn("shortened", r.stderr)

    def test_holdout_validates_on_training_samples_never_the_val_split(self):
        ws = self.workspace("holdout")
        r = convnets("train", self.data, "--holdout", "2", "--epochs", "1", "--batch-size", "2", "--prof", "1",
                     "--workspace", ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("8 images, 2 classes, 2 held out for validation (every 4th from the first)", r.stdout)
        self.assertIn("val 1/1", r.stdout)  # the 2 held-out images, not the val split's 4
        with open(os.path.join(ws, "config.json")) as f:
            self.assertIn("the 2 held out", json.load(f)["derived"]["val_data"])
        r = convnets("train", self.data, "--holdout", "8", "--epochs", "1", "--workspace", self.workspace("h8"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot hold out 8 of the 8 samples", r.stderr)
        self.assertIn("--holdout takes 1 .. 7 samples", r.stderr)
        r = convnets("train", self.data, "--holdout", "2", "--val-data", self.data, "--workspace", self.workspace("hv"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("--holdout must be used without --val-data", r.stderr)
        self.assertFalse(os.path.exists(self.workspace("h8")) or os.path.exists(self.workspace("hv")))

    def test_crop_padding_reaches_the_training_loader_and_is_checked_there(self):
        ws = self.workspace("pad")
        r = convnets("train", self.data, "--crop-padding", "4", "--image-size", "32", "--epochs", "1",
                     "--batch-size", "2", "--prof", "1", "--workspace", ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(ws, "config.json")) as f:
            self.assertEqual(json.load(f)["config"]["crop_padding"], 4)
        r = convnets("train", self.data, "--crop-padding", "32", "--image-size", "32", "--epochs", "1",
                     "--workspace", self.workspace("pad32"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("--crop-padding must be in 0..31 (less than --image-size), got 32", r.stderr)

    def test_every_builtin_recipe_runs_one_epoch(self):
        names = sorted(f[:-5] for f in os.listdir(os.path.join(SOURCE, "recipes")) if f.endswith(".json"))
        self.assertGreaterEqual(len(names), 15)
        for name in names:
            with self.subTest(recipe=name):
                with open(os.path.join(SOURCE, "recipes", name + ".json")) as f:
                    recipe = json.load(f)
                extra = ["--enable-distill", "False"] if recipe.get("teacher") else []
                ws = self.workspace(name)
                # At 64 px: the claim is the recipe's schedule and pieces in a short run; each network at its
                # own resolution is test_cli's (models) and onnx_cli's. Half the time of the 224-384 px steps.
                r = convnets("train", self.data, "--recipe", name, "--epochs", "1", "--batch-size", "2", "--prof", "1",
                             "--precision", "fp32", "--print-freq", "1", "--image-size", "64", "--workspace", ws,
                             *extra)
                self.assertEqual(r.returncode, 0, r.stderr[-2000:])
                self.assertIn("done: 1 steps", r.stdout)
                self.assertTrue(os.path.isfile(os.path.join(ws, "last.safetensors")))
                if recipe.get("warmup", 8) >= 1:
                    self.assertIn("warm-up shortened", r.stderr)
                else:
                    self.assertNotIn("warm-up shortened", r.stderr)
                # Gone before the next: 16 checkpoints of up to 600 MB (model, EMA, optimizer) would otherwise
                # wait in the page cache to be written back while the next runs.
                shutil.rmtree(ws)


if __name__ == "__main__":
    unittest.main()
