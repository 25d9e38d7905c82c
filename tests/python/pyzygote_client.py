"""The client end of pyzygote.py: `PYTHON -I -S pyzygote_client.py SOCKET ARGS...` behaves as `PYTHON ARGS...`.

It passes its arguments, working directory, environment and standard streams to the zygote at SOCKET and exits with
the status of the child that ran them (a signal as 128 + its number, as a shell reports it). It runs the real
interpreter itself, in place, when a fork could not be the same process: options other than -c, -m or a script,
no zygote answering, or the zygote's answer that the load-time variables differ (pyzygote.py says which). The
standard library only, and isolated mode: its own start costs about 20 ms.
"""
import json
import os
import socket
import sys

FRESH = -(2 ** 31)  # the zygote's answer "run it yourself"; keep in step with pyzygote.py
# Otherwise its first answer is STARTED (FRESH + 1: the child runs), then the child's status.


def fresh(args):
    os.execv(sys.executable, [sys.executable] + args)


def main():
    path, args = sys.argv[1], sys.argv[2:]
    plain = args and ((args[0] in ("-c", "-m") and len(args) > 1) or not args[0].startswith("-"))
    if not plain:
        fresh(args)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        fresh(args)
    request = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    try:
        socket.send_fds(s, [len(request).to_bytes(8, "little") + request], [0, 1, 2])
    except OSError:
        fresh(args)  # a zygote that stopped between connect and send: nothing has run yet
    first = read_int(s)
    if first is None or first == FRESH:  # the zygote ended before it forked (stopped, idle), or cannot serve
        s.close()
        fresh(args)
    code = read_int(s)
    if code is None:
        sys.stderr.write("pyzygote: the zygote at %s went away\n" % path)
        sys.exit(1)
    sys.exit(code)


def read_int(s):
    data = b""
    while len(data) < 4:
        try:
            chunk = s.recv(4 - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return int.from_bytes(data, "little", signed=True)


if __name__ == "__main__":
    main()
