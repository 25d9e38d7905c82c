"""End-to-end tests of `convnets train`, `eval` and `report` on Debian's Fashion-MNIST.

Short runs of the README's former main job (the fashion-mnist-resnet8 recipe on a
subset), interruption by signal and bit-exact resume, checkpoints, DLLogger
logs, the HTML report, and bad input that must leave the workspace untouched.
"""
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import fixtures  # noqa: E402 - the suite's shared tables (tests/python/fixtures.py)
import pth2safetensors  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"
# A small but real run: 2048 training and 1000 test images, batches of 64.
SMALL = ["--recipe", "fashion-mnist-resnet8", "--max-train-images", "2048", "--max-val-images", "1000",
         "--batch-size", "64", "--print-freq", "1"]


def convnets(*args, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def dllogger(path):
    records = []
    with open(path) as f:
        for line in f:
            assert line.startswith("DLLL "), line
            records.append(json.loads(line[5:]))
    return records


def digest(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def train_cmd(*args):
    # --threads is a global flag: it goes before the command.
    return [BIN, "train", *SMALL, *args]


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class TrainEvalReport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-train-")
        cls.ws = os.path.join(cls.tmp, "run")
        cls.result = subprocess.run(train_cmd("--epochs", "2", "--ema", "0.9", "--workspace", cls.ws),
                                    capture_output=True, text=True, timeout=600)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_run_learns_and_writes_workspace(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        for name in ("config.json", "log.json", "last.safetensors", "best.safetensors"):
            self.assertTrue(os.path.exists(os.path.join(self.ws, name)), name)
        with open(os.path.join(self.ws, "config.json")) as f:
            config = json.load(f)
        self.assertEqual(config["config"]["arch"], "resnet8")       # from the recipe
        self.assertEqual(config["config"]["batch_size"], 64)        # the flag overrode it
        self.assertEqual(config["derived"]["steps_per_epoch"], 32)  # 2048 / 64
        self.assertAlmostEqual(config["derived"]["base_lr_scaled"], 0.4 * 64 / 256)
        epochs = [r["data"] for r in dllogger(os.path.join(self.ws, "log.json"))
                  if r["type"] == "LOG" and isinstance(r["step"], list) and len(r["step"]) == 1]
        self.assertEqual(len(epochs), 2)
        self.assertLess(epochs[1]["train.loss"], epochs[0]["train.loss"])
        # 10 classes: chance is 10%; 64 steps on 2048 images reach well above.
        self.assertGreater(epochs[1]["val.top1"], 60.0)
        self.assertIn("val_ema.top1", epochs[1])

    def test_log_is_dllogger_json_stream(self):
        records = dllogger(os.path.join(self.ws, "log.json"))
        for r in records:
            for key in ("timestamp", "datetime", "elapsedtime", "type"):
                self.assertIn(key, r)
            float(r["timestamp"]), float(r["elapsedtime"])  # DLLogger writes them as strings
        params = [r for r in records if r.get("step") == "PARAMETER"]
        self.assertEqual(len(params), 1)
        self.assertEqual(params[0]["data"]["label_smoothing"], 0.1)
        steps = [r for r in records if isinstance(r.get("step"), list) and len(r["step"]) == 2]
        self.assertEqual(len(steps), 64)  # --print-freq 1
        for key in ("train.loss", "train.total_ips", "train.compute_ips", "train.data_time", "train.compute_time",
                    "train.lr"):
            self.assertIn(key, steps[0]["data"])
        epoch = [r for r in records if isinstance(r.get("step"), list) and len(r["step"]) == 1][0]["data"]
        for key in ("val.top1", "val.top5", "val.loss", "val.compute_ips", "val.compute_latency_at95",
                    "val.compute_latency_at99"):
            self.assertIn(key, epoch)
        self.assertTrue(any(r.get("step") == [] for r in records))
        metadata = [r for r in records if r["type"] == "METADATA"]
        self.assertIn("val.top1", [m["metric"] for m in metadata])

    def test_checkpoint_holds_model_ema_optimizer_and_metadata(self):
        tensors, meta = pth2safetensors.read_safetensors(os.path.join(self.ws, "last.safetensors"))
        m = json.loads(meta["convnets"])
        self.assertEqual(m["format"], "convnets-checkpoint/1")
        self.assertEqual((m["arch"], m["num_classes"], m["epoch"], m["step"]), ("resnet8", 10, 2, 64))
        self.assertEqual(m["class_names"], fixtures.fashion_class_names())  # the dataset's README's, not numbers
        self.assertEqual(m["preprocessing"]["input_size"], 28)
        self.assertEqual(m["config"]["ema"], 0.9)
        self.assertGreater(m["best_top1"], 60.0)
        for prefix in ("model.", "ema.", "optimizer.momentum."):
            self.assertTrue(any(k.startswith(prefix) for k in tensors), prefix)
        self.assertIn("model.fc.weight", tensors)
        self.assertFalse((tensors["model.fc.weight"] == tensors["ema.fc.weight"]).all())

    def test_eval_reproduces_the_logged_validation(self):
        r = convnets("eval", FASHION, "--checkpoint", os.path.join(self.ws, "last.safetensors"), "--max-images",
                     "1000", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout)
        epochs = [x["data"] for x in dllogger(os.path.join(self.ws, "log.json"))
                  if isinstance(x.get("step"), list) and len(x["step"]) == 1]
        self.assertEqual(got["images"], 1000)
        self.assertAlmostEqual(got["val.top1"], epochs[-1]["val.top1"], places=6)
        self.assertAlmostEqual(got["val.loss"], epochs[-1]["val.loss"], places=4)
        table = convnets("eval", FASHION, "--checkpoint", os.path.join(self.ws, "last.safetensors"),
                         "--max-images", "300", "--top-k", "3", "--ema", "--batch-size", "100")
        self.assertEqual(table.returncode, 0, table.stderr)
        self.assertRegex(table.stdout, r"top-3\s+\d+\.\d+ %")
        self.assertRegex(table.stdout, r"latency ms\s+mean [\d.]+\s+p50 [\d.]+\s+p90 [\d.]+\s+p95 [\d.]+\s+p99")
        k = convnets("eval", FASHION, "--checkpoint", os.path.join(self.ws, "last.safetensors"), "--max-images",
                     "100", "--top-k", "50", "--json")
        self.assertIn("val.top10", json.loads(k.stdout))  # k capped at the class count

    def test_eval_and_the_report_name_the_classes_as_the_dataset_does(self):
        # Fashion-MNIST's IDX files carry numbers; its README names the labels, and so do eval's per-class table and
        # the report's confusion matrix.
        names = fixtures.fashion_class_names()
        per_class = os.path.join(self.tmp, "per-class.json")
        r = convnets("eval", FASHION, "--checkpoint", os.path.join(self.ws, "last.safetensors"), "--max-images", "300",
                     "--per-class", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(per_class, "w") as f:
            f.write(r.stdout)
        self.assertEqual([row["class"] for row in json.loads(r.stdout)["per_class"]], names)
        out = os.path.join(self.tmp, "named.html")
        r = convnets("report", self.ws, "--eval", per_class, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            html = f.read()
        for name in names:  # each row's and column's label, and each cell's title, of the confusion matrix
            self.assertIn(f"<title>{name} -> ", html)
        # A checkpoint of the same classes, numbered (trained where the files' folder does not name the set, as
        # runs before the names were), still evaluates on the named set.
        digits = os.path.join(self.tmp, "idx")
        os.makedirs(digits, exist_ok=True)
        for f in os.listdir(FASHION):
            os.symlink(os.path.join(FASHION, f), os.path.join(digits, f))
        ws = os.path.join(self.tmp, "numbered")
        r = subprocess.run([BIN, "train", digits, "--recipe", "fashion-mnist-resnet8", "--epochs", "1",
                            "--max-train-images", "256", "--batch-size", "64", "--training-only", "--warmup", "0",
                            "--workspace", ws], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        _, meta = pth2safetensors.read_safetensors(os.path.join(ws, "last.safetensors"))
        self.assertEqual(json.loads(meta["convnets"])["class_names"], [str(i) for i in range(10)])
        r = convnets("eval", FASHION, "--checkpoint", os.path.join(ws, "last.safetensors"), "--max-images", "100")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_report_is_self_contained_html_with_five_charts(self):
        out = os.path.join(self.tmp, "report.html")
        r = convnets("report", self.ws, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            html = f.read()
        self.assertEqual(html.count("<svg"), 5)
        for title in ("Loss", "Top-1 accuracy", "Top-5 accuracy", "Learning rate", "Throughput"):
            self.assertIn(f'aria-label="{title}"', html)
        self.assertNotIn("<script", html)
        self.assertNotRegex(html, r'(src|href)="(https?:)?//')
        self.assertIn('data-name="val top-1 (EMA)"', html)
        # 2 epochs of loss x2, top-1 x2, top-5 x2, ips x2 (LR: 64 steps, no dots)
        self.assertEqual(html.count('<circle'), 4 * 2 * 2)
        bad = convnets("report", os.path.join(self.tmp, "nope"), "-o", out)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("nope", bad.stderr)

    def test_workspace_with_a_run_is_not_overwritten(self):
        before = digest(self.ws)
        r = subprocess.run(train_cmd("--epochs", "1", "--workspace", self.ws), capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("already holds a run", r.stderr)
        self.assertIn("--resume", r.stderr)
        self.assertEqual(digest(self.ws), before)

    def test_resume_auto_takes_the_newest_checkpoint_that_verifies(self):
        with tempfile.TemporaryDirectory() as tmp:
            ws = os.path.join(tmp, "run")
            shutil.copytree(self.ws, ws)
            last, best = os.path.join(ws, "last.safetensors"), os.path.join(ws, "best.safetensors")
            # One byte of the file's last tensor flipped, as a failing disk or a copy can: its checksum names it.
            with open(last, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            name = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
            with open(last, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                byte = f.read(1)[0]
                f.seek(-1, os.SEEK_END)
                f.write(bytes([byte ^ 0x10]))
            before = digest(ws)
            r = convnets("train", "--resume", last, "--epochs", "3")
            self.assertEqual(r.returncode, 1)
            self.assertIn(f"--resume {last}: safetensors file '{last}', tensor '{name}': its bytes do not match the "
                          "CRC-32C written with them", r.stderr)
            self.assertIn(f"--resume {best}", r.stderr)  # the hint: the checkpoints that remain
            self.assertEqual(digest(ws), before)

            r = convnets("train", "--resume", "auto", "--workspace", ws, "--epochs", "3")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"resume: auto: skipped {last}: safetensors file '{last}', tensor '{name}'", r.stdout)
            self.assertIn(f"resume: auto: {best}, the newest checkpoint in {ws} that verifies", r.stdout)
            meta = json.loads(pth2safetensors.read_safetensors(last)[1]["convnets"])
            self.assertEqual((meta["epoch"], meta["step"]), (3, 96))  # best was epoch 2's: one more epoch of 32 steps

            # A torchrun restart resumes by itself: the workspace's newest, now the repaired `last`.
            r = runner.run([BIN, "train", "--workspace", ws, "--epochs", "4"], capture_output=True, text=True,
                           env=dict(os.environ, TORCHELASTIC_RESTART_COUNT="1"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("resume: torchrun's restart 1: --resume auto", r.stdout)
            self.assertIn(f"resume: auto: {last}, the newest", r.stdout)
            self.assertEqual(json.loads(pth2safetensors.read_safetensors(last)[1]["convnets"])["step"], 128)
            # A torchrun job with a name resumes only its own checkpoints: these are no job's, so it stops, naming
            # the file, before anything is written.
            before = os.path.getmtime(last)
            r = runner.run([BIN, "train", "--workspace", ws, "--epochs", "5"], capture_output=True, text=True,
                           env=dict(os.environ, TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_RUN_ID="rn50"))
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn(f"torchrun job rn50: the newest checkpoint in {ws} that verifies, {last}, is no torchrun "
                          "job's", r.stderr)
            self.assertIn("--resume that checkpoint by name", r.stderr)
            self.assertEqual(os.path.getmtime(last), before)

    def test_resume_auto_reads_a_workspace_of_epoch_checkpoints_newest_first(self):
        # A workspace as --save-every leaves it: last, epoch-2 (a copy of it), best and epoch-1, newest first by
        # their times. The run is over (2 of 2 epochs), so each resume below only loads and ends.
        def workspace(name):
            ws = os.path.join(tmp, name)
            shutil.copytree(self.ws, ws)
            shutil.copy(os.path.join(ws, "last.safetensors"), os.path.join(ws, "epoch-2.safetensors"))
            shutil.copy(os.path.join(ws, "best.safetensors"), os.path.join(ws, "epoch-1.safetensors"))
            files = [os.path.join(ws, n + ".safetensors") for n in ("last", "epoch-2", "best", "epoch-1")]
            now = time.time()
            for age, path in enumerate(files):
                os.utime(path, (now - 10 * age, now - 10 * age))
            return ws, files

        def damage(path):  # the file's last byte: its last tensor's checksum names it
            with open(path, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                byte = f.read(1)[0]
                f.seek(-1, os.SEEK_END)
                f.write(bytes([byte ^ 0x10]))

        def train_in(ws, *args, **env):
            return runner.run([BIN, "train", "--workspace", ws, *args], capture_output=True, text=True,
                              env=dict(os.environ, **env))

        with tempfile.TemporaryDirectory() as tmp:
            ws, (last, epoch2, best, epoch1) = workspace("newest-damaged")
            damage(last)
            damage(epoch2)
            r = train_in(ws, "--resume", "auto")
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = [f"resume: auto: skipped {last}: ", f"resume: auto: skipped {epoch2}: ",
                     f"resume: auto: {best}, the newest checkpoint in {ws} that verifies"]
            at = [r.stdout.find(line) for line in lines]
            self.assertNotIn(-1, at, r.stdout)
            self.assertEqual(at, sorted(at), "not newest first:\n" + r.stdout)
            self.assertNotIn(epoch1, r.stdout)  # never reached: best verified first

            # None loads: refused, every file as it was.
            damage(best)
            damage(epoch1)
            before = digest(ws)
            r = train_in(ws, "--resume", "auto")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn(f"--resume auto: none of the 4 checkpoints in {ws} loads (first: {last}: ", r.stderr)
            self.assertEqual(digest(ws), before)

            # Slurm's --requeue restarts the job with SLURM_RESTART_COUNT set: it resumes by itself.
            ws, (last, _, _, _) = workspace("requeued")
            r = train_in(ws, SLURM_RESTART_COUNT="2")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("resume: Slurm's requeue 2: --resume auto", r.stdout)
            self.assertIn(f"resume: auto: {last}, the newest checkpoint in {ws} that verifies", r.stdout)

            # The newest checkpoint is another torchrun job's: a job with its own name stops before writing.
            ws, (last, _, _, _) = workspace("other-job")

            def other_job(header):
                record = json.loads(header["__metadata__"]["convnets"])
                record["torchrun_job"] = "rn18"
                header["__metadata__"]["convnets"] = json.dumps(record)

            fixtures.rewrite_safetensors(last, last, edit_header=other_job)
            before = digest(ws)
            r = train_in(ws, TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_RUN_ID="rn50")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn(f"torchrun job rn50: the newest checkpoint in {ws} that verifies, {last}, is torchrun job "
                          "rn18's", r.stderr)
            self.assertEqual(digest(ws), before)

    def test_resume_auto_starts_anew_where_only_a_stopped_runs_log_is_left(self):
        with tempfile.TemporaryDirectory() as tmp:
            ws = os.path.join(tmp, "run")
            os.makedirs(ws)
            # What a run killed before its first checkpoint leaves: its log, unlocked.
            left = os.path.join(ws, "log.json")
            shutil.copy(os.path.join(self.ws, "log.json"), left)
            with open(left, "rb") as f:
                logged = f.read()
            tiny = ("--epochs", "1", "--max-train-images", "256", "--max-val-images", "100", "--workspace", ws)
            r = subprocess.run(train_cmd(*tiny), capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("with no checkpoint to resume from", r.stderr)
            self.assertIn("--resume auto", r.stderr)
            r = subprocess.run(train_cmd(*tiny, "--resume", "auto"), capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"resume: auto: {ws} holds no checkpoint; a new run starts", r.stdout)
            self.assertIn(f"kept as {left}.stopped-1, a new run starts", r.stderr)
            with open(left + ".stopped-1", "rb") as f:
                self.assertEqual(f.read(), logged)
            self.assertTrue(os.path.exists(os.path.join(ws, "last.safetensors")))

    def test_bad_input_is_named_and_leaves_the_workspace_untouched(self):
        before = digest(self.ws)
        last = os.path.join(self.ws, "last.safetensors")
        corrupt = os.path.join(self.tmp, "corrupt.safetensors")
        with open(last, "rb") as f, open(corrupt, "wb") as g:
            g.write(f.read()[:5000])
        empty = os.path.join(self.tmp, "empty_classes")
        os.makedirs(os.path.join(empty, "cat"), exist_ok=True)
        cases = [
            (["/nonexistent/data"], "/nonexistent/data"),
            ([empty], "class 'cat' has no images"),
            (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
            (["--lr", "-0.1"], "--lr must be a non-negative number, got -0.1"),
            (["--mixup", "-1"], "--mixup must be alpha >= 0"),
            (["--precision", "amp"], "--precision amp needs a CUDA GPU"),
            (["--precision", "fp64"], "--precision 'fp64': expected fp32 | tf32 | amp | bf16"),
            (["--epochs", "1.5"], "--epochs expects an integer, got '1.5'"),
            (["--resume", last, "--arch", "resnet20"], "was trained as resnet8, but this run is resnet20"),
            (["--resume", corrupt], "corrupt.safetensors"),
            (["--recipe", "no-such-recipe"], "built-in recipes: fashion-mnist-resnet10s, fashion-mnist-resnet8"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                r = subprocess.run(train_cmd("--workspace", self.ws, *args), capture_output=True, text=True)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(message, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertNotIn("Exception raised from", r.stderr)  # no LibTorch stack traces
        self.assertEqual(digest(self.ws), before)

    def test_fine_tune_to_another_class_count_gets_a_new_classifier(self):
        from PIL import Image
        import numpy as np
        folder = os.path.join(self.tmp, "three")
        rng = np.random.default_rng(0)
        for c in ("a", "b", "c"):
            os.makedirs(os.path.join(folder, c), exist_ok=True)
            for i in range(8):
                Image.fromarray(rng.integers(0, 255, (28, 28, 3), dtype=np.uint8)).save(
                    os.path.join(folder, c, f"{i}.png"))
        ws = os.path.join(self.tmp, "fine")
        r = convnets("train", folder, "--arch", "resnet8", "--fine-tune",
                     os.path.join(self.ws, "last.safetensors"), "--training-only", "--epochs", "1", "--warmup", "0", "--batch-size",
                     "8", "--image-size", "28", "--device", "cpu", "--precision", "fp32", "--workspace", ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("new classifier (fc.weight, fc.bias)", r.stdout)
        tensors, meta = pth2safetensors.read_safetensors(os.path.join(ws, "last.safetensors"))
        self.assertEqual(list(tensors["model.fc.weight"].shape), [3, 64])
        self.assertEqual(json.loads(meta["convnets"])["class_names"], ["a", "b", "c"])
        src, _ = pth2safetensors.read_safetensors(os.path.join(self.ws, "last.safetensors"))
        # Everything but the classifier started from the given weights (one step of lr 0.0125 moved them a little).
        self.assertLess((tensors["model.conv1.weight"] - src["model.conv1.weight"]).abs().max().item(), 0.05)


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class InterruptAndResume(unittest.TestCase):
    ARGS = ["--epochs", "3", "--max-train-images", "1024", "--ema", "0.99", "--mixup", "0.2", "--workers", "2"]

    def interrupt(self, cmd, at_line, sig):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in p.stdout:
            if at_line in line:
                p.send_signal(sig)
                break
        out, err = p.communicate(timeout=300)
        return p.returncode, err

    def test_killed_run_resumes_bit_exact(self):
        with tempfile.TemporaryDirectory() as tmp:
            a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
            r = subprocess.run(train_cmd(*self.ARGS, "--workspace", a), capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)

            # SIGINT mid-epoch 2 (of 16 steps each), then SIGTERM mid-epoch 3 of the resumed run.
            code, err = self.interrupt(train_cmd(*self.ARGS, "--workspace", b), "epoch 2/3 train 5/16", signal.SIGINT)
            self.assertEqual(code, 128 + signal.SIGINT, err)
            self.assertIn("interrupted by SIGINT at epoch 2", err)
            resume = os.path.join(b, "last.safetensors")
            self.assertIn("resume with: convnets train --resume " + resume, err)
            meta = json.loads(pth2safetensors.read_safetensors(resume)[1]["convnets"])
            self.assertEqual(meta["epoch"], 1)  # 0-based epoch in progress
            self.assertGreaterEqual(meta["step_in_epoch"], 5)
            self.assertLess(meta["step_in_epoch"], 16)

            code, err = self.interrupt([BIN, "train", "--resume", resume, "--print-freq", "1"],
                                       "epoch 3/3 train 9/16", signal.SIGTERM)
            self.assertEqual(code, 128 + signal.SIGTERM, err)
            r = runner.run([BIN, "train", "--resume", resume], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)

            ta, ma = pth2safetensors.read_safetensors(os.path.join(a, "last.safetensors"))
            tb, mb = pth2safetensors.read_safetensors(resume)
            self.assertEqual(sorted(ta), sorted(tb))
            differing = [k for k in ta if not (ta[k] == tb[k]).all()]
            self.assertEqual(differing, [], "resumed run differs from the uninterrupted one")
            self.assertTrue(any(k.startswith("ema.") for k in ta))
            self.assertEqual(json.loads(ma["convnets"])["step"], json.loads(mb["convnets"])["step"])
            self.assertEqual(json.loads(ma["convnets"])["best_top1"], json.loads(mb["convnets"])["best_top1"])


if __name__ == "__main__":
    unittest.main()
