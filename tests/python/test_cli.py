"""End-to-end tests of the convnets executable and tools/pth2safetensors.py.

Run by CTest with CONVNETS_BIN (the executable) and CONVNETS_SOURCE_DIR set.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torchvision

SOURCE = os.environ["CONVNETS_SOURCE_DIR"]
BIN = os.environ["CONVNETS_BIN"]
sys.path.insert(0, os.path.join(SOURCE, "tools"))
import pth2safetensors  # noqa: E402
import runner  # noqa: E402


def convnets(*args):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=300)


class ModelsCommand(unittest.TestCase):
    def test_lists_every_arch_with_params_gmacs_and_input(self):
        r = convnets("models", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = {m["name"]: m for m in json.loads(r.stdout)}
        self.assertEqual(len(rows), 24)
        self.assertEqual(rows["resnet50"]["params"], 25557032)
        self.assertEqual(rows["resnet10s"]["params"], 1478904)  # 1000 classes
        self.assertAlmostEqual(rows["resnet50"]["gmacs"], 4.09, places=2)
        self.assertEqual(rows["se_resnext101_32x4d"]["params"], 45251128)
        self.assertEqual(rows["resnet50"]["input_size"], 224)
        self.assertEqual(rows["resnet50"]["crop_ratio"], 0.875)
        self.assertEqual(rows["gpunet-0"]["params"], 11885432)
        self.assertEqual(rows["gpunet-d2"]["params"], 19036728)
        self.assertEqual([rows[f"gpunet-{v}"]["input_size"] for v in ("0", "1", "2", "p0", "p1", "d1", "d2")],
                         [320, 288, 384, 224, 224, 456, 528])
        self.assertEqual(rows["gpunet-0"]["crop_ratio"], 1.0)
        self.assertEqual((rows["gpunet-p0"]["crop_ratio"], rows["gpunet-p0"]["interpolation"]), (0.875, "bicubic"))
        # GPUNet's distillation teachers, timm's counts and default_cfg sizes.
        self.assertEqual([rows[n]["params"] for n in ("tf_efficientnet_b2", "tf_efficientnet_b5_ns",
                                                       "tf_efficientnet_b6_ns")], [9109994, 30389784, 43040704])
        self.assertEqual([rows[n]["input_size"] for n in ("tf_efficientnet_b2", "tf_efficientnet_b5_ns",
                                                           "tf_efficientnet_b6_ns")], [260, 456, 528])
        table = convnets("models")
        self.assertEqual(table.returncode, 0, table.stderr)
        self.assertRegex(table.stdout, r"resnet50\s+25,557,032\s+4\.09\s+224")

    def test_num_classes_changes_the_parameter_count(self):
        r = convnets("models", "--arch", "resnet50", "--num-classes", "10", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        # fc shrinks from 2048*1000+1000 to 2048*10+10
        self.assertEqual(json.loads(r.stdout)["params"], 25557032 - (2048 * 990 + 990))

    def test_gpunet_definition_round_trips_through_a_file(self):
        r = convnets("models", "--arch", "gpunet-1", "--definition")
        self.assertEqual(r.returncode, 0, r.stderr)
        layers = json.loads(r.stdout)
        self.assertEqual(layers[0], {"layer_type": "data", "img_resolution": 288, "distill": False})
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "mine.json")
            with open(path, "w") as f:
                f.write(r.stdout)
            mine = convnets("models", "--arch", path, "--json")
            self.assertEqual(mine.returncode, 0, mine.stderr)
            self.assertEqual(json.loads(mine.stdout)["params"], 12704192)
            self.assertEqual(json.loads(mine.stdout)["input_size"], 288)
        resnet = convnets("models", "--arch", "resnet50", "--definition")
        self.assertEqual(resnet.returncode, 1)
        self.assertIn("resnet50 is not built from a layer list", resnet.stderr)

    def test_forward_pass(self):
        r = convnets("models", "--arch", "resnet18", "--forward", "--batch-size", "2", "--input-size", "64")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("logits [2,1000]", r.stdout)

    def test_version_names_the_torch_cuda_and_cudnn_it_was_built_with(self):
        # The engine is the LibTorch of the torch these tests import (.venv).
        r = convnets("--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        cudnn = torch.backends.cudnn.version()
        expected = "(LibTorch %s, CUDA %s, cuDNN %d.%d.%d" % (
            torch.__version__.split("+")[0], torch.version.cuda, cudnn // 10000, cudnn % 10000 // 100, cudnn % 100)
        self.assertRegex(r.stdout, r"^convnets \d+\.\d+\.\d+ ")
        self.assertIn(expected, r.stdout)
        # A build with the OpenVINO engine names the runtime it linked: the wheel in .venv.
        try:
            import openvino
        except ImportError:
            self.assertIn(expected + ")", r.stdout)
        else:
            self.assertIn(expected + ", OpenVINO %s)" % openvino.__version__.split("-")[0], r.stdout)

    def test_help_on_the_command(self):
        r = convnets("models", "--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("--arch", r.stdout)
        self.assertIn("--num-classes", r.stdout)

    def test_unknown_arch_lists_the_valid_ones(self):
        r = convnets("models", "--arch", "resnet5")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown arch 'resnet5'", r.stderr)
        for name in ("resnet18", "resnext101_32x8d", "se_resnext101_32x4d"):
            self.assertIn(name, r.stderr)
        self.assertNotIn("frame #", r.stderr, "no stack traces for user errors")

    def test_bad_num_classes(self):
        for n in ("0", "-4"):
            r = convnets("models", "--arch", "resnet18", "--num-classes", n)
            self.assertNotEqual(r.returncode, 0, n)
            self.assertIn("--num-classes", r.stderr)

    def test_bad_flags_name_the_flag(self):
        r = convnets("models", "--init", "xavier")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--init", r.stderr)
        self.assertIn("fan_in", r.stderr)
        r = convnets("models", "--frobnicate")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--frobnicate", r.stderr)
        r = convnets("models", "--forward")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--arch", r.stderr)
        for args, flag in ((("--threads", "x", "models"), "--threads"),
                           (("models", "--arch", "resnet18", "--forward", "--input-size", "0"), "--input-size"),
                           (("models", "--num-classes", "abc"), "--num-classes")):
            r = convnets(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(flag, r.stderr)
        r = convnets("models", "--arch", "resnet18", "--forward", "--batch-size", "0")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--batch-size", r.stderr)
        r = convnets("frobnicate")
        self.assertEqual(r.returncode, 2, "an unknown command is a usage error")
        self.assertIn("frobnicate", r.stderr)


class WeightExchange(unittest.TestCase):
    """torchvision .pth -> pth2safetensors -> convnets -> safetensors -> torchvision."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        torch.manual_seed(0)
        self.model = torchvision.models.resnet18(num_classes=10)
        with torch.no_grad():
            for m in self.model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.normal_()
                    m.weight.uniform_(0.5, 1.5)
        self.sd = self.model.state_dict()

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def convert(self, obj, name, *extra):
        pth = self.path(name + ".pth")
        torch.save(obj, pth)
        out = self.path(name + ".safetensors")
        r = subprocess.run([*runner.PYTHON, os.path.join(SOURCE, "tools", "pth2safetensors.py"), pth, out, *extra],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def assert_same_state_dict(self, path):
        back, meta = pth2safetensors.read_safetensors(path)
        self.assertEqual(list(back), list(self.sd), "same keys in the same order")
        for k, v in self.sd.items():
            self.assertTrue(torch.equal(back[k], v), k)
        return meta

    def test_round_trip_through_convnets_is_exact(self):
        st = self.convert(self.sd, "plain")
        out = self.path("out.safetensors")
        r = convnets("models", "--arch", "resnet18", "--num-classes", "10", "--weights", st, "--save", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        meta = self.assert_same_state_dict(out)
        self.assertEqual(meta["arch"], "resnet18")
        # PyTorch's own load_state_dict accepts what convnets wrote, and the logits agree.
        back, _ = pth2safetensors.read_safetensors(out)
        model = torchvision.models.resnet18(num_classes=10)
        model.load_state_dict(back)
        x = torch.randn(2, 3, 64, 64)
        self.model.eval(), model.eval()
        with torch.no_grad():
            self.assertTrue(torch.equal(model(x), self.model(x)))

    def test_wrapped_data_parallel_and_dle_checkpoints(self):
        wrapped = {"epoch": 3, "state_dict": collections.OrderedDict(("module." + k, v) for k, v in self.sd.items())}
        st = self.convert(wrapped, "wrapped")
        out = self.path("out1.safetensors")
        r = convnets("models", "--arch", "resnet18", "--num-classes", "10", "--weights", st, "--save", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_state_dict(out)

        dle = collections.OrderedDict()
        for k, v in self.sd.items():
            if k.startswith("layer"):
                k = "layers.%d.%s" % (int(k[5]) - 1, k[7:])
            dle[k] = v
        st = self.convert(dle, "dle")
        out = self.path("out2.safetensors")
        r = convnets("models", "--arch", "resnet18", "--num-classes", "10", "--weights", st, "--save", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_state_dict(out)

    def test_a_checkpoint_with_pickled_objects_needs_allow_pickle(self):
        # timm's training checkpoints keep their argparse arguments beside the weights.
        ckpt = {"state_dict": self.sd, "args": argparse.Namespace(lr=0.1)}
        pth = self.path("timm.pth")
        torch.save(ckpt, pth)
        out = self.path("timm.safetensors")
        tool = [*runner.PYTHON, os.path.join(SOURCE, "tools", "pth2safetensors.py"), pth, out]
        r = subprocess.run(tool, capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("timm.pth: holds objects other than tensors", r.stderr)
        self.assertIn("--allow-pickle", r.stderr)
        self.assertFalse(os.path.exists(out))
        r = subprocess.run(tool + ["--allow-pickle"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_state_dict(out)

    def test_weights_of_another_arch_name_the_first_mismatch(self):
        st = self.convert(self.sd, "r18")
        r = convnets("models", "--arch", "resnet18", "--weights", st)  # 1000 classes vs 10
        self.assertEqual(r.returncode, 1)
        self.assertIn("'fc.weight' has shape [1000, 512] in the model but [10, 512] in the file", r.stderr)
        self.assertIn("r18.safetensors", r.stderr)
        r = convnets("models", "--arch", "resnet34", "--num-classes", "10", "--weights", st)
        self.assertEqual(r.returncode, 1)
        self.assertIn("'layer1.2.conv1.weight' is missing from the file", r.stderr)

    def test_save_does_not_clobber_on_failure(self):
        out = self.path("keep.safetensors")
        with open(out, "wb") as f:
            f.write(b"precious")
        bad = self.path("bad.safetensors")
        with open(bad, "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
        r = convnets("models", "--arch", "resnet18", "--weights", bad, "--save", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("bad.safetensors", r.stderr)
        self.assertIn("not valid JSON", r.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"precious")


class ForkServer(unittest.TestCase):
    """The tests' runner (runner.py) answers from children of `convnets --fork-server`: each must give what a fresh
    process gives, or the whole suite would be testing something else."""

    def both(self, args, **kwargs):
        served = runner.run([BIN, *args], capture_output=True, text=True, timeout=120, **kwargs)
        fresh = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, **kwargs)
        self.assertEqual((served.returncode, served.stdout, served.stderr),
                         (fresh.returncode, fresh.stdout, fresh.stderr), args)
        return served

    def test_a_child_answers_as_a_fresh_process(self):
        self.assertEqual(self.both(["--version"]).returncode, 0)
        self.assertEqual(self.both(["models", "--arch", "resnet8", "--json"]).returncode, 0)
        self.assertEqual(self.both(["train", "--print-config", "--wd", "x"]).returncode, 1)  # a value's check
        self.assertEqual(self.both(["models", "--bogus"]).returncode, 2)  # CLI11's parse error
        self.assertEqual(self.both(["models", "--arch", "resnet5"]).returncode, 1)  # convnets::Error
        self.assertEqual(self.both(["tarin"]).returncode, 2)
        # The environment is the request's: a rank's errors name it (main.cpp reads RANK and WORLD_SIZE).
        env = dict(os.environ, RANK="1", WORLD_SIZE="2")
        r = self.both(["models", "--arch", "resnet5"], env=env)
        self.assertIn("(rank 1 of 2)", r.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            # The working folder too, and standard input: a list of images read from "-".
            r = self.both(["models", "--arch", "resnet8", "--num-classes", "10", "--save", "w.safetensors"], cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.isfile(os.path.join(tmp, "w.safetensors")))
            r = self.both(["classify", "-", "--arch", "resnet8", "--weights", "w.safetensors"], cwd=tmp,
                          input="missing.png\n")
            self.assertEqual(r.returncode, 1)
            self.assertIn("missing.png: cannot open", r.stdout)
            self.assertIn("1 of 1 images could not be classified (reported above)\n", r.stderr)

    def test_a_timeout_kills_the_child_and_the_server_goes_on(self):
        with self.assertRaises(subprocess.TimeoutExpired):
            runner.run([BIN, "bench", "infer", "--arch", "resnet50", "--iterations", "100000"], timeout=1)
        self.assertEqual(runner.run([BIN, "--version"]).returncode, 0)

    def test_a_malformed_request_is_answered_not_run(self):
        empty = json.dumps(dict(argv=[], env={}, cwd="/", stdin=os.devnull, stdout=os.devnull, stderr=os.devnull))
        server = subprocess.run([BIN, "--fork-server"], input=f'{empty}\nnot json\n{{"argv": ["x"]}}\n',
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(server.returncode, 0, server.stderr)
        replies = [json.loads(line) for line in server.stdout.splitlines()]
        self.assertEqual(len(replies), 3, replies)
        self.assertTrue(all(set(r) == {"error"} for r in replies), replies)
        self.assertIn('"argv" is empty', replies[0]["error"])
        self.assertIn('no "env"', replies[2]["error"])


if __name__ == "__main__":
    unittest.main()
