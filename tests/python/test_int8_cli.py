"""INT8 export and quantization-aware training, checked by runtimes convnets did not write.

A ResNet-8 trained briefly on Debian's Fashion-MNIST is exported as float and
as INT8 QDQ ONNX; ONNX Runtime and OpenVINO (PyPI, CPU) run both on the test
images. Checked: the graph is the QDQ form the runtimes fuse (per-channel int8
weights on axis 0, int32 bias, uint8 activations with ReLUs folded; int8
symmetric with ReLUs kept), INT8 top-1 close to float in both runtimes, the
runtimes agree, ONNX Runtime's fused integer kernels compute what the graph
says (its unoptimised reference run), QAT's own validation (fake quantization
in convnets) equals the exported graph's accuracy, and the errors.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import onnx_accuracy  # noqa: E402
import pth2safetensors  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"
VAL_IMAGES = 2000


def convnets(*args, timeout=900):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def run_ort(path, x, optimized=True):
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "2"))  # CTest: the test's share
    if not optimized:
        # Every QuantizeLinear/DequantizeLinear run as written, in float: the graph's meaning.
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"input": b})[0] for b in onnx_accuracy.batches(x, 500)])


def checkpoint_meta(path):
    _, meta = pth2safetensors.read_safetensors(path)
    return json.loads(meta["convnets"])


def metadata(path):
    return {p.key: p.value for p in onnx.load(path).metadata_props}


@unittest.skipUnless(os.path.isdir(FASHION), f"{FASHION} (Debian's fashion-mnist package) is not installed")
class Int8(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-int8-")
        cls.ckpt = fixtures.fashion_resnet8()  # the suite's trained ResNet-8, read only
        cls.ws = os.path.dirname(cls.ckpt)
        cls.images, cls.labels = onnx_accuracy.load_split(FASHION, "test", VAL_IMAGES)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def export(self, name, *extra, checkpoint=None):
        out = os.path.join(self.tmp, name)
        r = convnets("export", "--checkpoint", checkpoint or self.ckpt, "--format", "onnx", "--dynamic-batch",
                     "-o", out, *extra)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return out

    def int8(self, name, *extra, checkpoint=None):
        return self.export(name, "--int8", "--calibration", FASHION, "--calibration-images", "256",
                           *extra, checkpoint=checkpoint)

    def inputs(self, path):
        return onnx_accuracy.preprocess(self.images, metadata(path))

    def top1(self, logits):
        return float((logits.argmax(1) == self.labels).mean() * 100)

    def test_the_uint8_graph_is_the_qdq_form_onnx_runtime_fuses(self):
        path = self.int8("u8.onnx", "--calibration-method", "minmax", "--int8-reduce-range")
        m = onnx.load(path)
        onnx.checker.check_model(m)
        init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        producer = {o: n for n in m.graph.node for o in n.output}
        ops = [n.op_type for n in m.graph.node]
        self.assertNotIn("Relu", ops)  # every ReLU folded into a uint8 quantizer
        self.assertNotIn("BatchNormalization", ops)
        convs = [n for n in m.graph.node if n.op_type in ("Conv", "Gemm")]
        self.assertEqual(len(convs), 10)  # ResNet-8: 7 3x3 convs, 2 projections, the classifier
        for n in convs:
            x, w, b = (producer[i] for i in n.input)
            for dq in (x, w, b):
                self.assertEqual(dq.op_type, "DequantizeLinear", n.name)
            q = producer[x.input[0]]
            self.assertEqual(q.op_type, "QuantizeLinear")
            self.assertEqual(init[q.input[2]].dtype, np.uint8)
            wq, ws = init[w.input[0]], init[w.input[1]]
            self.assertEqual(wq.dtype, np.int8)
            self.assertEqual(ws.shape, (wq.shape[0],))  # one scale per output channel
            self.assertEqual([a.i for a in w.attribute if a.name == "axis"], [0])
            self.assertLessEqual(np.abs(wq.astype(int)).max(), 63)  # reduce range: 7-bit
            self.assertTrue((np.abs(wq.astype(int)).reshape(len(wq), -1).max(1) == 63).all())
            bq, bs = init[b.input[0]], init[b.input[1]]
            self.assertEqual(bq.dtype, np.int32)
            np.testing.assert_allclose(bs, ws * init[x.input[1]], rtol=1e-6)  # input scale x weight scale
        # The classifier's logits stay float: no quantizer after the last Gemm.
        self.assertEqual(m.graph.node[-1].op_type, "Gemm")
        q = json.loads(metadata(path)["quantization"])
        self.assertEqual((q["activations"], q["method"], q["reduce_range"], q["images"]), ("uint8", "minmax", True, 256))

    def test_int8_activations_are_symmetric_with_the_relus_kept(self):
        path = self.int8("s8.onnx", "--int8-activations", "int8")
        m = onnx.load(path)
        init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        ops = [n.op_type for n in m.graph.node]
        self.assertEqual(ops.count("Relu"), 7)
        for n in m.graph.node:
            if n.op_type == "QuantizeLinear":
                self.assertEqual(init[n.input[2]].dtype, np.int8)
                self.assertEqual(int(init[n.input[2]]), 0)
        # TensorRT quantizes no bias: the convs' biases stay float.
        self.assertTrue(all(init[n.input[2]].dtype == np.float32 for n in m.graph.node if n.op_type == "Conv"))
        x = self.inputs(path)
        self.assertEqual(run_ort(path, x, optimized=False).argmax(1).shape, (VAL_IMAGES,))

    def test_ptq_accuracy_in_onnx_runtime_and_openvino(self):
        fp32 = self.export("fp32.onnx")
        u8 = self.int8("ptq.onnx", "--calibration-method", "percentile", "--int8-reduce-range")
        x = self.inputs(fp32)
        ref = self.top1(run_ort(fp32, x))
        ort_logits = run_ort(u8, x)
        ort_top1 = self.top1(ort_logits)
        self.assertGreater(ref, 60)  # two short epochs: a model worth quantizing
        self.assertLess(abs(ort_top1 - ref), 2.0, (ort_top1, ref))
        ov = onnx_accuracy.run_openvino(u8, x, 500, 2)
        agreement = float((ov.argmax(1) == ort_logits.argmax(1)).mean() * 100)
        self.assertGreaterEqual(agreement, 98.0)
        # ONNX Runtime's fused integer kernels (QLinearConv, QLinearAdd, ...) compute what the QDQ graph says.
        reference = run_ort(u8, x, optimized=False)
        self.assertGreaterEqual(float((reference.argmax(1) == ort_logits.argmax(1)).mean() * 100), 99.5)

    def test_qat_trains_what_the_int8_export_computes(self):
        ws = os.path.join(self.tmp, "qat")
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--workspace", ws, "--fine-tune", self.ckpt,
                     "--qat", "--epochs", "1", "--lr", "0.01", "--warmup", "0", "--max-train-images", "4000",
                     "--max-val-images", str(VAL_IMAGES), "--calibration-images", "256", "--calibration-method",
                     "minmax", "--int8-reduce-range")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("qat: 14 quantized tensors calibrated", r.stdout)
        with open(os.path.join(ws, "log.json")) as f:
            log = [json.loads(line.removeprefix("DLLL ")) for line in f if line.strip()]
        fake_quant_top1 = [e["data"]["val.top1"] for e in log if "val.top1" in e.get("data", {})][-1]
        path = self.export("qat.onnx", "--int8", checkpoint=os.path.join(ws, "last.safetensors"))
        x = self.inputs(path)
        # The same computation up to float summation order: a handful of borderline images may flip.
        graph_top1 = self.top1(run_ort(path, x, optimized=False))
        self.assertLess(abs(graph_top1 - fake_quant_top1), 0.3, (graph_top1, fake_quant_top1))
        # `convnets eval` measures the QAT checkpoint as that INT8 network; --float, its float weights.
        evaluated = {}
        for extra in ([], ["--float"]):
            r = convnets("eval", FASHION, "--checkpoint", os.path.join(ws, "last.safetensors"), "--max-images",
                         str(VAL_IMAGES), "--json", *extra)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            evaluated[bool(extra)] = json.loads(r.stdout)
        self.assertEqual((evaluated[False]["quantized"], evaluated[True]["quantized"]), (True, False))
        # And OpenVINO (eval's engine on the CPU) ran it so: the INT8 network's nine convolutions in INT8 kernels,
        # the float weights' in f32 (the engine's own report after compiling, not the flag above).
        # (A build without OpenVINO evaluates with LibTorch, which reports nothing.)
        int8_kernels = [sum(evaluated[f]["kernel_precisions"].get(p, 0) for p in ("u8", "i8")) for f in (False, True)]
        if evaluated[False]["engine"] == "openvino":
            self.assertGreaterEqual(int8_kernels[0], 9, evaluated[False]["kernel_precisions"])
            self.assertEqual(int8_kernels[1], 0, evaluated[True]["kernel_precisions"])
        else:
            self.assertEqual(evaluated[False]["kernel_precisions"], {})
        self.assertNotEqual(evaluated[False]["val.loss"], evaluated[True]["val.loss"])  # two computations
        self.assertLess(abs(evaluated[False]["val.top1"] - fake_quant_top1), 0.3,
                        (evaluated[False]["val.top1"], fake_quant_top1))
        r = convnets("eval", FASHION, "--checkpoint", os.path.join(ws, "last.safetensors"), "--fold-bn")
        self.assertEqual(r.returncode, 1)
        self.assertIn("is quantization-aware; its quantized network folds its BatchNorms already", r.stderr)
        # QAT checkpoints carry their ranges: no recalibration, and the flags that would change them are refused.
        r = convnets("export", "--checkpoint", os.path.join(ws, "last.safetensors"), "--format", "onnx", "--int8",
                     "--calibration", FASHION, "-o", os.path.join(self.tmp, "no.onnx"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("was trained with --qat and carries its ranges", r.stderr)
        # A resumed QAT run goes on with its own ranges (the resumed config keeps --qat), not recalibrated ones.
        before = checkpoint_meta(os.path.join(ws, "last.safetensors"))["quantization"]
        r = convnets("train", "--workspace", ws, "--resume", os.path.join(ws, "last.safetensors"), "--epochs", "2")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("calibrat", r.stdout)
        after = checkpoint_meta(os.path.join(ws, "last.safetensors"))
        self.assertEqual((after["quantization"], after["epoch"]), (before, 2))
        # A dense run cannot be resumed as QAT (a copy of the shared run: were the refusal to regress, the
        # resumed run would write into it).
        dense = os.path.join(self.tmp, "dense-copy")
        shutil.copytree(self.ws, dense)
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--workspace", dense, "--resume",
                     os.path.join(dense, "last.safetensors"), "--qat", "--epochs", "3")
        self.assertEqual(r.returncode, 1)
        self.assertIn("that run was not quantization-aware", r.stderr)

    def test_bad_input_is_refused_with_the_reason(self):
        out = os.path.join(self.tmp, "bad.onnx")
        r = convnets("export", "--checkpoint", self.ckpt, "--format", "onnx", "--int8", "-o", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--int8 needs calibration images: add --calibration DATA", r.stderr)
        r = convnets("export", "--checkpoint", self.ckpt, "--format", "onnx", "--int8", "--dtype", "fp16",
                     "--calibration", FASHION, "--calibration-images", "8", "-o", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--int8 and --dtype fp16 exclude each other", r.stderr)
        r = convnets("export", "--checkpoint", self.ckpt, "--format", "onnx", "--calibration", FASHION, "-o", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--calibration applies to --int8", r.stderr)
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--workspace", os.path.join(self.tmp, "scratch"),
                     "--qat", "--epochs", "1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--qat fine-tunes a trained model: add --fine-tune WEIGHTS", r.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
