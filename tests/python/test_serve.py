"""`convnets serve` through Triton's own, unmodified HTTP client (PyPI's tritonclient) and raw sockets.

Protocol: health, server and model metadata, model config, the repository index, and infer with JSON and binary
tensors and the classification extension, for the suite's Fashion-MNIST ResNet-8, a ResNet-50, and a Triton
repository that `convnets export --format triton` wrote. Answers: encoded JPEGs give classify's top-1 and
probabilities; float tensors give the package's logits (classify's engine) within 1e-5. Hostile requests
(malformed JSON, shapes over the limits, a datatype mismatch, a truncated and a bomb image, a body over the limit,
a client that sends a byte a second, a thousand idle connections) each get a clear status and the next good
request succeeds. gRPC: test_serve_grpc.py; batching and the drain: test_serve_batching.py.

Every server listens on 127.0.0.1 only, on a port it picks, and is stopped by the test that started it.
"""
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import zlib

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import numpy as np
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from serve_harness import HOST, Serve, convnets, image_input, infer_json, post, raw, read, started, still_open, tensor_input


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
