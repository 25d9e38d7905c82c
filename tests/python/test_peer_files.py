"""Weights files as the peers write them, read by convnets' C++ torch.save reader (issue 46's bar): torchvision's
resnet50() and resnext50_32x4d() state dicts saved by torch.save, a timm resnet50 checkpoint written by timm's own
CheckpointSaver (its argparse arguments beside the weights), DLE's checkpoint.pth.tar layout (DDP names,
optimizer, epoch, best_prec1), and a GPUNet-0 state dict of the PyTorch GPUNet built from the spec
(bench/gpunet_reference.py).

On 10 JPEGs (one per class of the ImageNet-like fixture), each through convnets.load, `convnets classify` and
`convnets eval` gives the peer's own logits (its probabilities, its top-1) within 1e-5 relative, on the batch
convnets' eval transform makes; `train --fine-tune` starts from each. Label `accuracy`: a comparison with peers,
out of `scripts/test.sh --quick`.
"""
import argparse
import collections
import json
import os
import re
import shutil
import sys
import tempfile
import unittest

import torch

SOURCE = os.environ["CONVNETS_SOURCE_DIR"]
sys.path.insert(0, os.environ["CONVNETS_PYTHONPATH"])  # this build's package
sys.path.insert(0, os.path.join(SOURCE, "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convnets  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
SHARED = os.environ.get("CONVNETS_SHARED_DIR", "")
IMAGENET_LIKE = os.environ.get("CONVNETS_IMAGENET_LIKE", "")


def relative_error(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def cli(*args):
    r = runner.run([BIN, *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"convnets {' '.join(args)}:\n{r.stdout[-2000:]}{r.stderr}"
    return r


def settled(model):
    """Running statistics that are not the initial 0/1, so that eval-mode BN is exercised."""
    g = torch.Generator().manual_seed(5)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(4, 3, 64, 64, generator=g))
    return model.eval()


@unittest.skipUnless(os.path.isdir(IMAGENET_LIKE), "CONVNETS_IMAGENET_LIKE: the JPEG folder fixture is not built")
class PeerFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-peers-")
        cls.val = os.path.join(cls.tmp, "val")  # one image per class, in class order
        for c in sorted(os.listdir(os.path.join(IMAGENET_LIKE, "val"))):
            os.makedirs(os.path.join(cls.val, c))
            first = sorted(os.listdir(os.path.join(IMAGENET_LIKE, "val", c)))[0]
            os.symlink(os.path.join(IMAGENET_LIKE, "val", c, first), os.path.join(cls.val, c, first))
        cls.images = sorted(os.path.join(cls.val, c, f) for c in os.listdir(cls.val)
                            for f in os.listdir(os.path.join(cls.val, c)))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def check(self, arch, path, peer, **load):
        """convnets.load, classify and eval on `path` against `peer` (a torch module in eval mode)."""
        model = convnets.load(path, arch=arch, device="cpu", engine="torch", **load)
        pre = model.preprocessing
        loader = convnets.data.Loader(self.val, train=False, batch_size=len(self.images), image_size=pre["input_size"],
                                      crop_ratio=pre["crop_ratio"], interpolation=pre["interpolation"],
                                      normalize=True, mean=pre["mean"], std=pre["std"], workers=1)
        [(x, labels)] = list(loader)
        with torch.no_grad():
            theirs = peer(x)
        self.assertEqual(tuple(theirs.shape), (10, 1000))
        self.assertLess(relative_error(model(x), theirs), 1e-5, "convnets.load")
        # classify: the peer's softmax, top 5 per image, on convnets' own decoding and transform of the files.
        r = cli("classify", *self.images, "--arch", arch, "--weights", path, "--engine", "torch", "--json")
        probabilities = torch.softmax(theirs.double(), 1)
        for i, result in enumerate(json.loads(r.stdout)["results"]):
            self.assertEqual(result["path"], self.images[i])
            top = probabilities[i].topk(5)
            self.assertEqual([t["index"] for t in result["top"]], top.indices.tolist(), result["path"])
            for t, p in zip(result["top"], top.values.tolist()):
                self.assertLess(abs(t["probability"] - p), 1e-5 * max(p, 1e-3), result["path"])
        # eval: the peer's top-1 on the same images (ImageNet weights on 10 classes: --num-classes 1000).
        r = cli("eval", self.val, "--arch", arch, "--checkpoint", path, "--num-classes", "1000", "--engine", "torch",
                "--json", "-b", "10")
        expected = 100.0 * (theirs.argmax(1) == labels).double().mean().item()
        self.assertAlmostEqual(json.loads(r.stdout)["val.top1"], expected, places=9)
        # --fine-tune: a new 10-class classifier on the rest, one step.
        ws = tempfile.mkdtemp(dir=self.tmp)
        r = cli("train", IMAGENET_LIKE, "--arch", arch, "--fine-tune", path, "--epochs", "1", "--prof", "1", "-b", "2",
                "--image-size", "32", "--max-val-images", "2", "--warmup", "0", "--workspace", ws)
        self.assertIn(f"fine-tune: weights from {path}; new classifier", r.stdout)
        self.assertIn("done: 1 steps", r.stdout)

    def test_torchvision_resnet50_and_resnext50_state_dicts(self):
        import torchvision
        for arch, build in (("resnet50", torchvision.models.resnet50),
                            ("resnext50_32x4d", torchvision.models.resnext50_32x4d)):
            with self.subTest(arch=arch):
                torch.manual_seed(0)
                peer = settled(build())
                path = os.path.join(self.tmp, f"{arch}-torchvision.pth")
                torch.save(peer.state_dict(), path)
                self.check(arch, path, peer)

    def test_a_timm_checkpoint_from_its_checkpoint_saver(self):
        import timm
        from timm.utils import CheckpointSaver
        torch.manual_seed(1)
        peer = settled(timm.create_model("resnet50"))
        optimizer = torch.optim.SGD(peer.parameters(), lr=0.1, momentum=0.9)
        args = argparse.Namespace(model="resnet50", lr=0.1, epochs=1, amp=True, data_dir="/data/imagenet")
        folder = os.path.join(self.tmp, "timm-output")
        os.makedirs(folder)
        saver = CheckpointSaver(peer, optimizer, args=args, checkpoint_dir=folder, recovery_dir=folder, max_history=1)
        saver.save_checkpoint(epoch=0, metric=0.5)
        [path] = [os.path.join(folder, f) for f in os.listdir(folder) if re.match(r"checkpoint-0\.pth\.tar$", f)]
        saved = torch.load(path, weights_only=False)
        self.assertIsInstance(saved["args"], argparse.Namespace)  # what makes it timm's: its arguments beside
        self.check("resnet50", path, peer)

    def test_a_dle_checkpoint_pth_tar(self):
        import torchvision
        torch.manual_seed(2)
        peer = settled(torchvision.models.resnet50())
        dle = collections.OrderedDict()
        for k, v in peer.state_dict().items():
            dle["module." + re.sub(r"^layer(\d)\.", lambda m: f"layers.{int(m.group(1)) - 1}.", k)] = v
        params = [p for k, p in peer.named_parameters()]
        optimizer = torch.optim.SGD(params, lr=0.256, momentum=0.875)
        path = os.path.join(self.tmp, "checkpoint.pth.tar")
        torch.save({"epoch": 3, "best_prec1": 12.5, "state_dict": dle, "optimizer": optimizer.state_dict()}, path)
        self.check("resnet50", path, peer)

    @unittest.skipUnless(SHARED and os.path.isdir(os.path.join(SHARED, "reference", "gpunet")),
                         "shared/reference/gpunet is not beside the clone (CONVNETS_SHARED_DIR); it is in CI")
    def test_a_gpunet_0_state_dict(self):
        import gpunet_reference
        with open(os.path.join(SHARED, "reference", "gpunet", "0.65ms.json")) as f:
            definition = json.load(f)
        torch.manual_seed(3)
        peer = settled(gpunet_reference.GPUNet(definition))
        path = os.path.join(self.tmp, "0.65ms.pth.tar")
        torch.save({"state_dict": peer.state_dict()}, path)
        self.check("gpunet-0", path, peer)


if __name__ == "__main__":
    unittest.main()
