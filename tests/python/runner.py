"""`convnets` command lines for the tests, answered as subprocess.run answers them (a CompletedProcess, or
subprocess.TimeoutExpired), from children of one `convnets --fork-server` per test process instead of a fresh
process each: a fresh one spends about 0.3 s of CPU loading LibTorch before main(), and the suite runs several
hundred (src/cli/fork_server.h).

A child differs from a fresh process only in what libraries read while loading, so a call that changes those
variables (LD_*, MALLOC_*, OMP_*, ...) from the server's, a call from a second thread while the server is busy, and
every call when CONVNETS_TEST_FORK_SERVER=0 start a real process. Tests that signal, limit or watch a running
convnets use subprocess.Popen themselves.
"""
import atexit
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("CONVNETS_BIN", "")
# The interpreter for a test's own Python subprocesses (a tool, a peer script): the suite's zygote (pyzygote.py; CTest
# starts one and names its socket in CONVNETS_PYZYGOTE), which has torch imported already and starts the real
# interpreter itself where a fork cannot be the same. A test that signals or watches the process uses sys.executable.
PYTHON = ([sys.executable, "-I", "-S", os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyzygote_client.py"),
           os.environ["CONVNETS_PYZYGOTE"]] if os.environ.get("CONVNETS_PYZYGOTE") else [sys.executable])
LOAD_TIME = ("LD_", "MALLOC_", "OMP_", "GOMP_", "KMP_", "GLIBC_TUNABLES", "ASAN_", "LSAN_", "UBSAN_")


def _load_time(env):
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME)}


def _latin1(text):
    # The protocol's strings are bytes (arguments and paths need not be UTF-8), each byte one character.
    return os.fsencode(text).decode("latin-1")


def gone(pid):
    """Ended: no process, or a zombie its parent (init, for a zygote and its children's orphans) has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def end_server(proc, timeout=30):
    """A server child that reads its stdin to the end (the fork servers here): closes it, the server's signal to
    finish, and waits for it, killing it after `timeout` seconds; then closes its stdout."""
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.stdout.close()


class _Server:
    def __init__(self):
        self.env = dict(os.environ)
        self.tmp = tempfile.TemporaryDirectory(prefix="convnets-fork-server-")
        self.proc = subprocess.Popen([BIN, "--fork-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=self.env)
        self.pending = b""

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        end_server(self.proc)
        self.tmp.cleanup()

    def _line(self, deadline):
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"{BIN} --fork-server ended (exit {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, args, input, env, cwd, timeout):
        paths = {name: os.path.join(self.tmp.name, name) for name in ("stdin", "stdout", "stderr")}
        if input is None:
            paths["stdin"] = os.devnull
        else:
            with open(paths["stdin"], "wb") as f:
                f.write(input)
        request = dict(argv=[_latin1(a) for a in args], env={_latin1(k): _latin1(v) for k, v in env.items()},
                       cwd=_latin1(os.path.abspath(cwd or os.getcwd())), **{k: _latin1(v) for k, v in paths.items()})
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        started = self._line(None)
        if "error" in started:
            raise RuntimeError(f"{BIN} --fork-server: {started['error']}")
        done = self._line(deadline)
        timed_out = done is None
        if timed_out:
            os.kill(started["pid"], signal.SIGKILL)
            done = self._line(None)
        with open(paths["stdout"], "rb") as out, open(paths["stderr"], "rb") as err:
            return timed_out, done["returncode"], out.read(), err.read()


_server = None
_lock = threading.Lock()


def _stop():
    if _server is not None:
        _server.close()


atexit.register(_stop)


def _decode(data, errors):
    # What text=True gives: the locale's encoding, universal newlines.
    text = data.decode(locale.getpreferredencoding(False), errors or "strict")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def run(args, *, capture_output=True, input=None, env=None, cwd=None, timeout=None, text=False, errors=None):
    """subprocess.run(args, capture_output=True, ...) with the same keyword arguments and defaults."""
    global _server
    if not capture_output:
        raise ValueError("runner.run captures the output; use subprocess for a process that writes to the terminal")
    args = [os.fspath(a) if isinstance(a, (str, bytes, os.PathLike)) else str(a) for a in args]
    env = dict(os.environ if env is None else env)
    use_server = (args[0] == BIN and os.environ.get("CONVNETS_TEST_FORK_SERVER", "1") != "0"
                  and _lock.acquire(blocking=False))
    if use_server:
        try:
            if _server is None or not _server.alive():
                _server = _Server()
            if _load_time(env) == _load_time(_server.env):
                raw = input.encode() if isinstance(input, str) else input
                timed_out, code, out, err = _server.run(args, raw, env, cwd, timeout)
                if text or errors:
                    out, err = _decode(out, errors), _decode(err, errors)
                if timed_out:
                    raise subprocess.TimeoutExpired(args, timeout, output=out, stderr=err)
                return subprocess.CompletedProcess(args, code, out, err)
        finally:
            _lock.release()
    return subprocess.run(args, capture_output=True, input=input, env=env, cwd=cwd, timeout=timeout, text=text,
                          errors=errors)
