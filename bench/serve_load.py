#!/usr/bin/env python3
"""`convnets serve` under load on the loopback interface, against `convnets bench infer` in the same run (issue 47).

The load generator is Triton's own HTTP client (PyPI's tritonclient), not part of convnets: CONCURRENCY threads,
spread over --client-processes processes (one Python process cannot send more than about 2,000 such requests/s),
each with its own connection, each sending one image per request as Triton's binary FP32 tensor (random data, as
perf_analyzer sends by default) and waiting for the answer before sending the next. Per concurrency: inferences/s
and p50/p90/p95/p99/avg latency over --seconds after --warmup-seconds, shaped like DLE's Triton tables.
The server runs with dynamic batching up to --batch-size, the batch `convnets bench infer` is timed at.

Then, above saturation: --overload-concurrency clients against a queue of --overload-queue requests; the
overflow must be answered 503 at once and the server stay up. Then the soak: --soak requests to a small model
(--soak-checkpoint; the suite's Fashion-MNIST ResNet-8) at concurrency 4, with zero errors and the server's
resident memory sampled every tenth of the run (flat within 10 % from the first tenth to the last). Last,
SIGTERM during load: every answer counted, the exit status 0.

    .venv/bin/python bench/serve_load.py --convnets build/convnets --soak-checkpoint CKPT [--json out.json]

On a GPU (scripts/gpu.sh's graphs stage): --device cuda --precision amp --model-args=--fold-bn, the server's
CUDA graphs at the batch sizes its batcher fills.

--client bench-serve: the rows' load comes from `convnets bench serve` (issue 68: perf_analyzer's closed loop in
C++, one thread and connection per request in flight) instead of tritonclient, over HTTP or HTTP with the inputs in
system shared memory, sending FP32 tensors or (--client-input jpeg --images DIR) the JPEG files of a folder; each
row adds the client's and the server's CPU time per request, and its cells are named "serve ARCH PREC, concurrency
C, PROTOCOL, INPUT".
"""
import argparse
import json
import multiprocessing
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException


PROTOCOLS = ("http", "grpc", "http-shm", "grpc-shm")
LABELS = {"http": "HTTP", "grpc": "gRPC", "http-shm": "HTTP, inputs in system shared memory",
          "grpc-shm": "gRPC, inputs in system shared memory"}


def client_module(protocol):
    """tritonclient's HTTP or gRPC half: the same calls, the one protocol or the other (PROTOCOL-shm: its own)."""
    if protocol.startswith("grpc"):
        import tritonclient.grpc as grpc_client
        return grpc_client
    return triton


def percentile(values, p):
    return float(np.percentile(np.asarray(values), p)) if values else float("nan")


class Server:
    def __init__(self, convnets, *args, grpc=False):
        self.proc = subprocess.Popen([convnets, "serve", *args, "--host", "127.0.0.1", "--port", "0",
                                      "--metrics-port", "-1", "--grpc-port", "0" if grpc else "-1"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = []
        self.grpc_url = None
        for line in self.proc.stdout:
            lines.append(line)
            if " gRPC on " in line:
                self.grpc_url = line.split(" gRPC on ")[1].split()[0]
            if " HTTP on " in line:
                break
        else:
            raise SystemExit("convnets serve did not start:\n" + "".join(lines) + self.proc.stderr.read())
        self.startup = "".join(lines)
        self.url = line.split(" HTTP on ")[1].split()[0].removeprefix("http://")

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=120)
        return rc, self.proc.stderr.read()


def load(url, model, make_input, concurrency, seconds=None, requests=None, warmup=0.0, on_sample=None,
         protocol="http"):
    """CONCURRENCY closed-loop clients for SECONDS (after WARMUP) or REQUESTS in all. Returns the latencies of the
    timed successes, the timed span, and counts by outcome."""
    lock = threading.Lock()
    latencies, counts = [], {"ok": 0, "503": 0, "other": 0, "connection": 0, "refused": 0}
    kinds = {}
    sent = [0]
    start = time.perf_counter()
    t_begin, t_end = start + warmup, (start + warmup + seconds) if seconds else float("inf")

    def client():
        c = (client_module("grpc").InferenceServerClient(url) if protocol.startswith("grpc") else
             triton.InferenceServerClient(url, network_timeout=300))
        request = make_input(c)
        inputs = request.inputs
        try:
            while True:
                with lock:
                    if requests is not None and sent[0] >= requests:
                        return
                    sent[0] += 1
                    n = sent[0]
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                try:
                    c.infer(model, inputs)
                    outcome = "ok"
                except InferenceServerException as e:
                    outcome = "503" if str(e.status()) in ("503", "StatusCode.UNAVAILABLE") else "other"
                except ConnectionRefusedError:
                    outcome = "refused"  # nothing listens: the request was never accepted
                except Exception as e:  # noqa: BLE001 - a reset connection is an outcome to count, not a crash
                    outcome = "connection"
                    with lock:
                        kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
                t1 = time.perf_counter()
                with lock:
                    if t0 >= t_begin or requests is not None:
                        counts[outcome] += 1
                        if outcome == "ok":
                            latencies.append(t1 - t0)
                if outcome == "refused":
                    return
                if on_sample and requests and n % (requests // 10) == 0:
                    on_sample(n)
        finally:
            request.close()
            c.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = (min(time.perf_counter(), t_end) - t_begin) if seconds else (time.perf_counter() - start)
    if kinds:
        counts["connection_errors"] = kinds
    return latencies, span, counts


def _load_child(results, start, url, model, side, concurrency, seconds, warmup, protocol):
    start.wait()  # every process imported and connected-ready: the timed windows overlap
    results.put(load(url, model, tensor_maker(side, protocol=protocol), concurrency, seconds=seconds, warmup=warmup,
                     protocol=protocol))


def load_parallel(url, model, side, concurrency, processes, seconds, warmup=0.0, protocol="http"):
    """load() with its CONCURRENCY clients spread over PROCESSES client processes, their outcomes summed. One Python
    process sends at most about 2,000 requests/s of a 224-px FP32 image (tritonclient builds and parses each under
    one GIL): on the H100 of 2026-11-27 one process measured its own ceiling at 1,955/s, not the server's."""
    processes = max(1, min(processes, concurrency))
    if processes == 1:
        return load(url, model, tensor_maker(side, protocol=protocol), concurrency, seconds=seconds, warmup=warmup,
                    protocol=protocol)
    ctx = multiprocessing.get_context("spawn")
    results, start = ctx.Queue(), ctx.Barrier(processes)
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    procs = [ctx.Process(target=_load_child, args=(results, start, url, model, side, n, seconds, warmup, protocol),
                         daemon=True) for n in shares]
    for p in procs:
        p.start()
    try:
        parts = [results.get(timeout=seconds + warmup + 300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    latencies, spans, counts = [], [], {}
    for lat, span, c in parts:
        latencies += lat
        spans.append(span)
        for k, v in c.items():
            if isinstance(v, dict):
                merged = counts.setdefault(k, {})
                for kk, vv in v.items():
                    merged[kk] = merged.get(kk, 0) + vv
            else:
                counts[k] = counts.get(k, 0) + v
    return latencies, statistics.fmean(spans), counts


class SlowHeaders:
    """N raw connections sending request headers one byte a second and never finishing them (slowloris), each
    reopened when the server closes it; bounded by N and by the caller's stop(). Counts the server's closes and how
    long each connection had lived."""

    def __init__(self, url, n):
        import socket
        host, port = url.rsplit(":", 1)
        self.addr, self.n, self.stop_at = (host, int(port)), n, None
        self.closed, self.lifetimes, self._socket = 0, [], socket
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self):
        s = self._socket.create_connection(self.addr, timeout=5)
        s.setblocking(False)
        return [s, time.monotonic(), 0]

    def _run(self):
        line = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4096
        conns = [self._open() for _ in range(self.n)]
        while not self._stopping.wait(1.0):
            for i, c in enumerate(conns):
                try:
                    if c[0].recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    c[0].close()
                    self.closed += 1
                    self.lifetimes.append(time.monotonic() - c[1])
                    conns[i] = self._open()
                    continue
                try:
                    c[0].send(line[c[2] % len(line):][:1])
                    c[2] += 1
                except OSError:
                    pass
        for c in conns:
            c[0].close()

    def stop(self):
        self._stopping.set()
        self._thread.join(timeout=30)


class TensorRequest:
    """One client's input: a random 1x3xSIDExSIDE FP32 image in each request (Triton's binary tensor data over HTTP,
    raw contents over gRPC), or, for PROTOCOL-shm, written once into a POSIX shared-memory region of the client's own
    that it registers with the server, each request then naming the region instead of carrying the 0.6-1.2 MB
    (Triton's system shared memory, as perf_analyzer --shared-memory system sends)."""

    def __init__(self, client, side, seed, protocol):
        x = np.random.default_rng(seed).standard_normal((1, 3, side, side)).astype(np.float32)
        t = client_module(protocol).InferInput("input", list(x.shape), "FP32")
        self.region, self.client = None, client
        if protocol.endswith("-shm"):
            import tritonclient.utils.shared_memory as shm
            self.name = f"serve-load-{os.getpid()}-{threading.get_ident()}"
            self.region = shm.create_shared_memory_region(self.name, "/" + self.name, x.nbytes)
            shm.set_shared_memory_region(self.region, [x])
            client.register_system_shared_memory(self.name, "/" + self.name, x.nbytes)
            t.set_shared_memory(self.name, x.nbytes)
        elif protocol == "grpc":
            t.set_data_from_numpy(x)  # raw_input_contents: gRPC's binary form
        else:
            t.set_data_from_numpy(x, binary_data=True)
        self.inputs = [t]

    def close(self):
        if self.region is None:
            return
        import tritonclient.utils.shared_memory as shm
        try:
            self.client.unregister_system_shared_memory(self.name)
        except Exception:  # noqa: BLE001 - a server gone (the SIGTERM run) has nothing left to unregister
            pass
        shm.destroy_shared_memory_region(self.region)


def tensor_maker(side, seed=0, protocol="http"):
    return lambda client: TensorRequest(client, side, seed, protocol)


def bench_serve_rows(convnets, url, metrics_url, protocol, concurrency, seconds, warmup, client_input, images):
    """`convnets bench serve`'s rows, as this script's own: one run of every concurrency over one protocol."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        cmd = [convnets, "bench", "serve", "http://" + url, "--concurrency", concurrency, "--seconds", str(seconds),
               "--warmup-seconds", str(warmup), "--metrics-url", metrics_url, "--input", client_input, "--json", out]
        if protocol == "http-shm":
            cmd.append("--shared-memory")
        if client_input == "jpeg":
            cmd += ["--images", images]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("convnets bench serve failed: " + r.stderr.strip())
        print(r.stdout, end="", flush=True)
        with open(out) as f:
            j = json.load(f)
    rows = []
    for row in j["rows"]:
        counts = dict(row["counts"])
        counts.setdefault("ok", 0)
        rows.append({"protocol": protocol, "concurrency": int(row["concurrency"]), "client_batch": 1,
                     "inferences_per_s": row["inferences_per_s"], "p50_ms": row["p50_ms"], "p90_ms": row["p90_ms"],
                     "p95_ms": row["p95_ms"], "p99_ms": row["p99_ms"], "avg_ms": row["avg_ms"], "counts": counts,
                     "client": "convnets bench serve", "input": client_input,
                     "client_cpu_ms_per_request": row["client_cpu_ms_per_request"],
                     "server_cpu_ms_per_request": row.get("server_cpu_ms_per_request"),
                     "warning": row.get("warning")})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--convnets", required=True)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup-seconds", type=float, default=5)
    ap.add_argument("--max-queue-delay-us", type=int, default=2000)
    ap.add_argument("--overload-concurrency", type=int, default=48)
    ap.add_argument("--overload-queue", type=int, default=16)
    ap.add_argument("--slow-clients", type=int, default=0,
                    help="then: the last concurrency again alone and beside this many slowloris connections (headers "
                         "a byte a second); their throughputs' ratio")
    ap.add_argument("--soak", type=int, default=100000)
    ap.add_argument("--soak-checkpoint")
    ap.add_argument("--device", default="cpu", help="where the server and bench infer run (cpu, cuda)")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--model-args", default="", help="more options for both, e.g. --fold-bn")
    ap.add_argument("--image-size", type=int, default=224,
                    help="the input's side, for both (small: the HTTP front end's share of each request grows)")
    ap.add_argument("--protocols", default="http",
                    help="the load rows, each against the same server: http, grpc (needs a convnets built with "
                         "it and tritonclient's gRPC half), http-shm, grpc-shm (the same, each client's image in "
                         "a shared-memory region it registers, as perf_analyzer --shared-memory system); "
                         "comma-separated")
    ap.add_argument("--client-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                    help="client processes the concurrency's connections are spread over (default: half the CPUs, "
                         "at most 8; the server keeps the rest)")
    ap.add_argument("--client", choices=("tritonclient", "bench-serve"), default="tritonclient",
                    help="the rows' load generator: tritonclient's Python clients, or convnets bench serve (C++)")
    ap.add_argument("--client-input", choices=("fp32", "jpeg"), default="fp32",
                    help="--client bench-serve: FP32 tensors, or the JPEG files of --images sent encoded")
    ap.add_argument("--images", help="--client-input jpeg: a folder of JPEG files")
    ap.add_argument("--json")
    ap.add_argument("--summary", help="append each concurrency's cells to this summary.json (bench/compare.py's "
                                      "format): throughput against bench infer's at --batch-size, p99 against its "
                                      "batch-1 latency")
    a = ap.parse_args()
    model_args = ["--device", a.device, "--precision", a.precision, "--image-size", str(a.image_size),
                  *shlex.split(a.model_args)]
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
              "arch": a.arch, "batch_size": a.batch_size, "model_args": model_args,
              "client_processes": a.client_processes}
    with tempfile.TemporaryDirectory() as d:
        weights = os.path.join(d, a.arch + ".safetensors")
        subprocess.run([a.convnets, "models", "--arch", a.arch, "--seed", "5", "--save", weights], check=True,
                       capture_output=True)
        bench_json = os.path.join(d, "bench.json")
        subprocess.run([a.convnets, "bench", "infer", "--checkpoint", weights, "--arch", a.arch, "--batch-sizes",
                        f"1,{a.batch_size}", *model_args, "--json", bench_json, "--iterations", "10",
                        "--warmup", "3"], check=True, capture_output=True)
        with open(bench_json) as f:
            result["bench_infer"] = json.load(f)
        side = a.image_size
        protocols = a.protocols.split(",")
        unknown = [p for p in protocols if p not in PROTOCOLS]
        if unknown:
            raise SystemExit(f"--protocols: unknown {', '.join(unknown)} (expected some of {', '.join(PROTOCOLS)})")
        if a.client == "bench-serve" and any(p.startswith("grpc") for p in protocols):
            raise SystemExit("--client bench-serve speaks HTTP (http, http-shm); gRPC rows use tritonclient")
        if a.client_input == "jpeg" and (a.client != "bench-serve" or not a.images):
            raise SystemExit("--client-input jpeg needs --client bench-serve and --images DIR")
        server = Server(a.convnets, weights, "--arch", a.arch, *model_args, "--max-batch-size", str(a.batch_size),
                        "--max-queue-delay-us", str(a.max_queue_delay_us), "--max-queue-size", "256",
                        grpc=any(p.startswith("grpc") for p in protocols))
        result["server"] = server.startup
        print(server.startup, end="", flush=True)
        rows = []
        for protocol in protocols if a.client == "bench-serve" else ():
            metrics = "http://" + server.url + "/metrics"  # the Server above runs with --metrics-port -1
            rows += bench_serve_rows(a.convnets, server.url, metrics, protocol, a.concurrency, a.seconds,
                                     a.warmup_seconds, a.client_input, a.images)
        for protocol, c in ((p, int(x)) for p in protocols for x in a.concurrency.split(",")
                            if a.client == "tritonclient"):
            url = server.grpc_url if protocol.startswith("grpc") else server.url
            lat, span, counts = load_parallel(url, a.arch, side, c, a.client_processes, seconds=a.seconds,
                                              warmup=a.warmup_seconds, protocol=protocol)
            row = {"protocol": protocol, "concurrency": c, "client_batch": 1, "inferences_per_s": counts["ok"] / span,
                   "p50_ms": 1e3 * percentile(lat, 50), "p90_ms": 1e3 * percentile(lat, 90),
                   "p95_ms": 1e3 * percentile(lat, 95), "p99_ms": 1e3 * percentile(lat, 99),
                   "avg_ms": 1e3 * statistics.fmean(lat) if lat else float("nan"), "counts": counts}
            rows.append(row)
            print(json.dumps(row), flush=True)
        result["load"] = rows
        if a.slow_clients:
            c = int(a.concurrency.split(",")[-1])
            alone = load_parallel(server.url, a.arch, side, c, a.client_processes, seconds=a.seconds,
                                  warmup=a.warmup_seconds)
            slow = SlowHeaders(server.url, a.slow_clients)
            beside = load_parallel(server.url, a.arch, side, c, a.client_processes, seconds=a.seconds,
                                   warmup=a.warmup_seconds)
            slow.stop()
            rate = [r[2]["ok"] / r[1] for r in (alone, beside)]
            result["slow_clients"] = {
                "concurrency": c, "slow_clients": a.slow_clients, "alone_inferences_per_s": rate[0],
                "beside_inferences_per_s": rate[1], "ratio": rate[1] / rate[0], "counts": beside[2],
                "slow_closed": slow.closed,
                "slow_lifetime_s": [min(slow.lifetimes), max(slow.lifetimes)] if slow.lifetimes else None}
            print(json.dumps(result["slow_clients"]), flush=True)
        rc, err = server.stop()
        result["load_server_exit"] = rc

        # Above saturation: a short queue, many clients (--overload-concurrency 0: not run).
        if a.overload_concurrency <= 0:
            server = None
        else:
            server = Server(a.convnets, weights, "--arch", a.arch, *model_args, "--max-batch-size", str(a.batch_size),
                            "--max-queue-delay-us", str(a.max_queue_delay_us), "--max-queue-size",
                            str(a.overload_queue))
            lat, span, counts = load_parallel(server.url, a.arch, side, a.overload_concurrency, a.client_processes,
                                              seconds=a.seconds / 2)
            live = triton.InferenceServerClient(server.url).is_server_live()
            result["overload"] = {"concurrency": a.overload_concurrency, "max_queue_size": a.overload_queue,
                                  "counts": counts, "ok_p50_ms": 1e3 * percentile(lat, 50), "live_after": live}
            print(json.dumps(result["overload"]), flush=True)
            rc, _ = server.stop()
            result["overload_server_exit"] = rc

    if a.soak and a.soak_checkpoint:
        server = Server(a.convnets, "soak=" + a.soak_checkpoint, "--max-batch-size", "8")
        samples = []
        side = int(json.loads(triton.InferenceServerClient(server.url).get_model_config("soak")["parameters"]
                              ["preprocessing"]["string_value"])["input_size"])
        samples.append((0, server.rss_mib()))
        lat, span, counts = load(server.url, "soak", tensor_maker(side), 4, requests=a.soak,
                                 on_sample=lambda n: samples.append((n, server.rss_mib())))
        first = next((r for n, r in samples if n >= a.soak // 10), samples[0][1])
        last = samples[-1][1]
        result["soak"] = {"requests": a.soak, "counts": counts, "seconds": span, "rss_mib": samples,
                          "rss_change": (last - first) / first, "p99_ms": 1e3 * percentile(lat, 99)}
        print(json.dumps({k: v for k, v in result["soak"].items() if k != "rss_mib"}), flush=True)
        # SIGTERM during load: the clients run until the server is gone; every request they sent is counted.
        outcome = {}
        t = threading.Thread(target=lambda: outcome.update(
            zip(("lat", "span", "counts"), load(server.url, "soak", tensor_maker(side), 8, seconds=6))))
        t.start()
        time.sleep(3)
        rc, err = server.stop()
        t.join()
        result["sigterm"] = {"exit": rc, "counts": outcome["counts"], "stderr": err.strip().splitlines()}
        print(json.dumps(result["sigterm"]), flush=True)

    bench = next(r for r in result["bench_infer"]["rows"] if r["batch"] == a.batch_size)
    # Per protocol, at its highest concurrency: issue 59's bar (>= 0.85x bench infer at the batch it forms).
    result["ratio"] = []
    for protocol in protocols:
        top = max((r for r in result["load"] if r["protocol"] == protocol), key=lambda r: r["concurrency"])
        result["ratio"].append({"protocol": protocol, "bench_infer_images_per_s": bench["images_per_s"],
                                "serve_inferences_per_s": top["inferences_per_s"], "concurrency": top["concurrency"],
                                "serve_over_bench": top["inferences_per_s"] / bench["images_per_s"]})
        print(json.dumps(result["ratio"][-1]), flush=True)
    if a.summary:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import compare  # noqa: E402 - the summary's one writer, beside this script
        one = next(r for r in result["bench_infer"]["rows"] if r["batch"] == 1)
        command = compare.short(" ".join(sys.argv[:1] + sys.argv[1:]))
        cells = []
        for row in result["load"]:
            if a.client == "bench-serve":
                figure = "serve %s %s, concurrency %d, %s, %s" % (
                    a.arch, a.precision, row["concurrency"], LABELS[row["protocol"]],
                    "JPEG files" if a.client_input == "jpeg" else "FP32 tensors")
            else:
                figure = "serve %s %s, concurrency %d (tritonclient %s, batches up to %d)" % (
                    a.arch, a.precision, row["concurrency"], LABELS[row["protocol"]], a.batch_size)
            cells.append({"figure": figure, "convnets": row["inferences_per_s"],
                          "peer": "convnets bench infer, batch %d" % a.batch_size, "peer_value": bench["images_per_s"],
                          "ratio": row["inferences_per_s"] / bench["images_per_s"], "unit": "img/s",
                          "command": command})
            cells.append({"figure": figure + ", p99 latency", "convnets": row["p99_ms"],
                          "peer": "convnets bench infer, batch 1", "peer_value": one["mean_ms"],
                          "ratio": row["p99_ms"] / one["mean_ms"], "unit": "ms", "command": command})
        # gRPC against HTTP at each concurrency, one server: issue 60's bar (>= 0.9x at 16).
        http_rows = {r["concurrency"]: r for r in result["load"] if r["protocol"] == "http"}
        for row in (r for r in result["load"] if r["protocol"] == "grpc" and r["concurrency"] in http_rows):
            peer = http_rows[row["concurrency"]]["inferences_per_s"]
            cells.append({"figure": "serve %s %s, concurrency %d, gRPC against HTTP" % (a.arch, a.precision,
                                                                                        row["concurrency"]),
                          "convnets": row["inferences_per_s"], "peer": "convnets serve over HTTP, same server",
                          "peer_value": peer, "ratio": row["inferences_per_s"] / peer, "unit": "img/s",
                          "command": command})
        compare.append_summary(a.summary, cells)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
