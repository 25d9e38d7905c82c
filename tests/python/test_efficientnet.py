"""The TF-ported EfficientNets (DLE's GPUNet teachers) against timm 0.5.4 itself (in .venv): timm builds
each model with random weights, tools/pth2safetensors.py converts its .pth, convnets loads it and runs a
forward pass, and timm runs the same input. Keys, order, shapes, parameter counts and logits must agree;
the ONNX export must agree under ONNX Runtime; a misfit file is refused naming the tensor.
"""
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

import cv2
import numpy as np
import onnx
import onnxruntime
import torch

SOURCE = os.environ["CONVNETS_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SOURCE, "tools"))
import pth2safetensors  # noqa: E402
import runner  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # timm 0.5.4 on a newer torch warns about deprecated imports
    import timm  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"
# Forward-pass sizes. SAME padding differs from symmetric padding only where a strided conv meets an even
# size, and global pooling hides much of a one-pixel shift: at 260 px (130, 65, 33, 17) padding the odd
# pixel at the top-left instead moves B2's logits by only 7e-6, at 192 px (96, 48, 24, 12) by 3e-2. So
# B2 runs at its own 260 and at 192, B5 and B6 at sizes even down to the last stride (and small, for speed).
ARCHS = {"tf_efficientnet_b2": (260, 192), "tf_efficientnet_b5_ns": (96,), "tf_efficientnet_b6_ns": (128,)}
ONNX_SIZE = 192
# timm 0.5.4 default_cfg of each: input size, crop_pct (bicubic, ImageNet mean/std for all three).
DEFAULT_CFG = {"tf_efficientnet_b2": (260, 0.890), "tf_efficientnet_b5_ns": (456, 0.934),
               "tf_efficientnet_b6_ns": (528, 0.942)}
TOLERANCE = 1e-4  # max |logit difference|


def convnets(*args, timeout=600):
    return runner.run([BIN, "--threads", "2", *args], capture_output=True, text=True, timeout=timeout)


def timm_model(name, num_classes=1000):
    """timm's model with random weights whose BN statistics, BN affine parameters and SE biases are far
    from their initial 0/1, so that BN's eps, folding and every bias matter."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = timm.create_model(name, pretrained=False, num_classes=num_classes).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                var = torch.rand(m.num_features, generator=g) * 0.5 + 0.01  # small: eps=1e-3 vs 1e-5 shows
                m.running_var.copy_(var)
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                # gamma ~ 0.8 sqrt(var + eps) keeps 50-100 blocks well conditioned.
                m.weight.copy_((var + m.eps).sqrt() * (0.7 + 0.2 * torch.rand(m.num_features, generator=g)))
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            elif isinstance(m, torch.nn.Conv2d) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
        # timm's classifier init, U(+-1/sqrt(1000)), gives logits of ~0.1; these give ~1-10, so that the
        # 1e-4 tolerance is 1e-5 of them.
        fc = model.classifier
        fc.weight.copy_(torch.randn(fc.weight.shape, generator=g) * 32 / fc.in_features ** 0.5)
    return model


@contextlib.contextmanager
def near_misses(model):
    """timm's model with BN eps 1e-5 (PyTorch's default, not TF's 1e-3), then with timm's Conv2dSame padding
    the odd pixel at the top-left (ONNX's SAME_LOWER) instead of the bottom-right: the mistakes a port
    makes, which the comparison must see."""
    conv2d_same = sys.modules["timm.models.layers.conv2d_same"]
    same = [m for m in model.modules() if isinstance(m, conv2d_same.Conv2dSame)]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]

    def top_left(c):
        def forward(x):
            pads = [max((math.ceil(n / s) - 1) * s + k - n, 0)
                    for n, k, s in zip(x.shape[-2:], c.kernel_size, c.stride)]
            x = torch.nn.functional.pad(x, [pads[1] - pads[1] // 2, pads[1] // 2, pads[0] - pads[0] // 2, pads[0] // 2])
            return torch.nn.functional.conv2d(x, c.weight, c.bias, c.stride, 0, c.dilation, c.groups)
        return forward

    def eps(x):
        for m in norms:
            m.eps = 1e-5
        try:
            return model(x)
        finally:
            for m in norms:
                m.eps = 1e-3

    def padding(x):
        for m in same:
            m.forward = top_left(m)
        try:
            return model(x)
        finally:
            for m in same:
                del m.forward

    yield {"BN eps 1e-5": eps, "SAME_LOWER padding": padding}


class TimmCase(unittest.TestCase):
    """A folder per class, timm's networks and their weights as convnets reads them."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-efficientnet-")
        cls.models = {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def converted(self, name, num_classes=1000):
        """timm's state_dict saved as a .pth and converted by tools/pth2safetensors.py, as a user would."""
        out = self.path("%s-%d.safetensors" % (name, num_classes))
        if not os.path.exists(out):
            model = timm_model(name, num_classes)
            pth = self.path("%s-%d.pth" % (name, num_classes))
            torch.save(model.state_dict(), pth)
            r = subprocess.run([*runner.PYTHON, os.path.join(SOURCE, "tools", "pth2safetensors.py"), pth, out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.models[(name, num_classes)] = model
        return out

    def forward(self, name, weights, size, batch=2):
        """convnets loads `weights`, runs --forward, saves its own state_dict; returns (info, io, saved)."""
        io, saved = self.path("%s-%d.io.safetensors" % (name, size)), self.path(name + ".saved.safetensors")
        r = convnets("models", "--arch", name, "--weights", weights, "--forward", "--batch-size", str(batch),
                     "--input-size", str(size), "--seed", "5", "--forward-save", io, "--save", saved, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout), pth2safetensors.read_safetensors(io)[0], pth2safetensors.read_safetensors(saved)[0]


class AgainstTimm(TimmCase):
    """Keys, logits, the ONNX graph and distillation against timm itself (CTest efficientnet_accuracy)."""

    def test_keys_parameters_and_logits_equal_timm(self):
        for name, sizes in ARCHS.items():
            with self.subTest(name):
                start = time.time()
                weights = self.converted(name)
                model = self.models[(name, 1000)]
                params = sum(p.numel() for p in model.parameters())
                for size in sizes:
                    info, io, saved = self.forward(name, weights, size)
                    with torch.no_grad():
                        expected = model(io["input"])
                    diff = (io["logits"].double() - expected.double()).abs().max().item()
                    print("%s at %d px: %d parameters (timm %d), max |logit difference| %.3g (logits: std %.3g, "
                          "max %.3g)" % (name, size, info["params"], params, diff, expected.std().item(),
                                         expected.abs().max().item()))
                    self.assertLessEqual(diff, TOLERANCE)
                    self.assertGreater(expected.std().item(), 1.0, "logits must not be degenerate")
                    if size % 32 == 0:  # every strided conv meets an even size
                        with near_misses(model) as misses, torch.no_grad():
                            for what, run in misses.items():
                                miss = (run(io["input"]) - expected).abs().max().item()
                                self.assertGreater(miss, 100 * TOLERANCE, what + " would pass unseen")
                self.assertEqual(info["params"], params)
                # The state_dict convnets writes is timm's: the same keys in the same order, the same tensors.
                reference = model.state_dict()
                self.assertEqual(list(saved), list(reference))
                for k, v in reference.items():
                    self.assertTrue(torch.equal(saved[k], v), k)
                # timm's default_cfg
                input_size, crop = DEFAULT_CFG[name]
                self.assertEqual(model.default_cfg["input_size"], (3, input_size, input_size))
                self.assertEqual(info["input_size"], input_size)
                self.assertAlmostEqual(info["crop_ratio"], crop)
                self.assertAlmostEqual(model.default_cfg["crop_pct"], crop)
                self.assertEqual(info["interpolation"], model.default_cfg["interpolation"])
                self.assertEqual(tuple(info["mean"]), model.default_cfg["mean"])
                self.assertEqual(tuple(info["std"]), model.default_cfg["std"])
                print("%s: %.1f s" % (name, time.time() - start))

    def test_onnx_export_matches_under_onnxruntime(self):
        name, size = "tf_efficientnet_b2", ONNX_SIZE
        weights = self.converted(name)
        _, io, _ = self.forward(name, weights, size)
        x, ours = io["input"].numpy(), io["logits"].numpy()
        for extra in ([], ["--fold-bn", "--dynamic-batch"]):
            with self.subTest(" ".join(extra) or "plain"):
                out = self.path(name + ("-folded" if extra else "") + ".onnx")
                r = convnets("export", "--checkpoint", weights, "--arch", name, "--format", "onnx", "-o", out,
                             "--image-size", str(size), "--batch-size", "2", *extra)
                self.assertEqual(r.returncode, 0, r.stderr)
                m = onnx.load(out)
                onnx.checker.check_model(m)
                # The strided convs are TF SAME: asymmetric padding that depends on the input size.
                same = [n for n in m.graph.node if n.op_type == "Conv"
                        and any(a.name == "auto_pad" and a.s == b"SAME_UPPER" for a in n.attribute)]
                self.assertEqual(len(same), 5)  # the stem and the first block of 4 strided stages
                so = onnxruntime.SessionOptions()
                so.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "2"))  # CTest: the test's share
                sess = onnxruntime.InferenceSession(out, so, providers=["CPUExecutionProvider"])
                theirs = sess.run(None, {sess.get_inputs()[0].name: x})[0]
                diff = float(np.abs(theirs.astype(np.float64) - ours).max())
                print("%s ONNX %s: max |logit difference| vs convnets %.3g under ONNX Runtime"
                      % (name, extra or "plain", diff))
                self.assertLessEqual(diff, TOLERANCE)
                if not extra:  # OpenCV's DNN module too (a static batch: see test_onnx_cli.py)
                    net = cv2.dnn.readNetFromONNX(out)
                    net.setInput(x)
                    diff = float(np.abs(net.forward().astype(np.float64) - ours).max())
                    print("%s ONNX plain: max |logit difference| vs convnets %.3g under OpenCV %s"
                          % (name, diff, cv2.__version__))
                    self.assertLessEqual(diff, TOLERANCE)

    @unittest.skipUnless(os.path.isdir(FASHION), FASHION + " is missing (Debian's fashion-mnist package)")
    def test_gpunet_p0_recipe_distils_from_tf_efficientnet_b2(self):
        # DLE's GPUNet-P0 train.params through the CLI: the built-in recipe (RandAugment, random erasing,
        # RMSpropTF, EMA) with its teacher tf_efficientnet_b2, timm's weights converted to safetensors. Scaled
        # down for a CPU: 10 classes, Fashion-MNIST at 32 px, fp32, one short epoch; --test-teacher first.
        weights = self.converted("tf_efficientnet_b2", num_classes=10)
        ws = self.path("kd")
        r = convnets("train", FASHION, "--recipe", "gpunet-p0-450ep", "--teacher-checkpoint", weights,
                     "--precision", "fp32", "--epochs", "1", "--max-train-images", "256", "--max-val-images", "64",
                     "--batch-size", "32", "--image-size", "32", "--teacher-img-size", "32", "--test-teacher",
                     "--warmup", "0", "--print-freq", "2", "--workspace", ws)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("distillation: teacher tf_efficientnet_b2", r.stdout)
        self.assertIn("teacher tf_efficientnet_b2 at 32 px: top-1", r.stdout)
        with open(os.path.join(ws, "config.json")) as f:
            config = json.load(f)["config"]
        self.assertEqual((config["arch"], config["augment"], config["reprob"]), ("gpunet-p0", "rand-m9-mstd0.5", 0.2))
        with open(os.path.join(ws, "log.json")) as f:
            steps = [json.loads(l[5:]) for l in f if l.startswith("DLLL ")]
        losses = [x["data"]["train.loss"] for x in steps if len(x.get("step") or []) == 2]
        self.assertTrue(losses and all(0 < v < 20 for v in losses), losses)


class TimmFiles(TimmCase):
    """timm-named weights files written and refused (CTest efficientnet_timm)."""

    def test_safetensors_export_keeps_and_labels_timm_names(self):
        name = "tf_efficientnet_b2"
        weights = self.converted(name)
        out = self.path(name + "-export.safetensors")
        r = convnets("export", "--checkpoint", weights, "--arch", name, "--format", "safetensors", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        theirs, _ = pth2safetensors.read_safetensors(weights)
        ours, meta = pth2safetensors.read_safetensors(out)
        self.assertEqual(meta["key_style"], "timm")
        self.assertEqual(set(ours), set(theirs))
        for k in ("conv_stem.weight", "blocks.1.0.se.conv_reduce.weight", "classifier.bias"):
            self.assertTrue(torch.equal(ours[k], theirs[k]), k)

    def test_a_misfit_file_is_refused_naming_the_tensor(self):
        name = "tf_efficientnet_b2"
        tensors, meta = pth2safetensors.read_safetensors(self.converted(name))
        # The SE width taken from the expanded channels (96 / 4 = 24) instead of the block input's (16 / 4).
        key = "blocks.1.0.se.conv_reduce.weight"
        self.assertEqual(list(tensors[key].shape), [4, 96, 1, 1])
        tensors[key] = torch.zeros(24, 96, 1, 1)
        bad = self.path("bad.safetensors")
        pth2safetensors.write_safetensors(bad, tensors, meta)
        r = convnets("models", "--arch", name, "--weights", bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn("tensor '%s' has shape [4, 96, 1, 1] in the model but [24, 96, 1, 1] in the file" % key,
                      r.stderr)
        # Another variant's weights: the first tensor that differs is named.
        r = convnets("models", "--arch", "tf_efficientnet_b5_ns", "--weights", self.converted(name))
        self.assertEqual(r.returncode, 1)
        self.assertIn("tensor 'conv_stem.weight' has shape [48, 3, 3, 3] in the model but [32, 3, 3, 3] in the file",
                      r.stderr)



if __name__ == "__main__":
    unittest.main()
