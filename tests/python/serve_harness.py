"""What the tests of `convnets serve` share: a server on free loopback ports that the test which started it stops,
and the requests they send (tritonclient's inputs, raw bytes on a socket)."""
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import tritonclient.http as triton

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
