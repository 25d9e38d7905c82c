"""`convnets serve` through Triton's own, unmodified HTTP client (PyPI's tritonclient) and raw sockets.

Protocol: health, server and model metadata, model config, the repository index, and infer with JSON and binary
tensors and the classification extension, for the suite's Fashion-MNIST ResNet-8, a ResNet-50, and a Triton
repository that `convnets export --format triton` wrote. Answers: encoded JPEGs give classify's top-1 and
probabilities; float tensors give the package's logits (classify's engine) within 1e-5. Batching: concurrent
requests share a forward pass; a full queue is answered 503 at once; a request timeout expires. Hostile requests
(malformed JSON, shapes over the limits, a datatype mismatch, a truncated and a bomb image, a body over the limit,
a client that sends a byte a second, a thousand idle connections) each get a clear status and the next good
request succeeds. SIGTERM: every request accepted is answered, new ones get 503, and the exit status is 0.

Every server listens on 127.0.0.1 only, on a port it picks, and is stopped by the test that started it.
"""
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import zlib

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import numpy as np
import grpc
import tritonclient.grpc as tritongrpc
import tritonclient.http as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
HOST = "127.0.0.1"


def convnets(*args, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def still_open(sockets):
    """How many of SOCKETS the server has not closed: no EOF waiting on them (each left non-blocking)."""
    n = 0
    for s in sockets:
        s.setblocking(False)
        try:
            n += s.recv(1) != b""
        except BlockingIOError:
            n += 1
    return n


class Serve:
    """A `convnets serve` process on free loopback ports; stop() sends SIGTERM and gives its exit status."""

    def __init__(self, *args):
        grpc = [] if "--grpc-port" in args else ["--grpc-port", "0"]
        self.proc = subprocess.Popen([BIN, "serve", *args, "--host", HOST, "--port", "0", "--metrics-port", "0", *grpc],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.startup = []
        self.grpc_url = None
        for line in self.proc.stdout:
            self.startup.append(line)
            if " gRPC on " in line:
                self.grpc_url = line.split(" gRPC on ")[1].split()[0]
            if " HTTP on " in line:
                break
        else:
            self.proc.wait(timeout=30)
            raise AssertionError("convnets serve did not start: " + "".join(self.startup) + self.proc.stderr.read())
        words = line.split()
        self.url = words[words.index("on") + 1].removeprefix("http://")
        self.metrics_url = words[-1]
        self.port = int(self.url.rsplit(":", 1)[1])
        self.client = triton.InferenceServerClient(self.url, connection_timeout=60, network_timeout=120)

    def metrics(self):
        text = urllib.request.urlopen(self.metrics_url, timeout=30).read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                values[key] = float(value)
        return values

    def stop(self, timeout=60):
        """SIGTERM, then its exit status; again, the same status (a test's `finally` and its cleanup may both ask)."""
        if self.proc.stdout.closed:
            return self.proc.returncode
        self.client.close()  # its keep-alive connection would hold the drain until --idle-timeout-s
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc


def stopped(test, server):
    """A cleanup: `server` stopped whatever the test did before (another server's failed stop included), its exit
    status checked."""
    test.assertEqual(server.stop(), 0, server.stderr)


def started(test, *args):
    """A Serve that `test` stops when it ends, whichever assertion failed first."""
    server = Serve(*args)
    test.addCleanup(stopped, test, server)
    return server


def read(path):
    with open(path, "rb") as f:
        return f.read()


def image_input(paths):
    data = np.array([[read(p)] for p in paths], dtype=np.object_)
    x = triton.InferInput("INPUT", list(data.shape), "BYTES")
    x.set_data_from_numpy(data, binary_data=True)
    return x


def tensor_input(x, binary=True):
    t = triton.InferInput("input", list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=binary)
    return t


def pixel_input(pixels):
    p = triton.InferInput("PIXELS", list(pixels.shape), "UINT8")
    p.set_data_from_numpy(pixels, binary_data=True)
    return p


def raw(port, payload, read_timeout=30):
    """Sends bytes on a fresh connection; gives (status, body) of the answer, or (None, b"") if none came."""
    with socket.create_connection((HOST, port), timeout=read_timeout) as s:
        s.sendall(payload)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
                    if length and len(body) >= length[0]:
                        break
        except socket.timeout:
            pass
    if not data.startswith(b"HTTP/1.1 "):
        return None, b""
    head, _, body = data.partition(b"\r\n\r\n")
    length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
    # The first answer only: after refusing a body it did not read, httplib 0.11.4 keeps the connection and
    # answers what follows as another request.
    return int(head.split(b" ")[1]), body[:length[0]] if length else body


def post(port, path, body, headers=()):
    head = f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    return raw(port, head.encode() + b"\r\n" + body)


def infer_json(inputs):
    return json.dumps({"inputs": inputs}).encode()


def png_header_bomb(width, height):
    """A PNG that declares width x height pixels and holds almost none of them."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) +
            chunk(b"IEND", b""))


class FashionModel(unittest.TestCase):
    """The protocol and the answers, with the suite's Fashion-MNIST checkpoint."""

    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()
        cls.files = fixtures.imagenet_like_jpegs(100)
        cls.server = Serve(f"fashion={cls.ckpt}", "--max-batch-size", "16")
        cls.addClassCleanup(cls.server.stop)  # also where the rest of setUpClass fails

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_health_metadata_config_and_index(self):
        c = self.server.client
        self.assertTrue(c.is_server_live())
        self.assertTrue(c.is_server_ready())
        self.assertTrue(c.is_model_ready("fashion"))
        self.assertFalse(c.is_model_ready("absent"))
        meta = c.get_server_metadata()
        self.assertEqual(meta["name"], "convnets")
        self.assertIn("binary_tensor_data", meta["extensions"])
        model = c.get_model_metadata("fashion")
        self.assertEqual(model["versions"], ["1"])
        self.assertEqual({i["name"]: (i["datatype"], i["shape"]) for i in model["inputs"]},
                         {"INPUT": ("BYTES", [-1, 1]), "input": ("FP32", [-1, 3, 28, 28]),
                          "PIXELS": ("UINT8", [-1, 28, 28, 3])})
        self.assertEqual(model["outputs"], [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}])
        self.assertEqual(c.get_model_metadata("fashion", model_version="1")["name"], "fashion")
        with self.assertRaisesRegex(InferenceServerException, "version 2 is not found"):
            c.get_model_metadata("fashion", model_version="2")
        config = c.get_model_config("fashion")
        self.assertEqual(config["max_batch_size"], 16)
        self.assertEqual(config["dynamic_batching"]["default_queue_policy"]["max_queue_size"], 64)
        self.assertEqual(json.loads(config["parameters"]["preprocessing"]["string_value"])["input_size"], 28)
        self.assertEqual(c.get_model_repository_index(), [{"name": "fashion", "version": "1", "state": "READY"}])
        with self.assertRaisesRegex(InferenceServerException, "unknown model: 'absent'"):
            c.get_model_metadata("absent")
        self.assertIn("fashion from " + self.ckpt, "".join(self.server.startup))
        self.assertRegex("".join(self.server.startup), r"resnet8, 10 classes, 28x28 input; (openvino|torch)")

    def test_jpeg_bytes_give_classify_top1_and_probabilities(self):
        r = convnets("classify", *self.files, "--checkpoint", self.ckpt, "--json", "--top-k", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = [(x["top"][0]["index"], x["top"][0]["probability"]) for x in json.loads(r.stdout)["results"]]
        got = []
        for begin in range(0, 100, 16):  # batches of up to 16, as a client sends them
            out = self.server.client.infer("fashion", [image_input(self.files[begin:begin + 16])])
            got.extend(out.as_numpy("logits"))
        logits = np.stack(got)
        probabilities = np.exp(logits - logits.max(1, keepdims=True))
        probabilities /= probabilities.sum(1, keepdims=True)
        top1 = logits.argmax(1)
        self.assertEqual(sum(int(t) == e for t, (e, _) in zip(top1, expected)), 100)
        self.assertGreaterEqual(len(set(top1.tolist())), 3, "a constant answer would pass a top-1 comparison")
        np.testing.assert_allclose([probabilities[i, e] for i, (e, _) in enumerate(expected)],
                                   [p for _, p in expected], rtol=0, atol=1e-5)

    def test_float_tensors_give_the_package_logits(self):
        import convnets  # the package: classify's InferenceModel, its engine chosen as classify chooses it
        x = np.random.default_rng(3).standard_normal((5, 3, 28, 28)).astype(np.float32)
        expected = convnets.load(self.ckpt, device="cpu")(__import__("torch").from_numpy(x)).numpy()
        for binary in (True, False):  # Triton's binary tensor extension and JSON "data"
            out = self.server.client.infer("fashion", [tensor_input(x, binary)],
                                           outputs=[triton.InferRequestedOutput("logits", binary_data=binary)])
            np.testing.assert_allclose(out.as_numpy("logits"), expected, rtol=0, atol=1e-5)
        pixels = np.random.default_rng(4).integers(0, 256, (2, 28, 28, 3), dtype=np.uint8)
        p = triton.InferInput("PIXELS", list(pixels.shape), "UINT8")
        p.set_data_from_numpy(pixels)
        expected = convnets.load(self.ckpt, device="cpu")(__import__("torch").from_numpy(pixels)).numpy()
        np.testing.assert_allclose(self.server.client.infer("fashion", [p]).as_numpy("logits"), expected, rtol=0,
                                   atol=1e-5)

    def test_classification_extension_and_the_ensemble_output_name(self):
        names = fixtures.fashion_class_names()  # the dataset's own, from its README: not the server's reader
        x = np.random.default_rng(5).standard_normal((3, 3, 28, 28)).astype(np.float32)
        logits = self.server.client.infer("fashion", [tensor_input(x)]).as_numpy("logits")
        out = self.server.client.infer("fashion", [tensor_input(x)],
                                       outputs=[triton.InferRequestedOutput("logits", class_count=3)])
        rows = out.as_numpy("logits")
        self.assertEqual(rows.shape, (3, 3))
        for i in range(3):
            fields = [r.decode().split(":") for r in rows[i]]
            self.assertEqual([int(f[1]) for f in fields], np.argsort(-logits[i])[:3].tolist())
            np.testing.assert_allclose([float(f[0]) for f in fields], np.sort(logits[i])[::-1][:3], atol=1e-5)
            self.assertEqual([f[2] for f in fields], [names[int(f[1])] for f in fields])  # Fashion-MNIST's names
        alias = self.server.client.infer("fashion", [tensor_input(x)], outputs=[triton.InferRequestedOutput("LOGITS")])
        np.testing.assert_allclose(alias.as_numpy("LOGITS"), logits, atol=1e-6)

    def test_metrics_count_what_was_served(self):
        before = self.server.metrics()
        key = '{model="fashion",version="1"}'
        x = np.zeros((2, 3, 28, 28), np.float32)
        self.server.client.infer("fashion", [tensor_input(x)])
        with self.assertRaises(InferenceServerException):
            self.server.client.infer("fashion", [tensor_input(np.zeros((1, 3, 27, 27), np.float32))])
        after = self.server.metrics()
        self.assertEqual(after["nv_inference_request_success" + key] - before["nv_inference_request_success" + key], 1)
        self.assertEqual(after["nv_inference_request_failure" + key] - before["nv_inference_request_failure" + key], 1)
        self.assertEqual(after["nv_inference_count" + key] - before["nv_inference_count" + key], 2)
        self.assertEqual(after["nv_inference_exec_count" + key] - before["nv_inference_exec_count" + key], 1)
        self.assertGreater(after["nv_inference_compute_infer_duration_us" + key],
                           before["nv_inference_compute_infer_duration_us" + key])
        self.assertGreater(after["process_resident_memory_bytes"], 0)


class HostileRequests(unittest.TestCase):
    """Each hostile request gets a clear status, and a good request right after it succeeds."""

    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()
        cls.server = Serve(f"fashion={cls.ckpt}", "--max-request-bytes", "1048576", "--body-timeout-s", "2",
                           "--max-image-pixels", "1000000", "--idle-timeout-s", "60", "--max-json-bytes", "524288")
        cls.addClassCleanup(cls.server.stop)
        cls.good = infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 3, 28, 28],
                                "data": [0.5] * (3 * 28 * 28)}])

    @classmethod
    def tearDownClass(cls):
        rc = cls.server.stop()
        assert rc == 0, (rc, cls.server.stderr)

    def expect(self, status, body, text):
        self.assertIn(text, json.loads(body)["error"])
        good_status, good_body = post(self.server.port, "/v2/models/fashion/infer", self.good)
        self.assertEqual(good_status, 200, good_body)
        self.assertEqual(len(json.loads(good_body)["outputs"][0]["data"]), 10)

    def test_malformed_json(self):
        status, body = post(self.server.port, "/v2/models/fashion/infer", b'{"inputs": [')
        self.assertEqual(status, 400)
        self.expect(status, body, "not valid JSON")

    def test_shapes_over_the_limits(self):
        status, body = post(self.server.port, "/v2/models/fashion/infer",
                            infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 3, 100000, 100000],
                                         "data": [0.0]}]))
        self.assertEqual(status, 413)
        self.expect(status, body, "elements")
        status, body = post(self.server.port, "/v2/models/fashion/infer",
                            infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 3, 27, 27],
                                         "data": [0.0] * (3 * 27 * 27)}]))
        self.assertEqual(status, 400)
        self.expect(status, body, "expected shape [-1, 3, 28, 28]")

    def test_datatype_mismatch(self):
        status, body = post(self.server.port, "/v2/models/fashion/infer",
                            infer_json([{"name": "input", "datatype": "INT32", "shape": [1, 3, 28, 28],
                                         "data": [0] * (3 * 28 * 28)}]))
        self.assertEqual(status, 400)
        self.expect(status, body, "expected datatype FP32, got INT32")

    def test_truncated_and_bomb_images(self):
        # Each as Triton's binary BYTES element (a 4-byte length, then the bytes as they are), as tritonclient sends
        # them: inside JSON, bytes arrive as a string's UTF-8, a different (and never a JPEG) file.
        def as_binary(payload):
            header = json.dumps({"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1],
                                             "parameters": {"binary_data_size": 4 + len(payload)}}]}).encode()
            return post(self.server.port, "/v2/models/fashion/infer", header + struct.pack("<I", len(payload)) + payload,
                        headers=[("Inference-Header-Content-Length", len(header))])
        jpeg = read(fixtures.imagenet_like_jpegs(1)[0])
        bomb = png_header_bomb(100000, 100000)
        for payload, text in ((jpeg[:len(jpeg) // 3], "INPUT[0]: truncated JPEG (no end-of-image marker)"),
                              (bomb[:16], "INPUT[0]: not a PNG (no IHDR chunk at the start)"),
                              (bomb, "INPUT[0]: 100000x100000 = 10000.0 Mpixels exceeds the limit of 1.0 Mpixels "
                                     "(--max-image-pixels 1000000); refused before decoding, as a decompression "
                                     "bomb or a damaged header"),
                              (b"not an image at all", "INPUT[0]: not a JPEG or PNG image (unrecognised leading bytes)")):
            status, body = as_binary(payload)
            self.assertEqual(status, 400, body)
            self.assertEqual(json.loads(body)["error"], text)  # the whole message: a wrong one may still hold a prefix
            self.expect(status, body, text)
        # A JSON string is not bytes: the truncated JPEG sent as one is refused as what it became.
        status, body = post(self.server.port, "/v2/models/fashion/infer",
                            infer_json([{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1],
                                         "data": [jpeg[:len(jpeg) // 3].decode("latin-1")]}]))
        self.assertEqual(status, 400, body)
        self.expect(status, body, "INPUT[0]: not a JPEG or PNG image")

    def test_a_body_over_the_limit(self):
        # Declared too large: refused from the headers, before a byte of the body is sent.
        status, body = raw(self.server.port, b"POST /v2/models/fashion/infer HTTP/1.1\r\nHost: x\r\n"
                                             b"Content-Length: 5000000\r\n\r\n")
        self.assertEqual(status, 413)
        self.expect(status, body, "--max-request-bytes")
        # Chunked, so its length is not declared: refused once the limit is passed.
        chunk = b"x" * 65536
        stream = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(20)) + b"0\r\n\r\n"
        status, body = raw(self.server.port, b"POST /v2/models/fashion/infer HTTP/1.1\r\nHost: x\r\n"
                                             b"Transfer-Encoding: chunked\r\n\r\n" + stream)
        self.assertEqual(status, 413)
        self.expect(status, body, "--max-request-bytes")

    def test_a_client_that_sends_a_byte_a_second(self):
        start = time.monotonic()
        with socket.create_connection((HOST, self.server.port), timeout=30) as s:
            s.sendall(b"POST /v2/models/fashion/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" %
                      len(self.good))
            answer = b""
            for i in range(10):  # --body-timeout-s 2 ends it after 2-3 bytes; 10 bounds the loop if it does not
                try:
                    s.sendall(self.good[i:i + 1])
                except OSError:
                    break
                s.settimeout(1.0)
                try:
                    answer = s.recv(65536)
                except socket.timeout:
                    continue
                if answer:
                    s.settimeout(10)
                    while not answer.endswith(b"}"):  # the JSON body may come in a segment of its own
                        answer += s.recv(65536)
                    break
        self.assertTrue(answer.startswith(b"HTTP/1.1 408"), answer)
        self.assertLess(time.monotonic() - start, 9)
        self.expect(408, answer.partition(b"\r\n\r\n")[2], "--body-timeout-s")

    def test_a_thousand_idle_connections(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 1100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        idle = []
        try:
            for _ in range(1000):
                idle.append(socket.create_connection((HOST, self.server.port), timeout=30))
            status, body = post(self.server.port, "/v2/models/fashion/infer", self.good)
            self.assertEqual(status, 200, body)
            # Served beside a thousand silent connections, not after them: each is still open (no EOF waiting),
            # where a server that reached the good request only by timing them out would have closed them.
            self.assertEqual(still_open(idle), 1000)
        finally:
            for s in idle:
                s.close()
        self.assertTrue(self.server.client.is_server_live())

    def test_refused_bodies_keep_the_connection_in_step(self):
        # An unknown model's body is read and dropped: the good request after it on the same connection is answered
        # as itself, not parsed out of the refused body.
        refused = infer_json([{"name": "input", "datatype": "FP32", "shape": [1], "data": [0.0]}])
        head = "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n"
        statuses = []
        with socket.create_connection((HOST, self.server.port), timeout=30) as s:
            for path, body in (("/v2/models/nobody/infer", refused), ("/v2/models/fashion/infer", self.good)):
                s.sendall(head.format(path, len(body)).encode() + body)
                data = b""
                while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                statuses.append(int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else None)
        self.assertEqual(statuses, [404, 200])
        # Other routes take small declared bodies only: httplib reads theirs whole before the handler runs.
        status, body = raw(self.server.port, b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
                                             b"Transfer-Encoding: chunked\r\n\r\n" + b"10000\r\n" + b"x" * 65536)
        self.assertEqual(status, 411)
        self.expect(status, body, "needs a Content-Length")
        status, body = raw(self.server.port, b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
                                             b"Content-Length: 200000\r\n\r\n")
        self.assertEqual(status, 413)
        self.expect(status, body, "for /v2/repository/index")
        status, body = raw(self.server.port, b"POST /v2/models/fashion/infer HTTP/1.1\r\nHost: x\r\n"
                                             b"Content-Length: 12x\r\n\r\n")
        self.assertEqual(status, 400)
        self.expect(status, body, "is not a byte count")

    def test_a_json_part_over_its_limit(self):
        # Under --max-request-bytes (1 MiB here) but over --max-json-bytes (512 KiB): refused before it is parsed,
        # since a parsed JSON number costs about 16 bytes.
        big = infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 3, 28, 28], "data": [0.5] * 2352}])
        big = big[:-2] + b', "parameters": {"pad": "' + b" " * 600000 + b'"}}'
        self.assertLess(len(big), 1048576)
        status, body = post(self.server.port, "/v2/models/fashion/infer", big)
        self.assertEqual(status, 413, body)
        self.expect(status, body, "over --max-json-bytes 524288")

    def test_unknown_paths_models_and_encodings(self):
        status, body = raw(self.server.port, b"GET /v3/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertEqual(status, 404)
        self.expect(status, body, "no such endpoint")
        status, body = post(self.server.port, "/v2/models/nobody/infer", self.good)
        self.assertEqual(status, 404)
        self.expect(status, body, "unknown model: 'nobody'")
        status, body = post(self.server.port, "/v2/models/fashion/infer", zlib.compress(self.good),
                            headers=[("Content-Encoding", "deflate")])
        self.assertEqual(status, 415)
        self.expect(status, body, "Content-Encoding deflate")
        status, body = post(self.server.port, "/v2/models/fashion/infer",
                            infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 3, 28, 28],
                                         "data": [0.0] * (3 * 28 * 28)},
                                        {"name": "PIXELS", "datatype": "UINT8", "shape": [1, 28, 28, 3],
                                         "data": [0] * (3 * 28 * 28)}]))
        self.assertEqual(status, 400)
        self.expect(status, body, "takes one input per request")


class EventDrivenFront(unittest.TestCase):
    """The event-driven front end (issue 60): ten thousand idle keep-alive connections cost no thread and no CPU
    and slow the good requests beside them by less than half; clients that send their headers a byte at a time are
    closed at --header-timeout-s while the good requests beside them are answered."""

    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()
        cls.good = infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 3, 28, 28],
                                "data": [0.5] * (3 * 28 * 28)}])

    def cpu_seconds(self, pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def threads(self, pid):
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("Threads:")).split()[1])

    def latency(self, port):
        t0 = time.perf_counter()
        status, body = post(port, "/v2/models/fashion/infer", self.good)
        elapsed = time.perf_counter() - t0
        self.assertEqual(status, 200, body)
        return elapsed

    def paired_latencies(self, busy_port, quiet_port, pairs=60):
        """Median latencies of the two servers, asked in alternation so that whatever else the machine runs
        meanwhile (CTest's other tests) weighs on both alike; the order within a pair alternates too."""
        busy, quiet = [], []
        for i in range(pairs):
            if i % 2:
                busy.append(self.latency(busy_port))
                quiet.append(self.latency(quiet_port))
            else:
                quiet.append(self.latency(quiet_port))
                busy.append(self.latency(busy_port))
        return sorted(busy)[pairs // 2], sorted(quiet)[pairs // 2]

    def test_ten_thousand_idle_connections_cost_no_cpu(self):
        n = 10000
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard < n + 500:
            self.skipTest(f"the descriptor limit ({hard}) holds fewer than {n} connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, n + 500), hard))
        # Cleanups, not a `finally`: each server is stopped (and its status checked) whatever failed before, the
        # other's stop included.
        server = started(self, f"fashion={self.ckpt}", "--max-connections", str(n + 100), "--idle-timeout-s", "300")
        # Its twin holds no idle connection: the latency a good request has beside them is compared with the
        # twin's, measured in the same seconds, not with the server's own from before (the machine differs then).
        twin = started(self, f"fashion={self.ckpt}")
        idle = []
        self.addCleanup(lambda: [s.close() for s in idle])
        self.paired_latencies(server.port, twin.port, pairs=10)  # both warm
        threads_alone = self.threads(server.proc.pid)
        for _ in range(n):
            idle.append(socket.create_connection((HOST, server.port), timeout=30))
        # Accepted, each held by the server (its gauge), not waiting in the listen backlog.
        deadline = time.monotonic() + 30
        while server.metrics().get("convnets_http_open_connections", 0) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertGreaterEqual(server.metrics()["convnets_http_open_connections"], n)
        time.sleep(1)
        before = self.cpu_seconds(server.proc.pid)
        time.sleep(5)
        used = (self.cpu_seconds(server.proc.pid) - before) / 5
        self.assertLess(used, 0.05, f"{n} idle connections cost {100 * used:.1f} % of a core")
        # No thread per connection: the server's threads are those it had before (its event loop, workers
        # and batcher), give or take the few a pool may start.
        threads_beside = self.threads(server.proc.pid)
        self.assertLessEqual(threads_beside, threads_alone + 4,
                             f"{threads_beside} threads with {n} idle connections, {threads_alone} without")
        beside, alone = self.paired_latencies(server.port, twin.port)
        self.assertLess(beside, 1.5 * alone, f"a good request took {1e3 * beside:.2f} ms beside {n} idle "
                                             f"connections, {1e3 * alone:.2f} ms on the twin without them: "
                                             f"slowed by more than half")
        self.assertEqual(still_open(idle), n)

    def test_clients_sending_headers_a_byte_at_a_time_are_closed_at_the_deadline(self):
        server = started(self, f"fashion={self.ckpt}", "--header-timeout-s", "2", "--log-verbose", "1")
        slow, closed_after = [], {}
        head = b"POST /v2/models/fashion/infer HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100
        good = {"ok": 0, "other": 0}
        stop = threading.Event()

        def load():
            while not stop.is_set():
                status, _ = post(server.port, "/v2/models/fashion/infer", self.good)
                good["ok" if status == 200 else "other"] += 1

        try:
            for _ in range(256):
                s = socket.create_connection((HOST, server.port), timeout=30)
                s.setblocking(False)
                slow.append([s, time.monotonic()])
            worker = threading.Thread(target=load)
            worker.start()
            # A byte every half second from each, for 6 s at most: twice 256 bytes, never the headers' end.
            for tick in range(12):
                for i, (s, start) in enumerate(slow):
                    if i in closed_after:
                        continue
                    try:
                        if s.recv(1) == b"":
                            closed_after[i] = time.monotonic() - start
                            continue
                    except BlockingIOError:
                        pass
                    except OSError:
                        closed_after[i] = time.monotonic() - start
                        continue
                    try:
                        s.send(head[tick:tick + 1])
                    except OSError:
                        closed_after[i] = time.monotonic() - start
                if len(closed_after) == len(slow):
                    break
                time.sleep(0.5)
            stop.set()
            worker.join(timeout=60)
        finally:
            stop.set()
            for s, _ in slow:
                s.close()
            rc = server.stop()
        self.assertEqual(rc, 0, server.stderr)
        self.assertEqual(len(closed_after), 256, f"{256 - len(closed_after)} slow clients still open after 6 s")
        # The deadline counts from each one's first byte (sent at 0 s): closed 2 s after it, seen within a tick.
        self.assertGreaterEqual(min(closed_after.values()), 1.9)
        self.assertLess(max(closed_after.values()), 4.0)
        self.assertGreater(good["ok"], 0)
        self.assertEqual(good["other"], 0)
        self.assertEqual(server.stderr.count("its headers were not complete 2 s after their first byte "
                                             "(--header-timeout-s)"), 256, server.stderr[-2000:])


class GrpcService(unittest.TestCase):
    """Triton's gRPC service (`--grpc-port`) through tritonclient.grpc, unmodified (issue 60): every RPC beside its
    HTTP answer, images and tensors as over HTTP, the limits, 10^5 requests, and the drain."""

    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()
        cls.server = Serve(f"fashion={cls.ckpt}", "--max-batch-size", "16")
        cls.addClassCleanup(cls.server.stop)  # also where the rest of setUpClass fails
        cls.grpc = tritongrpc.InferenceServerClient(cls.server.grpc_url)

    @classmethod
    def tearDownClass(cls):
        cls.grpc.close()
        assert cls.server.stop() == 0, cls.server.stderr

    def code(self, call):
        with self.assertRaises(InferenceServerException) as e:
            call()
        return e.exception.status(), e.exception.message()

    def test_every_rpc_answers_as_http(self):
        g, h = self.grpc, self.server.client
        self.assertTrue(g.is_server_live())
        self.assertTrue(g.is_server_ready())
        self.assertTrue(g.is_model_ready("fashion"))
        self.assertTrue(g.is_model_ready("fashion", "1"))
        self.assertFalse(g.is_model_ready("absent"))
        self.assertFalse(g.is_model_ready("fashion", "2"))
        meta, http_meta = g.get_server_metadata(as_json=True), h.get_server_metadata()
        self.assertEqual((meta["name"], meta["version"], meta["extensions"]),
                         (http_meta["name"], http_meta["version"], http_meta["extensions"]))
        shaped = lambda ts: [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in ts]  # noqa: E731
        mm, hmm = g.get_model_metadata("fashion", as_json=True), h.get_model_metadata("fashion")
        self.assertEqual((mm["name"], mm["versions"], mm["platform"]), (hmm["name"], hmm["versions"], hmm["platform"]))
        self.assertEqual(shaped(mm["inputs"]), shaped(hmm["inputs"]))
        self.assertEqual(shaped(mm["outputs"]), shaped(hmm["outputs"]))
        config, http_config = g.get_model_config("fashion", as_json=True)["config"], h.get_model_config("fashion")
        self.assertEqual(int(config["max_batch_size"]), http_config["max_batch_size"])
        for key in ("input", "output"):
            self.assertEqual([(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config[key]],
                             [(t["name"], t["data_type"], t["dims"]) for t in http_config[key]])
        self.assertEqual({k: v["string_value"] for k, v in config["parameters"].items()},
                         {k: v["string_value"] for k, v in http_config["parameters"].items()})
        self.assertEqual(config["instance_group"][0]["kind"], http_config["instance_group"][0]["kind"])
        # The JSON is Triton's ModelConfig, field for field (deploy/triton_config.h writes it and config.pbtxt).
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2
        parsed = json_format.ParseDict(http_config, model_config_pb2.ModelConfig())
        self.assertEqual((parsed.dynamic_batching.default_queue_policy.max_queue_size, parsed.instance_group[0].count),
                         (64, 1))
        self.assertEqual(g.get_model_repository_index(as_json=True)["models"],
                         [{"name": "fashion", "version": "1", "state": "READY"}])
        status, message = self.code(lambda: g.get_model_metadata("absent"))
        self.assertEqual(status, "StatusCode.NOT_FOUND")
        self.assertIn("'absent' is not found", message)
        status, message = self.code(lambda: g.get_model_config("fashion", "2"))
        self.assertEqual(status, "StatusCode.NOT_FOUND")
        self.assertIn("version 1 is served", message)

    def test_the_proto_is_wire_compatible_with_tritonclient(self):
        # src/kserve/triton_grpc.proto, compiled by protoc (what the build compiles), field by field against the
        # descriptors tritonclient.grpc itself installs: numbers, types, repetition, enum values, and each RPC's
        # request and response types. protoc comes with scripts/setup.sh (protobuf-compiler).
        from google.protobuf import descriptor_pb2, descriptor_pool
        proto = os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "src", "kserve", "triton_grpc.proto")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "set.pb")
            r = subprocess.run(["protoc", "--descriptor_set_out=" + out, "-I", os.path.dirname(proto), proto],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            files = descriptor_pb2.FileDescriptorSet()
            files.ParseFromString(read(out))
        ours = descriptor_pool.DescriptorPool()
        for f in files.file:
            ours.Add(f)
        theirs = descriptor_pool.Default()  # tritonclient.grpc's service_pb2 and model_config_pb2, imported above
        problems = []

        def compare(mine, their, path):
            for f in mine.fields:
                t = their.fields_by_name.get(f.name)
                if t is None:
                    problems.append(f"{path}.{f.name}: not in tritonclient's {their.full_name}")
                    continue
                if (f.number, f.type, f.is_repeated) != (t.number, t.type, t.is_repeated):
                    problems.append(f"{path}.{f.name}: ({f.number}, {f.type}, {f.is_repeated}) against tritonclient's "
                                    f"({t.number}, {t.type}, {t.is_repeated})")
                if f.message_type and t.message_type:
                    compare(f.message_type, t.message_type, path + "." + f.name)
                if f.enum_type and t.enum_type:
                    values = {v.name: v.number for v in t.enum_type.values}
                    problems.extend(f"{path}.{f.name}: {v.name} = {v.number}, tritonclient's {values.get(v.name)}"
                                    for v in f.enum_type.values if values.get(v.name) != v.number)

        service = ours.FindServiceByName("inference.GRPCInferenceService")
        their_service = theirs.FindServiceByName("inference.GRPCInferenceService")
        for m in service.methods:
            t = their_service.methods_by_name.get(m.name)
            if t is None:
                problems.append(f"rpc {m.name}: not in tritonclient's service")
                continue
            for mine, their in ((m.input_type, t.input_type), (m.output_type, t.output_type)):
                self.assertEqual(mine.full_name, their.full_name, m.name)
                compare(mine, their, mine.full_name)
        self.assertEqual(problems, [])
        self.assertEqual(len(service.methods), 13)

    def test_tensors_give_the_package_logits(self):
        import convnets  # the package: classify's InferenceModel, its engine chosen as classify chooses it
        import torch
        model = convnets.load(self.ckpt, device="cpu")
        x = np.random.default_rng(11).standard_normal((5, 3, 28, 28)).astype(np.float32)
        expected = model(torch.from_numpy(x)).numpy()
        t = tritongrpc.InferInput("input", list(x.shape), "FP32")
        t.set_data_from_numpy(x)  # raw_input_contents, as tritonclient.grpc sends
        np.testing.assert_allclose(self.grpc.infer("fashion", [t]).as_numpy("logits"), expected, rtol=0, atol=1e-5)
        # The protocol's typed contents, which tritonclient never sends: through the generated stub.
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.server.grpc_url))
        request = service_pb2.ModelInferRequest(model_name="fashion", id="typed")
        typed = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        typed.contents.fp32_contents.extend(x.ravel().tolist())
        response = stub.ModelInfer(request, timeout=60)
        self.assertEqual((response.model_name, response.id, response.outputs[0].name), ("fashion", "typed", "logits"))
        self.assertEqual(list(response.outputs[0].shape), [5, 10])
        np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[0], np.float32).reshape(5, 10), expected,
                                   rtol=0, atol=1e-5)
        pixels = np.random.default_rng(12).integers(0, 256, (2, 28, 28, 3), dtype=np.uint8)
        p = tritongrpc.InferInput("PIXELS", list(pixels.shape), "UINT8")
        p.set_data_from_numpy(pixels)
        np.testing.assert_allclose(self.grpc.infer("fashion", [p]).as_numpy("logits"),
                                   model(torch.from_numpy(pixels)).numpy(), rtol=0, atol=1e-5)
        # The classification extension: the same strings as over HTTP.
        out = self.grpc.infer("fashion", [t], outputs=[tritongrpc.InferRequestedOutput("logits", class_count=3)])
        http_out = self.server.client.infer("fashion", [tensor_input(x)],
                                            outputs=[triton.InferRequestedOutput("logits", class_count=3)])
        self.assertEqual(out.as_numpy("logits").tolist(), http_out.as_numpy("logits").tolist())

    def test_jpeg_bytes_give_classify_top1(self):
        files = fixtures.imagenet_like_jpegs(100)
        r = convnets("classify", *files, "--checkpoint", self.ckpt, "--json", "--top-k", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = [x["top"][0]["index"] for x in json.loads(r.stdout)["results"]]
        got = []
        for i in range(0, len(files), 16):
            batch = files[i:i + 16]
            t = tritongrpc.InferInput("INPUT", [len(batch), 1], "BYTES")
            t.set_data_from_numpy(np.array([[read(p)] for p in batch], dtype=np.object_))
            out = self.grpc.infer("fashion", [t], outputs=[tritongrpc.InferRequestedOutput("logits", class_count=1)])
            got += [int(row[0].decode().split(":")[1]) for row in out.as_numpy("logits")]
        self.assertEqual(got, expected)
        self.assertGreater(len(set(got)), 1)

    def test_the_request_checks_answer_alike_over_both_protocols(self):
        # Each check of a request's own fields is written once (kserve/messages.h): the same message over HTTP and gRPC,
        # HTTP's status and gRPC's code for it. Sent raw (a JSON body; the generated stub), as no client stops them.
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.server.grpc_url))
        one = {"name": "input", "datatype": "FP32", "shape": [1], "data": [0.5]}

        def typed(request, n):
            for i in range(n):
                t = request.inputs.add(name=f"in{i}", datatype="FP32", shape=[1])
                t.contents.fp32_contents.append(0.5)
            return request

        negative_timeout = typed(service_pb2.ModelInferRequest(model_name="fashion"), 1)
        negative_timeout.parameters["timeout"].int64_param = -1
        negative_k = typed(service_pb2.ModelInferRequest(model_name="fashion"), 1)
        negative_k.outputs.add(name="logits").parameters["classification"].int64_param = -2
        many_outputs = typed(service_pb2.ModelInferRequest(model_name="fashion"), 1)
        for i in range(17):
            many_outputs.outputs.add(name=f"out{i}")
        cases = [
            ({"inputs": []}, service_pb2.ModelInferRequest(model_name="fashion"),
             400, "StatusCode.INVALID_ARGUMENT", "the request has no inputs"),
            ({"inputs": [dict(one, name=f"in{i}") for i in range(17)]},
             typed(service_pb2.ModelInferRequest(model_name="fashion"), 17),
             413, "StatusCode.RESOURCE_EXHAUSTED", "17 inputs, over the limit of 16"),
            ({"inputs": [one], "parameters": {"timeout": -1}}, negative_timeout,
             400, "StatusCode.INVALID_ARGUMENT", 'parameter "timeout" must be 0 or more microseconds'),
            ({"inputs": [one], "outputs": [{"name": f"out{i}"} for i in range(17)]}, many_outputs,
             413, "StatusCode.RESOURCE_EXHAUSTED", "17 outputs requested, over the limit of 16"),
            ({"inputs": [one], "outputs": [{"name": "logits", "parameters": {"classification": -2}}]}, negative_k,
             400, "StatusCode.INVALID_ARGUMENT", "output 'logits': classification must be 0 or more"),
        ]
        for body, message, http_status, grpc_code, text in cases:
            status, answer = post(self.server.port, "/v2/models/fashion/infer", json.dumps(body).encode())
            self.assertEqual((status, json.loads(answer)["error"]), (http_status, text), body)
            with self.assertRaises(grpc.RpcError) as e:
                stub.ModelInfer(message, timeout=60)
            self.assertEqual((str(e.exception.code()), e.exception.details()), (grpc_code, text))

    def test_bad_requests_are_refused_by_name(self):
        x = np.zeros((1, 3, 28, 28), np.int32)
        t = tritongrpc.InferInput("input", list(x.shape), "INT32")
        t.set_data_from_numpy(x)
        status, message = self.code(lambda: self.grpc.infer("fashion", [t]))
        self.assertEqual(status, "StatusCode.INVALID_ARGUMENT")
        self.assertIn("input 'input': expected datatype FP32, got INT32", message)
        jpeg = read(fixtures.imagenet_like_jpegs(1)[0])
        b = tritongrpc.InferInput("INPUT", [1, 1], "BYTES")
        b.set_data_from_numpy(np.array([[jpeg[:len(jpeg) // 3]]], dtype=np.object_))
        status, message = self.code(lambda: self.grpc.infer("fashion", [b]))
        self.assertEqual(status, "StatusCode.INVALID_ARGUMENT")
        self.assertIn("INPUT[0]: truncated JPEG", message)
        f = tritongrpc.InferInput("input", [1, 3, 28, 28], "FP32")
        f.set_data_from_numpy(np.zeros((1, 3, 28, 28), np.float32))
        status, message = self.code(lambda: self.grpc.infer("absent", [f]))
        self.assertEqual(status, "StatusCode.NOT_FOUND")
        self.assertIn("'absent' is not found", message)
        self.assertEqual(self.grpc.infer("fashion", [f]).as_numpy("logits").shape, (1, 10))

    def test_inputs_from_system_shared_memory(self):
        # Triton's system shared-memory extension, the way perf_analyzer --shared-memory system and tritonclient's
        # utilities use it: the client writes a tensor and a JPEG into one POSIX shared-memory object, registers it
        # over either protocol (one registry), and each request names a range of it instead of carrying the bytes.
        import tritonclient.utils.shared_memory as shm
        h, g = self.server.client, self.grpc
        x = np.random.default_rng(21).standard_normal((3, 3, 28, 28)).astype(np.float32)
        expected = h.infer("fashion", [tensor_input(x)]).as_numpy("logits")
        jpeg_path = fixtures.imagenet_like_jpegs(1)[0]
        # Triton's BYTES element as its shared-memory clients write it: a 4-byte length, then the bytes.
        jpeg = serialize_byte_tensor(np.array([[read(jpeg_path)]], dtype=np.object_))
        jpeg_top1 = h.infer("fashion", [image_input([jpeg_path])]).as_numpy("logits").argmax(1)
        jpeg_bytes = len(jpeg.item())
        key = f"/convnets-test-{os.getpid()}"
        size = 64 + x.nbytes + jpeg_bytes
        region = shm.create_shared_memory_region("in", key, size)
        try:
            shm.set_shared_memory_region(region, [x], offset=64)
            shm.set_shared_memory_region(region, [jpeg], offset=64 + x.nbytes)
            for register, client, module in ((h.register_system_shared_memory, h, triton),
                                             (g.register_system_shared_memory, g, tritongrpc)):
                register("in", key, size)
                t = module.InferInput("input", list(x.shape), "FP32")
                t.set_shared_memory("in", x.nbytes, offset=64)
                np.testing.assert_allclose(client.infer("fashion", [t]).as_numpy("logits"), expected, rtol=0, atol=1e-5)
                b = module.InferInput("INPUT", [1, 1], "BYTES")
                b.set_shared_memory("in", jpeg_bytes, offset=64 + x.nbytes)
                self.assertEqual(client.infer("fashion", [b]).as_numpy("logits").argmax(1).tolist(), jpeg_top1.tolist())
                # One registry: what one protocol registered, the other lists.
                self.assertEqual(h.get_system_shared_memory_status(),
                                 [{"name": "in", "key": key, "offset": 0, "byte_size": size}])
                status = g.get_system_shared_memory_status(as_json=True)["regions"]["in"]
                self.assertEqual((status["name"], status["key"], int(status["byte_size"])), ("in", key, size))
                # A range past the region, an output asked into it, a second registration, a range past the object,
                # a key that does not exist, a region unregistered: refused by name.
                past = module.InferInput("input", list(x.shape), "FP32")
                past.set_shared_memory("in", x.nbytes, offset=size - x.nbytes + 4)
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [past])
                self.assertIn("input 'input': shared_memory_offset", e.exception.message())
                self.assertIn(f"is past the end of shared memory region 'in' ({size} bytes)", e.exception.message())
                huge = module.InferInput("input", list(x.shape), "FP32")
                huge.set_shared_memory("in", 1 << 30)  # a range no body could carry: bounded as a body is
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [huge])
                self.assertIn("shared_memory_byte_size 1073741824 is over the limit of", e.exception.message())
                out = module.InferRequestedOutput("logits")
                out.set_shared_memory("in", 40 * 3)
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [t], outputs=[out])
                self.assertIn("output 'logits': outputs are not written into shared memory", e.exception.message())
                with self.assertRaises(InferenceServerException) as e:
                    register("in", key, size)
                self.assertIn("shared memory region 'in' is already registered", e.exception.message())
                with self.assertRaises(InferenceServerException) as e:
                    register("more", key, size + 1)
                self.assertIn(f"offset 0 + byte_size {size + 1} is past the end of '{key}' ({size} bytes)",
                              e.exception.message())
                with self.assertRaises(InferenceServerException) as e:
                    register("absent", key + "-absent", 8)
                self.assertIn(f"cannot open the shared memory object '{key}-absent'", e.exception.message())
                client.unregister_system_shared_memory("in")
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [t])
                self.assertIn("input 'input': shared memory region 'in' is not registered", e.exception.message())
                self.assertEqual(h.get_system_shared_memory_status(), [])
            self.assertIn("system_shared_memory", h.get_server_metadata()["extensions"])
            # tritonclient quote()s a region's name into the URL (a space as %20); the request's JSON names it as is.
            h.register_system_shared_memory("in two", key, size)
            self.assertEqual([r["name"] for r in h.get_system_shared_memory_status("in two")], ["in two"])
            t = triton.InferInput("input", list(x.shape), "FP32")
            t.set_shared_memory("in two", x.nbytes, offset=64)
            np.testing.assert_allclose(h.infer("fashion", [t]).as_numpy("logits"), expected, rtol=0, atol=1e-5)
            h.unregister_system_shared_memory("in two")
            self.assertEqual(h.get_system_shared_memory_status(), [])
        finally:
            h.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)

    def test_regions_registered_at_an_offset_are_read_from_it(self):
        # A region registered at an offset that is not a page's and one whose offset lies in the object's last page:
        # each input read from its region's own bytes, the object around them filled with other numbers, so a read
        # that dropped the region's offset (or an input's within it) gets those.
        import tritonclient.utils.shared_memory as shm
        h, g = self.server.client, self.grpc
        page = os.sysconf("SC_PAGE_SIZE")
        x = np.random.default_rng(31).standard_normal((1, 3, 28, 28)).astype(np.float32)
        pixels = np.random.default_rng(32).integers(0, 256, (1, 28, 28, 3), dtype=np.uint8)  # 2,352 bytes: fits a page
        want_x = h.infer("fashion", [tensor_input(x)]).as_numpy("logits")
        want_p = h.infer("fashion", [pixel_input(pixels)]).as_numpy("logits")
        total = 6 * page
        at = 100 + page  # neither page-aligned nor in the first page
        last = 5 * page + 700  # in the last page, the pixels ending before its end
        key = f"/convnets-test-offset-{os.getpid()}"
        region = shm.create_shared_memory_region("whole", key, total)
        try:
            shm.set_shared_memory_region(region, [np.full(total // 4, 7.5, np.float32)])
            shm.set_shared_memory_region(region, [x], offset=at)
            shm.set_shared_memory_region(region, [pixels], offset=last)
            for client, module in ((h, triton), (g, tritongrpc)):
                client.register_system_shared_memory("at", key, x.nbytes, offset=at)
                client.register_system_shared_memory("last", key, pixels.nbytes, offset=last)
                t = module.InferInput("input", list(x.shape), "FP32")
                t.set_shared_memory("at", x.nbytes)
                np.testing.assert_allclose(client.infer("fashion", [t]).as_numpy("logits"), want_x, rtol=0, atol=1e-5)
                p = module.InferInput("PIXELS", list(pixels.shape), "UINT8")
                p.set_shared_memory("last", pixels.nbytes)
                np.testing.assert_allclose(client.infer("fashion", [p]).as_numpy("logits"), want_p, rtol=0, atol=1e-5)
                client.unregister_system_shared_memory()
        finally:
            h.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)

    def test_an_object_shrunk_after_registration_fails_its_requests_not_the_server(self):
        # A client truncates its object below a registered range (a bug, or a hostile client): the server reads
        # regions through a descriptor, so the next request over either protocol is refused naming the region and
        # its key, where a mapping would have died of SIGBUS; other clients' requests go on being answered.
        import tritonclient.utils.shared_memory as shm
        h, g = self.server.client, self.grpc
        x = np.random.default_rng(41).standard_normal((1, 3, 28, 28)).astype(np.float32)
        want = h.infer("fashion", [tensor_input(x)]).as_numpy("logits")
        size = 2 * os.sysconf("SC_PAGE_SIZE") + x.nbytes
        key = f"/convnets-test-shrunk-{os.getpid()}"
        region = shm.create_shared_memory_region("shrunk", key, size)
        try:
            shm.set_shared_memory_region(region, [x], offset=size - x.nbytes)
            h.register_system_shared_memory("shrunk", key, size)
            t = triton.InferInput("input", list(x.shape), "FP32")
            t.set_shared_memory("shrunk", x.nbytes, offset=size - x.nbytes)
            np.testing.assert_allclose(h.infer("fashion", [t]).as_numpy("logits"), want, rtol=0, atol=1e-5)
            os.truncate("/dev/shm" + key, 100)
            for client, module in ((h, triton), (g, tritongrpc)):
                t = module.InferInput("input", list(x.shape), "FP32")
                t.set_shared_memory("shrunk", x.nbytes, offset=size - x.nbytes)
                with self.assertRaises(InferenceServerException) as e:
                    client.infer("fashion", [t])
                self.assertIn("input 'input': shared memory region 'shrunk' ends 0 bytes into the "
                              f"{x.nbytes} asked: its object '{key}' was shrunk after it was registered",
                              e.exception.message())
                self.assertEqual(e.exception.status(), "400" if client is h else "StatusCode.INVALID_ARGUMENT")
                inline = module.InferInput("input", list(x.shape), "FP32")
                inline.set_data_from_numpy(x)
                np.testing.assert_allclose(client.infer("fashion", [inline]).as_numpy("logits"), want, rtol=0, atol=1e-5)
            self.assertTrue(h.is_server_live())
        finally:
            h.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)

    def test_a_large_copy_out_of_a_region_leaves_the_event_loop_free(self):
        # A request naming 60 MB of a region is copied out on a worker: while two clients send such requests back
        # to back, the loop that every connection shares answers a health check in a fraction of one copy's time.
        import tritonclient.utils.shared_memory as shm
        size = 60 << 20
        key = f"/convnets-test-large-{os.getpid()}"
        region = shm.create_shared_memory_region("large", key, size + 4)
        body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1], "parameters": {
            "shared_memory_region": "large", "shared_memory_byte_size": size + 4}}]}).encode()
        try:
            shm.set_shared_memory_region(region, [np.frombuffer(struct.pack("<I", size), np.uint8),
                                                  np.full(size, 1, np.uint8)])
            self.server.client.register_system_shared_memory("large", key, size + 4)
            copies = []  # each copy's time, taken while the health checks are: the same seconds, the same machine

            def large():
                t0 = time.perf_counter()
                status, text = post(self.server.port, "/v2/models/fashion/infer", body)
                self.assertEqual(status, 400, text)  # copied, then found not to be an image
                copies.append(time.perf_counter() - t0)
            stop = threading.Event()

            def flood():
                while not stop.is_set():
                    large()
            threads = [threading.Thread(target=flood) for _ in range(2)]
            for t in threads:
                t.start()
            health = []
            try:
                time.sleep(0.2)
                for _ in range(30):
                    t0 = time.perf_counter()
                    with urllib.request.urlopen(f"http://{self.server.url}/v2/health/live", timeout=30) as r:
                        self.assertEqual(r.status, 200)
                    health.append(time.perf_counter() - t0)
                    time.sleep(0.02)
            finally:
                stop.set()
                for t in threads:
                    t.join()
            median = sorted(health)[len(health) // 2]
            copy = sorted(copies)[len(copies) // 2]
            self.assertGreaterEqual(len(copies), 4, "too few copies ran beside the health checks to compare them")
            self.assertLess(median, 0.25 * copy, f"a health check took {1e3 * median:.1f} ms while 60 MB copies "
                                                 f"ran, each {1e3 * copy:.1f} ms: the copies hold the event loop")
        finally:
            self.server.client.unregister_system_shared_memory("large")
            shm.destroy_shared_memory_region(region)

    def test_a_message_over_the_limit_is_resource_exhausted(self):
        server = started(self, f"fashion={self.ckpt}", "--max-request-bytes", "65536")
        try:
            client = tritongrpc.InferenceServerClient(server.grpc_url)
            big = tritongrpc.InferInput("input", [8, 3, 28, 28], "FP32")  # 75 KB of raw contents
            big.set_data_from_numpy(np.zeros((8, 3, 28, 28), np.float32))
            status, message = self.code(lambda: client.infer("fashion", [big]))
            self.assertEqual(status, "StatusCode.RESOURCE_EXHAUSTED", message)
            small = tritongrpc.InferInput("input", [1, 3, 28, 28], "FP32")
            small.set_data_from_numpy(np.zeros((1, 3, 28, 28), np.float32))
            self.assertEqual(client.infer("fashion", [small]).as_numpy("logits").shape, (1, 10))
            client.close()
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_hundred_thousand_requests_at_concurrency_16(self):
        key = '{model="fashion",version="1"}'
        before = self.server.metrics()["nv_inference_request_success" + key]
        pixels = np.random.default_rng(13).integers(0, 256, (1, 28, 28, 3), dtype=np.uint8)
        outcomes, lock = {}, threading.Lock()

        def client(n):
            c = tritongrpc.InferenceServerClient(self.server.grpc_url)
            p = tritongrpc.InferInput("PIXELS", list(pixels.shape), "UINT8")
            p.set_data_from_numpy(pixels)
            mine = {}
            for _ in range(n):
                try:
                    c.infer("fashion", [p], client_timeout=60)
                    kind = "ok"
                except InferenceServerException as e:
                    kind = str(e.status())
                mine[kind] = mine.get(kind, 0) + 1
            c.close()
            with lock:
                for k, v in mine.items():
                    outcomes[k] = outcomes.get(k, 0) + v

        threads = [threading.Thread(target=client, args=(100000 // 16,)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        self.assertEqual(outcomes, {"ok": 100000})
        self.assertEqual(self.server.metrics()["nv_inference_request_success" + key] - before, 100000)

    def test_sigterm_during_load_answers_every_request_read(self):
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "8")
        x = np.zeros((1, 3, 28, 28), np.float32)
        outcomes, lock, stop = [], threading.Lock(), time.monotonic() + 30

        def client():
            c = tritongrpc.InferenceServerClient(server.grpc_url)
            t = tritongrpc.InferInput("input", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            while time.monotonic() < stop:
                try:
                    c.infer("fashion", [t], client_timeout=30)
                    outcome = ("ok", "")
                except InferenceServerException as e:
                    outcome = (str(e.status()), e.message() or "")
                with lock:
                    outcomes.append(outcome)
                if outcome[0] != "ok":
                    break
            c.close()

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        self.assertEqual(server.stop(), 0, server.stderr)
        ok = sum(1 for o in outcomes if o[0] == "ok")
        self.assertGreater(ok, 100)
        # Every request the server ran was answered: its own count of results (the line it ends with) is what the
        # clients received. The others were refused, never run: 503's UNAVAILABLE "shutting down" while it
        # drained; then, racing the service's stop, a call gRPC itself turns away (CANCELLED) or finds no one to
        # connect to (UNAVAILABLE). Nothing else: no internal error, no reset.
        self.assertIn("convnets serve: stopped (fashion: %d succeeded, 0 failed)" % ok, server.stderr)
        for status, message in outcomes:
            if status == "StatusCode.UNAVAILABLE":
                self.assertTrue("shutting down" in message or "connect" in message.lower(), message)
            elif status != "ok":
                self.assertEqual(status, "StatusCode.CANCELLED", message)
        self.assertIn("SIGTERM: draining", server.stderr)


class Batching(unittest.TestCase):
    """Dynamic batching, the bounded queue, request timeouts and the drain on SIGTERM."""

    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()
        cls.x = np.random.default_rng(6).standard_normal((1, 3, 28, 28)).astype(np.float32)

    def concurrently(self, server, n, **kwargs):
        results = [None] * n

        def one(i):
            start = time.monotonic()
            client = triton.InferenceServerClient(server.url, network_timeout=120)
            try:
                out = client.infer("fashion", [tensor_input(self.x)], **kwargs)
                results[i] = (200, out.as_numpy("logits"), time.monotonic() - start)
            except InferenceServerException as e:
                results[i] = (int(e.status() or 0), str(e), time.monotonic() - start)
            finally:
                client.close()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        return threads, results

    def test_concurrent_requests_share_one_forward_pass(self):
        # Triton's delay (always): four clients that start at once may reach the server apart.
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "4", "--max-queue-delay-us", "5000000",
                       "--batch-delay-policy", "always")
        try:
            threads, results = self.concurrently(server, 4)
            for t in threads:
                t.join(60)
            self.assertEqual([r[0] for r in results], [200] * 4, results)
            for r in results[1:]:
                np.testing.assert_allclose(r[1], results[0][1], atol=1e-6)
            m = server.metrics()
            key = 'model="fashion",version="1"'
            # One pass of 4 rows, taken as soon as it was full, not after the 5 s delay.
            self.assertEqual(m["nv_inference_exec_count{%s}" % key], 1)
            self.assertEqual(m['convnets_inference_batch_size_count{%s,batch_size="4"}' % key], 1)
            self.assertLess(max(r[2] for r in results), 4.0)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_lone_request_pays_no_queue_delay_by_default(self):
        # --batch-delay-policy arrivals (the default): requests one after another, each alone in the server, are
        # each answered without waiting out the 3 s delay; with `always` (Triton's) the first waits it out.
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "8", "--max-queue-delay-us", "3000000")
        try:
            for _ in range(5):
                t0 = time.monotonic()
                self.assertEqual(server.client.infer("fashion", [tensor_input(self.x)]).as_numpy("logits").shape, (1, 10))
                self.assertLess(time.monotonic() - t0, 1.5, "a lone request waited for the batch delay")
        finally:
            self.assertEqual(server.stop(), 0)
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "8", "--max-queue-delay-us", "3000000",
                       "--batch-delay-policy", "always")
        try:
            t0 = time.monotonic()
            server.client.infer("fashion", [tensor_input(self.x)])
            self.assertGreater(time.monotonic() - t0, 2.9, "Triton's policy waits out the delay")
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_full_queue_is_answered_at_once_and_timeouts_expire(self):
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "8", "--max-queue-delay-us", "3000000",
                       "--max-queue-size", "2", "--batch-delay-policy", "always")
        try:
            threads, results = self.concurrently(server, 2)
            deadline = time.monotonic() + 2
            while server.metrics()['nv_inference_pending_request_count{model="fashion",version="1"}'] < 2:
                self.assertLess(time.monotonic(), deadline, "the two requests never queued")
                time.sleep(0.05)
            more, refused = self.concurrently(server, 2)
            for t in more:
                t.join(60)
            for status, text, seconds in refused:
                self.assertEqual(status, 503, text)
                self.assertIn("Exceeds maximum queue size", text)
                self.assertLess(seconds, 2.5, "refused at once, not after the 3 s batching delay")
            for t in threads:
                t.join(60)
            self.assertEqual([r[0] for r in results], [200, 200], results)
            self.assertGreater(min(r[2] for r in results), 2.0, "the queued pair waited for the delay")
            # A request whose timeout passes while it waits for its batch.
            late, answer = self.concurrently(server, 1, timeout=300000)
            late[0].join(60)
            self.assertEqual(answer[0][0], 503, answer)
            self.assertIn("Request timeout expired", answer[0][1])
            self.assertTrue(server.client.is_server_live())
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_signal_before_the_server_listens_still_stops_it(self):
        proc = subprocess.Popen([BIN, "serve", self.ckpt, "--host", HOST, "--port", "0", "--metrics-port", "0",
                                 "--grpc-port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertIn("loading model", proc.stdout.readline())  # the signal comes while it loads, before it listens
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            self.fail("convnets serve did not stop after a SIGINT sent while it loaded its model")
        self.assertEqual(proc.returncode, 0, err)
        self.assertIn("SIGINT: draining", err)

    def test_sigterm_answers_every_accepted_request(self):
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "8", "--max-queue-delay-us", "3000000",
                       "--batch-delay-policy", "always")
        threads, results = self.concurrently(server, 6)
        deadline = time.monotonic() + 2.5
        while server.metrics()['nv_inference_pending_request_count{model="fashion",version="1"}'] < 6:
            self.assertLess(time.monotonic(), deadline, "the six requests never queued")
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        status, body = post(server.port, "/v2/models/fashion/infer", infer_json(
            [{"name": "input", "datatype": "FP32", "shape": [1, 3, 28, 28], "data": [0.0] * (3 * 28 * 28)}]))
        for t in threads:
            t.join(60)
        self.assertEqual(server.stop(), 0, server.stderr)
        self.assertEqual([r[0] for r in results], [200] * 6, results)
        self.assertEqual(status, 503, body)
        self.assertIn("shutting down", json.loads(body)["error"])
        self.assertIn("SIGTERM: draining", server.stderr)


class OtherModels(unittest.TestCase):
    """A ResNet-50 from plain weights, and the models of a Triton repository that `export --format triton` wrote."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-serve-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_model_names_in_urls_are_percent_decoded_once(self):
        # Any byte of a URL's path may come %XX-escaped (RFC 3986; clients quote() names): the server decodes each
        # once, and a % not followed by two hex digits is itself, so such a name is looked up as written.
        server = started(self, f"fashion={fixtures.fashion_resnet8()}")
        try:
            def ready(path):
                with socket.create_connection((HOST, server.port), timeout=30) as c:
                    c.sendall(f"GET /v2/models/{path}/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                    answer = c.makefile("rb").read().decode()
                return int(answer.split()[1]), answer.split("\r\n\r\n", 1)[1]
            for path in ("fashion", "%66ashion", "fas%68ion", "fashio%6E", "fashion/versions/%31"):
                self.assertEqual(ready(path)[0], 200, path)
            for path, name in (("%2566ashion", "%66ashion"),   # decoded once: "%66ashion", no such model
                               ("fashion%zz", "fashion%zz"),    # no escape: the name as written
                               ("fashion%4", "fashion%4")):     # nor is a % with one hex digit after it
                status, body = ready(path)
                self.assertEqual(status, 404, path)
                self.assertIn(f"'{name}' is not found", body)
            status, body = ready("fashion/versions/%32")
            self.assertEqual(status, 404)
            self.assertIn("'fashion' version 2 is not found", body)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_resnet50_answers_as_classify(self):
        weights = fixtures.random_weights("resnet50", self.tmp)
        files = fixtures.imagenet_like_jpegs(8)
        r = convnets("classify", *files, "--checkpoint", weights, "--arch", "resnet50", "--json", "--top-k", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = [x["top"][0]["index"] for x in json.loads(r.stdout)["results"]]
        expected_names = [x["top"][0]["class"] for x in json.loads(r.stdout)["results"]]
        server = started(self, weights, "--arch", "resnet50", "--max-batch-size", "8")
        try:
            c = server.client
            self.assertTrue(c.is_model_ready("resnet50"))
            meta = c.get_model_metadata("resnet50")
            self.assertEqual(meta["outputs"][0]["shape"], [-1, 1000])
            out = c.infer("resnet50", [image_input(files)], outputs=[triton.InferRequestedOutput("logits", class_count=1)])
            got = [int(row[0].decode().split(":")[1]) for row in out.as_numpy("logits")]
            self.assertEqual(got, expected)
            self.assertGreater(len(set(got)), 1)
            # ImageNet's names for a 1000-class model without names of its own, as classify gives them.
            self.assertEqual([row[0].decode().split(":", 2)[2] for row in out.as_numpy("logits")], expected_names)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_triton_repository(self):
        ckpt = fixtures.fashion_resnet8()
        repo = os.path.join(self.tmp, "repo")
        r = convnets("export", "--checkpoint", ckpt, "--format", "triton", "-o", repo, "--model-name", "fm",
                     "--instance-kind", "cpu")
        self.assertEqual(r.returncode, 0, r.stderr)
        server = started(self, repo, "--engine", "openvino")
        try:
            c = server.client
            self.assertEqual(c.get_model_repository_index(), [{"name": "fm", "version": "1", "state": "READY"}])
            import convnets as package
            x = np.random.default_rng(7).standard_normal((3, 3, 28, 28)).astype(np.float32)
            expected = package.load(ckpt, device="cpu")(__import__("torch").from_numpy(x)).numpy()
            np.testing.assert_allclose(c.infer("fm", [tensor_input(x)]).as_numpy("logits"), expected, atol=1e-4)
            # The ensemble's own input form: one encoded image as a UINT8 vector.
            path = fixtures.imagenet_like_jpegs(1)[0]
            jpeg = np.frombuffer(read(path), np.uint8)[None]
            t = triton.InferInput("INPUT", list(jpeg.shape), "UINT8")
            t.set_data_from_numpy(jpeg)
            logits = c.infer("fm", [t]).as_numpy("logits")
            self.assertEqual(logits.shape, (1, 10))
            # classify's answer for the same file: every class's probability, from the package (classify's code).
            top = package.load(ckpt, device="cpu").predict(path, top_k=10)[0]["top"]
            probs = np.exp(logits[0] - logits[0].max())
            probs /= probs.sum()
            self.assertEqual([t["index"] for t in top], np.argsort(-probs, kind="stable").tolist())
            np.testing.assert_allclose([t["probability"] for t in top], np.sort(probs)[::-1], atol=1e-4)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_bad_models_and_ports_are_named(self):
        r = convnets("serve", os.path.join(self.tmp, "absent.safetensors"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("absent.safetensors: no such file or folder", r.stderr)
        ckpt = fixtures.fashion_resnet8()
        r = convnets("serve", f"a={ckpt}", f"a={ckpt}")
        self.assertIn("two models are named 'a'", r.stderr)
        r = convnets("serve", f"a/b={ckpt}")
        self.assertIn("model name 'a/b'", r.stderr)
        r = convnets("serve", f"bad name={ckpt}")
        self.assertIn("model name 'bad name'", r.stderr)
        with socket.socket() as busy:
            busy.bind((HOST, 0))
            busy.listen(1)
            port = busy.getsockname()[1]
            r = convnets("serve", ckpt, "--port", str(port), "--metrics-port", "-1", "--grpc-port", "-1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--port %d: cannot listen" % port, r.stderr)
        # A port another convnets serve holds is refused, not shared (no SO_REUSEPORT).
        first = started(self, ckpt)
        try:
            try:
                r = convnets("serve", ckpt, "--host", HOST, "--port", str(first.port), "--metrics-port", "-1",
                             "--grpc-port", "-1",
                             timeout=60)
            except subprocess.TimeoutExpired:
                self.fail("a second convnets serve bound port %d, which the first one holds" % first.port)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("--port %d: cannot listen" % first.port, r.stderr)
            # Its gRPC port likewise (gRPC's own default would share it through SO_REUSEPORT).
            grpc_port = int(first.grpc_url.rsplit(":", 1)[1])
            try:
                r = convnets("serve", ckpt, "--host", HOST, "--port", "0", "--metrics-port", "-1",
                             "--grpc-port", str(grpc_port), timeout=60)
            except subprocess.TimeoutExpired:
                self.fail("a second convnets serve bound gRPC port %d, which the first one holds" % grpc_port)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("--grpc-port %d: cannot listen" % grpc_port, r.stderr)
        finally:
            self.assertEqual(first.stop(), 0)
        r = convnets("serve", ckpt, "--preferred-batch-sizes", "4,99", "--max-batch-size", "8")
        self.assertIn("--preferred-batch-sizes: 99 is outside 1..8", r.stderr)


if __name__ == "__main__":
    unittest.main()
