"""GPUNet through the CLI: logits against an independent PyTorch implementation, training on
Fashion-MNIST with the GPUNet recipe pieces, a user's JSON file, knowledge distillation.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

import torch

SOURCE = os.environ["CONVNETS_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SOURCE, "tools"))
sys.path.insert(0, os.path.join(SOURCE, "bench"))
import gpunet_reference  # noqa: E402
import pth2safetensors  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
SHARED = os.environ.get("CONVNETS_SHARED_DIR", "")
FASHION = "/usr/share/datasets/fashion-mnist"
VARIANTS = {"gpunet-0": "0.65ms.json", "gpunet-1": "0.85ms.json", "gpunet-2": "1.75ms.json",
            "gpunet-p0": "0.5ms-D.json", "gpunet-p1": "0.8ms-D.json", "gpunet-d1": "1.25ms-D.json",
            "gpunet-d2": "2.25ms-D.json"}

# Every block kind of the distill=false builder, at 32 px.
TINY = [
    {"layer_type": "data", "img_resolution": 32, "distill": False},
    {"layer_type": "head", "num_in_channels": 3, "num_out_channels": 16},
    {"layer_type": "conv", "num_in_channels": 16, "num_out_channels": 16, "stride": 1, "kernel_size": 3,
     "act": "relu", "stage": 1},
    {"layer_type": "fused_irb", "num_in_channels": 16, "num_out_channels": 24, "stride": 2, "expansion": 4,
     "kernel_size": 3, "act": "relu", "use_se": False, "stage": 2},
    {"layer_type": "irb", "num_in_channels": 24, "num_out_channels": 24, "stride": 1, "expansion": 3,
     "kernel_size": 5, "act": "swish", "use_se": True, "stage": 3},
    {"layer_type": "irb", "num_in_channels": 24, "num_out_channels": 48, "stride": 2, "expansion": 3,
     "kernel_size": 3, "act": "swish", "use_se": False, "stage": 4},
    {"layer_type": "tail", "num_in_channels": 48, "num_out_channels": 128, "num_classes": 10},
]


def convnets(*args, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def dllogger(path):
    with open(path) as f:
        return [json.loads(line[5:]) for line in f]


def relative_error(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@unittest.skipUnless(SHARED and os.path.isdir(os.path.join(SHARED, "reference", "gpunet")),
                     "shared/reference/gpunet is not beside the clone (CONVNETS_SHARED_DIR); it is in CI")
class AgainstThePyTorchReference(unittest.TestCase):
    """bench/gpunet_reference.py builds DLE's original JSON files in PyTorch, from the spec alone."""

    def test_weights_load_strictly_and_logits_agree_for_all_seven(self):
        tmp = tempfile.mkdtemp(prefix="convnets-gpunet-")
        try:
            for name, file in VARIANTS.items():
                with self.subTest(name):
                    with open(os.path.join(SHARED, "reference", "gpunet", file)) as f:
                        ref = gpunet_reference.GPUNet(json.load(f)).eval()
                    with open(os.path.join(SHARED, "reference", "models", name + ".keys.json")) as f:
                        keys = json.load(f)
                    self.assertEqual([[k, list(v.shape)] for k, v in ref.state_dict().items()], keys["state_dict"])
                    w, io = os.path.join(tmp, name + ".safetensors"), os.path.join(tmp, name + ".io.safetensors")
                    r = convnets("models", "--arch", name, "--seed", "7", "--save", w, "--forward", "--batch-size",
                                 "2", "--input-size", "64", "--forward-save", io)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    tensors, _ = pth2safetensors.read_safetensors(w)
                    ref.load_state_dict(tensors, strict=True)
                    ours, _ = pth2safetensors.read_safetensors(io)
                    with torch.no_grad():
                        theirs = ref(ours["input"])
                    self.assertLess(relative_error(ours["logits"], theirs), 1e-4, name)
        finally:
            shutil.rmtree(tmp)


class InAFolder(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-gpunet-train-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class Gpunet0Learns(InAFolder):
    """The accuracy claim (CTest gpunet_accuracy): GPUNet-0 with its recipe's pieces learns Fashion-MNIST."""

    def test_gpunet_0_learns_with_its_recipe_pieces(self):
        # GPUNet's recipe (DLE train_params): RMSpropTF with eps 1e-3, staircase
        # decay, warmup from a small LR, EMA, drop-path 0.2 and dropout 0.2
        # (the arch's defaults). Fashion-MNIST is resized to 32 px.
        ws = os.path.join(self.tmp, "g0")
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--arch", "gpunet-0", "--image-size", "32",
                     "--workspace", ws, "--epochs", "1", "--max-train-images", "6400", "--max-val-images", "1000",
                     "--batch-size", "64", "--optimizer", "rmsproptf", "--lr", "0.002", "--lr-reference-batch", "0",
                     "--momentum", "0.9", "--no-nesterov", "--weight-decay", "1e-5", "--lr-schedule", "staircase",
                     "--lr-decay-epochs", "0.25", "--lr-step-factor", "0.9", "--warmup", "0.1", "--warmup-lr",
                     "1e-4", "--ema", "0.99", "--print-freq", "20")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        records = dllogger(os.path.join(ws, "log.json"))
        windows = [x["data"] for x in records if len(x.get("step") or []) == 2]
        self.assertEqual(len(windows), 5)
        self.assertLess(windows[-1]["train.loss"], 0.8 * windows[0]["train.loss"])
        # staircase: 10 warmup steps from 1e-4, then 0.002 * 0.9^floor(epoch / 0.25)
        self.assertAlmostEqual(windows[0]["train.lr"], 0.002, places=9)
        self.assertAlmostEqual(windows[-1]["train.lr"], 0.002 * 0.9 ** 3, places=9)
        epoch = [x["data"] for x in records if x.get("step") == [1]][0]
        self.assertGreater(epoch["val.top1"], 40.0, "chance is 10%")
        with open(os.path.join(ws, "config.json")) as f:
            self.assertEqual(json.load(f)["config"]["optimizer"], "rmsproptf")


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class TrainsOnFashionMnist(InAFolder):
    def test_user_json_trains_evaluates_without_the_file_and_teaches(self):
        arch = os.path.join(self.tmp, "tiny.json")
        with open(arch, "w") as f:
            json.dump(TINY, f)
        ws = os.path.join(self.tmp, "tiny")
        common = ["--recipe", "fashion-mnist-resnet8", "--epochs", "1", "--max-train-images", "1024",
                  "--max-val-images", "500", "--batch-size", "64", "--print-freq", "4"]
        r = convnets("train", *common, "--arch", arch, "--image-size", "32", "--workspace", ws)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        logged = [x["data"] for x in dllogger(os.path.join(ws, "log.json")) if x.get("step") == [1]][0]
        ckpt = os.path.join(ws, "last.safetensors")

        # Knowledge distillation as DLE's GPUNet train.py: a ResNet-8 student at 28 px, the GPUNet teacher on
        # the same batch; --test-teacher validates the teacher first at --teacher-img-size with the
        # preprocessing it was trained with, so its top-1 is the one its own run logged.
        kd = os.path.join(self.tmp, "kd")
        r = convnets("train", *common, "--workspace", kd, "--teacher", arch, "--teacher-checkpoint", ckpt,
                     "--teacher-img-size", "32", "--test-teacher")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("distillation: teacher " + arch, r.stdout)
        self.assertIn("on the student's batch at 28 px", r.stdout)
        self.assertIn("teacher %s at 32 px: top-1 %.2f%%" % (arch, logged["val.top1"]), r.stdout)
        kd_log = dllogger(os.path.join(kd, "log.json"))
        self.assertTrue(all(x["data"]["train.loss"] > 0 for x in kd_log if len(x.get("step") or []) == 2))
        # The two-resolution mode: images load at the teacher's 32 px, the student gets them resized.
        kd2 = os.path.join(self.tmp, "kd2")
        r = convnets("train", *common, "--workspace", kd2, "--teacher", arch, "--teacher-checkpoint", ckpt,
                     "--teacher-img-size", "32", "--teacher-two-res")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("at 32 px, student at 28 px (two resolutions)", r.stdout)
        bad = convnets("train", *common, "--workspace", os.path.join(self.tmp, "kd-bad"), "--teacher", "resnet20",
                       "--teacher-checkpoint", ckpt)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("holds a " + arch + ", not the --teacher resnet20", bad.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "kd-bad")))

        # The checkpoint carries the layer list: eval works once the file is gone.
        os.remove(arch)
        r = convnets("eval", FASHION, "--checkpoint", ckpt, "--max-images", "500", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertAlmostEqual(json.loads(r.stdout)["val.top1"], logged["val.top1"], places=6)

    def test_bad_definition_file_is_named_before_anything_is_written(self):
        arch = os.path.join(self.tmp, "bad.json")
        broken = [dict(x) for x in TINY]
        broken[4]["num_in_channels"] = 32
        with open(arch, "w") as f:
            json.dump(broken, f)
        ws = os.path.join(self.tmp, "bad-run")
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--arch", arch, "--workspace", ws)
        self.assertEqual(r.returncode, 1)
        self.assertIn(arch + ": layer 4 (irb): field 'num_in_channels' is 32; expected 24, the num_out_channels of "
                      "layer 3", r.stderr)
        self.assertFalse(os.path.exists(ws))


if __name__ == "__main__":
    unittest.main()
