"""examples/train_pytorch.py, short: a plain PyTorch loop (torchvision's ResNet-18, SGD) fed by convnets.data.Loader
trains on Fashion-MNIST and on an image folder (the loss falls), and under torchrun each of 2 ranks loads its own
half of the data while DistributedDataParallel trains. The README's full run gives the accuracy it reaches.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.environ["CONVNETS_SOURCE_DIR"]
EXAMPLE = os.path.join(SOURCE, "examples", "train_pytorch.py")
IMAGENET_LIKE = os.environ["CONVNETS_IMAGENET_LIKE"]
FASHION = "/usr/share/datasets/fashion-mnist"
ENV = dict(os.environ, PYTHONPATH=os.environ["CONVNETS_PYTHONPATH"])
# The test's share of the cores as CTest gives it (tests/CMakeLists.txt); one thread per rank under torchrun.
THREADS = os.environ.get("OMP_NUM_THREADS", "2")
sys.path.insert(0, os.environ["CONVNETS_PYTHONPATH"])
import convnets  # noqa: E402
from fixtures import free_port  # noqa: E402


def run(args, launcher=None):
    out = tempfile.mktemp(suffix=".json")
    cmd = (launcher or [sys.executable]) + [EXAMPLE, *args, "--threads", "1" if launcher else THREADS, "--json", out]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        summary = json.load(f)
    os.remove(out)
    return summary, r.stdout


def sample_digests(train, max_images):
    """Each sample of a loader the example's way (its Fashion-MNIST settings), as a digest of itself or its mirror."""
    loader = convnets.data.Loader(FASHION, train=train, seed=0, max_images=max_images, batch_size=100, image_size=28,
                                  workers=1, crop_scale_min=1.0)
    return [hashlib.sha1(min(x.numpy().tobytes(), x.flip(1).numpy().tobytes())).hexdigest()
            for images, _ in loader for x in images]


# Run under torchrun: each rank writes the digests of the samples its loaders yield.
RANK_SAMPLES = """
import json, os, sys
import torch.distributed as dist
sys.path.insert(0, os.path.dirname(%r))
from test_examples import sample_digests
dist.init_process_group("gloo")
out = {"train": sample_digests(True, 3200), "val": sample_digests(False, 500)}
with open("%%s.%%d.json" %% (sys.argv[1], dist.get_rank()), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
""" % os.path.abspath(__file__)


def mean(xs):
    return sum(xs) / len(xs)


class TrainPytorchExample(unittest.TestCase):
    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_fashion_mnist_loss_falls(self):
        summary, out = run(["--epochs", "1", "--max-train-images", "3200", "--max-val-images", "500",
                            "--batch-size", "64", "--workers", "1"])
        self.assertEqual((summary["arch"], summary["steps"], summary["world_size"]), ("resnet18", 50, 1))
        self.assertLess(mean(summary["last_losses"]), mean(summary["first_losses"]) - 0.3, summary)
        self.assertGreater(summary["top1"], 30.0, out)  # far above chance (10 %) after 50 steps
        self.assertIn("28x28x1", out)

    def test_image_folder_loss_falls(self):
        summary, out = run([IMAGENET_LIKE, "--epochs", "3", "--image-size", "64", "--batch-size", "32",
                            "--workers", "2", "--lr", "0.1"])
        self.assertEqual(summary["steps"], 3 * (320 // 32))
        self.assertLess(mean(summary["last_losses"]), mean(summary["first_losses"]) - 0.2, summary)
        self.assertIn("image folder", out)


class UnderTorchrun(unittest.TestCase):
    """Two ranks of one thread each (CTest examples_torchrun)."""

    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_torchrun_two_ranks_each_load_their_half(self):
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        summary, out = run(["--epochs", "1", "--max-train-images", "3200", "--max-val-images", "500",
                            "--batch-size", "32", "--workers", "1"],
                           launcher=[torchrun, "--nproc-per-node", "2", "--master-port", str(free_port())])
        ranks = sorted(re.findall(r"rank (\d)/2: (\d+) batches per epoch \((\d+) samples\), validation (\d+)", out))
        self.assertEqual(ranks, [("0", "50", "1600", "250"), ("1", "50", "1600", "250")], out)
        self.assertEqual((summary["world_size"], summary["steps"]), (2, 50))
        self.assertLess(mean(summary["last_losses"]), mean(summary["first_losses"]) - 0.3, summary)
        # Halves, not just half the count: under torchrun, loaders built as the example builds them (rank and
        # world size left to torch.distributed) load disjoint samples that together are the whole set. A
        # training image may come flipped, so each is compared as the lesser of itself and its mirror.
        with tempfile.TemporaryDirectory(prefix="convnets-ranks-") as tmp:
            script = os.path.join(tmp, "ranks.py")
            with open(script, "w") as f:
                f.write(RANK_SAMPLES)
            r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), script,
                                os.path.join(tmp, "rank")], capture_output=True, text=True, env=ENV, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            halves = []
            for rank in (0, 1):
                with open(os.path.join(tmp, "rank.%d.json" % rank)) as f:
                    halves.append(json.load(f))
        for train, n in (("train", 3200), ("val", 500)):
            with self.subTest(split=train):
                whole = sample_digests(train == "train", n)  # one process: rank 0 of 1
                self.assertEqual(len(whole), n)
                self.assertEqual([len(h[train]) for h in halves], [n // 2, n // 2])
                # Equal as multisets: a sample both ranks loaded would leave another out (Fashion-MNIST has a few
                # pixel-identical images, so a plain set intersection would not prove anything more).
                mine = sorted(halves[0][train] + halves[1][train])
                self.assertTrue(mine == sorted(whole), "the ranks' halves are not a split of the set")


if __name__ == "__main__":
    unittest.main()
