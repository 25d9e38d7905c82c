"""Deployment commands end to end.

`convnets classify`: a model trained by the CLI on Fashion-MNIST classifies held-out test images
given as PNG files with the accuracy `eval` reports; JSON output; bad images and bad checkpoints.
`convnets export --format safetensors`: torchvision loads the export and computes the same logits;
torchvision weights load into convnets and compute the same logits.
`convnets export --format triton`: a Triton model repository entry (onnxruntime or openvino backend) whose
config.pbtxt parses with Triton's own schema (tritonclient's model_config_pb2) and names the graph's inputs and
outputs, whose graph gives convnets' logits in ONNX Runtime and OpenVINO, and which never overwrites an entry; its DALI preprocessing, serialized by
PyPI's DALI as Triton's DALI backend does and run in DALI's CPU pipeline, gives convnets' eval tensors (CTest
deploy_accuracy).
"""
import gzip
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import unittest

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import numpy as np
import onnx
import onnxruntime
import openvino
import torch
import torchvision
from google.protobuf import text_format
from PIL import Image
from nvidia.dali import Pipeline
from nvidia.dali._utils.autoserialize import invoke_autoserialize
from tritonclient.grpc import model_config_pb2

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import pth2safetensors  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"
HELD_OUT = 1000


def convnets(*args, stdin=None, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, input=stdin,
                      timeout=timeout)


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    if data[2] == 8 and data[3] == 3:
        n, h, w = (int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, h, w)
    return np.frombuffer(data, np.uint8, offset=8)


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class Classify(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-classify-")
        cls.ckpt = fixtures.fashion_resnet8()  # the suite's trained ResNet-8, validated on the first HELD_OUT
        images = idx(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"))[:HELD_OUT]
        cls.labels = idx(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz"))[:HELD_OUT]
        cls.pngs = []
        for i, im in enumerate(images):
            path = os.path.join(cls.tmp, f"test-{i:05d}.png")
            Image.fromarray(im, mode="L").save(path)
            cls.pngs.append(path)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_png_files_classify_with_the_accuracy_eval_reports(self):
        r = convnets("classify", "-", "--checkpoint", self.ckpt, "--json", "--batch-size", "100",
                     stdin="\n".join(self.pngs) + "\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual((out["images"], out["failed"]), (HELD_OUT, 0))
        results = out["results"]
        self.assertEqual([x["path"] for x in results], self.pngs)
        top1 = [x["top"][0]["index"] for x in results]
        accuracy = 100.0 * float(np.mean(np.array(top1) == self.labels))
        for x in results[:5]:
            self.assertEqual(len(x["top"]), 5)
            probs = [t["probability"] for t in x["top"]]
            self.assertEqual(probs, sorted(probs, reverse=True))
            # Fashion-MNIST's own names for its IDX labels, as its README lists them.
            self.assertEqual(x["top"][0]["class"], fixtures.fashion_class_names()[x["top"][0]["index"]])
        e = convnets("eval", FASHION, "--checkpoint", self.ckpt, "--max-images", str(HELD_OUT), "--json")
        self.assertEqual(e.returncode, 0, e.stderr)
        self.assertLessEqual(abs(accuracy - json.loads(e.stdout)["val.top1"]), 0.1)
        self.assertGreater(accuracy, 60.0, "a trained model, not chance")
        # With BN folded into the convs the predictions are those of the unfolded network.
        f = convnets("classify", "-", "--checkpoint", self.ckpt, "--json", "--batch-size", "100", "--fold-bn",
                     stdin="\n".join(self.pngs) + "\n")
        self.assertEqual(f.returncode, 0, f.stderr)
        folded = [x["top"][0]["index"] for x in json.loads(f.stdout)["results"]]
        self.assertGreaterEqual(float(np.mean(np.array(folded) == np.array(top1))), 0.999)
        # The CUDA graphs' flags: parsed and checked on any device, refused by name.
        for flag, value, message in (("--graph-batch-sizes", "8,4", "expected ascending sizes without repeats"),
                                     ("--graph-batch-sizes", "0", "expected positive batch sizes"),
                                     ("--graph-memory-mb", "0", "--graph-memory-mb")):
            r = convnets("classify", self.pngs[0], "--checkpoint", self.ckpt, flag, value)
            self.assertNotEqual(r.returncode, 0, flag + " " + value)
            self.assertIn(message, r.stderr)
        g = convnets("classify", self.pngs[0], "--checkpoint", self.ckpt, "--graph-batch-sizes", "1,8",
                     "--no-cuda-graph", "--no-fused-conv", "--json")
        self.assertEqual(g.returncode, 0, g.stderr)
        self.assertEqual(json.loads(g.stdout)["results"][0]["top"][0]["index"], top1[0])

    def test_table_jpeg_and_an_undecodable_file_among_good_ones(self):
        jpeg = os.path.join(self.tmp, "shoe.jpg")
        Image.open(self.pngs[0]).convert("RGB").resize((56, 56)).save(jpeg, quality=95)
        broken = os.path.join(self.tmp, "broken.png")
        with open(broken, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 10)
        r = convnets("classify", self.pngs[1], broken, jpeg, "--checkpoint", self.ckpt, "--top-k", "3")
        self.assertEqual(r.returncode, 1)
        self.assertIn("1 of 3 images could not be classified", r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], self.pngs[1])
        # A probability, the class's name, its index.
        m = re.match(r"^ +[0-9.]+%  (.+) \((\d)\)$", lines[1])
        self.assertTrue(m, lines[1])
        self.assertEqual(m.group(1), fixtures.fashion_class_names()[int(m.group(2))])
        self.assertEqual(lines[4], broken)
        self.assertIn("error: ", lines[5])
        self.assertIn(broken, lines[5])
        self.assertEqual(lines[6], jpeg)
        self.assertEqual(len(lines), 10)
        j = convnets("classify", broken, jpeg, "--checkpoint", self.ckpt, "--json", "--top-k", "50")
        out = json.loads(j.stdout)
        self.assertIn("error", out["results"][0])
        self.assertEqual(len(out["results"][1]["top"]), 10, "top-k is capped at the class count")

    def test_bad_checkpoints_are_named(self):
        junk = os.path.join(self.tmp, "junk.safetensors")
        with open(junk, "wb") as f:
            f.write(b"PK\x03\x04 this is a zip, not safetensors")
        truncated = os.path.join(self.tmp, "truncated.safetensors")
        with open(self.ckpt, "rb") as f:
            data = f.read()
        with open(truncated, "wb") as f:
            f.write(data[: len(data) // 2])
        newer = os.path.join(self.tmp, "newer.safetensors")
        tensors, meta = pth2safetensors.read_safetensors(self.ckpt)
        record = json.loads(meta["convnets"])
        record["format"] = "convnets-checkpoint/2"
        meta["convnets"] = json.dumps(record)
        pth2safetensors.write_safetensors(newer, tensors, meta)
        for path, message in ((junk, junk), (truncated, truncated),
                              (newer, "checkpoint format convnets-checkpoint/2 is not convnets-checkpoint/1")):
            r = convnets("classify", self.pngs[0], "--checkpoint", path)
            self.assertEqual(r.returncode, 1, path)
            self.assertIn(message, r.stderr)
            self.assertNotIn("terminate called", r.stderr)


def relative_error(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class ExportSafetensors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-export-")
        ws = os.path.join(cls.tmp, "r18")
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--arch", "resnet18", "--image-size", "32",
                     "--epochs", "1", "--max-train-images", "512", "--batch-size", "64", "--training-only",
                     "--ema", "0.9", "--workspace", ws)
        assert r.returncode == 0, r.stdout + r.stderr
        cls.ckpt = os.path.join(ws, "last.safetensors")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def convnets_logits(self, weights):
        io = self.path("io.safetensors")
        r = convnets("models", "--arch", "resnet18", "--num-classes", "10", "--weights", weights, "--forward",
                     "--batch-size", "4", "--input-size", "32", "--seed", "3", "--forward-save", io)
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors, _ = pth2safetensors.read_safetensors(io)
        return tensors["input"], tensors["logits"]

    def test_torchvision_loads_the_export_and_computes_the_same_logits(self):
        out = self.path("tv.safetensors")
        r = convnets("export", "--checkpoint", self.ckpt, "--format", "safetensors", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors, meta = pth2safetensors.read_safetensors(out)
        self.assertEqual((meta["arch"], meta["key_style"], meta["num_classes"]), ("resnet18", "torchvision", "10"))
        self.assertEqual(json.loads(meta["class_names"]), fixtures.fashion_class_names())
        model = torchvision.models.resnet18(num_classes=10)
        model.load_state_dict(tensors)  # strict: every key, every shape
        model.eval()
        x, ours = self.convnets_logits(out)
        with torch.no_grad():
            theirs = model(x)
        self.assertLess(relative_error(ours, theirs), 1e-5)

    def test_torchvision_weights_load_into_convnets_with_the_same_logits(self):
        torch.manual_seed(5)
        model = torchvision.models.resnet18(num_classes=10)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.normal_(0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        model.eval()
        src = self.path("from-tv.safetensors")
        pth2safetensors.write_safetensors(src, model.state_dict())
        x, ours = self.convnets_logits(src)
        with torch.no_grad():
            theirs = model(x)
        self.assertLess(relative_error(ours, theirs), 1e-5)

    def test_dle_names_fp16_and_ema(self):
        dle = self.path("dle.safetensors")
        r = convnets("export", "--checkpoint", self.ckpt, "-o", dle, "--key-style", "dle", "--dtype", "fp16", "--ema")
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors, meta = pth2safetensors.read_safetensors(dle)
        self.assertEqual((meta["key_style"], meta["weights"]), ("dle", "ema"))
        self.assertIn("layers.0.0.conv1.weight", tensors)
        self.assertNotIn("layer1.0.conv1.weight", tensors)
        self.assertEqual(tensors["layers.3.1.bn2.weight"].dtype, torch.float16)
        self.assertEqual(tensors["layers.0.0.bn1.num_batches_tracked"].dtype, torch.int64)
        # DLE names load back (convnets maps them), and the EMA is not the model.
        r = convnets("models", "--arch", "resnet18", "--num-classes", "10", "--weights", dle)
        self.assertEqual(r.returncode, 0, r.stderr)
        plain = self.path("plain.safetensors")
        self.assertEqual(convnets("export", "--checkpoint", self.ckpt, "-o", plain).returncode, 0)
        model_w, _ = pth2safetensors.read_safetensors(plain)
        self.assertFalse(torch.equal(model_w["fc.weight"].half(), tensors["fc.weight"]))

    def test_bad_export_requests_are_named_and_write_nothing(self):
        out = self.path("never.safetensors")
        plain = self.path("plain2.safetensors")
        self.assertEqual(convnets("export", "--checkpoint", self.ckpt, "-o", plain).returncode, 0)
        r = convnets("export", "--checkpoint", plain, "-o", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is a plain weights file; name its --arch", r.stderr)
        r = convnets("export", "--checkpoint", plain, "--arch", "resnet18", "-o", out, "--ema")
        self.assertEqual(r.returncode, 1)
        self.assertIn("is a weights file with no EMA (no state_dict_ema)", r.stderr)
        r = convnets("export", "--checkpoint", self.ckpt, "-o", out, "--format", "tflite")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--format", r.stderr)
        r = convnets("export", "--checkpoint", self.ckpt, "-o", out, "--fold-bn")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--fold-bn and --dynamic-batch apply to --format onnx", r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_plain_dle_weights_convert_to_torchvision_names(self):
        dle = self.path("dle2.safetensors")
        self.assertEqual(convnets("export", "--checkpoint", self.ckpt, "-o", dle, "--key-style", "dle").returncode, 0)
        tv = self.path("tv2.safetensors")
        r = convnets("export", "--checkpoint", dle, "--arch", "resnet18", "-o", tv)
        self.assertEqual(r.returncode, 0, r.stderr)
        a, _ = pth2safetensors.read_safetensors(tv)
        b, _ = pth2safetensors.read_safetensors(dle)
        self.assertIn("layer4.1.bn2.weight", a)
        self.assertTrue(torch.equal(a["layer4.1.bn2.weight"], b["layers.3.1.bn2.weight"]))


def triton_config(entry):
    with open(os.path.join(entry, "config.pbtxt")) as f:
        return text_format.Parse(f.read(), model_config_pb2.ModelConfig())


def onnx_io(graph):
    """{name: (elem_type, dims)} of a graph's inputs and outputs; a symbolic dimension is its name."""
    return {v.name: (v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in list(graph.input) + list(graph.output)}


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class TritonRepository(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-triton-")
        cls.ckpt = fixtures.fashion_resnet8()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def export(self, repo, *flags):
        return convnets("export", "--checkpoint", self.ckpt, "--format", "triton", "-o", repo, *flags)

    def convnets_logits(self, batch):
        io = os.path.join(self.tmp, f"io{batch}.safetensors")
        r = convnets("models", "--arch", "resnet8", "--num-classes", "10", "--weights", self.ckpt, "--forward",
                     "--batch-size", str(batch), "--input-size", "28", "--seed", str(batch), "--forward-save", io)
        self.assertEqual(r.returncode, 0, r.stderr)
        t, _ = pth2safetensors.read_safetensors(io)
        return t["input"].numpy(), t["logits"].numpy()

    def test_the_entry_parses_with_tritons_schema_and_names_what_the_graph_has(self):
        repo = os.path.join(self.tmp, "repo")
        r = self.export(repo, "--model-name", "fashion", "--max-batch-size", "32", "--preferred-batch-sizes", "8,16",
                        "--max-queue-delay-us", "250", "--engine-count-per-device", "2", "--backend-accelerator", "trt")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Triton model repository " + repo + ", model fashion", r.stdout)
        entry = os.path.join(repo, "fashion")
        files = sorted(os.path.relpath(os.path.join(d, f), repo) for d, _, fs in os.walk(repo) for f in fs)
        self.assertEqual(files, ["fashion/1/model.onnx", "fashion/config.pbtxt", "fashion/labels.txt",
                                 "fashion_ensemble/config.pbtxt", "fashion_ensemble/labels.txt",
                                 "fashion_preprocessing/1/dali.py", "fashion_preprocessing/config.pbtxt"])
        c = triton_config(entry)
        self.assertEqual((c.name, c.backend, c.max_batch_size), ("fashion", "onnxruntime", 32))
        self.assertEqual(list(c.dynamic_batching.preferred_batch_size), [8, 16])
        self.assertEqual(c.dynamic_batching.max_queue_delay_microseconds, 250)
        # serve's queue bound, written as Triton's default queue policy (one batching struct for both commands).
        self.assertEqual(c.dynamic_batching.default_queue_policy.max_queue_size, 64)
        self.assertEqual([(g.count, g.kind) for g in c.instance_group],
                         [(2, model_config_pb2.ModelInstanceGroup.KIND_GPU)])
        trt = c.optimization.execution_accelerators.gpu_execution_accelerator
        self.assertEqual([(a.name, dict(a.parameters)["precision_mode"]) for a in trt], [("tensorrt", "FP16")])
        # Each input and output the config names is the graph's, with its type and (past the batch) its shape.
        model = onnx.load(os.path.join(entry, "1", "model.onnx"))
        io = onnx_io(model.graph)
        self.assertEqual(len(io), len(c.input) + len(c.output))
        for t in list(c.input) + list(c.output):
            elem, dims = io[t.name]
            self.assertEqual(model_config_pb2.DataType.Name(t.data_type), "TYPE_FP32")
            self.assertEqual(elem, onnx.TensorProto.FLOAT)
            self.assertEqual(dims, ["batch", *t.dims], t.name)
        self.assertEqual(list(c.input[0].dims), [3, 28, 28])
        self.assertEqual(list(c.output[0].dims), [10])
        with open(os.path.join(entry, c.output[0].label_filename)) as f:
            self.assertEqual(f.read().splitlines(), fixtures.fashion_class_names())  # the checkpoint's IDX classes
        pre = json.loads(c.parameters["convnets.preprocessing"].string_value)
        self.assertEqual((pre["input_size"], pre["crop_ratio"]), (28, 1.0))
        # The graph carries the same preprocessing for convnets' own runtimes.
        meta = {p.key: p.value for p in model.metadata_props}
        self.assertEqual(json.loads(meta["preprocessing"]), pre)

    def test_the_graph_gives_convnets_logits_in_onnx_runtime_openvino_and_classify(self):
        repo = os.path.join(self.tmp, "repo-logits")
        r = self.export(repo, "--instance-kind", "cpu", "--preprocessing", "none")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.listdir(repo), ["resnet8"])  # the arch names the entry by default; no DALI step
        entry = os.path.join(repo, "resnet8")
        c = triton_config(entry)
        self.assertEqual(c.instance_group[0].kind, model_config_pb2.ModelInstanceGroup.KIND_CPU)
        self.assertFalse(c.HasField("optimization"))
        self.assertEqual(list(c.dynamic_batching.preferred_batch_size), [])
        self.assertEqual((c.max_batch_size, c.dynamic_batching.max_queue_delay_microseconds), (64, 100))
        path = os.path.join(entry, "1", "model.onnx")
        threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = threads
        ort = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        core = openvino.Core()
        core.set_property("CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"})
        ov = core.compile_model(path, "CPU")
        for batch in (1, 5):  # one graph, any batch up to Triton's max_batch_size
            x, ours = self.convnets_logits(batch)
            with self.subTest(batch=batch):
                ours_t = torch.from_numpy(ours)
                self.assertLess(relative_error(torch.from_numpy(ort.run(["logits"], {"input": x})[0]), ours_t), 1e-5)
                self.assertLess(relative_error(torch.from_numpy(ov(x)[0]), ours_t), 1e-5)
        # convnets' own classify reads the entry's graph (its preprocessing travels in the graph's metadata) and
        # answers as it does from the checkpoint.
        pngs = []
        for i, im in enumerate(idx(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"))[:20]):
            pngs.append(os.path.join(self.tmp, f"t{i}.png"))
            Image.fromarray(im, mode="L").save(pngs[-1])
        answers = []
        for model in (self.ckpt, path):
            r = convnets("classify", *pngs, "--checkpoint", model, "--json", "--top-k", "3")
            self.assertEqual(r.returncode, 0, r.stderr)
            answers.append(json.loads(r.stdout)["results"])
        for a, b in zip(*answers):
            self.assertEqual([t["index"] for t in a["top"]], [t["index"] for t in b["top"]])
            for ta, tb in zip(a["top"], b["top"]):
                self.assertAlmostEqual(ta["probability"], tb["probability"], delta=1e-5)

    def test_the_openvino_backend_variant(self):
        repo = os.path.join(self.tmp, "repo-openvino")
        r = self.export(repo, "--model-name", "ov", "--backend", "openvino", "--instance-kind", "cpu",
                        "--preprocessing", "none", "--engine-count-per-device", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        c = triton_config(os.path.join(repo, "ov"))
        self.assertEqual((c.backend, c.default_model_filename), ("openvino", "model.onnx"))
        self.assertEqual([(g.count, g.kind) for g in c.instance_group],
                         [(2, model_config_pb2.ModelInstanceGroup.KIND_CPU)])
        self.assertFalse(c.optimization.execution_accelerators.gpu_execution_accelerator)
        self.assertEqual(sorted(os.listdir(repo)), ["ov"])
        # The file the config names, compiled by OpenVINO as its backend does, gives convnets' logits.
        x, expected = self.convnets_logits(3)
        core = openvino.Core()
        core.set_property("CPU", {"INFERENCE_PRECISION_HINT": "f32"})  # a bf16 CPU would default to bf16
        compiled = core.compile_model(os.path.join(repo, "ov", "1", c.default_model_filename), "CPU")
        np.testing.assert_allclose(compiled(x)[0], expected, rtol=0, atol=1e-4)
        for flags, message in ((["--backend", "openvino"], "--backend openvino needs --instance-kind cpu"),
                               (["--backend", "openvino", "--instance-kind", "cpu", "--backend-accelerator", "trt"],
                                "--backend openvino takes none")):
            r = self.export(os.path.join(self.tmp, "repo-refused"), "--model-name", "ov2", *flags)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(message, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "repo-refused", "ov2")))

    def test_fp16_graphs_declare_their_type(self):
        repo = os.path.join(self.tmp, "repo-types")
        r = self.export(repo, "--dtype", "fp16", "--model-name", "half")
        self.assertEqual(r.returncode, 0, r.stderr)
        c = triton_config(os.path.join(repo, "half"))
        io = onnx_io(onnx.load(os.path.join(repo, "half", "1", "model.onnx")).graph)
        for t in list(c.input) + list(c.output):
            self.assertEqual(model_config_pb2.DataType.Name(t.data_type), "TYPE_FP16")
            self.assertEqual(io[t.name][0], onnx.TensorProto.FLOAT16)

    def test_bad_requests_are_named_and_leave_the_repository_as_it_was(self):
        repo = os.path.join(self.tmp, "repo-kept")
        self.assertEqual(self.export(repo, "--model-name", "kept").returncode, 0)
        config = os.path.join(repo, "kept", "config.pbtxt")
        with open(config, "rb") as f:
            before = f.read()
        listing = sorted(os.listdir(repo))
        cases = [
            (["--model-name", "kept", "--max-batch-size", "8"],
             repo + "/kept already exists; nothing was overwritten"),
            (["--model-name", "a/b"], "--model-name 'a/b': expected letters, digits"),
            (["--model-name", ".hidden"], "not starting with '.'"),
            (["--model-name", "x", "--max-batch-size", "8", "--preferred-batch-sizes", "4,16"],
             "--preferred-batch-sizes: 16 is outside 1..8 (--max-batch-size)"),
            (["--model-name", "x", "--backend-accelerator", "trt", "--instance-kind", "cpu"],
             "--backend-accelerator trt needs --instance-kind gpu"),
            (["--model-name", "x", "--batch-size", "4"], "--batch-size and --dynamic-batch apply to --format onnx"),
            (["--model-name", "x", "--key-style", "dle"], "--key-style applies to --format safetensors"),
            # One of the three entries taken is enough to refuse them all.
            (["--model-name", "kept_preprocessing", "--preprocessing", "none"], "kept_preprocessing already exists"),
        ]
        os.makedirs(os.path.join(repo, "y_ensemble"))
        listing.append("y_ensemble")
        cases.append((["--model-name", "y"], repo + "/y_ensemble already exists"))
        for flags, message in cases:
            with self.subTest(flags=flags):
                r = self.export(repo, *flags)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(message, r.stderr)
        r = self.export(repo, "--model-name", "x", "--instance-kind", "tpu")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--instance-kind", r.stderr)
        self.assertEqual(sorted(os.listdir(repo)), sorted(listing))  # no entry, no partial folder
        with open(config, "rb") as f:
            self.assertEqual(f.read(), before)



IMAGENET_LIKE = os.environ.get("CONVNETS_IMAGENET_LIKE", "")


@unittest.skipUnless(os.path.isdir(IMAGENET_LIKE), "no ImageNet-like JPEG set (CTest's imagenet_like fixture)")
class TritonEnsemble(unittest.TestCase):
    """The ensemble's DALI step against convnets' eval transform and classify, on 100 JPEGs of several sizes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-ensemble-")
        # Random ResNet-18 weights with BatchNorm statistics far from 0/1, so that images get different classes.
        cls.weights = fixtures.random_weights("resnet18", cls.tmp)
        cls.repo = os.path.join(cls.tmp, "repo")
        r = convnets("export", "--checkpoint", cls.weights, "--arch", "resnet18", "--format", "triton", "-o", cls.repo,
                     "--instance-kind", "cpu", "--max-batch-size", "64")
        assert r.returncode == 0, r.stderr
        cls.files = fixtures.imagenet_like_jpegs(100)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_the_ensemble_joins_its_models_by_their_tensors(self):
        configs = {name: triton_config(os.path.join(self.repo, name)) for name in os.listdir(self.repo)}
        self.assertEqual(sorted(configs), ["resnet18", "resnet18_ensemble", "resnet18_preprocessing"])
        ensemble, dali = configs["resnet18_ensemble"], configs["resnet18_preprocessing"]
        self.assertEqual((ensemble.platform, dali.backend), ("ensemble", "dali"))
        tensors = {"INPUT": (ensemble.input[0].data_type, list(ensemble.input[0].dims))}
        for step in ensemble.ensemble_scheduling.step:
            model = configs[step.model_name]
            self.assertEqual(model.max_batch_size, ensemble.max_batch_size)
            inputs = {t.name: (t.data_type, list(t.dims)) for t in model.input}
            outputs = {t.name: (t.data_type, list(t.dims)) for t in model.output}
            self.assertEqual(set(step.input_map), set(inputs), step.model_name)
            self.assertEqual(set(step.output_map), set(outputs), step.model_name)
            for name, tensor in step.input_map.items():
                self.assertEqual(tensors[tensor], inputs[name], (step.model_name, name))  # type and shape flow on
            for name, tensor in step.output_map.items():
                tensors[tensor] = outputs[name]
        self.assertEqual(tensors["LOGITS"], (ensemble.output[0].data_type, list(ensemble.output[0].dims)))
        with open(os.path.join(self.repo, "resnet18_ensemble", "labels.txt")) as f:
            labels = f.read().splitlines()
        self.assertEqual((len(labels), labels[0]), (1000, "tench"))  # ImageNet's, as classify names them
        with open(os.path.join(self.repo, "resnet18", "labels.txt")) as f:
            self.assertEqual(f.read().splitlines(), labels)

    def test_the_serialized_dali_step_gives_convnets_eval_tensors_and_classify_top1(self):
        # As Triton's DALI backend does with 1/dali.py: serialize its @autoserialize pipeline, then load that.
        source = os.path.join(self.repo, "resnet18_preprocessing", "1", "dali.py")
        spec = importlib.util.spec_from_file_location("convnets_dali_model", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        serialized = os.path.join(self.tmp, "model.dali")
        invoke_autoserialize(module, serialized)
        pipe = Pipeline.deserialize(filename=serialized, num_threads=1, device_id=None)
        pipe.build()
        batches = []
        for i in range(0, len(self.files), 64):
            chunk = self.files[i:i + 64]
            pipe.feed_input("DALI_INPUT_0", [np.fromfile(f, dtype=np.uint8) for f in chunk])
            out, = pipe.run()
            batches += [np.array(out[j]) for j in range(len(chunk))]
        dali = np.stack(batches)
        self.assertEqual(dali.shape, (100, 3, 224, 224))
        # convnets' eval transform of the same files (the package's loader, normalized as the model sees it).
        listing = os.path.join(self.tmp, "files.txt")
        with open(listing, "w") as f:
            f.writelines(f"{path} 0\n" for path in self.files)
        sys.path.insert(0, os.environ["CONVNETS_PYTHONPATH"])
        from convnets.data import Loader  # the package; `convnets` here is this module's command runner
        loader = Loader(listing, train=False, image_size=224, crop_ratio=0.875, batch_size=100,
                                      workers=1, normalize=True)
        ours = next(iter(loader))[0].float().numpy()
        # DALI's resampling against convnets' (PIL's): one level of 255 at most, bilinear (measured 2026-11-26:
        # mean 0.16, max 1.00; bicubic reaches 5).
        levels = np.abs(dali - ours) * np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1) * 255
        self.assertLessEqual(float(levels.max()), 1.0 + 1e-3)
        self.assertLess(float(levels.mean()), 0.5)
        # The ensemble's second step on DALI's tensors against classify on the files.
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        sess = onnxruntime.InferenceSession(os.path.join(self.repo, "resnet18", "1", "model.onnx"), so,
                                            providers=["CPUExecutionProvider"])
        ensemble = np.concatenate([sess.run(["logits"], {"input": dali[i:i + 25]})[0].argmax(1)
                                   for i in range(0, 100, 25)])
        r = convnets("classify", *self.files, "--checkpoint", self.weights, "--arch", "resnet18", "--json",
                     "--top-k", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        classify = np.array([x["top"][0]["index"] for x in json.loads(r.stdout)["results"]])
        self.assertGreaterEqual(len(set(classify.tolist())), 5, "the network must tell the images apart")
        self.assertGreaterEqual(int((ensemble == classify).sum()), 99)

if __name__ == "__main__":
    unittest.main()
