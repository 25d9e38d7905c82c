"""Weights files as the peers write them, read by convnets' C++ torch.save reader (issue 46's bar): torchvision's
resnet50() and resnext50_32x4d() state dicts saved by torch.save, a timm resnet50 checkpoint written by timm's own
CheckpointSaver (its argparse arguments beside the weights), DLE's checkpoint.pth.tar layout (DDP names,
optimizer, epoch, best_prec1), and a GPUNet-0 state dict of the PyTorch GPUNet built from the spec
(bench/gpunet_reference.py).

On 10 JPEGs (one per class of the ImageNet-like fixture), each through convnets.load, `convnets classify` and
`convnets eval` gives the peer's own logits (its probabilities, its top-1) within 1e-5 relative, on the batch
convnets' eval transform makes. A random network's top-1 on 10 of 1,000 classes is 0 %, which any reading of the
file would also give, so each peer's classifier is first set from its own features to score exactly 8 of the 10
(meaningful_top1). `train --fine-tune` starts from each at learning rate 0: every weight but the new classifier's
must come back unchanged from the file. Label `accuracy`: a comparison with peers, out of `scripts/test.sh --quick`.
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

sys.path.insert(0, os.path.join(SOURCE, "tools"))
import pth2safetensors  # noqa: E402

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


def classifier(model):
    """The last nn.Linear: the 1,000-class head of each peer."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]


def meaningful_top1(model, x, labels):
    """Sets the classifier from the model's own features so that its top-1 on (x, labels) is exactly 80 %: row c
    is the unit direction of class c's image in the features centred over the batch (the bias subtracts the
    mean), so each image scores highest on its own row (Cauchy-Schwarz), and the rows of the last two classes are
    swapped, so those two are wrong. Rows scaled to the features' mean norm put the ten logits within a few units
    of each other, so the softmax's top five are all well above rounding; the other 990 classes get a bias a few
    units below them, so that the largest logit (relative_error's scale) stays one of the ten's size."""
    head = classifier(model)
    seen = []
    hook = head.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0].detach()))
    with torch.no_grad():
        model(x)
    hook.remove()
    f = seen[0].double()
    mean = f.mean(0)
    rows = (f - mean) / (f - mean).norm(dim=1, keepdim=True)
    scale = 4 / float((f - mean).norm(dim=1).mean())
    order = labels.tolist()
    order[-2], order[-1] = order[-1], order[-2]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-8)
        for row, c in zip(rows, order):
            head.weight[c] = row.to(head.weight.dtype) * scale
            head.bias[c] = -scale * float(row @ mean)  # so that the logit sees the centred features



@unittest.skipUnless(os.path.isdir(IMAGENET_LIKE), "CONVNETS_IMAGENET_LIKE: the JPEG folder fixture is not built")
class PeerFileChecks(unittest.TestCase):
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

    def check(self, arch, save, peer):
        """convnets.load, classify and eval on the file `save(peer)` writes against `peer` (a torch module in eval
        mode), after meaningful_top1. convnets keeps the peers' own names (torchvision's; DLE's GPUNet's), which
        the fine-tuned checkpoint is compared by."""
        pre = convnets.load(save(peer), arch=arch, device="cpu", engine="torch").preprocessing
        loader = convnets.data.Loader(self.val, train=False, batch_size=len(self.images), image_size=pre["input_size"],
                                      crop_ratio=pre["crop_ratio"], interpolation=pre["interpolation"],
                                      normalize=True, mean=pre["mean"], std=pre["std"], workers=1)
        [(x, labels)] = list(loader)
        meaningful_top1(peer, x, labels)
        path = save(peer)
        model = convnets.load(path, arch=arch, device="cpu", engine="torch")
        with torch.no_grad():
            theirs = peer(x)
        self.assertEqual(tuple(theirs.shape), (10, 1000))
        self.assertEqual((theirs.argmax(1) == labels).sum().item(), 8, "meaningful_top1 did not hold")
        self.assertLess(relative_error(model(x), theirs), 1e-5, "convnets.load")
        # classify: the peer's softmax, top 5 per image, on convnets' own decoding and transform of the files.
        r = cli("classify", *self.images, "--arch", arch, "--weights", path, "--engine", "torch", "--json")
        probabilities = torch.softmax(theirs.double(), 1)
        for i, result in enumerate(json.loads(r.stdout)["results"]):
            self.assertEqual(result["path"], self.images[i])
            top = probabilities[i].topk(5)
            # Each index with the peer's probability of that index, and the five the peer's largest: two classes
            # within rounding of each other may come in either order.
            for t, p in zip(result["top"], top.values.tolist()):
                theirs_p = probabilities[i][t["index"]].item()
                self.assertLess(abs(t["probability"] - theirs_p), 1e-5 * max(theirs_p, 1e-3), result["path"])
                self.assertLess(abs(t["probability"] - p), 1e-5 * max(p, 1e-3), result["path"])
        # eval: the peer's top-1 on the same images (ImageNet weights on 10 classes: --num-classes 1000).
        r = cli("eval", self.val, "--arch", arch, "--checkpoint", path, "--num-classes", "1000", "--engine", "torch",
                "--json", "-b", "10")
        self.assertAlmostEqual(json.loads(r.stdout)["val.top1"], 80.0, places=9)
        # --fine-tune: a new 10-class classifier on the rest, one step at learning rate 0, so every other weight
        # (parameters and buffers but BN's running statistics, which the step's batch moves) must be the file's.
        ws = tempfile.mkdtemp(dir=self.tmp)
        r = cli("train", IMAGENET_LIKE, "--arch", arch, "--fine-tune", path, "--epochs", "1", "--prof", "1", "-b", "2",
                "--image-size", "32", "--max-val-images", "2", "--warmup", "0", "--lr", "0", "--workspace", ws)
        [name] = [n for n, m in peer.named_modules() if m is classifier(peer)]
        head = (name + ".weight", name + ".bias")
        self.assertIn(f"fine-tune: weights from {path}; new classifier", r.stdout)
        self.assertIn("done: 1 steps", r.stdout)
        tensors, _ = pth2safetensors.read_safetensors(os.path.join(ws, "last.safetensors"))
        expected = peer.state_dict()
        compared = 0
        for k, v in expected.items():
            if k.endswith(("running_mean", "running_var", "num_batches_tracked")):
                continue
            with self.subTest(weight=k):
                got = tensors["model." + k]
                if k in head:
                    self.assertEqual(got.shape[0], 10)  # the folder's classes: new, not the file's
                else:
                    self.assertTrue(torch.equal(got, v), k)
                    compared += 1
        self.assertGreater(compared, 50)  # 95 tensors in GPUNet-0, 161 in ResNet-50


class PeerFiles(PeerFileChecks):
    """torchvision's, timm's and DLE's ResNet files."""

    def test_torchvision_resnet50_and_resnext50_state_dicts(self):
        import torchvision
        for arch, build in (("resnet50", torchvision.models.resnet50),
                            ("resnext50_32x4d", torchvision.models.resnext50_32x4d)):
            with self.subTest(arch=arch):
                torch.manual_seed(0)
                path = os.path.join(self.tmp, f"{arch}-torchvision.pth")

                def save(peer):
                    torch.save(peer.state_dict(), path)
                    return path
                self.check(arch, save, settled(build()))

    def test_a_timm_checkpoint_from_its_checkpoint_saver(self):
        import timm
        from timm.utils import CheckpointSaver
        torch.manual_seed(1)
        peer = settled(timm.create_model("resnet50"))
        optimizer = torch.optim.SGD(peer.parameters(), lr=0.1, momentum=0.9)
        args = argparse.Namespace(model="resnet50", lr=0.1, epochs=1, amp=True, data_dir="/data/imagenet")
        saves = []

        def save(peer):
            folder = os.path.join(self.tmp, f"timm-output-{len(saves)}")
            os.makedirs(folder)
            saver = CheckpointSaver(peer, optimizer, args=args, checkpoint_dir=folder, recovery_dir=folder,
                                    max_history=1)
            saver.save_checkpoint(epoch=0, metric=0.5)
            [path] = [os.path.join(folder, f) for f in os.listdir(folder) if re.match(r"checkpoint-0\.pth\.tar$", f)]
            saved = torch.load(path, weights_only=False)
            self.assertIsInstance(saved["args"], argparse.Namespace)  # what makes it timm's: its arguments beside
            saves.append(path)
            return path
        self.check("resnet50", save, peer)

    def test_a_dle_checkpoint_pth_tar(self):
        import torchvision
        torch.manual_seed(2)
        path = os.path.join(self.tmp, "checkpoint.pth.tar")

        def save(peer):
            dle = collections.OrderedDict()
            for k, v in peer.state_dict().items():
                dle["module." + re.sub(r"^layer(\d)\.", lambda m: f"layers.{int(m.group(1)) - 1}.", k)] = v
            optimizer = torch.optim.SGD(peer.parameters(), lr=0.256, momentum=0.875)
            torch.save({"epoch": 3, "best_prec1": 12.5, "state_dict": dle, "optimizer": optimizer.state_dict()}, path)
            return path
        self.check("resnet50", save, settled(torchvision.models.resnet50()))



@unittest.skipUnless(SHARED and os.path.isdir(os.path.join(SHARED, "reference", "gpunet")),
                     "shared/reference/gpunet is not beside the clone (CONVNETS_SHARED_DIR); it is in CI")
class PeerGpunetFile(PeerFileChecks):
    """The PyTorch GPUNet's state dict: a test of its own, which reads as skipped without ../shared."""

    def test_a_gpunet_0_state_dict(self):
        import gpunet_reference
        with open(os.path.join(SHARED, "reference", "gpunet", "0.65ms.json")) as f:
            definition = json.load(f)
        torch.manual_seed(3)
        path = os.path.join(self.tmp, "0.65ms.pth.tar")

        def save(peer):
            torch.save({"state_dict": peer.state_dict()}, path)
            return path
        self.check("gpunet-0", save, settled(gpunet_reference.GPUNet(definition)))

if __name__ == "__main__":
    unittest.main()
