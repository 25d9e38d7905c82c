"""`convnets serve --http-restricted-api / --grpc-restricted-protocol` through tritonclient, as Triton restricts.

A restricted group answers only requests that carry its KEY: VALUE (HTTP header, any case of the name) or
triton-grpc-protocol-KEY metadata (gRPC): without it, or with another value, HTTP gets 403 and Triton's message
before the body is read, gRPC gets UNAVAILABLE and Triton's message; the groups left open answer as before. Bad
flag values are refused at startup, naming the flag.

Every server listens on 127.0.0.1 only, on ports it picks, and is stopped by the test that started it.
"""
import os
import socket
import time
import unittest

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)
import numpy as np
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from serve_harness import BIN, HOST, convnets, started, tensor_input

ADMIN = {"admin-key": "s3cret"}
INFER = {"infer-key": "go"}


class Restricted(unittest.TestCase):
    """Admin groups behind one key, inference behind another, health and metadata open."""

    @classmethod
    def setUpClass(cls):
        cls.ckpt = fixtures.fashion_resnet8()

    def setUp(self):
        # The flags before the model: each takes one value, so the positional MODEL is not taken for a second.
        self.server = started(self, "--http-restricted-api", "shared-memory,model-repository:admin-key=s3cret",
                              "--http-restricted-api", "inference:infer-key=go",
                              "--grpc-restricted-protocol", "shared-memory,model-repository:admin-key=s3cret",
                              "--grpc-restricted-protocol", "inference:infer-key=go",
                              f"fashion={self.ckpt}")
        self.grpc = tritongrpc.InferenceServerClient(self.server.grpc_url)
        self.addCleanup(self.grpc.close)

    def refused(self, call):
        with self.assertRaises(InferenceServerException) as e:
            call()
        return e.exception.status(), e.exception.message()

    def test_http_groups_need_their_header(self):
        c = self.server.client
        expected = ("403", "This API is restricted, expecting header 'admin-key'")
        self.assertEqual(self.refused(c.get_system_shared_memory_status), expected)
        self.assertEqual(self.refused(c.get_model_repository_index), expected)
        self.assertEqual(self.refused(lambda: c.register_system_shared_memory("r", "/convnets-none", 4)), expected)
        self.assertEqual(self.refused(lambda: c.get_system_shared_memory_status(headers={"admin-key": "wrong"})),
                         expected)
        self.assertEqual(self.refused(lambda: c.get_system_shared_memory_status(headers=INFER)), expected)
        # The key opens its groups, its name in any case; the other key's group stays shut.
        self.assertEqual(c.get_system_shared_memory_status(headers=ADMIN), [])
        self.assertEqual(c.get_system_shared_memory_status(headers={"Admin-Key": "s3cret"}), [])
        self.assertEqual([m["name"] for m in c.get_model_repository_index(headers=ADMIN)], ["fashion"])
        x = np.random.default_rng(0).standard_normal((1, 3, 28, 28)).astype(np.float32)
        self.assertEqual(self.refused(lambda: c.infer("fashion", [tensor_input(x)], headers=ADMIN)),
                         ("403", "This API is restricted, expecting header 'infer-key'"))
        self.assertEqual(c.infer("fashion", [tensor_input(x)], headers=INFER).as_numpy("logits").shape, (1, 10))
        # Groups no flag names answer everyone.
        self.assertTrue(c.is_server_live())
        self.assertTrue(c.is_model_ready("fashion"))
        self.assertEqual(c.get_model_metadata("fashion")["name"], "fashion")
        self.assertEqual(c.get_model_config("fashion")["name"], "fashion")

    def test_http_refuses_before_reading_the_body(self):
        # Headers that promise a body never sent: the answer comes at once, not after --body-timeout-s.
        head = (f"POST /v2/systemsharedmemory/region/r/register HTTP/1.1\r\nHost: {HOST}\r\n"
                "Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n").encode()
        started_at = time.monotonic()
        with socket.create_connection((HOST, self.server.port), timeout=20) as s:
            s.sendall(head)
            answer = s.recv(65536)
        self.assertLess(time.monotonic() - started_at, 10)
        self.assertTrue(answer.startswith(b"HTTP/1.1 403 "), answer[:80])
        self.assertIn(b"This API is restricted, expecting header 'admin-key'", answer)

    def test_grpc_groups_need_their_metadata(self):
        g = self.grpc
        expected = ("StatusCode.UNAVAILABLE",
                    "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'")
        self.assertEqual(self.refused(g.get_system_shared_memory_status), expected)
        self.assertEqual(self.refused(g.get_model_repository_index), expected)
        self.assertEqual(self.refused(lambda: g.get_model_repository_index(headers=ADMIN)), expected)
        self.assertEqual(self.refused(
            lambda: g.get_model_repository_index(headers={"triton-grpc-protocol-admin-key": "wrong"})), expected)
        admin = {"triton-grpc-protocol-admin-key": "s3cret"}
        self.assertEqual(len(g.get_system_shared_memory_status(headers=admin).regions), 0)
        self.assertEqual([m.name for m in g.get_model_repository_index(headers=admin).models], ["fashion"])
        x = np.random.default_rng(0).standard_normal((1, 3, 28, 28)).astype(np.float32)
        t = tritongrpc.InferInput("input", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        self.assertEqual(self.refused(lambda: g.infer("fashion", [t])),
                         ("StatusCode.UNAVAILABLE",
                          "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"))
        logits = g.infer("fashion", [t], headers={"triton-grpc-protocol-infer-key": "go"}).as_numpy("logits")
        self.assertEqual(logits.shape, (1, 10))
        self.assertTrue(g.is_server_live())
        self.assertEqual(g.get_model_metadata("fashion").name, "fashion")


class BadFlags(unittest.TestCase):
    """Each malformed value refused before the server starts, naming the flag and what was expected."""

    def test_values_of_another_shape_unknown_groups_and_groups_named_twice(self):
        ckpt = fixtures.fashion_resnet8()
        cases = [
            (["--http-restricted-api", "shared-memory"], "--http-restricted-api shared-memory: expected GROUP"),
            (["--http-restricted-api", "health:key"], "--http-restricted-api health:key: expected GROUP"),
            (["--http-restricted-api", "health:key="], "expected GROUP[,GROUP...]:KEY=VALUE"),
            (["--http-restricted-api", "health, metadata:k=v"], "unknown restricted api ' metadata'"),
            (["--grpc-restricted-protocol", "shm:k=v"],
             "--grpc-restricted-protocol shm:k=v: unknown restricted protocol 'shm'"),
            (["--http-restricted-api", "health:a=1", "--http-restricted-api", "metadata,health:b=2"],
             "restricted api 'health' can not be specified in multiple config groups"),
            (["--grpc-restricted-protocol", "health:Admin-Key=1"],
             "gRPC metadata keys are lower case, so no client can send 'triton-grpc-protocol-Admin-Key'"),
        ]
        for flags, message in cases:
            with self.subTest(flags=flags):
                r = convnets("serve", f"fashion={ckpt}", *flags, "--host", HOST, "--port", "0", "--grpc-port", "-1",
                             "--metrics-port", "-1", timeout=120)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(message, r.stderr)
                self.assertNotIn("HTTP on", r.stdout)


if __name__ == "__main__":
    unittest.main()
