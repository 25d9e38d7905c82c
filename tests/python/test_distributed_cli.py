"""End-to-end tests of data-parallel `convnets train` on CPU with Gloo over loopback.

Two processes started by the launcher, by two "node" launchers and by a
torchrun-style environment; equivalence with one process accumulating the
same micro-batches; exact sharded evaluation; a killed and a frozen rank; resume
with another world size; launches that must fail within seconds.
"""
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import pth2safetensors  # noqa: E402
from fixtures import free_port  # noqa: E402
import kill_resume  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"
# One thread per process everywhere: then each rank computes its micro-batch
# exactly as the single process does, and the runs must agree to the bit.
RUN = ["--recipe", "fashion-mnist-resnet8", "--max-train-images", "1024", "--max-val-images", "201",
       "--epochs", "1", "--warmup", "0", "--batch-size", "32", "--print-freq", "2"]


def env1(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def train(*args, timeout=300, env=None):
    return runner.run([BIN, "--threads", "1", "train", FASHION, *RUN, *args], capture_output=True, text=True,
                      timeout=timeout, env=env or env1())


def params(path):
    tensors = pth2safetensors.read_safetensors(path)
    tensors = tensors[0] if isinstance(tensors, tuple) else tensors
    return {k: v.double() for k, v in tensors.items()
            if k.startswith("model.") and "running" not in k and "num_batches" not in k}


def max_relative_error(a, b):
    """The bar's measure: per tensor max|a - b| / max|b|, the worst tensor."""
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)).item() for k in a)


def step_records(log):
    """{(epoch, step): data} of a DLLogger log's per-step records (every --print-freq steps); where a resumed run
    logged a step again, its record, the last, is the one that counts."""
    with open(log) as f:
        records = [json.loads(line[5:]) for line in f if line.startswith("DLLL ")]
    return {(r["step"][0], r["step"][1]): r["data"] for r in records
            if isinstance(r.get("step"), list) and len(r["step"]) == 2 and "train.lr" in r.get("data", {})}


def step_lrs(log):
    return {k: v["train.lr"] for k, v in step_records(log).items()}


def images_seen(*logs):
    """{(epoch, step): (images, digest)} of the steps in the logs, later logs' records over earlier ones': which
    images each span of steps trained (the digest sums a mix of their dataset indices)."""
    seen = {}
    for log in logs:
        seen.update({k: (v["train.images"], v["train.image_digest"]) for k, v in step_records(log).items()})
    return seen


def rank_pids(launcher_pid):
    """rank -> pid of the launcher's workers, read from their environment."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher_pid:
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            out[int(env[b"RANK"])] = int(pid)
        except (OSError, KeyError, ValueError):
            pass
    return out


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class DataParallelTraining(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.single = train("--prof", "6", "--optimizer-batch-size", "64", "--training-only",
                           "--workspace", cls.ws("single"))
        assert cls.single.returncode == 0, cls.single.stderr

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def ws(cls, name):
        return os.path.join(cls.tmp.name, name)

    def test_two_processes_equal_one_process_accumulating_the_same_micro_batches(self):
        r = train("--prof", "6", "--training-only", "--nproc-per-node", "2", "--master-port", str(free_port()),
                  "--workspace", self.ws("dp"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("data-parallel: 2 ranks over gloo", r.stdout)
        self.assertIn("gradient buckets", r.stdout)
        err = max_relative_error(params(self.ws("dp/last.safetensors")), params(self.ws("single/last.safetensors")))
        self.assertLess(err, 1e-5)
        # Rank 0 alone writes: one PARAMETER record, one progress banner.
        with open(self.ws("dp/log.json")) as f:
            self.assertEqual(sum('"PARAMETER"' in line for line in f), 1)
        self.assertEqual(r.stdout.count("train: resnet8"), 1)
        with open(self.ws("dp/config.json")) as f:
            derived = json.load(f)["derived"]
        self.assertEqual((derived["world_size"], derived["optimizer_batch"]), (2, 64))

    def test_two_node_launchers_on_one_machine_agree_the_same_way(self):
        port = str(free_port())
        common = ["--prof", "6", "--training-only", "--nnodes", "2", "--nproc-per-node", "1",
                  "--master-addr", "127.0.0.1", "--master-port", port]
        cmd = [BIN, "--threads", "1", "train", FASHION, *RUN, *common]
        node1 = subprocess.Popen(cmd + ["--node-rank", "1", "--workspace", self.ws("node1")], env=env1(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        node0 = runner.run(cmd + ["--node-rank", "0", "--workspace", self.ws("node0")], env=env1(),
                           capture_output=True, text=True, timeout=300)
        out1, err1 = node1.communicate(timeout=300)
        self.assertEqual(node0.returncode, 0, node0.stderr)
        self.assertEqual(node1.returncode, 0, err1)
        self.assertFalse(os.path.exists(self.ws("node1")), "a rank other than 0 wrote its workspace")
        err = max_relative_error(params(self.ws("node0/last.safetensors")),
                                 params(self.ws("single/last.safetensors")))
        self.assertLess(err, 1e-5)

    def test_torchrun_environment_starts_the_plain_binary_as_a_worker(self):
        port = str(free_port())
        procs = [subprocess.Popen([BIN, "--threads", "1", "train", FASHION, *RUN, "--prof", "6", "--training-only",
                                   "--workspace", self.ws("torchrun")],
                                  env=env1(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
        for p in procs:
            _, err = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 0, err)
        err = max_relative_error(params(self.ws("torchrun/last.safetensors")),
                                 params(self.ws("single/last.safetensors")))
        self.assertLess(err, 1e-5)

    def test_a_resume_on_more_processes_keeps_the_checkpoints_images_per_step(self):
        # The fixture: 1 process accumulating 2 micro-batches of 32 (64 images a step), stopped at step 6 of 16.
        ckpt = self.ws("single/last.safetensors")
        r = train("--resume", ckpt, "--prof", "8", "--nproc-per-node", "4", "--master-port", str(free_port()),
                  "--workspace", self.ws("world4"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("resume: world 1 -> 4: 1 micro-batch of 16 per process instead of 2 of 32, the checkpoint's 64 "
                      "images a step kept (--resume-batch recipe)", r.stdout)
        self.assertIn("16 steps/epoch of 64 images (4 processes x 16)", r.stdout)
        self.assertIn("at epoch 1, step 6/16", r.stdout)
        self.assertIn("done: 8 steps", r.stdout)
        # The schedule is the recipe's: the LR of steps 7 and 8 as the single process has them.
        one = train("--resume", ckpt, "--prof", "8", "--workspace", self.ws("world1"))
        self.assertEqual(one.returncode, 0, one.stderr)
        lrs = step_lrs(self.ws("world4/log.json"))
        self.assertIn((1, 8), lrs)
        self.assertEqual(lrs, step_lrs(self.ws("world1/log.json")))
        # Exactly once: the 4 processes' steps 7 and 8 trained the images the single process trains there, and with
        # the steps before the checkpoint, those of an uninterrupted run's first 8 steps, each once.
        ref = train("--prof", "8", "--optimizer-batch-size", "64", "--training-only", "--workspace", self.ws("ref8"))
        self.assertEqual(ref.returncode, 0, ref.stderr)
        resumed = images_seen(self.ws("single/log.json"), self.ws("world4/log.json"))
        self.assertEqual(sorted(resumed), [(1, 2), (1, 4), (1, 6), (1, 8)])
        self.assertEqual(resumed, images_seen(self.ws("ref8/log.json")))
        self.assertEqual(sum(n for n, _ in resumed.values()), 8 * 64)
        # As given, the flags' 4 x 32 images are no whole number of the checkpoint's optimizer batch: refused, named.
        given = train("--resume", ckpt, "--prof", "8", "--nproc-per-node", "4", "--master-port", str(free_port()),
                      "--workspace", self.ws("world4-as-given"), "--resume-batch", "as-given")
        self.assertNotEqual(given.returncode, 0)
        self.assertIn("--optimizer-batch-size 64 is not a multiple of --batch-size 32 x 4 processes", given.stderr)

    def test_an_uneven_world_change_scales_the_lr_as_the_images_a_step_change(self):
        # 4 processes of 16 (64 images a step) for the first of 2 epochs of 4 steps, resumed on 3: 64 does not
        # split evenly, so 3 x 21 = 63 images a step. The recipe's LR is per --lr-reference-batch images: each step
        # of epoch 2 has 63/64 of the uninterrupted run's LR. With an absolute --lr (the uninterrupted run's own),
        # each step's LR is the uninterrupted run's.
        short = ["--max-train-images", "256", "--epochs", "2", "--print-freq", "1", "--training-only"]
        ws4, reference = self.ws("uneven-4"), self.ws("uneven-reference")
        r = train(*short, "--batch-size", "16", "--run-epochs", "1", "--nproc-per-node", "4", "--master-port",
                  str(free_port()), "--workspace", ws4)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = train(*short, "--optimizer-batch-size", "64", "--workspace", reference)
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = step_lrs(os.path.join(reference, "log.json"))
        epoch2 = sorted(k for k in expected if k[0] == 2)
        self.assertEqual(len(epoch2), 4)
        for name, extra, branch, scale in (
                ("uneven-3", [], "so 63 (-1.6 %); the LR scales with it (--lr-reference-batch)", 63 / 64),
                ("uneven-3-absolute", ["--lr", repr(expected[(1, 1)])],
                 "so 63 (-1.6 %); the LR stays the checkpoint's (absolute --lr)", 1.0)):
            with self.subTest(branch=name):
                ws3 = self.ws(name)
                r = train(*short, "--resume", os.path.join(ws4, "last.safetensors"), *extra, "--nproc-per-node", "3",
                          "--master-port", str(free_port()), "--workspace", ws3)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("resume: world 4 -> 3: 1 micro-batch of 21 per process instead of 1 of 16: no equal "
                              "split of the checkpoint's 64 images a step over 3 processes, " + branch, r.stdout)
                self.assertIn("4 steps/epoch of 63 images (3 processes x 21)", r.stdout)
                lrs = step_lrs(os.path.join(ws3, "log.json"))
                self.assertEqual(sorted(lrs), epoch2)
                for step in epoch2:
                    self.assertAlmostEqual(lrs[step], expected[step] * scale, places=12, msg=step)

    def test_sharded_evaluation_counts_every_image_exactly_once(self):
        ckpt = self.ws("single/last.safetensors")
        one = train("--evaluate", "--no-training-only", "--resume", ckpt)
        two = train("--evaluate", "--no-training-only", "--resume", ckpt, "--nproc-per-node", "2",
                    "--master-port", str(free_port()))
        self.assertEqual(one.returncode, 0, one.stderr)
        self.assertEqual(two.returncode, 0, two.stderr)
        a = json.loads(one.stdout[one.stdout.index("{"):])
        b = json.loads(two.stdout[two.stdout.index("{"):])
        # 201 images over 2 ranks: 101 + 100, none padded or dropped.
        self.assertEqual(a["val.top1"], b["val.top1"])
        self.assertEqual(round(a["val.top1"] * 201 / 100), round(b["val.top1"] * 201 / 100))
        self.assertAlmostEqual(a["val.loss"], b["val.loss"], places=5)

    def _start_long_run(self, workspace, timeout_s):
        cmd = [BIN, "--threads", "1", "train", FASHION, *RUN, "--epochs", "5", "--training-only",
               "--nproc-per-node", "2", "--master-port", str(free_port()), "--dist-timeout", str(timeout_s),
               "--workspace", workspace]
        p = subprocess.Popen(cmd, env=env1(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        last = os.path.join(workspace, "last.safetensors")
        deadline = time.time() + 120
        while not os.path.exists(last):
            self.assertIsNone(p.poll(), "the run ended before its first checkpoint")
            self.assertLess(time.time(), deadline)
            time.sleep(0.05)
        time.sleep(0.3)  # into epoch 2
        return p

    def test_a_killed_rank_is_named_by_the_survivor_and_the_run_resumes_on_one_process(self):
        ws = self.ws("killed")
        p = self._start_long_run(ws, 30)
        with open(os.path.join(ws, "last.safetensors"), "rb") as f:
            before = f.read()
        t0 = time.time()
        os.kill(rank_pids(p.pid)[1], signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        elapsed = time.time() - t0
        self.assertNotEqual(p.returncode, 0)
        self.assertLess(elapsed, 30, "the survivor must exit within --dist-timeout")
        self.assertIn("error (rank 0 of 2): distributed run:", err)
        self.assertIn("rank 1 stopped responding", err)
        self.assertIn("worker rank 1", err)  # the launcher says it too
        # The last complete checkpoint is intact (the kill came mid-epoch, between saves).
        with open(os.path.join(ws, "last.safetensors"), "rb") as f:
            self.assertEqual(f.read(), before)
        # ... and resumes with another world size: 1 process accumulating 2 x 32 keeps the step of 64 images.
        r = runner.run([BIN, "--threads", "1", "train", FASHION, "--resume", os.path.join(ws, "last.safetensors"),
                        "--optimizer-batch-size", "64", "--epochs", "2"], capture_output=True, text=True,
                       timeout=300, env=env1())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("resume:", r.stdout)
        self.assertIn("done: 32 steps", r.stdout)

    def test_a_frozen_rank_is_named_after_the_timeout(self):
        p = self._start_long_run(self.ws("frozen"), 4)
        ranks = rank_pids(p.pid)
        t0 = time.time()
        os.kill(ranks[1], signal.SIGSTOP)
        try:
            lines = []
            for line in p.stderr:
                lines.append(line)
                if "stopped responding" in line:
                    break
            elapsed = time.time() - t0
            text = "".join(lines)
            self.assertIn("error (rank 0 of 2)", text)
            self.assertIn("rank 1 stopped responding", text)
            self.assertLess(elapsed, 4 + 15)  # the timeout, the diagnosis, and slack for a loaded machine
        finally:
            os.kill(ranks[1], signal.SIGKILL)
            p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)


def documented_torchrun_line():
    """docs/MULTINODE.md's elastic torchrun line ("Restarts"), its continuation lines joined, as words."""
    with open(os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "docs", "MULTINODE.md")) as f:
        text = f.read()
    section = text[text.index("## Restarts"):]
    m = re.search(r"^    (torchrun --no-python .*?)\n(?!        )", section, re.M | re.S)
    return m.group(1).replace("\\\n", " ").split()


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class ElasticRestarts(unittest.TestCase):
    """torchrun's elastic agent, the real one from the project's .venv, running the docs' line as written but for the
    machine's names and a short run. A worker killed with SIGKILL mid-epoch: the agent restarts both, they resume by
    themselves from the last checkpoint saved in the background, and the run ends bit-identical to one never killed.
    One of two agents killed with its worker: the other re-forms the group alone and keeps the recipe, and a third
    agent joining later grows the world back. Each way each step trains the images the uninterrupted run's step
    trains (log.json's train.image_digest)."""

    STEPS = 64  # 4,096 images an epoch in steps of 2 x 32

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.reference = os.path.join(cls.tmp.name, "reference")
        cls.reference_run = runner.run(cls.torchrun(cls.reference, 2), capture_output=True, text=True, timeout=300,
                                       env=env1())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def torchrun(cls, workspace, nproc, endpoint=None, last_call_s=1, host=None, misses=2):
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        line = documented_torchrun_line()
        fill = {"NODE0:29400": endpoint or f"127.0.0.1:{free_port()}", "8": str(nproc), "$(which": BIN,
                "convnets)": None, "DATA": FASHION, "/shared/runs/rn50": workspace}
        if line[:2] != ["torchrun", "--no-python"] or any(word not in line for word in fill):
            raise AssertionError(f"docs/MULTINODE.md's torchrun line changed: {shlex.join(line)}")
        words = [fill.get(w, w) for w in line]
        words = [torchrun] + [w for w in words[1:] if w is not None]
        # The rendezvous closes `last_call_s` after its last arrival, not torchrun's 30 s wait for a node that may
        # come, and takes a node for lost after `misses` missed heartbeats 1 s apart, not 3 of 5 s. A checkpoint
        # every 4 steps: the line's 10 minutes would not come in this run.
        conf = f"last_call_timeout={last_call_s},keep_alive_interval=1,keep_alive_max_attempt={misses}"
        words[1:1] = ["--rdzv-conf", conf + ("" if host is None else f",is_host={str(host).lower()}")]
        return words + ["--recipe", "fashion-mnist-resnet8", "--max-train-images", str(64 * cls.STEPS), "--epochs",
                        "1", "--warmup", "0", "--batch-size", "32", "--print-freq", "1", "--training-only",
                        "--checkpoint-every-steps", "4"]

    def setUp(self):
        self.assertEqual(self.reference_run.returncode, 0, self.reference_run.stdout + self.reference_run.stderr)
        self.work = tempfile.TemporaryDirectory()
        self.addCleanup(self.work.cleanup)
        self.ws = os.path.join(self.work.name, "ws")

    def wait_for_step(self, step, *agents):
        log, reached, deadline = os.path.join(self.ws, "log.json"), 0, time.time() + 120
        while reached < step and all(a.poll() is None for a in agents) and time.time() < deadline:
            if os.path.exists(log):
                records = step_records(log)
                reached = max(s for _, s in records) if records else 0
            time.sleep(0.01)
        return reached

    def assert_each_step_trained_the_references_images(self):
        seen = images_seen(os.path.join(self.ws, "log.json"))
        expected = images_seen(os.path.join(self.reference, "log.json"))
        self.assertEqual(len(expected), self.STEPS)
        self.assertEqual(seen, expected)

    def test_a_worker_killed_mid_epoch_is_restarted_and_the_run_ends_as_if_never_killed(self):
        p = subprocess.Popen(self.torchrun(self.ws, 2), env=env1(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        reached = self.wait_for_step(random.randint(10, self.STEPS - 10), p)
        ranks = rank_pids(p.pid)
        self.assertEqual(sorted(ranks), [0, 1], f"the workers at step {reached}")
        os.kill(ranks[1], signal.SIGKILL)
        out = p.communicate(timeout=300)[0]
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("failed (exitcode: -9) local_rank: 1", out)  # torchrun saw the kill
        self.assertIn("resume: torchrun job rn50, torchrun's restart 1: --resume auto", out)
        m = re.search(r"^resume: \S+ at epoch 1, step (\d+)/64$", out, re.M)
        self.assertIsNotNone(m, out)
        # Killed at step `reached` or soon after: the resume is from a save of the 4-step interval before it. No
        # further back than two intervals: the save at the point before the kill may still have been written when
        # it came (the next save waits for it), but the one before that was done before the steps went on.
        self.assertGreater(int(m.group(1)), 0, out)
        self.assertEqual(int(m.group(1)) % 4, 0, out)
        self.assertLessEqual(int(m.group(1)), reached + 4, out)
        self.assertGreaterEqual(int(m.group(1)), reached - 8, out)
        self.assertIn(f"done: {self.STEPS} steps", out)
        a = kill_resume.read_checkpoint(os.path.join(self.ws, "last.safetensors"))[0]
        b = kill_resume.read_checkpoint(os.path.join(self.reference, "last.safetensors"))[0]
        self.assertEqual(sorted(a), sorted(b))
        differing = [k for k in b if a[k] != b[k]]
        self.assertEqual(differing, [], f"killed at step {reached} and resumed at {m.group(1)}: not bit-identical")
        # Exactly once: each step of the killed and resumed run (its last record of the step) trained the images
        # that step of the uninterrupted run trained, and the epoch's record of the resumed part counts the rest.
        self.assert_each_step_trained_the_references_images()
        with open(os.path.join(self.ws, "log.json")) as f:
            records = [json.loads(line[5:]) for line in f if line.startswith("DLLL ")]
        epochs = [r["data"] for r in records if r.get("step") == [1]]
        self.assertEqual(epochs[-1]["train.images"], (self.STEPS - int(m.group(1))) * 64)

    def test_an_agent_lost_and_another_joining_later_keep_the_recipe(self):
        # Two agents of one worker each (--nnodes 1:2), the first hosting the rendezvous. The second is killed with
        # its worker; the first's worker fails on the lost peer, its agent re-forms the group alone, and the worker
        # resumes by itself with the checkpoint's 64 images a step as 2 micro-batches of 32. Then a third agent joins
        # the one left: that agent restarts its worker for the larger world, and both workers resume by themselves,
        # the newcomer's though its restart count is 0 (the checkpoints name torchrun's job, --rdzv-id), 1 -> 2
        # processes with the checkpoint's 64 images a step. torch 2.14.1 grows a
        # group only with a store that each round's rank 0 serves anew (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; with
        # the agent's, both agents wait out the rank assignment: pytorch/pytorch#147064) and with 3 or more missed
        # heartbeats allowed (with 2 the newcomer takes the others for lost before its first heartbeat and forms a
        # group alone). LOGLEVEL=INFO prints the agent's "new nodes" decision.
        port, env = free_port(), env1(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", LOGLEVEL="INFO")

        def agent(name, host):
            """An agent writing to NAME.out (appending: the test reads the file while it grows); (agent, path)."""
            path = os.path.join(self.work.name, name + ".out")
            with open(path, "ab") as out:
                p = subprocess.Popen(self.torchrun(self.ws, 1, f"127.0.0.1:{port}", last_call_s=5, host=host,
                                                   misses=5),
                                     env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.addCleanup(stop, p)
            return p, path

        def stop(p):  # the agent and the worker it starts in a process group of its own, whatever state they are in
            workers = rank_pids(p.pid) if p.poll() is None else {}
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            for pid in workers.values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        def text_of(path):
            with open(path, errors="replace") as f:
                return f.read()

        def wait_for_text(path, pattern, *agents):
            """The last match of `pattern` in an agent's output so far, once there is one; None if it ends first."""
            deadline = time.time() + 120
            while all(a.poll() is None for a in agents) and time.time() < deadline:
                found = re.findall(pattern, text_of(path), re.M)
                if found:
                    return found[-1]
                time.sleep(0.05)
            return None

        # Both arrive within the round's 5 s last call, so they start as one group of 2.
        (first, first_out), (second, _) = agent("first", True), agent("second", False)
        reached = self.wait_for_step(random.randint(8, 16), first, second)
        workers = rank_pids(second.pid)
        self.assertEqual(len(workers), 1, f"the second agent's worker at step {reached}")
        os.killpg(second.pid, signal.SIGKILL)
        for pid in workers.values():
            os.kill(pid, signal.SIGKILL)
        second.wait()
        # The furthest step log.json holds from the group of 2.
        trained = max((step for _, step in step_records(os.path.join(self.ws, "log.json"))), default=0)
        shrunk = re.escape("resume: world 2 -> 1: 2 micro-batches of 32 per process instead of 1 of 32, the "
                           "checkpoint's 64 images a step kept (--resume-batch recipe)\n")
        self.assertIsNotNone(wait_for_text(first_out, shrunk, first), "the first agent did not go on alone")
        self.assertIn("resume: torchrun job rn50, torchrun's restart 1: --resume auto", text_of(first_out))
        # Alone past a checkpoint of its own (every 4 steps) and past the steps the group of 2 logged, then held still
        # while the newcomer arrives, so that the epoch is not over before it has: the agent stops a held worker as
        # it stops a running one.
        alone_from = wait_for_text(first_out, r"^resume: \S+ at epoch 1, step (\d+)/64$", first)
        self.assertIsNotNone(alone_from, "the first agent's worker did not resume")
        target = max(int(alone_from), trained) + 5
        self.assertGreaterEqual(self.wait_for_step(target, first), target, "the first agent alone stopped")
        (worker,) = rank_pids(first.pid).values()
        os.kill(worker, signal.SIGSTOP)
        third, third_out = agent("third", False)
        arrived = wait_for_text(first_out, "new nodes from group_rank", first, third)
        os.kill(worker, signal.SIGCONT)
        self.assertIsNotNone(arrived, "the first agent never saw the third")
        self.assertEqual(first.wait(timeout=120), 0)  # about 30 s with the rendezvous rounds
        self.assertEqual(third.wait(timeout=60), 0)
        out = text_of(first_out) + text_of(third_out)  # rank 0 speaks, whichever agent holds it
        self.assertIn("resume: world 1 -> 2: 1 micro-batch of 32 per process instead of 2 of 32, the checkpoint's 64 "
                      "images a step kept (--resume-batch recipe)", out)
        self.assertIn(f"done: {self.STEPS} steps", out)
        self.assert_each_step_trained_the_references_images()
        # The recipe kept through both changes: each step's LR, the last logged for it, is the uninterrupted run's.
        lrs, expected = (step_lrs(os.path.join(ws, "log.json")) for ws in (self.ws, self.reference))
        self.assertEqual(len(expected), self.STEPS)
        self.assertEqual(lrs, expected)


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class BadLaunches(unittest.TestCase):
    def run_fast(self, args, expect, env=None, within=10):
        with tempfile.TemporaryDirectory() as tmp:
            ws = os.path.join(tmp, "ws")
            t0 = time.time()
            r = runner.run([BIN, "--threads", "1", "train", FASHION, *RUN, "--workspace", ws, *args],
                           capture_output=True, text=True, timeout=120, env=env or env1())
            self.assertLess(time.time() - t0, within, r.stderr)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(expect, r.stderr)
            self.assertFalse(os.path.exists(ws), "a failed launch wrote its workspace")
            return r

    def test_an_unresolvable_master_address(self):
        self.run_fast(["--nproc-per-node", "2", "--master-addr", "no-such-host.invalid",
                       "--master-port", str(free_port())], "'no-such-host.invalid' (--master-addr / MASTER_ADDR) does not resolve")

    def test_a_master_address_that_is_not_this_machine_for_node_0(self):
        # 192.0.2.1 is TEST-NET-1: never an address of this machine.
        self.run_fast(["--nproc-per-node", "2", "--master-addr", "192.0.2.1", "--master-port", str(free_port())],
                      "is not an address of this machine")

    def test_a_port_already_in_use(self):
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            s.listen(1)
            port = s.getsockname()[1]
            self.run_fast(["--nproc-per-node", "2", "--master-port", str(port)],
                          f"--master-port {port} is not free on this machine")

    def test_a_port_out_of_range(self):
        self.run_fast(["--nproc-per-node", "2", "--master-port", "70000"], "--master-port 70000: expected a TCP port")

    def test_world_size_inconsistent_with_the_launch(self):
        self.run_fast(["--nproc-per-node", "2"], "but WORLD_SIZE is 3",
                      env=env1(RANK="0", WORLD_SIZE="3", MASTER_PORT=str(free_port())))

    def test_a_world_size_larger_than_the_processes_started_times_out_naming_the_missing_rank(self):
        r = self.run_fast(["--dist-timeout", "2"], "rank(s) 1 of WORLD_SIZE 2 never joined",
                          env=env1(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())))
        self.assertIn("(rank 0 of 2)", r.stderr)


if __name__ == "__main__":
    unittest.main()
