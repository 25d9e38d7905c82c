"""An interpreter with torch and torchvision already imported, answering `python ARGS` from forked children: for the
test modules CTest runs (each would spend 2.5-5 s of CPU importing torch and torchvision before its first test) and
for a test that runs a script which starts Python many times (scripts/gpu.sh's dry run starts about a dozen PyTorch
peers and probes).

    with Zygote(directory) as z:        # z.python: an executable to give the script as its interpreter
        subprocess.run([z.python, "-c", "import torch; print(torch.__version__)"])

    pyzygote.py start SOCKET MODULES... [--log FILE]   a detached zygote for CTest's Python tests (a fixture)
    pyzygote.py stop SOCKET                            ends it
    PYTHON -I -S pyzygote_client.py SOCKET ARGS...     `PYTHON ARGS...`, forked from the zygote at SOCKET if any

The client (pyzygote_client.py) passes its arguments, working directory, environment and standard streams to the
server over a Unix socket; the server forks, the child runs `-c CODE`, `-m MODULE` or `SCRIPT` as the interpreter
would (sys.argv, sys.path, PYTHONPATH) and ends as it would (threads joined, atexit), and the client exits with the
child's status (a signal as 128 + its number, as a shell reports it). The server tells the client to run the real
interpreter instead when the client's load-time variables (LD_*, OMP_*, ...: read while libraries load, which a
fork has already done) differ from its own, except those it was told to ignore (gpu.sh preloads a crash handler
into every step, which a dry run does without). A client killed (a step's or CTest's timeout) takes its child, and
the processes of the child's group, with it. A client that loses the zygote before its child starts runs the real
interpreter. A detached zygote ends when stopped, when another takes over its socket path, or after `idle` seconds
without a request; one that cannot start leaves each test to start the real interpreter.
"""
import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

from runner import LOAD_TIME as LIBRARY_LOAD_TIME, end_server

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "pyzygote_client.py")
FRESH = -(2 ** 31)  # "run it yourself"; keep in step with pyzygote_client.py
STARTED = FRESH + 1  # "your child runs": before it, a client that loses the zygote may still run it itself

# What libraries read while they load (runner.py's list, convnets' fork server has the same limit), and what the
# interpreter itself reads only at its start: every PYTHON* variable (PYTHONUNBUFFERED, PYTHONWARNINGS,
# PYTHONHASHSEED, ...) but PYTHONPATH, which the child applies; torch's logging settings; the locale (stdio's
# encoding).
LOAD_TIME = LIBRARY_LOAD_TIME + ("MKL_", "PYTHON", "TORCH_", "PYTORCH_", "LC_", "LANG")


def _load_time(env, ignore):
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME) and k != "PYTHONPATH" and k not in ignore}


def _interpreter_path():
    """sys.path as a fresh interpreter has it after its first entry and PYTHONPATH's: the standard library and
    site-packages (with their .pth files), not this script's folder or this server's PYTHONPATH."""
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in own]


def _run_child(request, base_path, own_modules):
    """In the forked child: become `python ARGV`, then end as that interpreter ends; never returns."""
    code = 1
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # The server's own modules (runner.py read CONVNETS_BIN when the server imported it): imported afresh.
        for name in own_modules:
            sys.modules.pop(name, None)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        import runpy
        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[:] = [""] + extra + base_path
            import types
            main = sys.modules["__main__"] = types.ModuleType("__main__")  # as the interpreter's: importable, picklable
            main.__builtins__ = __builtins__
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path[:] = [os.getcwd()] + extra + base_path
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.realpath(argv[0]))] + extra + base_path  # the link followed
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            sys.stderr.write(str(e.code) + "\n")
            code = 1
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    # The interpreter's own end, up to the C level: non-daemon threads joined, then the atexit handlers (temporary
    # folders, loggers), as Py_FinalizeEx begins. Not its C-level teardown: a library's static destructors may wait
    # for a thread the server had before the fork (onnxruntime starts one on import), which the child lacks.
    try:
        import atexit
        import threading
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        try:
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                stream.flush()
        finally:
            os._exit(code & 0xFF)


def _supervise(conn, server, own_env, ignore, base_path, own_modules):
    """In a child of the server: receive one request, fork its worker, report how it ended, exit."""
    for sig in (signal.SIGCHLD, signal.SIGTERM):  # SIG_IGN'd SIGCHLD would reap the worker before waitpid
        signal.signal(sig, signal.SIG_DFL)
    header, fds, _, _ = socket.recv_fds(conn, 8 + 65536, 3)
    size = int.from_bytes(header[:8], "little")
    data = header[8:]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    request = json.loads(data)
    if request.get("stop"):
        if os.getppid() == server:  # not whoever adopted us if the server has gone already
            os.kill(server, signal.SIGTERM)
        os._exit(0)
    if _load_time(request["env"], ignore) != _load_time(own_env, ignore):
        for fd in fds:
            os.close(fd)
        conn.sendall(FRESH.to_bytes(4, "little", signed=True))
        os._exit(0)
    try:
        conn.sendall(STARTED.to_bytes(4, "little", signed=True))
    except OSError:
        os._exit(0)  # the client is gone already
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        # A group of its own, so that a client killed (a timeout) takes the test's own children with it too, as
        # CTest's kill would with a real interpreter's.
        os.setpgid(0, 0)
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _run_child(request, base_path, own_modules)
    try:
        os.setpgid(pid, pid)  # whichever of the two runs first
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        # The client gone (killed by a timeout, say): so is its child.
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1, socket.MSG_PEEK):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            os._exit(0)
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code
    try:
        conn.sendall(code.to_bytes(4, "little", signed=True))
    except OSError:
        pass
    os._exit(0)


class _Stop(Exception):
    pass


def serve(path, modules, ignore=(), idle=None, until_stdin_closes=False, quiet=False):
    """Import `modules`, listen at `path`, print "ready", and fork a supervisor per request until stopped (SIGTERM or
    a stop request), stdin closed (until_stdin_closes), the path taken by another server, or `idle` seconds without
    a request. quiet: stdout to /dev/null once ready (a detached zygote's starter reads that line and goes). Returns
    in the server only."""
    for m in modules:
        __import__(m)
    base_path = _interpreter_path()
    own_env = dict(os.environ)
    own_modules = [name for name, module in sys.modules.items() if name != "__main__"
                   and os.path.dirname(os.path.abspath(getattr(module, "__file__", None) or "/")) == HERE]
    me = os.getpid()

    def on_sigterm(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: not again in the clean-up
        raise _Stop()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    signal.signal(signal.SIGTERM, on_sigterm)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    inode = os.stat(path).st_ino
    print("ready", flush=True)
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    last = time.monotonic()
    watch = [server, sys.stdin] if until_stdin_closes else [server]
    try:
        while True:
            readable, _, _ = select.select(watch, [], [], 1.0)  # a tick: idle and take-over checks
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
                return  # the test closed our stdin: done
            if server in readable:
                conn, _ = server.accept()
                last = time.monotonic()
                sys.stdout.flush()
                if os.fork() == 0:
                    supervisor = os.getpid()
                    try:
                        signal.signal(signal.SIGTERM, signal.SIG_DFL)
                        server.close()
                        _supervise(conn, me, own_env, ignore, base_path, own_modules)
                    finally:
                        if os.getpid() == supervisor:
                            os._exit(0)  # never back into the server's loop
                conn.close()
            elif idle is not None and time.monotonic() - last > idle:
                return
            try:
                if os.stat(path).st_ino != inode:
                    return  # another server has this path now
            except FileNotFoundError:
                return
    except _Stop:
        pass
    finally:
        if os.getpid() == me:  # not in a worker on its way out
            server.close()
            try:
                if os.stat(path).st_ino == inode:
                    os.remove(path)
            except FileNotFoundError:
                pass


def stop(path, timeout=30):
    """Ends the detached zygote at `path`; False when none answered."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        request = json.dumps({"stop": True}).encode()
        socket.send_fds(s, [len(request).to_bytes(8, "little") + request], [])
    except OSError:
        return False
    finally:
        s.close()
    deadline = time.monotonic() + timeout
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def start(path, modules, log, idle):
    """(Re)starts the zygote at `path`, detached (its own session, no stream of the caller's), once it answers."""
    if len(os.fsencode(path)) >= 108:  # sun_path's size on Linux
        print("pyzygote: %s is too long for a Unix socket; each test starts its own interpreter" % path)
        return
    stop(path)
    if os.path.exists(path):
        os.remove(path)
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", path, *modules, "--idle",
                                 str(idle), "--quiet"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True)
    line = proc.stdout.readline()
    proc.stdout.close()
    if line.strip() != b"ready":
        proc.kill()
        proc.wait()
        # Not a failed fixture, which would keep every Python test from running: they start real interpreters.
        print("pyzygote: the zygote at %s did not start (%s says why); each test starts its own interpreter"
              % (path, log))
        return
    print("pyzygote: a zygote with %s at %s (pid %d)" % (", ".join(modules) or "no module", path, proc.pid))


class Zygote:
    """The server, started with `modules` imported, and the client `python` in `directory`; `ignore`: load-time
    variables whose difference from this process's the caller accepts."""

    def __init__(self, directory, modules=("torch", "torchvision"), ignore=()):
        self.socket = os.path.join(tempfile.mkdtemp(prefix="pyzygote-"), "s")
        ignored = [a for name in ignore for a in ("--ignore", name)]
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", self.socket, *modules,
                                      "--until-stdin-closes", *ignored],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.proc.kill()
            raise RuntimeError("pyzygote: the server did not start (%r)" % line)
        self.python = os.path.join(directory, "python")
        with open(self.python, "w") as f:
            f.write('#!/bin/sh\nexec "%s" -I -S "%s" "%s" "$@"\n' % (sys.executable, CLIENT, self.socket))
        os.chmod(self.python, 0o755)

    def close(self):
        end_server(self.proc)
        try:
            os.rmdir(os.path.dirname(self.socket))
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("socket")
    s.add_argument("modules", nargs="*")
    s.add_argument("--ignore", action="append", default=[])
    s.add_argument("--idle", type=float)
    s.add_argument("--until-stdin-closes", action="store_true")
    s.add_argument("--quiet", action="store_true", help="stdout to /dev/null once ready (a detached zygote)")
    s = sub.add_parser("start")
    s.add_argument("socket")
    s.add_argument("modules", nargs="*")
    s.add_argument("--log", default=os.devnull)
    s.add_argument("--idle", type=float, default=900)
    s = sub.add_parser("stop")
    s.add_argument("socket")
    a = p.parse_args()
    if a.command == "serve":
        serve(a.socket, a.modules, ignore=tuple(a.ignore), idle=a.idle, until_stdin_closes=a.until_stdin_closes,
              quiet=a.quiet)
    elif a.command == "start":
        start(a.socket, a.modules, a.log, a.idle)
    else:
        print(("stopped the zygote at %s" if stop(a.socket) else "no zygote answered at %s") % a.socket)


if __name__ == "__main__":
    main()
