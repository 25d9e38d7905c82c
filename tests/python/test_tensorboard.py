"""Watching a run: `convnets train --tensorboard`'s event files read by TensorBoard's own reader (PyPI
`tensorboard`), and `convnets report --watch` following a live run.

Every scalar of log.json is found under its name with the same global step and
value (float32, as TensorBoard stores them), the resolved config as text, the
first batch as images; a record cut at the end of a file (a run killed
mid-write) is skipped by the reader, and a run resumed from an earlier
checkpoint shows each step once, with the values of the resumed run.
"""
import fcntl
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator as ea

import runner

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"


def convnets(*args, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def read_log(path):
    with open(path) as f:
        return [json.loads(line.removeprefix("DLLL ")) for line in f if line.startswith("DLLL ")]


def load(folder):
    acc = ea.EventAccumulator(folder, size_guidance={ea.SCALARS: 0, ea.IMAGES: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def expected_scalars(log):
    """{(tag, global step): value} from log.json, the last entry winning (a resumed run's)."""
    steps_per_epoch = max(e["step"][1] for e in log if e["type"] == "LOG" and len(e.get("step", [])) == 2)
    out = {}
    for e in log:
        if e["type"] != "LOG" or not isinstance(e["step"], list) or not e["step"]:
            continue
        if len(e["step"]) == 2:
            step = (e["step"][0] - 1) * steps_per_epoch + e["step"][1]
            items = {k: v for k, v in e["data"].items()}
        else:
            step = e["step"][0] * steps_per_epoch
            items = {(k if k.startswith("val") else "epoch/" + k): v for k, v in e["data"].items()}
        for k, v in items.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[(k, step)] = v
    return out


@unittest.skipUnless(os.path.isdir(FASHION), f"{FASHION} (Debian's fashion-mnist package) is not installed")
class TensorBoard(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-tb-")
        cls.ws = os.path.join(cls.tmp, "run")
        cls.common = ["--recipe", "fashion-mnist-resnet8", "--workspace", cls.ws, "--max-train-images", "1280",
                      "--max-val-images", "500", "--print-freq", "5", "--epochs", "3"]
        cls.first = convnets("train", *cls.common, "--tensorboard", "--save-every", "2")
        cls.tb = os.path.join(cls.ws, "tensorboard")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_1_every_logged_scalar_config_and_images(self):
        self.assertEqual(self.first.returncode, 0, self.first.stdout + self.first.stderr)
        acc = load(self.tb)
        want = expected_scalars(read_log(os.path.join(self.ws, "log.json")))
        tags = set(acc.Tags()["scalars"])
        for name in ("train.loss", "train.lr", "train.total_ips", "val.top1", "val.top5", "val.loss",
                     "val.compute_latency_at99", "epoch/train.loss"):
            self.assertIn(name, tags)
        got = {(t, s.step): s.value for t in tags for s in acc.Scalars(t)}
        self.assertEqual(set(got), set(want))
        for key, v in want.items():
            self.assertEqual(got[key], float(np.float32(v)), key)
        text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
        self.assertIn('"arch": "resnet8"', text)
        self.assertIn('"tensorboard": true', text)
        images = [t for t in acc.Tags()["images"] if t.startswith("train/first_batch/")]
        self.assertEqual(len(images), 8)
        event = acc.Images(images[0])[0]
        self.assertEqual(event.step, 0)
        pixels = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)))
        self.assertEqual(pixels.shape[:2], (28, 28))
        self.assertGreater(pixels.std(), 10)  # an image, not a blank

    def test_2_a_cut_record_is_skipped_and_a_resume_shows_each_step_once(self):
        self.assertEqual(self.first.returncode, 0, self.first.stdout + self.first.stderr)
        files = sorted(os.listdir(self.tb))
        self.assertEqual(len(files), 1)
        path = os.path.join(self.tb, files[0])
        with open(path, "r+b") as f:  # killed inside the last record
            f.truncate(os.path.getsize(path) - 7)
        cut = load(self.tb)
        self.assertIn("val.top1", cut.Tags()["scalars"])
        # Epoch 3 again, from the epoch-2 checkpoint: its steps were logged once already.
        r = convnets("train", "--workspace", self.ws, "--resume", os.path.join(self.ws, "epoch-2.safetensors"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len(os.listdir(self.tb)), 2)  # a new file; the cut one is left as it is
        acc = load(self.tb)
        want = expected_scalars(read_log(os.path.join(self.ws, "log.json")))
        for tag in acc.Tags()["scalars"]:
            steps = [s.step for s in acc.Scalars(tag)]
            self.assertEqual(len(steps), len(set(steps)), tag)  # no step twice
            self.assertEqual(steps, sorted(steps), tag)
        got = {(t, s.step): s.value for t in acc.Tags()["scalars"] for s in acc.Scalars(t)}
        for key, v in want.items():
            self.assertEqual(got[key], float(np.float32(v)), key)  # the resumed run's values for epoch 3
        # summary.csv likewise: epoch 3 once, with the resumed run's figures.
        import csv
        with open(os.path.join(self.ws, "summary.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([int(row["epoch"]) for row in rows], [1, 2, 3])
        last = [x for x in read_log(os.path.join(self.ws, "log.json")) if x.get("step") == [3]][-1]["data"]
        self.assertEqual(float(rows[2]["eval_top1"]), last["val.top1"])
        self.assertEqual(float(rows[2]["train_loss"]), last["train.loss"])


@unittest.skipUnless(os.path.isdir(FASHION), f"{FASHION} (Debian's fashion-mnist package) is not installed")
class ReportWatch(unittest.TestCase):
    def test_the_page_follows_a_live_run_and_stops_when_it_ends(self):
        tmp = tempfile.mkdtemp(prefix="convnets-watch-")
        self.addCleanup(shutil.rmtree, tmp)
        ws, page = os.path.join(tmp, "run"), os.path.join(tmp, "report.html")
        # Started first: it waits for the run's log to appear.
        watch = subprocess.Popen([BIN, "report", ws, "-o", page, "--watch", "1"], stdout=subprocess.PIPE, text=True)
        train = subprocess.Popen([BIN, "--threads", "1", "train", "--recipe", "fashion-mnist-resnet8", "--workspace", ws,
                                  "--max-train-images", "1920", "--max-val-images", "500", "--epochs", "3",
                                  "--print-freq", "5"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = set()
        while train.poll() is None:
            if os.path.exists(page):
                with open(page, encoding="utf-8") as f:
                    seen.add(f.read())
            time.sleep(0.3)
        self.assertEqual(train.returncode, 0, train.stderr.read())
        out, _ = watch.communicate(timeout=60)
        self.assertEqual(watch.returncode, 0, out)
        live = [p for p in seen if '<meta http-equiv="refresh" content="1">' in p]
        self.assertGreaterEqual(len(live), 2)  # rewritten while the run went on
        with open(page, encoding="utf-8") as f:
            final = f.read()
        self.assertNotIn("http-equiv=\"refresh\"", final)  # the run ended: the last page stays
        self.assertIn("<th>epochs logged</th><td>3 of 3</td>", final)
        self.assertRegex(final, r"<th>validation top-1</th><td>\d+\.\d\d %</td>")
        self.assertRegex(final, r"<th>validation latency, p99 \(per batch\)</th><td>\d+\.\d\d ms</td>")
        self.assertIn("train loss (per 5 steps)", final)
        self.assertNotIn("stopped without logging its summary", out)

    def test_a_live_run_is_locked_and_a_killed_one_ends_the_watch(self):
        tmp = tempfile.mkdtemp(prefix="convnets-watch-")
        self.addCleanup(shutil.rmtree, tmp)
        ws, page = os.path.join(tmp, "run"), os.path.join(tmp, "report.html")
        log = os.path.join(ws, "log.json")
        train = subprocess.Popen([BIN, "--threads", "1", "train", "--recipe", "fashion-mnist-resnet8", "--workspace", ws,
                                  "--max-train-images", "1280", "--max-val-images", "500", "--epochs", "60",
                                  "--print-freq", "5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(train.kill)
        deadline = time.time() + 300
        last = os.path.join(ws, "last.safetensors")
        while not os.path.exists(last):
            self.assertIsNone(train.poll(), "the run ended before its first checkpoint")
            self.assertLess(time.time(), deadline, "no checkpoint in 300 s")
            time.sleep(0.3)
        # A second process resuming the live run is refused before it touches the workspace.
        r = convnets("train", "--workspace", ws, "--resume", last)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(log + " is being written by another convnets process", r.stderr)
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--workspace", ws)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("already holds a run", r.stderr)
        watch = subprocess.Popen([BIN, "report", ws, "-o", page, "--watch", "1"], stdout=subprocess.PIPE, text=True)
        self.addCleanup(watch.kill)
        time.sleep(2.5)  # two of the watch's ticks
        self.assertIsNone(watch.poll(), "the watch stopped while the run was live")
        with open(page, encoding="utf-8") as f:
            self.assertIn('http-equiv="refresh"', f.read())
        train.kill()  # SIGKILL: no summary, no clean-up
        train.wait()
        out, _ = watch.communicate(timeout=30)
        self.assertEqual(watch.returncode, 0, out)
        self.assertIn("the run stopped without logging its summary", out)
        with open(page, encoding="utf-8") as f:
            final = f.read()
        self.assertNotIn('http-equiv="refresh"', final)
        self.assertIn("No summary: the run is still going or stopped before its end", final)


    def test_a_resumed_run_is_watched_from_its_start_to_its_new_end(self):
        tmp = tempfile.mkdtemp(prefix="convnets-watch-")
        self.addCleanup(shutil.rmtree, tmp)
        ws, page = os.path.join(tmp, "run"), os.path.join(tmp, "report.html")
        base = ["train", "--recipe", "fashion-mnist-resnet8", "--workspace", ws,
                "--max-train-images", "1280", "--max-val-images", "500", "--epochs", "3", "--print-freq", "5"]
        r = convnets(*base, "--run-epochs", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len([x for x in read_log(os.path.join(ws, "log.json")) if x.get("step") == []]), 1)
        # The log holds that invocation's summary; the resumed run must not be
        # taken for ended by it, nor for killed while it loads data and model
        # (its log is locked from its first moment).
        train = subprocess.Popen([BIN, "--threads", "1"] + base + ["--resume", os.path.join(ws, "last.safetensors")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(train.kill)
        # The watch starts once the resumed process holds the log (as a user
        # starts it after the resume), before that process has logged anything.
        deadline = time.time() + 60
        with open(os.path.join(ws, "log.json"), "rb") as f:
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    break
                self.assertIsNone(train.poll(), "the resumed run ended before it was seen")
                self.assertLess(time.time(), deadline, "the resumed run never locked its log")
                time.sleep(0.01)
        watch = subprocess.Popen([BIN, "report", ws, "-o", page, "--watch", "1"], stdout=subprocess.PIPE, text=True)
        self.addCleanup(watch.kill)
        self.assertEqual(train.wait(timeout=600), 0, train.stderr.read())
        out, _ = watch.communicate(timeout=60)
        self.assertEqual(watch.returncode, 0, out)
        self.assertNotIn("stopped without logging its summary", out)
        self.assertIn("live", out)  # it watched the resumed run rather than ending on the old summary
        with open(page, encoding="utf-8") as f:
            final = f.read()
        self.assertNotIn('http-equiv="refresh"', final)
        # The resumed run keeps the checkpoint's --run-epochs 1: one more epoch, its own summary.
        self.assertIn("<th>epochs logged</th><td>2 of 3</td>", final)

    def test_an_empty_log_nobody_writes_ends_the_watch_with_an_error(self):
        # A run killed between creating its log and its first line.
        with tempfile.TemporaryDirectory() as ws:
            open(os.path.join(ws, "log.json"), "w").close()
            r = runner.run([BIN, "report", ws, "-o", os.path.join(ws, "r.html"), "--watch", "1"],
                           capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("log.json holds no complete line and no process writes it", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(ws, "r.html")))

    def test_a_log_whose_writer_does_not_lock_is_watched_until_its_summary(self):
        # DLE's Python DLLogger takes no lock: its unlocked log says nothing
        # about whether the run is going, so only the summary ends the watch.
        tmp = tempfile.mkdtemp(prefix="convnets-watch-")
        self.addCleanup(shutil.rmtree, tmp)
        log, page = os.path.join(tmp, "log.json"), os.path.join(tmp, "report.html")
        with open(log, "w") as f:
            f.write('DLLL {"type": "LOG", "step": "PARAMETER", "data": {"arch": "resnet50", "epochs": 2}}\n')
            f.write('DLLL {"type": "LOG", "step": [1], "data": {"train.loss": 2.5, "val.top1": 40.0}}\n')
        watch = subprocess.Popen([BIN, "report", log, "-o", page, "--watch", "1"], stdout=subprocess.PIPE, text=True)
        self.addCleanup(watch.kill)
        time.sleep(3)  # three of the watch's ticks
        self.assertIsNone(watch.poll(), "the watch of an unlocked DLE log ended without its summary")
        with open(log, "a") as f:
            f.write('DLLL {"type": "LOG", "step": [2], "data": {"train.loss": 2.0, "val.top1": 50.0}}\n')
            f.write('DLLL {"type": "LOG", "step": [], "data": {"val.top1": 50.0}}\n')
        out, _ = watch.communicate(timeout=30)
        self.assertEqual(watch.returncode, 0, out)
        self.assertNotIn("stopped without logging its summary", out)


@unittest.skipUnless(os.path.isdir(FASHION), f"{FASHION} (Debian's fashion-mnist package) is not installed")
class LeftLog(unittest.TestCase):
    def test_a_log_without_checkpoint_says_no_run_is_going(self):
        with tempfile.TemporaryDirectory() as ws:
            with open(os.path.join(ws, "log.json"), "w") as f:
                f.write('DLLL {"type": "LOG", "step": "PARAMETER", "data": {}}\n')
            r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--workspace", ws)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("already holds a run's log (%s/log.json), with no checkpoint to resume from" % ws, r.stderr)
            self.assertEqual(os.listdir(ws), ["log.json"])  # nothing written


class TensorBoardFolder(unittest.TestCase):
    """`--tensorboard [DIR]`: the folder is optional, and a value that swallowed DATA is named."""

    def test_the_optional_folder(self):
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--tensorboard", "/tmp/tb-elsewhere",
                     "--print-config")
        self.assertEqual(r.returncode, 0, r.stderr)
        config = json.loads(r.stdout)
        self.assertEqual((config["tensorboard"], config["tensorboard_dir"]), (True, "/tmp/tb-elsewhere"))
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--tensorboard", "--print-config")
        self.assertEqual(r.returncode, 0, r.stderr)
        config = json.loads(r.stdout)
        self.assertEqual((config["tensorboard"], config["tensorboard_dir"]), (True, ""))
        # Given twice, the last one wins (as for every flag), with or without its folder.
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--tensorboard", "--tensorboard", "/tmp/tb-last",
                     "--print-config")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["tensorboard_dir"], "/tmp/tb-last")
        r = convnets("train", "--arch", "resnet18", "--tensorboard", "/data/imagenet")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--tensorboard took '/data/imagenet' as its folder", r.stderr)
        self.assertIn("put DATA before --tensorboard", r.stderr)
        r = convnets("train", "--recipe", "fashion-mnist-resnet8", "--tensorboard", "a", "--tensorboard-dir", "b",
                     "--print-config")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("name two folders", r.stderr)


if __name__ == "__main__":
    unittest.main()
