"""An interpreter with torch and torchvision already imported, answering `python ARGS` from forked children: for a
test that runs a script which starts Python many times (scripts/gpu.sh's dry run starts about a dozen PyTorch
peers and probes, each spending 3-4 s of CPU importing torch and torchvision before its first line).

    with Zygote(directory) as z:        # z.python: an executable to give the script as its interpreter
        subprocess.run([z.python, "-c", "import torch; print(torch.__version__)"])

z.python is a small client (Python in isolated mode, no site: about 20 ms) that passes its arguments, working
directory, environment and standard streams to the server over a Unix socket; the server forks, the child runs
`-c CODE`, `-m MODULE` or `SCRIPT` as the interpreter would (sys.argv, sys.path[0], PYTHONPATH), and the client
exits with the child's status (a signal as 128 + its number, as a shell reports it). Other interpreter options,
and variables read only while libraries load (LD_*, OMP_*, ...), which a forked child cannot honour, make the
client run the real interpreter instead, except those the caller names in `ignore` (it accepts losing them: gpu.sh
preloads a crash handler into every step, which a dry run does without). A client killed (a step's timeout) takes
its child with it.
"""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile

from runner import LOAD_TIME as LIBRARY_LOAD_TIME, end_server

# What libraries read while they load (runner.py's list, convnets' fork server has the same limit), and what the
# interpreter itself reads only at its start.
LOAD_TIME = LIBRARY_LOAD_TIME + ("MKL_", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONDONTWRITEBYTECODE",
                                 "PYTHONHASHSEED")

# The client: its interpreter's own startup is all it costs. The real interpreter and the socket are filled in.
CLIENT = r'''#!%(python)s -IS
import json, os, socket, sys
REAL, SOCKET, ENV0, IGNORE = %(python)r, %(socket)r, %(env0)r, %(ignore)r
LOAD_TIME = %(load_time)r
args = sys.argv[1:]
def same(k):
    return os.environ.get(k) == ENV0.get(k)
plain = args and (args[0] in ("-c", "-m") and len(args) > 1 or not args[0].startswith("-"))
if not plain or not all(same(k) for k in set(os.environ) | set(ENV0) if k.startswith(LOAD_TIME) and k not in IGNORE):
    os.execv(REAL, [REAL] + args)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(SOCKET)
except OSError:
    os.execv(REAL, [REAL] + args)
request = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
socket.send_fds(s, [len(request).to_bytes(8, "little") + request], [0, 1, 2])
status = b""
while len(status) < 4:
    chunk = s.recv(4 - len(status))
    if not chunk:
        sys.stderr.write("pyzygote: the server went away\n")
        sys.exit(1)
    status += chunk
sys.exit(int.from_bytes(status, "little", signed=True))
'''


def _run_child(request):
    """In the forked child: become `python ARGV` and never return."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        import runpy
        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[:0] = [""] + extra
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path[:0] = [os.getcwd()] + extra
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[:0] = [os.path.dirname(os.path.realpath(argv[0]))] + extra  # as CPython: the link followed
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
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def _supervise(conn):
    """In a child of the server: receive one request, fork its worker, report how it ended, exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's SIG_IGN would reap the worker before waitpid
    header, fds, _, _ = socket.recv_fds(conn, 8 + 65536, 3)
    size = int.from_bytes(header[:8], "little")
    data = header[8:]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    request = json.loads(data)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _run_child(request)
    for fd in fds:
        os.close(fd)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        # The client gone (killed by a timeout, say): so is its child.
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1, socket.MSG_PEEK):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os._exit(0)
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code
    try:
        conn.sendall(code.to_bytes(4, "little", signed=True))
    except OSError:
        pass
    os._exit(0)


def serve(path, modules):
    for m in modules:
        __import__(m)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([server, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return  # the test closed our stdin: done
        if server in readable:
            conn, _ = server.accept()
            sys.stdout.flush()
            if os.fork() == 0:
                server.close()
                _supervise(conn)
            conn.close()


class Zygote:
    """The server, started with `modules` imported, and the client `python` in `directory`; `ignore`: load-time
    variables whose difference from this process's the caller accepts."""

    def __init__(self, directory, modules=("torch", "torchvision"), ignore=()):
        self.socket = os.path.join(tempfile.mkdtemp(prefix="pyzygote-"), "s")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.socket, *modules],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.proc.kill()
            raise RuntimeError("pyzygote: the server did not start (%r)" % line)
        env0 = {k: v for k, v in os.environ.items() if k.startswith(LOAD_TIME)}
        self.python = os.path.join(directory, "python")
        with open(self.python, "w") as f:
            f.write(CLIENT % {"python": sys.executable, "socket": self.socket, "env0": env0, "load_time": LOAD_TIME,
                             "ignore": tuple(ignore)})
        os.chmod(self.python, 0o755)

    def close(self):
        end_server(self.proc)
        try:
            os.remove(self.socket)
            os.rmdir(os.path.dirname(self.socket))
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
