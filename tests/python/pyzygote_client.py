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
    status = b""
    while len(status) < 4:
        chunk = s.recv(4 - len(status))
        if not chunk:
            sys.stderr.write("pyzygote: the zygote at %s went away\n" % path)
            sys.exit(1)
        status += chunk
    code = int.from_bytes(status, "little", signed=True)
    if code == FRESH:
        s.close()
        fresh(args)
    sys.exit(code)


if __name__ == "__main__":
    main()
