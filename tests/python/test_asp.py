"""2:4 structured sparsity (`convnets train --asp`) end to end, on a tiny Fashion-MNIST run.

A dense ResNet-8 is trained for an epoch, then fine-tuned with --asp and an
EMA for one epoch, interrupted (--run-epochs 1) and resumed for the second.
Checked: every masked weight of the model and of the EMA is exactly 2:4 along
its input channels after training steps, the zeros are where the checkpoint's
masks say, the resumed run keeps the masks it saved, a two-process run keeps
the pattern and agrees with one process, pruning after --asp-dense-epochs, the
exports (safetensors, ONNX with and without BN folding) keep the pattern,
`models --sparsity` reports it, and the refusals name the problem.
"""
import json
import os
import sys
import tempfile
import unittest

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import pth2safetensors  # noqa: E402
from fixtures import free_port  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"
RUN = ["--recipe", "fashion-mnist-resnet8", "--max-train-images", "1024", "--max-val-images", "200",
       "--warmup", "0", "--print-freq", "4"]
# ResNet-8's conv/linear weights: conv1 (3 input channels) and the classifier stay dense.
MASKED = ["layer1.0.conv1.weight", "layer1.0.conv2.weight", "layer2.0.conv1.weight", "layer2.0.conv2.weight",
          "layer2.0.downsample.0.weight", "layer3.0.conv1.weight", "layer3.0.conv2.weight",
          "layer3.0.downsample.0.weight"]


def convnets(*args, threads=None, timeout=300, env=None):
    # Without `threads`, convnets' default: OMP_NUM_THREADS (CTest gives each test its share of the cores).
    return runner.run([BIN, *(["--threads", threads] if threads else []), *args], capture_output=True, text=True,
                      timeout=timeout,
                      env=env)


def train(ws, *args, **kw):
    return convnets("train", FASHION, *RUN, "--workspace", ws, *args, **kw)


def resume(path, *args, **kw):
    """The run goes on as its checkpoint's config says (a --recipe would override it)."""
    return convnets("train", "--resume", path, *args, **kw)


def tensors(path):
    return {k: v.numpy() for k, v in pth2safetensors.read_safetensors(path)[0].items()}


def groups_of_four(w):
    """[K, C, R, S] or [K, C] -> rows of 4 consecutive input channels at each tap."""
    w = w.transpose(0, 2, 3, 1) if w.ndim == 4 else w
    return w.reshape(-1, 4)


def is_2_4(w):
    return w.shape[1] % 4 == 0 and bool(((groups_of_four(w) != 0).sum(1) <= 2).all())


@unittest.skipUnless(os.path.isdir(FASHION), f"{FASHION} (Debian's fashion-mnist package) is not installed")
class Asp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="convnets-asp-")
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.dense = cls.ws("dense")
        r = train(cls.dense, "--epochs", "1")
        assert r.returncode == 0, r.stdout + r.stderr
        cls.asp = cls.ws("asp")
        common = ["--epochs", "2", "--ema", "0.99", "--fine-tune", os.path.join(cls.dense, "last.safetensors"),
                  "--asp"]
        cls.first = train(cls.asp, *common, "--run-epochs", "1")
        assert cls.first.returncode == 0, cls.first.stdout + cls.first.stderr
        cls.epoch1 = tensors(os.path.join(cls.asp, "last.safetensors"))
        cls.second = resume(os.path.join(cls.asp, "last.safetensors"))
        assert cls.second.returncode == 0, cls.second.stdout + cls.second.stderr
        cls.ckpt = os.path.join(cls.asp, "last.safetensors")
        cls.epoch2 = tensors(cls.ckpt)

    @classmethod
    def ws(cls, name):
        return os.path.join(cls.tmp.name, name)

    def test_the_plan_names_the_layers_left_dense_and_why(self):
        out = self.first.stdout
        self.assertIn("asp: 2:4 masks on 8 of 10 conv/linear weights", out)
        self.assertIn("left dense: conv1.weight [16, 3, 3, 3]: 3 input channels, not a multiple of 4", out)
        self.assertIn("left dense: fc.weight [10, 64]: the classifier", out)
        self.assertIn("asp: pruned to 2:4 at the start of epoch 1", out)

    def test_training_keeps_exactly_2_4_where_the_masks_say_in_the_model_and_the_ema(self):
        for state in (self.epoch1, self.epoch2):
            masks = {k[len("asp_mask."):]: v for k, v in state.items() if k.startswith("asp_mask.")}
            self.assertEqual(sorted(masks), sorted(MASKED))
            for name, mask in masks.items():
                self.assertEqual(mask.dtype, np.uint8)
                self.assertTrue((groups_of_four(mask).sum(1) == 2).all(), name)
                for section in ("model.", "ema."):
                    w = state[section + name]
                    self.assertTrue(is_2_4(w), section + name)
                    self.assertTrue((w[mask == 0] == 0).all(), section + name)
                    self.assertEqual(int((w != 0).sum()), int(mask.sum()), section + name)  # no kept weight is 0
            self.assertFalse(is_2_4(state["model.fc.weight"]))

    def test_resume_keeps_the_saved_masks(self):
        self.assertIn("asp: 2:4 masks restored from", self.second.stdout)
        self.assertNotIn("pruned to 2:4", self.second.stdout)
        for name in MASKED:
            np.testing.assert_array_equal(self.epoch1["asp_mask." + name], self.epoch2["asp_mask." + name])
            self.assertFalse(np.array_equal(self.epoch1["model." + name], self.epoch2["model." + name]), name)
        with open(os.path.join(self.asp, "config.json")) as f:
            config = json.load(f)["config"]
        self.assertEqual((config["asp"], config["asp_dense_epochs"]), (True, 0))

    def test_exports_keep_the_pattern(self):
        st = self.ws("export.safetensors")
        r = convnets("export", "--checkpoint", self.ckpt, "--format", "safetensors", "-o", st)
        self.assertEqual(r.returncode, 0, r.stderr)
        exported = tensors(st)
        self.assertEqual(sum(is_2_4(exported[n]) for n in MASKED), len(MASKED))
        for extra, name in (([], "plain.onnx"), (["--fold-bn"], "folded.onnx"), (["--ema", "--fold-bn"], "ema.onnx")):
            path = self.ws(name)
            r = convnets("export", "--checkpoint", self.ckpt, "--format", "onnx", "-o", path, *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            m = onnx.load(path)
            init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
            convs = [init[n.input[1]] for n in m.graph.node if n.op_type == "Conv"]
            self.assertEqual(len(convs), 9, name)
            # Every conv but the first (3 input channels): folding BN scales
            # output channels, so the zeros stay zeros.
            self.assertEqual([is_2_4(w) for w in convs], [False] + [True] * 8, name)
            self.assertTrue(all(abs((w == 0).mean() - 0.5) < 1e-9 for w in convs[1:]), name)

    def test_models_sparsity_reports_each_layer(self):
        r = convnets("models", "--weights", self.ckpt, "--sparsity")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("model: 8 of 10 conv/linear weights are 2:4", r.stdout)
        self.assertIn("ema: 8 of 10 conv/linear weights are 2:4", r.stdout)
        self.assertRegex(r.stdout, r"conv1\.weight +\[16,3,3,3\] +0\.00% +dense \(3 input channels\)")
        r = convnets("models", "--weights", os.path.join(self.dense, "last.safetensors"), "--sparsity", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        report = json.loads(r.stdout)["model"]
        self.assertEqual((report["conv_linear_weights"], report["2_4_weights"]), (10, 0))
        # A training checkpoint is --weights for the model views too: its model weights, its class count.
        r = convnets("models", "--arch", "resnet8", "--weights", self.ckpt, "--forward", "--input-size", "28", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        info = json.loads(r.stdout)
        self.assertEqual((info["num_classes"], info["forward"]["output_shape"]), (10, [1, 10]))
        r = convnets("models", "--arch", "resnet8", "--num-classes", "1000", "--weights", self.ckpt)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--num-classes 1000 disagrees with --weights %s, trained for 10 classes" % self.ckpt, r.stderr)
        r = convnets("models", "--arch", "resnet18", "--weights", self.ckpt)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--arch resnet18 disagrees with --weights %s, a resnet8 training checkpoint" % self.ckpt,
                      r.stderr)

    def test_two_processes_keep_the_pattern_and_agree_with_one(self):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        common = ["--epochs", "1", "--batch-size", "32", "--prof", "4", "--training-only", "--asp",
                  "--fine-tune", os.path.join(self.dense, "last.safetensors")]
        single = train(self.ws("single"), *common, "--optimizer-batch-size", "64", threads="1", env=env)
        self.assertEqual(single.returncode, 0, single.stdout + single.stderr)
        dp = train(self.ws("dp"), *common, "--nproc-per-node", "2", "--master-port", str(free_port()), threads="1",
                   env=env)
        self.assertEqual(dp.returncode, 0, dp.stdout + dp.stderr)
        self.assertIn("data-parallel: 2 ranks", dp.stdout)
        a, b = tensors(self.ws("dp/last.safetensors")), tensors(self.ws("single/last.safetensors"))
        for name in MASKED:
            np.testing.assert_array_equal(a["asp_mask." + name], b["asp_mask." + name])
            self.assertTrue(is_2_4(a["model." + name]), name)
            np.testing.assert_allclose(a["model." + name], b["model." + name], rtol=0,
                                       atol=1e-5 * np.abs(b["model." + name]).max())

    def test_from_scratch_prunes_after_the_dense_epochs(self):
        ws = self.ws("scratch")
        r = train(ws, "--epochs", "2", "--asp", "--asp-dense-epochs", "1", "--run-epochs", "1", "--training-only")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("pruned to 2:4", r.stdout)
        last = os.path.join(ws, "last.safetensors")
        self.assertFalse(any(k.startswith("asp_mask.") for k in tensors(last)))
        r = resume(last)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("asp: pruned to 2:4 at the start of epoch 2", r.stdout)
        state = tensors(last)
        self.assertTrue(all(is_2_4(state["model." + n]) for n in MASKED))

    def test_refusals_name_the_problem(self):
        r = train(self.ws("bad1"), "--epochs", "1", "--asp")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--asp prunes a trained model", r.stderr)
        self.assertIn("--asp-dense-epochs", r.stderr)
        r = train(self.ws("bad2"), "--epochs", "2", "--asp-dense-epochs", "1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--asp-dense-epochs must be used with --asp", r.stderr)
        r = resume(self.ckpt, "--no-asp", "--epochs", "3", "--workspace", self.ws("bad3"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is a 2:4-sparse run (--asp)", r.stderr)
        self.assertFalse(os.path.exists(self.ws("bad1")) or os.path.exists(self.ws("bad3")))


if __name__ == "__main__":
    unittest.main()
