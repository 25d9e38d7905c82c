"""`convnets serve --model-control-mode explicit|poll` against tritonclient, as Triton manages its models.

Explicit: only --load-model's models load at startup; POST .../load and .../unload (gRPC RepositoryModelLoad and
RepositoryModelUnload) answer with Triton's statuses and texts: a load of a broken file 400 "load failed for model
..." with the served version kept, a load of a model the server does not know 500 "failed to load ..., failed to
poll from model repository", an unload of an unknown model 200; the index shows READY, then UNAVAILABLE "unloaded".
Parameters: "config" changes the batching; "file:1/model.onnx" loads a model from the request's bytes. Poll: a
replaced file is served from the next poll, a broken one is not, and load and unload are refused as Triton refuses
them. Under load (8 clients), five reloads each way: no request fails, every answer is one version's, and requests
sent after a reload are answered by the new version; then one version stays in memory.

The two versions are the suite's Fashion-MNIST ResNet-8 exported to ONNX from its weights and from its EMA weights.
Every server listens on 127.0.0.1 only, on ports it picks, and is stopped by the test that started it; the clients'
loops are bounded in count and time.
"""
import json
import os
import shutil
import tempfile
import threading
import time
import unittest

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)
import numpy as np
import tritonclient.grpc as tritongrpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from serve_harness import convnets, started, tensor_input

X = np.random.default_rng(3).standard_normal((1, 3, 28, 28)).astype(np.float32)
POLL_REFUSED = "explicit model load / unload is not allowed if polling is enabled"


def replace_file(src, dst):
    """dst becomes a copy of src in one rename, with a new modification time (what poll looks at)."""
    shutil.copyfile(src, dst + ".part")
    os.replace(dst + ".part", dst)


class Load:
    """CLIENTS threads sending X to `model` back to back (each its own connection) until stop(), at most LIMIT
    requests each and SECONDS in all: per request its send and answer times and its logits, or its error."""

    def __init__(self, url, model, clients=8, limit=3000, seconds=120):
        self.records, self.errors = [], []
        self.lock, self.done = threading.Lock(), threading.Event()
        deadline = time.monotonic() + seconds

        def client():
            c = triton.InferenceServerClient(url, connection_timeout=60, network_timeout=60)
            try:
                for _ in range(limit):
                    if self.done.is_set() or time.monotonic() > deadline:
                        break
                    sent = time.monotonic()
                    try:
                        logits = c.infer(model, [tensor_input(X)]).as_numpy("logits")[0]
                    except Exception as e:  # noqa: BLE001 - every failure is counted and named
                        with self.lock:
                            self.errors.append(repr(e))
                        continue
                    with self.lock:
                        self.records.append((sent, time.monotonic(), logits))
            finally:
                c.close()
        self.threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(timeout=120)
        return self.records, self.errors


class ModelControl(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ckpt = fixtures.fashion_resnet8()
        cls.tmp = tempfile.mkdtemp(prefix="convnets-model-control-")
        cls.v1, cls.v2 = os.path.join(cls.tmp, "v1.onnx"), os.path.join(cls.tmp, "v2.onnx")
        for path, extra in ((cls.v1, []), (cls.v2, ["--ema"])):
            r = convnets("export", "--checkpoint", ckpt, "--format", "onnx", "--dynamic-batch", "-o", path, *extra)
            assert r.returncode == 0, r.stderr
        cls.broken = os.path.join(cls.tmp, "broken.onnx")
        with open(cls.broken, "wb") as f:
            f.write(b"not an ONNX file\n" * 64)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def served_path(self):
        path = os.path.join(self.tmp, f"fm-{self.id().rsplit('.', 1)[1]}.onnx")
        replace_file(self.v1, path)
        return path

    def refused(self, call):
        with self.assertRaises(InferenceServerException) as e:
            call()
        return e.exception.status(), e.exception.message()

    def logits(self, client, model="fm"):
        return client.infer(model, [tensor_input(X)]).as_numpy("logits")[0]

    def state(self, client, name="fm"):
        return next(m for m in client.get_model_repository_index() if m["name"] == name)

    def wait_for(self, what, predicate, seconds=20):
        deadline = time.monotonic() + seconds
        while not predicate():
            self.assertLess(time.monotonic(), deadline, f"waited {seconds} s for {what}")
            time.sleep(0.05)

    def in_memory(self, server):
        return server.metrics()["convnets_models_in_memory"]

    def test_explicit_load_unload_and_their_failures_over_both_protocols(self):
        path = self.served_path()
        server = started(self, "--model-control-mode", "explicit", f"fm={path}")
        c = server.client
        g = tritongrpc.InferenceServerClient(server.grpc_url)
        self.addCleanup(g.close)
        # Explicit mode loads only --load-model's models: fm is named, with no state, and not served.
        self.assertEqual(c.get_model_repository_index(), [{"name": "fm"}])
        self.assertEqual(self.refused(lambda: self.logits(c))[0], "404")
        self.assertIsNone(c.load_model("fm"))
        self.assertEqual(self.state(c), {"name": "fm", "version": "1", "state": "READY"})
        first = self.logits(c)

        # A broken file: Triton's 400 and text, the version served before still answering.
        replace_file(self.broken, path)
        status, message = self.refused(lambda: c.load_model("fm"))
        self.assertEqual(status, "400")
        self.assertTrue(message.startswith("load failed for model 'fm': version 1 is at UNAVAILABLE state: Internal: "),
                        message)
        self.assertIn(path, message)
        np.testing.assert_array_equal(self.logits(c), first)
        self.assertEqual(self.state(c)["state"], "READY")
        with self.assertRaises(InferenceServerException) as e:
            g.load_model("fm")
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        self.assertTrue(e.exception.message().startswith("load failed for model 'fm'"), e.exception.message())

        # A model the server does not know: 500 (gRPC INTERNAL), Triton's text first.
        for load, code in ((c.load_model, "500"), (g.load_model, "StatusCode.INTERNAL")):
            with self.assertRaises(InferenceServerException) as e:
                load("nope")
            self.assertEqual(e.exception.status(), code)
            self.assertTrue(e.exception.message().startswith(
                "failed to load 'nope', failed to poll from model repository"), e.exception.message())
        # An unknown model's unload is no error, as Triton's.
        self.assertIsNone(c.unload_model("nope"))
        self.assertIsNone(g.unload_model("nope"))

        # The good file back, over gRPC; its index too.
        replace_file(self.v2, path)
        self.assertIsNone(g.load_model("fm"))
        index = g.get_model_repository_index(as_json=True)["models"]
        self.assertEqual(index, [{"name": "fm", "version": "1", "state": "READY"}])
        second = self.logits(c)
        self.assertFalse(np.allclose(first, second, atol=1e-4), "the EMA weights answer as the last ones")

        # parameters.config: the batching it names, the rest as served; a field serve cannot change is refused.
        config = c.get_model_config("fm")
        config["max_batch_size"] = 4
        self.assertIsNone(c.load_model("fm", config=json.dumps(config)))
        self.assertEqual(c.get_model_config("fm")["max_batch_size"], 4)
        status, message = self.refused(lambda: c.load_model("fm", config=json.dumps({"platform": "tensorrt_plan"})))
        self.assertEqual(status, "500")
        self.assertIn("Invalid config override: 'platform' cannot be changed", message)
        status, message = self.refused(lambda: c.load_model("fm2", files={"file:1/model.onnx": b"x"}))
        self.assertIn("Load parameter 'config' must be specified for model file override", message)
        status, message = self.refused(lambda: c.load_model(
            "fm2", config="{}", files={"file:../../etc/model.onnx": b"x"}))
        self.assertIn("must stay within model directory", message)

        # file:1/model.onnx: a model the repository never held, from the request's bytes (HTTP base64, gRPC raw).
        with open(self.v1, "rb") as f:
            v1_bytes = f.read()
        self.assertIsNone(c.load_model("fm2", config=json.dumps({"name": "fm2"}), files={"file:1/model.onnx": v1_bytes}))
        np.testing.assert_allclose(self.logits(c, "fm2"), first, atol=1e-5)
        self.assertIsNone(g.load_model("fm3", config="{}", files={"file:1/model.onnx": v1_bytes}))
        np.testing.assert_allclose(self.logits(c, "fm3"), first, atol=1e-5)

        # Unloaded: UNLOADING while requests hold it, then UNAVAILABLE "unloaded"; its requests get 404.
        self.assertIsNone(c.unload_model("fm"))
        self.wait_for("fm unloaded", lambda: self.state(c)["state"] == "UNAVAILABLE")
        self.assertEqual(self.state(c), {"name": "fm", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"})
        status, message = self.refused(lambda: self.logits(c))
        self.assertEqual((status, message), ("404", "Request for unknown model: 'fm' has no available versions"))
        self.assertEqual([m["name"] for m in c.get_model_repository_index() if m.get("state") == "READY"],
                         ["fm2", "fm3"])
        self.assertEqual(g.get_model_repository_index(as_json=True).get("models", [])[0]["reason"], "unloaded")
        self.wait_for("two versions in memory", lambda: self.in_memory(server) == 2)

    def reloads_under_load(self, server, path, reload):
        """Five reloads while 8 clients send X, each reload alternating the file between v2 and v1: `reload`
        makes the server take the file (named by its version, "v1" or "v2") and returns once it serves it. Every answer is one version's, and each
        request sent after a reload completed (and answered before the next began) is the new version's."""
        c = server.client
        first = self.logits(c)
        load = Load(server.url, "fm")
        windows = []  # (after, before, version): requests sent after `after` and answered before `before`
        try:
            time.sleep(0.5)
            for k in range(5):
                version = "v2" if k % 2 == 0 else "v1"
                began = time.monotonic()
                if windows:
                    windows[-1][1] = began
                replace_file(self.v2 if version == "v2" else self.v1, path)
                reload(version)
                windows.append([time.monotonic(), float("inf"), version])
                time.sleep(0.5)
        finally:
            records, errors = load.stop()
        self.assertEqual(errors, [], f"{len(errors)} of {len(records) + len(errors)} requests failed")
        self.assertGreater(len(records), 100)
        versions = {"v1": first, "v2": None}
        for sent, answered, logits in sorted(records, key=lambda r: r[0]):
            if versions["v2"] is None and not np.allclose(logits, first, atol=1e-4):
                versions["v2"] = logits
        self.assertIsNotNone(versions["v2"], "no answer came from the reloaded version")
        seen = {"v1": 0, "v2": 0}
        for sent, answered, logits in records:
            which = [v for v, ref in versions.items() if np.allclose(logits, ref, atol=1e-4)]
            self.assertEqual(len(which), 1, f"an answer of neither version: {logits}")
            seen[which[0]] += 1
            for after, before, version in windows:
                if sent > after and answered < before:
                    self.assertEqual(which[0], version, f"a request sent {sent - after:.3f} s after a reload")
        self.assertGreater(min(seen.values()), 10, seen)
        # The replaced versions leave memory once their requests are answered.
        self.wait_for("one version in memory", lambda: self.in_memory(server) == 1)

    def test_explicit_reloads_under_load_lose_no_request(self):
        path = self.served_path()
        server = started(self, "--model-control-mode", "explicit", "--load-model", "fm", f"fm={path}")
        self.reloads_under_load(server, path, lambda version: server.client.load_model("fm"))

    def test_poll_reloads_under_load_lose_no_request_and_refuse_explicit_control(self):
        path = self.served_path()
        server = started(self, "--model-control-mode", "poll", "--repository-poll-secs", "1", f"fm={path}")
        c = server.client
        probe = triton.InferenceServerClient(server.url)
        self.addCleanup(probe.close)

        # The poll takes a file within its period; the probe tells when the new version answers: v2's answer is
        # whatever first differs from v1's, the version served at the start.
        answers = {"v1": self.logits(probe)}

        def reload(version):
            if version not in answers:
                self.wait_for("the poll's reload", lambda: not np.allclose(self.logits(probe), answers["v1"], atol=1e-4))
                answers[version] = self.logits(probe)
            else:
                self.wait_for("the poll's reload", lambda: np.allclose(self.logits(probe), answers[version], atol=1e-4))
        self.reloads_under_load(server, path, reload)

        # A broken file is not taken: the version served stays, READY.
        served = self.logits(c)
        replace_file(self.broken, path)
        time.sleep(2.5)
        np.testing.assert_array_equal(self.logits(c), served)
        self.assertEqual(self.state(c)["state"], "READY")

        # Load and unload are explicit mode's: Triton's 503 and UNAVAILABLE, its text.
        self.assertEqual(self.refused(lambda: c.load_model("fm")), ("503", POLL_REFUSED))
        self.assertEqual(self.refused(lambda: c.unload_model("fm")), ("503", POLL_REFUSED))
        g = tritongrpc.InferenceServerClient(server.grpc_url)
        self.addCleanup(g.close)
        for call in (g.load_model, g.unload_model):
            with self.assertRaises(InferenceServerException) as e:
                call("fm")
            self.assertEqual((e.exception.status(), e.exception.message()), ("StatusCode.UNAVAILABLE", POLL_REFUSED))

    def test_none_mode_refuses_load_and_load_model_needs_explicit(self):
        r = convnets("serve", "--load-model", "fm", f"fm={self.v1}", "--port", "0", "--grpc-port", "-1", timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--load-model needs --model-control-mode explicit", r.stderr)
        r = convnets("serve", "--model-control-mode", "explicit", "--load-model", "other", f"fm={self.v1}",
                     "--port", "0", "--grpc-port", "-1", timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--load-model other: no such model among the MODEL arguments (fm)", r.stderr)
        server = started(self, f"fm={self.v1}")
        self.assertEqual(self.refused(lambda: server.client.load_model("fm")), ("503", POLL_REFUSED))


if __name__ == "__main__":
    unittest.main()
