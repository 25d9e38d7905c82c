"""scripts/gpu.sh, rehearsed without a GPU (issue 43): `run --dry` goes through every stage's shell logic, data
generation and peer scripts on the CPU at a tiny size, so a change that breaks the GPU machine's script fails here
rather than in its one rare hour; a failing step is a FAIL line and a non-zero exit, never a quiet pass.

Run by CTest with CONVNETS_SOURCE_DIR and CONVNETS_BUILD_DIR (this build: its convnets, unit_tests, data_tests and
Python module) set; the interpreter running this file is the one the script is given, through a zygote for the
whole dry run (pyzygote.py: its dozen PyTorch peers and probes would spend about 45 s importing torch and
torchvision). The failure cases use the interpreter itself.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

from pyzygote import Zygote
from runner import gone

SOURCE = os.environ["CONVNETS_SOURCE_DIR"]
BUILD = os.environ["CONVNETS_BUILD_DIR"]
SCRIPT = os.path.join(SOURCE, "scripts", "gpu.sh")
HERE = os.path.dirname(os.path.abspath(__file__))
STAGES = ["build", "tests", "data", "python", "train", "infer"]
# A positive number as the tables print them (1234.5, 0.97x): not "." or "0", which `[0-9.]+` would also take.
NUMBER = r"(?:[1-9][0-9]*(?:\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)"


def table_rows(text, first_cell):
    """The cells of every markdown table row of `text` whose first cell is `first_cell`, as strings."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.strip().startswith("|") and cells and cells[0] == first_cell:
            rows.append(cells)
    return rows


def gtest_names(suite):
    """The names of the TEST(suite, NAME) cases tests/*.cpp declare."""
    names = []
    for name in sorted(os.listdir(os.path.join(SOURCE, "tests"))):
        if name.endswith(".cpp"):
            with open(os.path.join(SOURCE, "tests", name)) as f:
                names += re.findall(r"^TEST\(%s, (\w+)\)" % suite, f.read(), re.MULTILINE)
    return names


def gtest_count(suite):
    return len(gtest_names(suite))


def gpu_sh(out, *args, python=sys.executable, timeout=540):
    env = dict(os.environ, OUT=out, CONVNETS_BUILD=BUILD, CONVNETS_PYTHON=python)
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout, env=env)


ZYGOTE = ZYGOTE_DIR = None


def setUpModule():
    # One interpreter with torch and torchvision loaded for the module's gpu.sh runs (the dry run and the failure
    # cases). gpu.sh preloads its crash handler into every step; a forked peer goes without (the failure cases
    # check the handler on a real process).
    global ZYGOTE, ZYGOTE_DIR
    ZYGOTE_DIR = tempfile.TemporaryDirectory(prefix="gpu-dry-python-")
    ZYGOTE = Zygote(ZYGOTE_DIR.name, ignore=("LD_PRELOAD",))


def tearDownModule():
    ZYGOTE.close()
    ZYGOTE_DIR.cleanup()


def summary(out):
    with open(os.path.join(out, "summary.txt")) as f:
        return f.read()


class DryCall(unittest.TestCase):
    """One dry `gpu.sh run` of STAGES (as one device call would run them), shared by the class's tests."""
    STAGES = ()

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="gpu-dry-")
        cls.out = cls.tmp.name
        cls.result = gpu_sh(cls.out, "run", "--dry", *cls.STAGES, python=ZYGOTE.python)
        cls.text = summary(cls.out) if os.path.exists(os.path.join(cls.out, "summary.txt")) else ""

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assert_passed(self):
        r = self.result
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        self.assertNotIn("FAIL", self.text)


class DryRun(DryCall):
    STAGES = ("all",)

    def test_every_stage_passes_on_the_cpu(self):
        self.assert_passed()
        for stage in STAGES:
            self.assertRegex(self.text, r"== stage %s: 0 failed, \d+ s" % stage)
        m = re.search(r"== gpu\.sh run build tests data train infer python: (\d+) passed, 0 failed", self.text)
        self.assertTrue(m, self.text[-2000:])
        self.assertEqual(int(m.group(1)), self.text.count("\nPASS "))

    def test_each_measurement_ran_with_convnets_and_its_peer(self):
        # Named by what ran: the dry run's fp32, never the GPU's amp, bf16 or tf32.
        for step in ["build/version", "tests/gpu-cases", "tests/unit-tests", "data/device-decode",
                     "data/loader-cpu", "data/loader-gpu", "data/train-from-files", "python/loader-cuda",
                     "python/train-pytorch-example-fp32-convnets", "python/train-pytorch-example-fp32-synthetic",
                     "python/train-pytorch-example-fp32-torchvision", "python/compare-example-fp32",
                     "train/convnets-train-fp32", "train/eager-train-fp32",
                     "train/compile-train-fp32", "train/compare-train-fp32", "train/one-process-nccl",
                     "infer/convnets-infer-fp32", "infer/eager-infer-fp32", "infer/compare-infer-fp32",
                     "infer/convnets-infer-folded", "infer/convnets-gpunet-0", "infer/eager-gpunet-0",
                     "infer/convnets-gpunet-d1", "infer/eager-gpunet-d1"]:
            self.assertRegex(self.text, r"\nPASS %s \(\d+ s\)" % re.escape(step))
        for line in self.text.splitlines():
            if line.startswith("PASS "):
                self.assertNotRegex(line.split()[1], r"(?:^|[-/])(?:amp|bf16|tf32)(?:$|-)",
                                    "a dry-run step named for what it did not run")
        self.assertRegex(self.text, r"\nGPU  train/\{convnets,eager,compare\}-train-\{bf16,tf32\}: ")
        # The JPEG set is made once per build folder (on the GPU machine: once per warm machine).
        self.assertRegex(self.text, r"\n(PASS data/make-jpegs \(\d+ s\)|"
                                    r"REUSE data/make-jpegs: .*imagenet_like, made by an earlier call)\n")
        # The comparison tables hold a row per batch size, convnets' and the peers' figures side by side, every
        # figure a positive number.
        train = table_rows(self.text, "2")  # train: convnets, eager, compile, and the two ratios
        self.assertTrue(any(len(r) == 6 and all(re.fullmatch(NUMBER + "x?", c) for c in r[1:]) for r in train), train)
        infer = table_rows(self.text, "1")  # infer batch 1: img/s, eager's, ratio, then the latencies and theirs
        self.assertTrue(any(len(r) == 7 and all(re.fullmatch(NUMBER + "x?", c) for c in r[1:]) for r in infer), infer)

    def test_every_cell_lands_in_summary_json(self):
        with open(os.path.join(self.out, "summary.json")) as f:
            cells = json.load(f)
        keys = {"figure", "convnets", "peer", "peer_value", "ratio", "unit", "command"}
        self.assertTrue(cells)
        for c in cells:
            self.assertEqual(set(c), keys, c)
            self.assertGreater(c["convnets"], 0, c)
            self.assertGreater(c["peer_value"], 0, c)
            self.assertAlmostEqual(c["ratio"], c["convnets"] / c["peer_value"], places=9)
            self.assertIn(c["unit"], ("img/s", "ms"))
            self.assertRegex(c["command"], r"^(convnets bench |python3 examples/train_pytorch\.py )")
            self.assertNotIn("/gpu-work/", c["command"], "files by name, not by one machine's folders")
        peers = {(c["figure"], c["peer"]) for c in cells}
        self.assertIn(("train resnet18 fp32, batch 2", "pytorch-eager"), peers)
        self.assertIn(("train resnet18 fp32, batch 2", "pytorch-compile"), peers)
        self.assertIn(("infer resnet18 fp32, batch 1, latency", "pytorch-eager"), peers)
        self.assertIn(("infer resnet18 fp32, batch 2, BN folded", "pytorch-eager"), peers)
        self.assertIn(("examples/train_pytorch.py resnet18 fp32, batch 2, convnets.data.Loader",
                       "the same loop on torchvision's DataLoader"), peers)

    def test_the_steps_only_a_gpu_runs_are_named_not_run(self):
        gpu_lines = [line for line in self.text.splitlines() if line.startswith("GPU  ")]
        named = {line.split(":")[0][5:] for line in gpu_lines}
        self.assertTrue({"build/configure", "tests/ran-not-skipped", "data/ran-not-skipped",
                         "python/ran-not-skipped", "data/train-from-files"} <= named, gpu_lines)
        configure = next(line for line in gpu_lines if line.startswith("GPU  build/configure"))
        self.assertIn("-DTORCH_CUDA_ARCH_LIST=9.0", configure)
        # On the CPU every CUDA case skips (that is the dry run's point; on the GPU a skip is a FAIL: RanOnGpu).
        m = re.search(r"\nPASS tests/gpu-cases \(\d+ s\)\n(?:    .*\n)*?    \[  SKIPPED \] (\d+) tests?, listed below",
                      self.text)
        self.assertTrue(m, self.text[:3000])
        self.assertEqual(int(m.group(1)), gtest_count("Gpu"))

    def test_what_comes_back_fits_the_device_tools_limits(self):
        files = sorted(os.listdir(self.out))
        self.assertEqual(files, sorted(["summary.txt", "summary.json"] + ["%s.tar.gz" % s for s in STAGES]))
        self.assertLessEqual(len(files), 8)  # the device tool returns at most 8 files from $OUT
        with tarfile.open(os.path.join(self.out, "train.tar.gz")) as t:
            names = {os.path.basename(n) for n in t.getnames()}
        self.assertTrue({"convnets-train-fp32.json", "eager-train-fp32.json", "compile-train-fp32.json",
                         "convnets-train-fp32.log", "one-process-nccl.log"} <= names, names)


class FusedStage(DryCall):
    """Issue 67's stage, a call of its own on the GPU (`run build fused`): the tuned step (its first run writing the
    tuning cache, its second reading it) against itself on each family forced and PyTorch's eager and compiled steps,
    each profiled per kernel family, then the JPEG rows."""
    STAGES = ("fused",)

    def test_each_step_ran_and_its_table_holds_every_peer(self):
        self.assert_passed()
        for step in ["fused/fused-numerics", "fused/convnets-fp32", "fused/convnets-fp32-cached",
                     "fused/convnets-fp32-fusion-bn", "fused/convnets-fp32-fusion-none",
                     "fused/convnets-fp32-eager-step", "fused/eager-fp32", "fused/compile-eager-default-fp32",
                     "fused/compare-fp32", "fused/profile-fp32", "fused/train-from-imagenet_like",
                     "fused/train-from-imagenet_like_x4"]:
            self.assertRegex(self.text, r"\nPASS %s \(\d+ s\)" % re.escape(step))
        self.assertRegex(self.text, r"\nGPU  fused/ran-not-skipped: .*gpu\.sh _ran_on_gpu .*fused-numerics\.log gtest\n")
        m = re.search(r"\[  SKIPPED \] (\d+) tests?, listed below", self.text)
        self.assertTrue(m)
        self.assertEqual(int(m.group(1)), len([n for n in gtest_names("Gpu")
                                               if n.startswith(("Fused", "NormConv", "BnStats"))]))
        # convnets tuned, then itself with --fusion bn and none, eager and compiled: img/s and the four ratios, all
        # positive.
        rows = table_rows(self.text, "2")
        self.assertTrue(any(len(r) == 10 and all(re.fullmatch(NUMBER + "x?", c) for c in r[1:]) for r in rows), rows)
        self.assertIn("| family | convnets ms | % | convnets --fusion none ms | % | convnets eager step ms | % | "
                      "pytorch eager ms | % |", self.text)
        with open(os.path.join(self.out, "summary.json")) as f:
            peers = {c["peer"] for c in json.load(f)}
        self.assertEqual(peers, {"convnets --fusion bn", "convnets --fusion none", "pytorch-eager", "pytorch-compile"})
        self.assertEqual(sorted(os.listdir(self.out)), ["build.tar.gz", "fused.tar.gz", "summary.json", "summary.txt"])
        with tarfile.open(os.path.join(self.out, "fused.tar.gz")) as t:
            names = {os.path.basename(n) for n in t.getnames()}
            first = json.load(t.extractfile(next(n for n in t.getnames() if n.endswith("/convnets-fp32.json"))))
        self.assertTrue({"convnets-fp32.trace.json", "eager-fp32.trace.json", "profile-fp32.json",
                         "convnets-fp32-cached.json", "train-from-imagenet_like_x4.json"} <= names, names)
        # Each row says how long its first step took and what the tuner spent of it (nothing to time on the CPU).
        for row in first["rows"]:
            self.assertGreater(row["first_step_s"], 0, row)
            self.assertEqual(row["tuning_s"], 0, row)


class AutotuneStage(DryCall):
    """Issue 67's second call (`run build autotune`): convnets' default step against torch.compile's max-autotune
    modes (GPU only: inductor), and the NormConv path forced; issue 70's step around a checkpoint saved mid-epoch."""
    STAGES = ("autotune",)

    def test_each_step_ran_and_its_peers_are_named(self):
        self.assert_passed()
        for step in ["autotune/convnets-fp32", "autotune/convnets-fp32-fusion-normconv",
                     "autotune/convnets-fp32-save-every", "autotune/compare-fp32"]:
            self.assertRegex(self.text, r"\nPASS %s \(\d+ s\)" % re.escape(step))
        for mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            self.assertIn("SKIP autotune/compile-inductor-%s-fp32: inductor's modes run on the GPU only" % mode,
                          self.text)
        with open(os.path.join(self.out, "summary.json")) as f:
            peers = {c["peer"] for c in json.load(f)}
        self.assertEqual(peers, {"convnets --fusion normconv"})


class GraphsStage(DryCall):
    """Issue 59's stage, a call of its own on the GPU (`run build graphs`): inference replaying a CUDA graph per batch
    size against itself eager, PyTorch eager and torch.compile; GPUNet batch-1 latency with its GPU compute time;
    `serve` under bench/serve_load.py's load."""
    STAGES = ("graphs",)

    def test_each_step_ran_and_each_comparison_holds_its_peers(self):
        self.assert_passed()
        for step in ["graphs/graph-numerics", "graphs/convnets-infer-fp32-fold-bn", "graphs/convnets-infer-fp32-no-fused-conv",
                     "graphs/convnets-infer-fp32", "graphs/convnets-infer-fp32-no-cuda-graph",
                     "graphs/convnets-gpunet-0-unfolded",
                     "graphs/eager-infer-fp32", "graphs/compile-eager-default-infer-fp32", "graphs/compare-infer-fp32",
                     "graphs/convnets-gpunet-0", "graphs/eager-gpunet-0", "graphs/compare-gpunet-0",
                     "graphs/convnets-gpunet-d1", "graphs/eager-gpunet-d1", "graphs/compare-gpunet-d1",
                     "graphs/serve-load-fp32", "graphs/serve-load-gpunet-0-fp32", "graphs/serve-bench-fp32",
                     "graphs/serve-bench-jpeg-fp32"]:
            self.assertRegex(self.text, r"\nPASS %s \(\d+ s\)" % re.escape(step))
        self.assertRegex(self.text, r"\nGPU  graphs/ran-not-skipped: .*graph-numerics\.log gtest\n")
        m = re.search(r"\[  SKIPPED \] (\d+) tests?, listed below", self.text)
        self.assertTrue(m)
        self.assertEqual(int(m.group(1)), len([n for n in gtest_names("Gpu") if n.startswith(("Graphed", "Inference"))]))
        with open(os.path.join(self.out, "summary.json")) as f:
            cells = json.load(f)
        peers = {(c["figure"], c["peer"]) for c in cells}
        self.assertIn(("infer resnet18 fp32, batch 1, CUDA graphs, fused convs, latency", "convnets --no-cuda-graph"), peers)
        self.assertIn(("infer resnet18 fp32, batch 1, CUDA graphs, fused convs, latency", "convnets --fold-bn --no-fused-conv"),
                      peers)
        self.assertIn(("infer resnet18 fp32, batch 2, CUDA graphs, fused convs", "pytorch-compile"), peers)
        self.assertIn(("infer gpunet-0 fp32, batch 1, latency", "pytorch-eager"), peers)
        self.assertIn(("infer gpunet-0 fp32, batch 1, latency", "convnets BN unfolded"), peers)
        self.assertIn(("serve resnet18 fp32, concurrency 2 (tritonclient HTTP, batches up to 2)",
                       "convnets bench infer, batch 2"), peers)
        self.assertIn(("serve gpunet-0 fp32, concurrency 2 (tritonclient HTTP, batches up to 2)",
                       "convnets bench infer, batch 2"), peers)
        for net in ("resnet18", "gpunet-0"):
            self.assertIn(("serve %s fp32, concurrency 2 (tritonclient HTTP, inputs in system shared memory, batches "
                           "up to 2)" % net, "convnets bench infer, batch 2"), peers)
        # Issue 68's rows, from convnets bench serve: FP32 tensors over HTTP and from shared memory, JPEG files.
        for label in ("HTTP, FP32 tensors", "HTTP, inputs in system shared memory, FP32 tensors", "HTTP, JPEG files"):
            self.assertIn(("serve resnet18 fp32, concurrency 2, " + label, "convnets bench infer, batch 2"), peers)
        with tarfile.open(os.path.join(self.out, "graphs.tar.gz")) as t:
            rows = json.load(t.extractfile(next(n for n in t.getnames() if n.endswith("/serve-bench-fp32.json"))))
        for row in rows["load"]:
            self.assertEqual(row["client"], "convnets bench serve")
            self.assertGreater(row["server_cpu_ms_per_request"], 0, row)
            self.assertEqual(set(row["counts"]), {"ok"}, row)
        self.assertEqual(sorted(os.listdir(self.out)), ["build.tar.gz", "graphs.tar.gz", "summary.json", "summary.txt"])


class RanOnGpu(unittest.TestCase):
    """`gpu.sh _ran_on_gpu LOG KIND`, the verdict of each ran-not-skipped step on the GPU (a CUDA case that skips
    there is a failure), on logs written here: a dry run never reaches it, its cases skipping by design."""

    def verdict(self, text, kind):
        with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
            f.write(text)
            f.flush()
            r = subprocess.run([SCRIPT, "_ran_on_gpu", f.name, kind], capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr

    GTEST_OK = ("[==========] Running 2 tests from 1 test suite.\n[ RUN      ] Gpu.A\n[       OK ] Gpu.A (3 ms)\n"
                "[ RUN      ] Gpu.B\n[       OK ] Gpu.B (4 ms)\n[==========] 2 tests from 1 test suite ran.\n"
                "[  PASSED  ] 2 tests.\n")

    def test_gtest_passed_and_none_skipped(self):
        self.assertEqual(self.verdict(self.GTEST_OK, "gtest")[0], 0)

    def test_a_gtest_skip_fails_naming_it(self):
        text = self.GTEST_OK.replace("[       OK ] Gpu.B (4 ms)", "[  SKIPPED ] Gpu.B (0 ms)").replace(
            "[  PASSED  ] 2 tests.", "[  PASSED  ] 1 test.\n[  SKIPPED ] 1 test, listed below:\n[  SKIPPED ] Gpu.B")
        rc, out = self.verdict(text, "gtest")
        self.assertEqual(rc, 1, out)
        self.assertIn("Gpu.B", out)
        self.assertIn("a case skipped on the GPU", out)

    def test_no_test_passed_fails(self):
        rc, out = self.verdict("[==========] 0 tests from 0 test suites ran.\n[  PASSED  ] 0 tests.\n", "gtest")
        self.assertEqual(rc, 1, out)
        self.assertIn("no test passed", out)
        self.assertEqual(self.verdict("", "gtest")[0], 1)

    def test_unittest_ok_passes_and_ok_with_skips_fails(self):
        ok = "test_a (m.Cuda.test_a) ... ok\n\n----------------------------------------------------------------------\n" \
             "Ran 1 test in 0.1s\n\nOK\n"
        self.assertEqual(self.verdict(ok, "unittest")[0], 0)
        skipped = ok.replace("... ok", "... skipped 'no CUDA device'").replace("\nOK\n", "\nOK (skipped=1)\n")
        rc, out = self.verdict(skipped, "unittest")
        self.assertEqual(rc, 1, out)
        self.assertIn("skipped", out)
        self.assertEqual(self.verdict(ok.replace("\nOK\n", "\nFAILED (failures=1)\n"), "unittest")[0], 1)

    def test_an_unknown_log_kind_is_refused(self):
        rc, out = self.verdict(self.GTEST_OK, "pytest")
        self.assertEqual(rc, 2)
        self.assertIn("unknown log kind 'pytest'", out)


class Interpreter(unittest.TestCase):
    """pyzygote's `python` against the real interpreter: what the dry run's verdicts rest on (a zygote that
    answered 0 for a failed peer would let every dry run pass)."""

    PROBE = ("import json, os, sys; print(json.dumps([sys.argv, sys.path[0], os.getcwd(), os.environ.get('PROBE_X'),"
             " sys.stdin.read(), os.getppid() == int(os.environ['PROBE_PARENT'])]))")

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="pyzygote-test-")
        cls.zygote = Zygote(cls.tmp.name, modules=())
        cls.script = os.path.join(cls.tmp.name, "probe.py")
        with open(cls.script, "w") as f:
            f.write(cls.PROBE + "\n")
        os.makedirs(os.path.join(cls.tmp.name, "pkg"))
        with open(os.path.join(cls.tmp.name, "pkg", "probe_module.py"), "w") as f:
            f.write(cls.PROBE + "\n")

    @classmethod
    def tearDownClass(cls):
        cls.zygote.close()
        cls.tmp.cleanup()

    def both(self, args, env=None, cwd=None):
        env = dict(os.environ, PROBE_X="x y", PROBE_PARENT=str(os.getpid()), **(env or {}))
        run = lambda python: subprocess.run([python, *args], input="from stdin", capture_output=True, text=True,
                                            env=env, cwd=cwd, timeout=60)
        return run(sys.executable), run(self.zygote.python)

    def test_arguments_paths_environment_and_streams_as_the_interpreter_gives_them(self):
        pkg = os.path.join(self.tmp.name, "pkg")
        for args in ([self.script, "a", "b c"], ["-c", self.PROBE, "d"], ["-m", "probe_module", "e"]):
            real, forked = self.both(args, cwd=pkg)
            self.assertEqual(real.returncode, 0, real.stderr)
            self.assertEqual(forked.returncode, 0, forked.stderr)
            want, got = json.loads(real.stdout), json.loads(forked.stdout)
            self.assertEqual(got[:5], want[:5], args)
            self.assertTrue(want[5], "the real interpreter is the test's child")
            self.assertFalse(got[5], "forked from the zygote, not started by the test: %s" % (args,))

    def test_exit_statuses_are_the_interpreters(self):
        for code, want in (("import sys; sys.exit(3)", 3), ("raise ValueError('broken peer')", 1),
                           ("import sys; sys.exit('message')", 1), ("pass", 0)):
            real, forked = self.both(["-c", code])
            self.assertEqual((forked.returncode, real.returncode), (want, want), code)
            self.assertEqual(forked.stderr.splitlines()[-1:], real.stderr.splitlines()[-1:], code)
        # A signal: the shell's 128 + n, which is what gpu.sh's steps see of a real process too.
        real, forked = self.both(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
        self.assertEqual((real.returncode, forked.returncode), (-11, 139))

    def test_a_load_time_variable_it_cannot_honour_starts_the_real_interpreter(self):
        _, forked = self.both(["-c", self.PROBE], env={"OMP_NUM_THREADS": "7"} if os.environ.get(
            "OMP_NUM_THREADS") != "7" else {"OMP_NUM_THREADS": "6"})
        self.assertTrue(json.loads(forked.stdout)[5], "exec'd in place: the test's child")

    def test_a_killed_client_takes_its_child_with_it(self):
        marker = "pyzygote-marker-%d" % os.getpid()
        r = subprocess.run(["timeout", "1", self.zygote.python, "-c", "import time; time.sleep(60)", marker])
        self.assertEqual(r.returncode, 124)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and marker in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                                       text=True).stdout:
            time.sleep(0.05)
        self.assertNotIn(marker, subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)


class Detached(unittest.TestCase):
    """The zygote CTest's Python tests run from (pyzygote.py start/stop, a fixture): it answers once started, ends
    when stopped, when another takes over its socket path or when idle, and a client without one runs the real
    interpreter."""

    PARENT = "import os; print(os.getppid())"

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="pyzygote-detached-")
        self.addCleanup(self.tmp.cleanup)
        self.socket = os.path.join(self.tmp.name, "z")

    def pyzygote(self, *args):
        r = subprocess.run([sys.executable, os.path.join(HERE, "pyzygote.py"), *args], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def start(self, *extra):
        out = self.pyzygote("start", self.socket, *extra)
        pid = int(re.search(r"\(pid (\d+)\)", out).group(1))
        self.addCleanup(lambda: os.path.exists(f"/proc/{pid}") and os.kill(pid, signal.SIGKILL))
        return pid

    def client_parent(self, env=None):
        # The client's child (a fork) has another parent than the client; the real interpreter, exec'd in the
        # client's place, has the client's: this test.
        p = subprocess.Popen([sys.executable, "-I", "-S", os.path.join(HERE, "pyzygote_client.py"), self.socket,
                              "-c", self.PARENT], stdout=subprocess.PIPE, text=True, env=env)
        out, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0)
        return "real" if int(out) == os.getpid() else "forked"

    def wait_gone(self, pid, seconds=15):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not gone(pid):
            time.sleep(0.05)
        return gone(pid)

    def test_started_it_answers_stopped_it_ends_and_the_client_runs_the_interpreter(self):
        self.assertEqual(self.client_parent(), "real")  # none yet
        pid = self.start()
        self.assertEqual(self.client_parent(), "forked")
        self.assertEqual(self.client_parent(dict(os.environ, OMP_NUM_THREADS="9")), "real")  # a load-time variable
        self.assertIn("stopped the zygote", self.pyzygote("stop", self.socket))
        self.assertTrue(self.wait_gone(pid))
        self.assertFalse(os.path.exists(self.socket))
        self.assertEqual(self.client_parent(), "real")
        self.assertIn("no zygote answered", self.pyzygote("stop", self.socket))

    def test_a_new_start_replaces_the_old_and_an_idle_zygote_ends(self):
        first = self.start()
        second = self.start("--idle", "3")
        self.assertTrue(self.wait_gone(first))
        self.assertEqual(self.client_parent(), "forked")
        self.assertTrue(self.wait_gone(second, seconds=30))
        self.assertEqual(self.client_parent(), "real")

    def test_a_server_whose_path_another_takes_ends(self):
        first = self.start()
        os.remove(self.socket)  # what a second zygote binding the same path does first
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
            other.bind(self.socket)
            self.assertTrue(self.wait_gone(first))
            self.assertTrue(os.path.exists(self.socket), "the old server removed the new one's socket")

    def test_c_code_has_a_main_module(self):
        self.start()
        r = subprocess.run([sys.executable, "-I", "-S", os.path.join(HERE, "pyzygote_client.py"), self.socket, "-c",
                            "import os, pickle, __main__\ndef f(): pass\nprint(os.getppid(), pickle.loads(pickle.dumps(f)) is f)"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        parent, same = r.stdout.split()
        self.assertNotEqual(int(parent), os.getpid(), "forked")
        self.assertEqual(same, "True")

    def test_a_socket_path_too_long_starts_none(self):
        self.socket = os.path.join(self.tmp.name, "z" * 120)
        self.assertIn("too long for a Unix socket", self.pyzygote("start", self.socket))
        self.assertEqual(self.client_parent(), "real")


class Failures(unittest.TestCase):
    def test_a_failing_step_is_a_fail_line_and_an_exit_status_and_the_rest_still_runs(self):
        with tempfile.TemporaryDirectory(prefix="gpu-fail-") as out:
            # An interpreter whose PyTorch peer breaks: convnets' own steps must still run and pass.
            python = os.path.join(out, "python")
            with open(python, "w") as f:
                # ... and its GPUNet reference crashes, as the module did on the GPU machine.
                f.write('#!/bin/sh\ncase "$*" in *torch_peer.py*) echo "peer broke" >&2; exit 3;;\n'
                        '*gpunet_reference.py*) exec "%s" -c "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)";;'
                        '\nesac\nexec "%s" "$@"\n' % (sys.executable, ZYGOTE.python))
            os.chmod(python, 0o755)
            r = gpu_sh(out, "run", "--dry", "infer", python=python)
            text = summary(out)
            os.remove(python)
            self.assertEqual(r.returncode, 1, r.stdout[-3000:])
            self.assertRegex(text, r"\nFAIL infer/eager-infer-fp32 \(exit 3, \d+ s; log: infer\.tar\.gz "
                                   r"eager-infer-fp32\.log\)\n    \$ .*torch_peer\.py infer")
            self.assertIn("    peer broke", text)
            self.assertRegex(text, r"\nPASS infer/convnets-infer-fp32 ")
            self.assertRegex(text, r"\nPASS infer/convnets-gpunet-d1 ")
            # The comparisons that need the peer's figures fail too, rather than print half a table.
            self.assertRegex(text, r"\nFAIL infer/compare-infer-fp32 ")
            self.assertRegex(text, r"\nFAIL infer/compare-infer-folded ")
            # A crash names its native frames (scripts/crash-frames.c; the GPU machine has no gdb).
            self.assertRegex(text, r"\nFAIL infer/eager-gpunet-0 \(exit 139, ")
            self.assertIn("    native frames of the crash (scripts/crash-frames.c):", text)
            self.assertRegex(text, r"\n      crash-frames\.so 0x[0-9a-f]+ print_frames\n")
            self.assertRegex(text, r"\nFAIL infer/compare-gpunet-0 ")
            self.assertRegex(text, r"== stage infer: 7 failed")
            self.assertRegex(text, r"== gpu\.sh run infer: \d+ passed, 7 failed")

    def test_an_unknown_stage_is_refused_by_name(self):
        with tempfile.TemporaryDirectory(prefix="gpu-usage-") as out:
            r = gpu_sh(out, "run", "--dry", "tarin")
            self.assertEqual(r.returncode, 2)
            self.assertIn("unknown stage 'tarin' (expected: build tests data train infer python fused autotune graphs or all)",
                          r.stderr)
            self.assertFalse(os.path.exists(os.path.join(out, "summary.txt")))


if __name__ == "__main__":
    unittest.main()
