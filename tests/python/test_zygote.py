"""The GoogleTest cases' zygote (tests/zygote.h): a case run through tests/zygote_client in a child of
`unit_tests --zygote` must give what the executable run fresh gives (exit status, crash signal, output, working
directory, environment, standard input), and fall back to a fresh process where a fork cannot be the same: the
executable rebuilt since the zygote started, other load-time variables, no zygote at all. A client CTest kills
(its timeout) takes its case with it.

The probe is unit_tests' DISABLED_ZygoteProbe case (tests/test_zygote.cpp), which only a run naming it runs.
"""
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

from runner import gone

BUILD = os.environ["CONVNETS_BUILD_DIR"]
UNIT = os.path.join(BUILD, "tests", "unit_tests")
CLIENT = os.path.join(BUILD, "tests", "zygote_client")
PROBE = ["--gtest_filter=DISABLED_ZygoteProbe.*", "--gtest_also_run_disabled_tests"]


def probe_env(what, **extra):
    # The zygote is started with OMP_NUM_THREADS=1, as CTest's cases are.
    return {**os.environ, "OMP_NUM_THREADS": "1", "CONVNETS_ZYGOTE_PROBE": what, **extra}


def probe_line(out):
    m = re.search(r"probe pid=(\d+) ppid=(\d+) cwd=(.*) stdin=(.*) mark=(.*)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)), m.group(3), m.group(4), m.group(5)


def read_text(path):
    with open(path) as f:
        return f.read()


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[:-1]


class Zygote(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="zyg-")
        self.addCleanup(self.tmp.cleanup)
        self.exe = os.path.join(self.tmp.name, "unit_tests")
        shutil.copy2(UNIT, self.exe)
        self.socket = os.path.join(self.tmp.name, "s")
        self.start()
        self.addCleanup(self.stop)

    def start(self):
        r = subprocess.run([CLIENT, "--start", self.socket, self.exe], capture_output=True, text=True,
                           env=probe_env("none"), timeout=90)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("zygote for", r.stdout)

    def stop(self):
        subprocess.run([CLIENT, "--stop", self.socket], capture_output=True, timeout=30)

    def run_probe(self, what, via_zygote=True, input="line one\n", **env):
        args = ([CLIENT, self.socket] if via_zygote else []) + [self.exe, *PROBE]
        return subprocess.run(args, capture_output=True, text=True, input=input, cwd=self.tmp.name,
                              env=probe_env(what, **env), timeout=60)

    def zygote_pid(self):
        want = [self.exe.encode(), b"--zygote", self.socket.encode()]
        pids = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and cmdline(entry) == want and not gone(entry):
                    pids.append(int(entry))
            except OSError:
                pass  # a process that ended while listed
        self.assertEqual(len(pids), 1, pids)
        return pids[0]

    def test_a_case_ends_as_a_fresh_process_of_it_ends(self):
        server = self.zygote_pid()
        for what, code, verdict in [("pass", 0, "[  PASSED  ] 1 test."), ("fail", 1, "[  FAILED  ] 1 test"),
                                    ("abort", -signal.SIGABRT, None)]:
            fresh = self.run_probe(what, via_zygote=False, CONVNETS_ZYGOTE_MARK=what)
            forked = self.run_probe(what, CONVNETS_ZYGOTE_MARK=what)
            with self.subTest(what=what):
                self.assertEqual(fresh.returncode, code, fresh.stdout + fresh.stderr)
                self.assertEqual(forked.returncode, code, forked.stdout + forked.stderr)
                if verdict:
                    self.assertIn(verdict, fresh.stdout)
                    self.assertIn(verdict, forked.stdout)
                _, fresh_parent, *fresh_seen = probe_line(fresh.stdout)
                _, parent, *seen = probe_line(forked.stdout)
                self.assertEqual(fresh_parent, os.getpid())
                self.assertEqual(parent, server, "the case did not run in a child of the zygote")
                # Working directory, standard input and environment are the client's, not the zygote's.
                self.assertEqual(seen, fresh_seen)
                self.assertEqual(seen, [os.path.realpath(self.tmp.name), "line one", what])
                self.assertEqual(forked.stderr, "")
        # A client naming another executable gets that executable, not the zygote's code under its name.
        r = subprocess.run([CLIENT, self.socket, "/bin/sh", "-c", "echo other; exit 3"], capture_output=True,
                           text=True, env=probe_env("pass"), timeout=30)
        self.assertEqual((r.returncode, r.stdout), (3, "other\n"))
        self.assertIn("is not the file the zygote loaded", r.stderr)

    def test_a_client_that_goes_away_takes_its_case_with_it(self):
        pid_file = os.path.join(self.tmp.name, "pid")
        client = subprocess.Popen([CLIENT, self.socket, self.exe, *PROBE], stdout=subprocess.DEVNULL,
                                  stdin=subprocess.DEVNULL, env=probe_env("sleep", CONVNETS_ZYGOTE_PID_FILE=pid_file))
        deadline = time.monotonic() + 30
        while not os.path.exists(pid_file) or not read_text(pid_file).endswith("\n"):
            self.assertLess(time.monotonic(), deadline, "the probe never started")
            time.sleep(0.05)
        with open(pid_file) as f:
            case = int(f.read())
        self.assertFalse(gone(case))
        client.kill()
        client.wait()
        deadline = time.monotonic() + 5
        while not gone(case):
            self.assertLess(time.monotonic(), deadline, "the case outlived its client")
            time.sleep(0.05)
        # And the zygote goes on serving.
        self.assertEqual(self.run_probe("pass").returncode, 0)

    def test_a_rebuilt_executable_or_other_load_time_variables_run_fresh(self):
        server = self.zygote_pid()
        r = self.run_probe("pass", OMP_NUM_THREADS="2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("load-time variables", r.stderr)
        self.assertEqual(probe_line(r.stdout)[1], os.getpid())  # the client became the executable

        # A rebuild replaces the file (the linker writes a new one): the zygote's code is no longer the file's.
        replacement = self.exe + ".new"
        shutil.copy2(UNIT, replacement)
        os.replace(replacement, self.exe)
        r = self.run_probe("fail")
        self.assertEqual(r.returncode, 1)
        self.assertIn("rebuilt since the zygote started", r.stderr)
        self.assertEqual(probe_line(r.stdout)[1], os.getpid())
        self.assertFalse(gone(server))

    def test_requests_that_declare_more_than_they_hold_are_refused_and_the_zygote_goes_on(self):
        server = self.zygote_pid()
        magic, run = 0x7a79676f, 1  # tests/zygote_protocol.h
        # (argc, envc, length, body): 2^32-1 arguments in 2 bytes, a 4 GiB blob, an argument without its NUL.
        for argc, envc, length, body in [(0xFFFFFFFF, 0, 2, b"a\0"), (1, 0, 0xFFFFFFFF, b""), (1, 0, 3, b"abc")]:
            with self.subTest(argc=argc, length=length), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(30)
                sock.connect(self.socket)
                socket.send_fds(sock, [struct.pack("=5I", magic, run, argc, envc, length)], [0, 1, 2])
                try:
                    if body:
                        sock.sendall(body)
                    sock.shutdown(socket.SHUT_WR)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused from the header alone: the zygote answered and closed before the rest

                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
                self.assertEqual(reply, b"Fmalformed request")
        self.assertFalse(gone(server))
        self.assertEqual(probe_line(self.run_probe("pass").stdout)[1], server)

    def test_stop_ends_the_zygote_and_cases_then_run_fresh(self):
        server = self.zygote_pid()
        r = subprocess.run([CLIENT, "--stop", self.socket], capture_output=True, text=True, timeout=30)
        self.assertIn("stopped the zygote", r.stdout)
        deadline = time.monotonic() + 10
        while not gone(server):
            self.assertLess(time.monotonic(), deadline, "the zygote did not stop")
            time.sleep(0.05)
        self.assertFalse(os.path.exists(self.socket))
        r = self.run_probe("pass")
        self.assertEqual(r.returncode, 0)
        self.assertEqual(r.stderr, "")
        self.assertEqual(probe_line(r.stdout)[1], os.getpid())


if __name__ == "__main__":
    unittest.main()
