"""`convnets bench serve`, the C++ KServe v2 load generator, against `convnets serve` on loopback.

Its answers are the server's: each JPEG's logits as bench serve received them equal tritonclient's for the same
file, over HTTP's binary tensors, gRPC's raw contents and, over either, from system shared memory (where each file
sits at its own offset); over either protocol it counts what the server's nv_inference_count counts. Its rows
are what happened: every request of the window answered or counted by status, the percentiles ordered, the
client's and the server's CPU time per request measured (the server's from its /metrics), an open loop near its
rate. Its region is unregistered and unlinked after the run. Bad usage is named. Servers listen on 127.0.0.1 only,
on ports they pick, and each test stops the one it started.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.request

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import numpy as np
import tritonclient.http as triton

from serve_harness import Serve, image_input

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]


def bench_serve(*args, timeout=300):
    return runner.run([BIN, "bench", "serve", *args], capture_output=True, text=True, timeout=timeout)


class FashionServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()
        cls.server = Serve(f"fashion={cls.ckpt}", "--max-batch-size", "8")
        cls.tmp = tempfile.TemporaryDirectory(prefix="bench-serve-")
        cls.images = os.path.join(cls.tmp.name, "images")
        os.makedirs(cls.images)
        # Twelve photographs of several sizes, linked into a folder of their own.
        for i, f in enumerate(fixtures.imagenet_like_jpegs(12)):
            os.symlink(f, os.path.join(cls.images, "%02d-%s" % (i, os.path.basename(f))))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def url(self, protocol):
        return ["http://" + self.server.url] if protocol == "http" else [self.server.grpc_url, "--protocol", "grpc"]

    def run_json(self, *args, protocol="http"):
        out = os.path.join(self.tmp.name, "rows.json")
        r = bench_serve(*self.url(protocol), "--metrics-url", self.server.metrics_url, *args, "--json", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            return r.stdout, json.load(f)

    def test_fp32_rows_count_every_request_and_both_cpus(self):
        text, j = self.run_json("--concurrency", "1,2", "--seconds", "1", "--warmup-seconds", "0.3")
        self.assertEqual(j["model"], "fashion")
        self.assertEqual(j["input"]["name"], "input")
        self.assertEqual(j["input"]["shape"], [1, 3, 28, 28])
        self.assertEqual(j["protocol"], "http")
        self.assertEqual([r["concurrency"] for r in j["rows"]], [1, 2])
        for r in j["rows"]:
            self.assertGreater(r["counts"]["ok"], 10, r)
            self.assertEqual(set(r["counts"]), {"ok"}, r)
            self.assertAlmostEqual(r["inferences_per_s"], r["counts"]["ok"] / 1.0, places=6)
            self.assertLessEqual(r["p50_ms"], r["p90_ms"])
            self.assertLessEqual(r["p90_ms"], r["p95_ms"])
            self.assertLessEqual(r["p95_ms"], r["p99_ms"])
            self.assertGreater(r["client_cpu_ms_per_request"], 0, r)
            self.assertGreater(r["server_cpu_ms_per_request"], 0, r)
            self.assertNotIn("warning", r)
        self.assertIn("| Concurrency | Inferences/s | p50 ms |", text)
        self.assertIn("server CPU from " + self.server.metrics_url, text)

    def test_its_inferences_per_second_are_the_servers_own_count(self):
        # The server's nv_inference_count around a run with no warm-up: each request bench serve counts in its
        # window the server counted too, and besides them at most one answer a client that was in flight when the
        # window closed (answered after it, so not counted by bench serve).
        key = 'nv_inference_count{model="fashion",version="1"}'
        for protocol, concurrency in (("http", 1), ("http", 4), ("grpc", 1), ("grpc", 4)):
            with self.subTest(protocol=protocol, concurrency=concurrency):
                before = self.server.metrics()[key]
                _, j = self.run_json("--concurrency", str(concurrency), "--seconds", "1", "--warmup-seconds", "0",
                                     protocol=protocol)
                self.assertEqual(j["protocol"], protocol)
                self.assertEqual(set(j["rows"][0]["counts"]), {"ok"}, j["rows"][0])
                served = self.server.metrics()[key] - before
                counted = j["rows"][0]["inferences_per_s"] * 1.0  # over the 1-second window
                self.assertGreater(counted, 10)
                self.assertLessEqual(counted, served)
                self.assertLessEqual(served, counted + concurrency)

    def answers(self, *args, protocol="http"):
        out = os.path.join(self.tmp.name, "answers.json")
        r = bench_serve(*self.url(protocol), "--input", "jpeg", "--images", self.images, "--concurrency", "3",
                        "--seconds", "0.5", "--warmup-seconds", "0.25", "--metrics-url", "none", "--outputs", out, *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("input INPUT BYTES [1,1] (12 distinct", r.stdout)
        with open(out) as f:
            return json.load(f)["answers"]

    def test_each_jpegs_answer_is_tritonclients_over_http_grpc_and_shared_memory(self):
        for protocol in ("http", "grpc"):
            for mode in ([], ["--shared-memory"]):
                got = self.answers(*mode, protocol=protocol)
                self.assertEqual(len(got), 12, (protocol, mode))
                for a in got:
                    path = os.path.join(self.images, a["input"])
                    want = self.server.client.infer("fashion", [image_input([path])]).as_numpy("logits")[0]
                    np.testing.assert_allclose(a["output"], want, rtol=0, atol=1e-5,
                                               err_msg=f"{protocol} {mode} {a['input']}")

    def test_the_shared_memory_region_is_gone_after_the_run(self):
        for protocol in ("http", "grpc"):
            text, j = self.run_json("--shared-memory", "--concurrency", "2", "--seconds", "0.5", "--warmup-seconds",
                                    "0", protocol=protocol)
            self.assertEqual(j["protocol"], protocol + "-shm")
            self.assertGreater(j["rows"][0]["counts"]["ok"], 0)
            # Only the request's own fields cross the socket: no tensor bytes.
            self.assertLess(j["input"]["request_bytes"], 1000)
            self.assertIn(f"in {protocol.upper() if protocol == 'http' else 'gRPC'}, the tensors in system shared "
                          "memory", text)
            with urllib.request.urlopen("http://" + self.server.url + "/v2/systemsharedmemory/status",
                                        timeout=30) as r:
                self.assertEqual(json.loads(r.read()), [])
            self.assertEqual(glob.glob("/dev/shm/convnets-bench-serve-*"), [])

    def test_an_open_loop_keeps_near_its_rate(self):
        _, j = self.run_json("--request-rate", "40", "--rate-connections", "4", "--seconds", "2",
                             "--warmup-seconds", "0.5")
        self.assertEqual(len(j["rows"]), 1, "--request-rate alone: no concurrency row")
        r = j["rows"][0]
        self.assertEqual(r["rate"], 40)
        # 80 slots fall in the window; an answer finishing past its end is not counted.
        self.assertGreaterEqual(r["counts"]["ok"], 60, r)
        self.assertLessEqual(r["counts"]["ok"], 81, r)
        self.assertIn("late", r)

    def test_bad_usage_is_named(self):
        r = bench_serve("http://127.0.0.1:1", "--seconds", "0.2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot connect to http://127.0.0.1:1", r.stderr)
        url = "http://" + self.server.url
        r = bench_serve(url, "--model", "absent", "--seconds", "0.2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("model absent's metadata: HTTP 404", r.stderr)
        r = bench_serve(url, "--input", "jpeg", "--seconds", "0.2")
        self.assertIn("--input jpeg needs --images DIR", r.stderr)
        r = bench_serve(url, "--input", "jpeg", "--images", self.tmp.name + "/none", "--seconds", "0.2")
        self.assertIn("not a folder", r.stderr)
        r = bench_serve("https://" + self.server.url, "--seconds", "0.2")
        self.assertIn("only http:// is spoken", r.stderr)
        r = bench_serve("127.0.0.1:1", "--protocol", "grpc", "--seconds", "0.2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot connect to 127.0.0.1:1", r.stderr)
        r = bench_serve(self.server.grpc_url, "--protocol", "grpc", "--model", "absent", "--seconds", "0.2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("model absent's metadata: NOT_FOUND", r.stderr)


class Overload(unittest.TestCase):
    """A queue that fills: bench serve counts the 503s by status, and the rest are answered."""

    def test_refusals_are_counted_by_status(self):
        server = Serve(f"fashion={fixtures.fashion_resnet8()}", "--max-batch-size", "1", "--max-queue-size", "1",
                       "--instances", "1")
        try:
            r = bench_serve("http://" + server.url, "--concurrency", "16", "--seconds", "1", "--warmup-seconds",
                            "0.2", "--metrics-url", "none", "--json", os.devnull)
            self.assertEqual(r.returncode, 0, r.stderr)
            row = [line for line in r.stdout.splitlines() if line.startswith("| 16 |")][0]
            self.assertRegex(row, r"\| 503: [1-9][0-9]* \|$")
            ok = float(row.split("|")[2])
            self.assertGreater(ok, 0)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
