"""Inference engines (issue 35): OpenVINO beside LibTorch in classify, eval, bench infer and the Python package.

The OpenVINO engine runs the graph convnets' exporter writes; its logits must
equal LibTorch's (1e-4 of the largest logit) for every family the exporter
covers. bf16 on the CPU is checked where the CPU has native bf16, and its
refusal where it has not (one of the two always runs). INT8: a PTQ export and
a checkpoint's QDQ graph run as INT8 kernels and measure what ONNX Runtime
measures on the same graph; the SiLU placement (--int8-silu) each runtime
wants, in PTQ and QAT.
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
import torch

sys.path.insert(0, os.environ["CONVNETS_PYTHONPATH"])
import convnets  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"


def cli(*args, check=True):
    r = runner.run([BIN, *args], capture_output=True, text=True, timeout=900)
    if check and r.returncode != 0:
        raise AssertionError("convnets %s failed (%d):\n%s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
    return r


def relative_gap(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def fashion_test_batches(model, batch=500):
    """The 10,000 test images through the model's own eval preprocessing, as `convnets eval` reads them."""
    pre = model.preprocessing
    loader = convnets.data.Loader(FASHION, batch_size=batch, train=False, workers=2, image_size=pre["input_size"],
                                  crop_ratio=pre["crop_ratio"], interpolation=pre["interpolation"])
    for images, labels in loader:
        yield images, labels


def onnx_metadata(path):
    return {p.key: p.value for p in onnx.load(path).metadata_props}


def run_graph_as_written(path, x):
    """ONNX Runtime with every optimisation off: each QuantizeLinear/DequantizeLinear in float, the graph's meaning."""
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "2"))  # CTest: the test's share
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


class InAFolder(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-engines-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)


class OnTheSharedCheckpoint(InAFolder):
    """And the suite's trained ResNet-8 (~85 %, so that predictions mean something)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ckpt = fixtures.fashion_resnet8()


@unittest.skipUnless("openvino" in convnets.engines(), "this build has no OpenVINO engine (openvino wheel not found)")
class EveryFamily(InAFolder):
    """OpenVINO against LibTorch for each family of networks, a batch split over OpenVINO's streams (CTest
    engines_families, which takes both cores: one stream per core)."""

    def test_openvino_logits_equal_torch_for_every_family(self):
        # ResNet, ResNeXt (grouped convs), SE-ResNeXt, GPUNet (fused IRBs, SE), EfficientNet (SiLU, SE, depthwise).
        archs = ["resnet50", "resnext50_32x4d", "se_resnext101_32x4d", "gpunet-0", "gpunet-p0", "gpunet-d1",
                 "tf_efficientnet_b2"]
        torch.manual_seed(0)
        # Eleven images: the OpenVINO engine splits them over its streams as six requests (5 x 2 + 1), more than
        # its pool holds on 2 cores (4), so requests are rebound as they finish.
        pixels = torch.randint(0, 256, (11, 64, 64, 3), dtype=torch.uint8)
        for arch in archs:
            with self.subTest(arch=arch):
                # Freshly initialised BN statistics (mean 0, var 1) let a deep random network's activations
                # grow by orders of magnitude, and then LibTorch disagrees with itself (BN folded or not) by
                # 1e-3. Eight steps at learning rate 0 on synthetic images give the BNs real statistics (64 px
                # and batches of 8: every family's layers at a quarter of the 96 px batch-16 cost).
                ws = os.path.join(self.tmp, arch)
                cli("train", "synthetic:64", "--arch", arch, "--image-size", "64", "--epochs", "1", "--lr", "0",
                    "--warmup", "0", "--batch-size", "8", "--max-val-images", "8", "--workspace", ws)
                out = {}
                for engine in ("torch", "openvino"):
                    m = convnets.load(os.path.join(ws, "last.safetensors"), device="cpu", engine=engine,
                                      image_size=64)
                    self.assertEqual(m.engine, engine)
                    out[engine] = m(pixels)
                self.assertEqual(out["openvino"].shape, (11, 1000))
                self.assertLess(relative_gap(out["openvino"], out["torch"]), 1e-4, arch)
                # Not a trivial match: the engines differ far less than two images' logits do.
                between_images = float((out["torch"][0] - out["torch"][1]).abs().max())
                self.assertGreater(between_images, 100 * float((out["openvino"] - out["torch"]).abs().max()))


@unittest.skipUnless("openvino" in convnets.engines(), "this build has no OpenVINO engine (openvino wheel not found)")
class Engines(OnTheSharedCheckpoint):

    def test_engines_agree_on_a_checkpoint_and_auto_says_which(self):
        from PIL import Image
        # classify reads files: eight test images as PNGs.
        paths = []
        images, _ = next(iter(fashion_test_batches(convnets.load(self.ckpt, device="cpu", engine="torch"), 8)))
        for j in range(images.shape[0]):
            p = os.path.join(self.tmp, "img%d.png" % j)
            Image.fromarray(images[j, :, :, 0].numpy()).save(p)
            paths.append(p)
        docs = {}
        for engine in ("torch", "openvino", "auto"):
            r = cli("classify", "--checkpoint", self.ckpt, "--engine", engine, "--device", "cpu", "--json", *paths)
            docs[engine] = json.loads(r.stdout)
            self.assertEqual(docs[engine]["engine"], "torch" if engine == "torch" else "openvino")
        for a, b in zip(docs["torch"]["results"], docs["openvino"]["results"]):
            self.assertEqual([t["index"] for t in a["top"]][:1], [t["index"] for t in b["top"]][:1])
            self.assertAlmostEqual(a["top"][0]["probability"], b["top"][0]["probability"], places=4)
        r = cli("eval", FASHION, "--checkpoint", self.ckpt, "--max-images", "500")
        self.assertIn("engine: openvino", r.stdout)
        self.assertIn("(auto)", r.stdout)
        # The Python package: the same engine by default, the same answers.
        model = convnets.load(self.ckpt, device="cpu")
        self.assertEqual(model.engine, "openvino")
        self.assertEqual(model.predict(paths), docs["auto"]["results"])

    def test_bench_infer_times_the_engines_side_by_side(self):
        out = os.path.join(self.tmp, "bench.json")
        r = cli("bench", "infer", "--arch", "resnet8", "--num-classes", "10", "--image-size", "32", "--batch-sizes",
                "1,4", "--engine", "torch,openvino", "--device", "cpu", "--warmup", "1", "--iterations", "3",
                "--json", out)
        self.assertIn("| Engine | Batch |", r.stdout)
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual([(row["engine"], row["batch"]) for row in doc["rows"]],
                         [("torch", 1), ("torch", 4), ("openvino", 1), ("openvino", 4)])
        self.assertTrue(all(row["images_per_s"] > 0 for row in doc["rows"]))
        self.assertTrue(doc["openvino_version"])

    def test_bench_infer_times_a_checkpoint_and_its_int8_graph(self):
        # A training checkpoint: its arch, input size and classes, not --arch's defaults.
        out = os.path.join(self.tmp, "bench_ckpt.json")
        r = cli("bench", "infer", "--checkpoint", self.ckpt, "--engine", "torch,openvino", "--device", "cpu",
                "--batch-sizes", "2", "--warmup", "1", "--iterations", "2", "--json", out)
        self.assertIn("resnet8 from " + self.ckpt, r.stdout)
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual((doc["arch"], doc["image_size"], doc["checkpoint"], doc["quantized"]),
                         ("resnet8", 28, self.ckpt, False))
        self.assertEqual([row["engine"] for row in doc["rows"]], ["torch", "openvino"])
        # An INT8 export: timed as INT8 by OpenVINO, refused by LibTorch.
        onnx = os.path.join(self.tmp, "bench_int8.onnx")
        cli("export", "--checkpoint", self.ckpt, "--format", "onnx", "--int8", "--dynamic-batch",
            "--calibration", FASHION, "--calibration-images", "64", "-o", onnx)
        r = cli("bench", "infer", "--checkpoint", onnx, "--device", "cpu", "--batch-sizes", "1,4", "--warmup", "1",
                "--iterations", "2", "--json", out)
        self.assertIn(", INT8,", r.stdout.splitlines()[0])
        with open(out) as f:
            doc = json.load(f)
        self.assertTrue(doc["quantized"])
        self.assertEqual([(row["engine"], row["batch"]) for row in doc["rows"]], [("openvino", 1), ("openvino", 4)])
        self.assertTrue(all(row["images_per_s"] > 0 for row in doc["rows"]))
        r = cli("bench", "infer", "--checkpoint", onnx, "--engine", "torch", "--device", "cpu", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is an ONNX graph", r.stderr)
        r = cli("bench", "infer", "--checkpoint", os.path.join(self.tmp, "absent.safetensors"), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("absent.safetensors", r.stderr)

    def test_bad_engine_requests_are_named(self):
        cases = [
            (["eval", FASHION, "--checkpoint", self.ckpt, "--engine", "openvino", "--precision", "amp",
              "--device", "cpu"], "--precision amp needs a CUDA GPU"),
            (["eval", FASHION, "--checkpoint", self.ckpt, "--engine", "tensorrt"], "--engine"),
            (["bench", "infer", "--arch", "resnet8", "--engine", "torch,onnx"], "--engine"),
        ]
        if not torch.cuda.is_available():
            cases.append((["classify", "--checkpoint", self.ckpt, "--engine", "openvino", "--device", "cuda", "x.png"],
                          "--device cuda: no CUDA device is available"))
        for args, message in cases:
            with self.subTest(args=args[:1] + args[-2:]):
                r = cli(*args, check=False)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(message, r.stderr)
        with self.assertRaisesRegex(ValueError, "^engine 'onnxruntime': expected auto"):  # the keyword, not the flag
            convnets.load(self.ckpt, engine="onnxruntime")
        not_onnx = os.path.join(self.tmp, "broken.onnx")
        with open(not_onnx, "wb") as f:
            f.write(b"\x08\x07garbage that is not a protobuf" * 3)
        r = cli("eval", FASHION, "--checkpoint", not_onnx, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("broken.onnx", r.stderr)


@unittest.skipUnless("openvino" in convnets.engines(), "this build has no OpenVINO engine (openvino wheel not found)")
class EngineAccuracy(OnTheSharedCheckpoint):
    """The accuracy claims, on the 10,000 test images: bf16 against fp32, an INT8 graph against ONNX Runtime."""

    def test_bf16_on_the_cpu(self):
        if not fixtures.cpu_has_native_bf16():
            # The other half of the contract: a clear refusal naming the instruction sets.
            for args in (["eval", FASHION, "--checkpoint", self.ckpt, "--precision", "bf16", "--device", "cpu"],
                         ["train", FASHION, "--recipe", "fashion-mnist-resnet8", "--precision", "bf16",
                          "--device", "cpu", "--workspace", os.path.join(self.tmp, "nobf16")]):
                r = cli(*args, check=False)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn("AVX512_BF16 or AMX-BF16", r.stderr)
            self.skipTest("this CPU has no native bf16: the refusal was checked, the agreement cannot be")
        labels_all, preds, first_logits = [], {}, {}
        models = {(e, p): convnets.load(self.ckpt, device="cpu", engine=e, precision=p)
                  for e in ("torch", "openvino") for p in ("fp32", "bf16")}
        # OpenVINO says which kernels it compiled: bf16 ones for the bf16 request, none for the fp32 one.
        self.assertGreaterEqual(models[("openvino", "bf16")].kernel_precisions.get("bf16", 0), 9)
        self.assertNotIn("bf16", models[("openvino", "fp32")].kernel_precisions)
        self.assertEqual(models[("torch", "bf16")].kernel_precisions, {})  # LibTorch does not report
        for images, labels in fashion_test_batches(models[("torch", "fp32")]):
            labels_all.append(labels)
            for key, m in models.items():
                logits = m(images)
                first_logits.setdefault(key, logits)
                preds.setdefault(key, []).append(logits.argmax(1))
        for engine in ("torch", "openvino"):
            # bf16 really ran: its 8-bit mantissa moves the logits by about 1e-2 of their scale (measured 0.013
            # torch, 0.008 OpenVINO), where a bf16 request silently run in fp32 matches fp32 to the last bits, and
            # one that only rounds the input to bf16 moves them by about 1e-3.
            gap = relative_gap(first_logits[(engine, "bf16")].float(), first_logits[(engine, "fp32")])
            self.assertGreater(gap, 3e-3, (engine, gap))
        labels = torch.cat(labels_all)
        self.assertEqual(labels.numel(), 10000)
        for engine in ("torch", "openvino"):
            fp32 = torch.cat(preds[(engine, "fp32")])
            bf16 = torch.cat(preds[(engine, "bf16")])
            top1 = lambda p: float((p == labels).float().mean() * 100)  # noqa: E731
            self.assertGreater(top1(fp32), 70)
            self.assertLessEqual(abs(top1(bf16) - top1(fp32)), 0.2, (engine, top1(bf16), top1(fp32)))
            self.assertGreaterEqual(float((bf16 == fp32).float().mean() * 100), 99.5, engine)

    def test_int8_graphs_run_as_int8_and_measure_what_onnx_runtime_measures(self):
        onnx = os.path.join(self.tmp, "int8.onnx")
        cli("export", "--checkpoint", self.ckpt, "--format", "onnx", "--int8", "--dynamic-batch",
            "--calibration", FASHION, "--calibration-images", "256", "-o", onnx)
        r = cli("eval", FASHION, "--checkpoint", onnx, "--json")
        ours = json.loads(r.stdout)
        self.assertEqual((ours["engine"], ours["quantized"], ours["images"]), ("openvino", True, 10000))
        # What OpenVINO chose after compiling, not what was asked: ResNet-8's nine convolutions in INT8 kernels
        # (u8 activations, i8 weights), where the float network's run in f32.
        int8_kernels = lambda k: k.get("u8", 0) + k.get("i8", 0)  # noqa: E731
        self.assertGreaterEqual(int8_kernels(ours["kernel_precisions"]), 9, ours["kernel_precisions"])
        dense = convnets.load(self.ckpt, device="cpu", engine="openvino").kernel_precisions
        self.assertEqual(int8_kernels(dense), 0, dense)
        self.assertGreaterEqual(dense.get("f32", 0), 9, dense)
        # ONNX Runtime on the same graph and the same pixels (the package's loader = the CLI's).
        sess = onnxruntime.InferenceSession(onnx, providers=["CPUExecutionProvider"])
        model = convnets.load(onnx)
        self.assertEqual((model.engine, model.quantized), ("openvino", True))
        mean = torch.tensor(model.preprocessing["mean"]).view(1, 3, 1, 1)
        std = torch.tensor(model.preprocessing["std"]).view(1, 3, 1, 1)
        hits, agree, n = 0, 0, 0
        for images, labels in fashion_test_batches(model):
            x = images.permute(0, 3, 1, 2).float().div(255).expand(-1, 3, -1, -1)
            x = ((x - mean) / std).contiguous()
            ort = torch.from_numpy(sess.run(None, {"input": x.numpy()})[0]).argmax(1)
            ov = model(images).argmax(1)
            hits += int((ort == labels).sum())
            agree += int((ort == ov).sum())
            n += labels.numel()
        self.assertGreaterEqual(agree / n, 0.99)
        self.assertLess(abs(ours["val.top1"] - 100.0 * hits / n), 0.5, (ours["val.top1"], 100.0 * hits / n))
        # The same graph through the torch engine is refused, naming the way out.
        r = cli("eval", FASHION, "--checkpoint", onnx, "--engine", "torch", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is an ONNX graph", r.stderr)
        self.assertIn("--engine openvino", r.stderr)


class SiluPlacement(unittest.TestCase):
    """--int8-silu: GPUNet-0's seven SiLUs quantized as two ops (ONNX Runtime's form) or in float after their conv
    (OpenVINO's), in PTQ and in QAT, and the float form's graph computes what QAT's fake quantization does."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-int8-silu-")
        cls.dense = os.path.join(cls.tmp, "dense")
        # Twelve steps on random images and labels: BN statistics and logits that depend on the image (a freshly
        # initialised GPUNet-0's barely do), so that quantization's rounding shows in them.
        cli("train", "synthetic:64", "--arch", "gpunet-0", "--image-size", "96", "--epochs", "3", "--lr", "0.2",
            "--warmup", "0", "--batch-size", "16", "--max-val-images", "16", "--workspace", cls.dense)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def export(self, name, checkpoint, *extra):
        out = os.path.join(self.tmp, name)
        self.said = cli("export", "--checkpoint", checkpoint, "--format", "onnx", "--dynamic-batch", "--int8", "-o", out,
                        *extra).stdout
        return out

    def sigmoid_inputs(self, path):
        """For each Sigmoid: what feeds it, and whether its Mul's output goes only into a QuantizeLinear."""
        m = onnx.load(path)
        onnx.checker.check_model(m)
        producer = {o: n for n in m.graph.node for o in n.output}
        consumers = {}
        for n in m.graph.node:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        rows = []
        for n in m.graph.node:
            if n.op_type == "Sigmoid":
                mul = [c for c in consumers[n.output[0]] if c.op_type == "Mul"]
                after = [c.op_type for c in consumers[mul[0].output[0]]] if mul else []
                rows.append((producer[n.input[0]].op_type, after))
        return rows, len(json.loads(onnx_metadata(path)["quantization"])["points"])

    def test_ptq_float_silu_follows_its_conv_and_is_quantized_once(self):
        ckpt = os.path.join(self.dense, "last.safetensors")
        calib = ("--calibration", "synthetic:32", "--calibration-images", "32")
        ops, ops_points = self.sigmoid_inputs(self.export("ops.onnx", ckpt, *calib))
        flt, flt_points = self.sigmoid_inputs(self.export("float.onnx", ckpt, *calib, "--int8-silu", "float"))
        self.assertIn("SiLU in float", self.said)
        # Ops: every Sigmoid reads a dequantized tensor (7 SiLUs and 2 SE gates).
        self.assertEqual([src for src, _ in ops], ["DequantizeLinear"] * 9)
        # Float: the seven SiLUs read their conv directly and are quantized once, after the Mul; the SE gates
        # (a Sigmoid on its own) keep the ops form.
        silus = [(src, after) for src, after in flt if src == "Conv"]
        self.assertEqual(len(silus), 7, flt)
        self.assertTrue(all(after == ["QuantizeLinear"] for _, after in silus), silus)
        self.assertEqual(sum(src == "DequantizeLinear" for src, _ in flt), 2, flt)
        # Each SiLU drops two quantized tensors: its input and its sigmoid's output.
        self.assertEqual(ops_points - flt_points, 14, (ops_points, flt_points))
        self.assertEqual(json.loads(onnx_metadata(os.path.join(self.tmp, "float.onnx"))["quantization"])["silu"], "float")
        # The package's export is the CLI's: the same graph from the same keywords.
        out = os.path.join(self.tmp, "package.onnx")
        convnets.export(ckpt, out, format="onnx", dynamic_batch=True, int8=True, calibration="synthetic:32",
                        calibration_images=32, int8_silu="float")
        self.assertEqual(self.sigmoid_inputs(out), (flt, flt_points))
        with self.assertRaisesRegex(ValueError, "^int8_silu 'fused': expected ops"):
            convnets.export(ckpt, out + ".bad", format="onnx", int8=True, calibration="synthetic:8", int8_silu="fused")

    def test_qat_trains_the_float_silu_graph_it_exports(self):
        ws = os.path.join(self.tmp, "qat")
        r = cli("train", "synthetic:64", "--arch", "gpunet-0", "--image-size", "96", "--epochs", "1", "--lr", "0",
                "--warmup", "0", "--batch-size", "16", "--max-val-images", "16", "--workspace", ws,
                "--fine-tune", os.path.join(self.dense, "last.safetensors"), "--qat", "--int8-silu", "float",
                "--calibration-images", "32")
        self.assertIn("SiLU float", r.stdout)
        ckpt = os.path.join(ws, "last.safetensors")
        path = self.export("qat_float.onnx", ckpt)
        plan = json.loads(onnx_metadata(path)["quantization"])  # the checkpoint's plan, as the export carries it
        self.assertEqual(plan["silu"], "float")
        # Calibration (and so the fake quantization that must visit the same points) used the float placement:
        # as many points as a float PTQ export of the same network, 14 fewer than the ops form.
        ptq = self.export("ptq_float.onnx", os.path.join(self.dense, "last.safetensors"), "--calibration",
                          "synthetic:8", "--calibration-images", "8", "--int8-silu", "float")
        self.assertEqual(len(plan["points"]), len(json.loads(onnx_metadata(ptq)["quantization"])["points"]))
        self.assertIn("qat: %d quantized tensors calibrated" % len(plan["points"]), r.stdout)
        rows, _ = self.sigmoid_inputs(path)
        self.assertEqual(sum(src == "Conv" for src, _ in rows), 7, rows)
        # Resumed, it goes on with its own placement: asking for the other is refused before anything is written.
        before = os.path.getmtime(ckpt)
        r = cli("train", "--workspace", ws, "--resume", ckpt, "--epochs", "2", "--int8-silu", "ops", check=False)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("was trained with uint8 activations and SiLU float, the run asks for uint8 and SiLU ops", r.stderr)
        self.assertEqual(os.path.getmtime(ckpt), before)
        # Its placement is the one it trained with: asking for the other is refused, naming both.
        r = cli("export", "--checkpoint", ckpt, "--format", "onnx", "--int8", "--int8-silu", "ops",
                "-o", os.path.join(self.tmp, "no.onnx"), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--int8-silu", r.stderr)
        self.assertIn("SiLU float", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "no.onnx")))
        # The fake-quantized network (the torch engine) and the exported graph run as written compute the same
        # logits, up to the odd value that float summation order rounds to the neighbouring step.
        model = convnets.load(ckpt, device="cpu", engine="torch")
        rng = np.random.default_rng(0)
        pixels = rng.integers(0, 256, (8, 96, 96, 3), dtype=np.uint8)
        ours = model(torch.from_numpy(pixels)).numpy()
        mean = np.array(model.preprocessing["mean"], dtype=np.float32).reshape(1, 3, 1, 1)
        std = np.array(model.preprocessing["std"], dtype=np.float32).reshape(1, 3, 1, 1)
        x = ((pixels.transpose(0, 3, 1, 2).astype(np.float32) / 255 - mean) / std).astype(np.float32)
        graph = run_graph_as_written(path, x)
        unquantized = convnets.load(ckpt, device="cpu", engine="torch", float_weights=True)
        unquantized = unquantized(torch.from_numpy(pixels)).numpy()
        to_fake_quant = np.abs(graph - ours).max()
        self.assertLess(to_fake_quant, 1e-2 * np.abs(ours).max(), (to_fake_quant, np.abs(ours).max()))
        # Not a trivial match: quantization moved the logits far more than the two computations differ.
        self.assertGreater(np.abs(ours - unquantized).max(), 100 * to_fake_quant)


if __name__ == "__main__":
    unittest.main()
