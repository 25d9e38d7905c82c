"""`convnets serve`'s dynamic batching through tritonclient and raw sockets: concurrent requests share a forward
pass, a lone request pays no queue delay, a request whose body is still arriving is waited for, a full queue is
answered 503 at once, a request timeout expires, and SIGTERM answers every request accepted, refuses new ones with
503 and exits 0.

Every server listens on 127.0.0.1 only, on a port it picks, and is stopped by the test that started it.
"""
import json
import signal
import socket
import subprocess
import threading
import time
import unittest

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import numpy as np
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from serve_harness import BIN, HOST, infer_json, post, started, tensor_input


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

    def test_a_body_still_arriving_is_waited_for_and_one_that_never_comes_is_not(self):
        # --batch-delay-policy arrivals counts a request from its headers: while one client's body is still on its
        # way, another's request waits for it (both in one pass) instead of leaving alone. A body refused part-way
        # (413) or abandoned (the client closes) stops counting at once: the other request does not wait out the
        # 5 s delay for it.
        server = started(self, f"fashion={self.ckpt}", "--max-batch-size", "8", "--max-queue-delay-us", "5000000",
                         "--max-request-bytes", "65536")
        key = 'model="fashion",version="1"'
        body = infer_json([{"name": "input", "datatype": "FP32", "shape": [1, 3, 28, 28],
                            "data": self.x.ravel().tolist()}])
        head = (f"POST /v2/models/fashion/infer HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()

        def answered_after(send_rest, wait_s):
            """The other request's seconds, `send_rest` run once it has waited `wait_s` unanswered."""
            threads, results = self.concurrently(server, 1)
            threads[0].join(wait_s)
            self.assertTrue(threads[0].is_alive(), f"answered {results[0]} without waiting for the body on its way")
            t0 = time.monotonic()
            send_rest()
            threads[0].join(60)
            self.assertEqual(results[0][0], 200, results)
            return time.monotonic() - t0

        slow = socket.create_connection((HOST, server.port), timeout=30)
        slow.sendall(head + body[:len(body) // 2])
        time.sleep(0.3)  # its headers read
        after = answered_after(lambda: slow.sendall(body[len(body) // 2:]), 1.0)
        self.assertLess(after, 2.0, "answered once the body came, in the same pass")
        self.assertIn(b"200 OK", slow.recv(65536))
        slow.close()
        m = server.metrics()
        self.assertEqual(m["nv_inference_exec_count{%s}" % key], 1)
        self.assertEqual(m['convnets_inference_batch_size_count{%s,batch_size="2"}' % key], 1)

        # Chunked past --max-request-bytes: 413 part-way, its connection lingering for 2 s after.
        refused = socket.create_connection((HOST, server.port), timeout=30)
        refused.sendall(head.replace(b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked"))
        time.sleep(0.3)
        after = answered_after(lambda: refused.sendall(b"%x\r\n" % 70000 + b"0" * 70000 + b"\r\n"), 0.5)
        self.assertLess(after, 1.5, "the request waited for a body refused with 413")
        self.assertIn(b"413", refused.recv(65536))
        refused.close()

        gone = socket.create_connection((HOST, server.port), timeout=30)
        gone.sendall(head + body[:100])
        time.sleep(0.3)
        after = answered_after(gone.close, 0.5)
        self.assertLess(after, 1.5, "the request waited for a body whose client had gone")
        self.assertEqual(server.metrics()["nv_inference_request_success{%s}" % key], 4)

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


if __name__ == "__main__":
    unittest.main()
