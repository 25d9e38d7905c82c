"""`convnets export --format onnx` checked by two implementations no one here wrote: OpenCV's DNN
module and ONNX Runtime (opencv-python-headless and onnxruntime in .venv) run the exported graph, and
their logits must equal convnets' own on the same weights and input, with and without BN folding,
static and dynamic batch.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

import cv2
import numpy as np
import onnx
import onnxruntime
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import fixtures  # noqa: E402
import pth2safetensors  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
SIZE = 64  # every arch runs at 64 px here: the graph is the same at any size
ARCHS = ["resnet10s", "resnet18", "resnet50", "se_resnext101_32x4d", "gpunet-0", "gpunet-1", "gpunet-2", "gpunet-p0",
         "gpunet-p1", "gpunet-d1", "gpunet-d2"]


def convnets(*args, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def relative_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def opencv_logits(path, x):
    net = cv2.dnn.readNetFromONNX(path)
    net.setInput(x)
    return net.forward()


def onnxruntime_logits(path, x):
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "2"))  # CTest: the test's share
    sess = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


class OnnxCase(unittest.TestCase):
    """A folder per class, and random weights with real BatchNorm statistics."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-onnx-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def weights_with_real_bn(self, arch):
        """Random weights whose BN statistics and affine parameters are far from 0/1, so folding matters."""
        return fixtures.random_weights(arch, self.tmp, num_classes=10, seed=11)

    def reference(self, arch, weights, batch):
        io = self.path(arch + ".io.safetensors")
        r = convnets("models", "--arch", arch, "--num-classes", "10", "--weights", weights, "--forward",
                     "--batch-size", str(batch), "--input-size", str(SIZE), "--seed", "13", "--forward-save", io)
        self.assertEqual(r.returncode, 0, r.stderr)
        t, _ = pth2safetensors.read_safetensors(io)
        return t["input"].numpy(), t["logits"].numpy()


class OnnxAgainstOpenCv(OnnxCase):
    """Every arch's graph against OpenCV's and ONNX Runtime's own runs, within 1e-4 (CTest onnx_accuracy)."""

    def test_every_arch_matches_opencv_and_onnxruntime_with_and_without_bn_folding(self):
        for arch in ARCHS:
            with self.subTest(arch):
                w = self.weights_with_real_bn(arch)
                x, ours = self.reference(arch, w, 2)
                plain, folded = self.path(arch + ".onnx"), self.path(arch + ".folded.onnx")
                r = convnets("export", "--checkpoint", w, "--arch", arch, "--format", "onnx", "-o", plain,
                             "--image-size", str(SIZE), "--batch-size", "2")
                self.assertEqual(r.returncode, 0, r.stderr)
                r = convnets("export", "--checkpoint", w, "--arch", arch, "--format", "onnx", "-o", folded,
                             "--image-size", str(SIZE), "--fold-bn", "--dynamic-batch")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertLess(relative_error(opencv_logits(plain, x), ours), 1e-4)
                # OpenCV 4.6 infers shapes with a symbolic batch as 1 (a batch of 2 fails or broadcasts
                # SE gates wrongly), so the dynamic graph runs one image there.
                self.assertLess(relative_error(opencv_logits(folded, x[:1]), ours[:1]), 1e-4)
                # ONNX Runtime takes the symbolic batch as it is: both images through the dynamic graph.
                self.assertLess(relative_error(onnxruntime_logits(plain, x), ours), 1e-4)
                self.assertLess(relative_error(onnxruntime_logits(folded, x), ours), 1e-4)
                m = onnx.load(folded)
                self.assertNotIn("BatchNormalization", {n.op_type for n in m.graph.node})
                self.assertIn("BatchNormalization", {n.op_type for n in onnx.load(plain).graph.node})


class OnnxGraphs(OnnxCase):
    """The exported graph's metadata, fp16 weights and refusals (CTest onnx_cli)."""

    def test_graph_metadata_opset_and_shapes(self):
        w = self.weights_with_real_bn("resnet18")
        out = self.path("meta.onnx")
        r = convnets("export", "--checkpoint", w, "--arch", "resnet18", "--format", "onnx", "-o", out,
                     "--dynamic-batch")
        self.assertEqual(r.returncode, 0, r.stderr)
        m = onnx.load(out)
        onnx.checker.check_model(m)
        self.assertGreaterEqual(m.opset_import[0].version, 13)
        props = {p.key: p.value for p in m.metadata_props}
        self.assertEqual(props["arch"], "resnet18")
        self.assertEqual(json.loads(props["preprocessing"])["input_size"], 224)
        self.assertEqual(json.loads(props["preprocessing"])["crop_ratio"], 0.875)
        dims = [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
        self.assertEqual(dims, ["batch", 3, 224, 224])
        dims = [d.dim_param or d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
        self.assertEqual(dims, ["batch", 10])

    def test_fp16_weights_hold_the_fp32_weights_rounded(self):
        # OpenCV 4.6 reads no FLOAT16 tensors: the fp16 graph is checked by ONNX's checker, and its
        # weights, widened back to fp32, must give the fp32 logits to fp16 precision.
        arch = "gpunet-0"
        w = self.weights_with_real_bn(arch)
        x, ours = self.reference(arch, w, 2)
        half = self.path("half.onnx")
        r = convnets("export", "--checkpoint", w, "--arch", arch, "--format", "onnx", "-o", half, "--image-size",
                     str(SIZE), "--batch-size", "2", "--dtype", "fp16")
        self.assertEqual(r.returncode, 0, r.stderr)
        m = onnx.load(half)
        onnx.checker.check_model(m)
        self.assertEqual(m.graph.input[0].type.tensor_type.elem_type, onnx.TensorProto.FLOAT16)
        for init in m.graph.initializer:
            self.assertEqual(init.data_type, onnx.TensorProto.FLOAT16, init.name)
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
        for v in (m.graph.input[0], m.graph.output[0]):
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        widened = self.path("widened.onnx")
        onnx.save(m, widened)
        self.assertLess(relative_error(opencv_logits(widened, x), ours), 2e-2)

    def test_bad_requests_are_named_and_write_nothing(self):
        w = self.weights_with_real_bn("resnet18")
        out = self.path("never.onnx")
        r = convnets("export", "--checkpoint", w, "--format", "onnx", "-o", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is a plain weights file; name its --arch", r.stderr)
        r = convnets("export", "--checkpoint", w, "--arch", "resnet18", "--format", "onnx", "-o", out, "--opset", "11")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--opset 11", r.stderr)
        r = convnets("export", "--checkpoint", w, "--arch", "resnet34", "--format", "onnx", "-o", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is missing from the file", r.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
