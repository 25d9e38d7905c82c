"""Faults during a training run (issue 21): a full disk while a checkpoint is written, kill -9 at random moments,
image files that vanish or stop being files mid-run, and a damaged last.safetensors on --resume.

Small runs: ResNet-8 on 64 Fashion-MNIST images (4 steps an epoch) or on a few dozen generated PNGs.
"""
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kill_resume  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"
TINY = ["--recipe", "fashion-mnist-resnet8", "--max-train-images", "64", "--max-val-images", "32", "--batch-size", "16",
        "--workers", "1", "--print-freq", "1"]
NEEDS_FASHION = unittest.skipUnless(os.path.isdir(FASHION),
                                    "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")


def train(*args, timeout=300):
    return runner.run([BIN, "train", *args], capture_output=True, text=True,
                      errors="backslashreplace", timeout=timeout)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_text(path):
    with open(path) as f:
        return f.read()


def sha256(path):
    return hashlib.sha256(read_bytes(path)).hexdigest()


def digest(folder):
    return {name: sha256(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, name))}


def log_records(path):
    """Every line of a DLLogger file, parsed: a line that does not parse fails the caller."""
    with open(path) as f:
        text = f.read()
    assert text.endswith("\n"), f"{path} ends in an unfinished line: {text[-80:]!r}"
    records = []
    for line in text.splitlines():
        assert line.startswith("DLLL "), f"{path}: not a DLLogger line: {line[:80]!r}"
        records.append(json.loads(line[5:]))
    return records


def epoch_records(path):
    return {r["step"][0]: r["data"] for r in log_records(path)
            if r["type"] == "LOG" and isinstance(r["step"], list) and len(r["step"]) == 1}


def checkpoint_meta(path):
    return kill_resume.read_checkpoint(path)[1]


_base = {}


def base_workspace():
    """A finished 2-epoch run (of 3) with last, best, epoch-1 and epoch-2, made once; tests work on copies."""
    if "ws" not in _base:
        _base["tmp"] = tempfile.mkdtemp(prefix="convnets-faults-")
        ws = os.path.join(_base["tmp"], "base")
        r = train(FASHION, *TINY, "--epochs", "3", "--run-epochs", "2", "--save-every", "1", "--workspace", ws)
        assert r.returncode == 0, r.stderr
        _base["ws"] = ws
    return _base["ws"]


def copy_workspace(dest):
    shutil.copytree(base_workspace(), dest)  # copy2: modification times too, which order the hint's checkpoints
    return dest


def tearDownModule():
    if "tmp" in _base:
        shutil.rmtree(_base["tmp"], ignore_errors=True)


# ---- the disk fills while a checkpoint is written

def disk_full_scenario(mnt):
    """Runs with the workspace on the tmpfs at `mnt` and returns what happened, for the test to judge.

    A first run writes last and best (one epoch). A filler file then takes all the free space but half a
    checkpoint: room for another epoch's log lines, not for the new `last` written beside the old one. The resumed
    run trains epoch 2 and must fail on that save; with the filler gone it must resume from the `last` it left.
    """
    ws = os.path.join(mnt, "ws")
    last, best, log = (os.path.join(ws, n) for n in ("last.safetensors", "best.safetensors", "log.json"))
    filler = os.path.join(mnt, "filler")
    obs = {}
    r = train(FASHION, *TINY, "--epochs", "3", "--run-epochs", "1", "--workspace", ws)
    obs["first"] = [r.returncode, r.stderr]
    if r.returncode != 0:
        return obs
    obs["checkpoint_bytes"] = os.path.getsize(last)
    obs["before"] = {"last": sha256(last), "best": sha256(best), "log": read_text(log)}
    st = os.statvfs(mnt)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize - obs["checkpoint_bytes"] // 2)
    os.close(fd)
    r = train("--resume", last)
    st = os.statvfs(mnt)
    obs["second"] = [r.returncode, r.stderr]
    obs["free_after"] = st.f_bavail * st.f_frsize
    obs["files"] = sorted(os.listdir(ws))
    obs["after"] = {"last": sha256(last), "best": sha256(best), "log": read_text(log)}
    obs["eval"] = {}
    for name, path in (("last", last), ("best", best)):
        e = runner.run([BIN, "eval", FASHION, "--checkpoint", path, "--max-images", "16", "--json"],
                       capture_output=True, text=True, timeout=300)
        obs["eval"][name] = [e.returncode, e.stderr]
    os.remove(filler)
    r = train("--resume", last)
    obs["third"] = [r.returncode, r.stderr]
    obs["third_epoch"] = checkpoint_meta(last)["epoch"] if r.returncode == 0 else None
    obs["log_final"] = read_text(log)
    return obs


def tmpfs_observations(cls):
    """disk_full_scenario on a 16 MiB tmpfs: mounted here as root, else inside a user and mount namespace
    (unshare), else the tests are skipped with both reasons, never passed."""
    mnt = tempfile.mkdtemp(prefix="convnets-tmpfs-")
    cls.addClassCleanup(shutil.rmtree, mnt, True)
    reasons = []
    if os.geteuid() == 0:
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", mnt], capture_output=True, text=True)
        if m.returncode == 0:
            cls.addClassCleanup(subprocess.run, ["umount", "-l", mnt])
            return disk_full_scenario(mnt)
        reasons.append("mount -t tmpfs: " + (m.stderr.strip() or f"exit {m.returncode}"))
    else:
        reasons.append("not root, so no mount here")
    unshare = shutil.which("unshare")
    if unshare is None:
        reasons.append("no unshare(1)")
    else:
        u = subprocess.run([unshare, "--user", "--map-root-user", "--mount", sys.executable, os.path.abspath(__file__),
                            "--disk-full-scenario", mnt], capture_output=True, text=True, timeout=900)
        if u.returncode == 0:
            return json.loads(u.stdout.splitlines()[-1])
        if u.returncode != 77 and not u.stderr.startswith("unshare:"):
            raise AssertionError("the disk-full scenario failed inside the namespace:\n" + u.stderr)
        reasons.append("unshare: " + u.stderr.strip())
    raise unittest.SkipTest("no tmpfs could be mounted for the workspace: " + "; ".join(reasons))


@NEEDS_FASHION
class DiskFullWhileSaving(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.o = tmpfs_observations(cls)

    def setUp(self):
        self.assertEqual(self.o["first"][0], 0, self.o["first"][1])

    def test_error_names_the_file_the_bytes_needed_and_the_free_space(self):
        code, err = self.o["second"]
        self.assertEqual(code, 1, err)
        self.assertRegex(err, r"cannot write '[^']*/ws/last\.safetensors': No space left on device")
        m = re.search(r"it needs ([\d.]+) MiB \((\d+) bytes\), the filesystem of '([^']*)' has [\d.]+ MiB \((\d+) bytes\)"
                      r" free", err)
        self.assertIsNotNone(m, err)
        needed, free = int(m.group(2)), int(m.group(4))
        self.assertTrue(m.group(3).endswith("/ws"), m.group(3))
        # The new checkpoint is the old one's size give or take its metadata; free is what statvfs says is left.
        self.assertLess(abs(needed - self.o["checkpoint_bytes"]), 4096)
        self.assertLess(free, needed)
        self.assertLessEqual(abs(free - self.o["free_after"]), 64 * 1024)
        self.assertIn("hint: free space there", err)
        self.assertNotIn(".tmp.", err)  # the user's file, not the temporary one
        self.assertNotIn("Exception raised from", err)

    def test_previous_checkpoints_are_intact_and_no_partial_file_is_left(self):
        self.assertEqual(self.o["after"]["last"], self.o["before"]["last"])
        self.assertEqual(self.o["after"]["best"], self.o["before"]["best"])
        self.assertEqual([f for f in self.o["files"] if ".tmp." in f], [])
        for name in ("last", "best"):
            self.assertEqual(self.o["eval"][name][0], 0, f"{name}: {self.o['eval'][name][1]}")

    def test_log_keeps_what_was_written(self):
        before, after = self.o["before"]["log"], self.o["after"]["log"]
        self.assertTrue(after.startswith(before), "log.json lost or changed lines it had")
        self.assertTrue(after.endswith("\n"))
        records = [json.loads(line[5:]) for line in after.splitlines()]
        self.assertIn([2], [r.get("step") for r in records])  # epoch 2 was trained and logged before the save failed

    def test_resume_after_space_is_freed(self):
        self.assertEqual(self.o["third"][0], 0, self.o["third"][1])
        self.assertEqual(self.o["third_epoch"], 2)
        for line in self.o["log_final"].splitlines():
            json.loads(line[5:])


# ---- kill -9

@NEEDS_FASHION
class KillNine(unittest.TestCase):
    def test_kill_9_at_random_moments_then_resume(self):
        # The short version of kill_resume.py (run it with --trials 20 for the recorded loop): trials 1 and 3 land
        # the kill in a checkpoint write when the poll sees its temporary file in time, trial 2 at a random moment.
        s = kill_resume.run_trials(BIN, trials=3, seed=21, say=lambda line: print(line, file=sys.stderr))
        self.assertEqual(s["failures"], [])
        self.assertEqual(s["trials"], 3)
        self.assertTrue(s["bit_exact_with_uninterrupted_run"])
        # Each trial's exact bound is kill_resume's (the second save point after the step last holds); over all
        # trials that is at most twice the steps between saves.
        self.assertLessEqual(s["max_lost_steps"], 2 * s["steps_between_saves"])

    def test_a_checkpoint_written_in_the_background_resumes_bit_exactly(self):
        # Each last.safetensors the background saves rename into place is caught as it lands; the first from the
        # middle of the epoch, resumed in a workspace of its own, must end the epoch where a run that never saved
        # mid-epoch ends it, bit for bit: the snapshot is the state of its step, taken while the steps went on.
        # 32 steps an epoch, so that some of its 10 mid-epoch saves are caught whatever else the machine runs.
        steps = 32
        run = list(kill_resume.RUN)
        run[run.index("--max-train-images") + 1] = str(16 * steps)
        with tempfile.TemporaryDirectory() as tmp:
            ws, resumed, reference = (os.path.join(tmp, name) for name in ("run", "resumed", "reference"))
            os.makedirs(ws)
            os.makedirs(resumed)
            copy = os.path.join(resumed, "last.safetensors")
            watch = kill_resume.DirectoryWatch(ws)
            caught = None
            try:
                p = subprocess.Popen([BIN, "train", FASHION, *run, *kill_resume.SAVES, "--run-epochs", "1",
                                      "--workspace", ws], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                while p.poll() is None and caught is None:
                    for mask, name in watch.events(0.05):
                        if mask & kill_resume.DirectoryWatch.IN_MOVED_TO and name == "last.safetensors":
                            data = read_bytes(os.path.join(ws, name))  # the file renamed in, or a newer one: whole
                            with open(copy, "wb") as f:
                                f.write(data)
                            if checkpoint_meta(copy)["step_in_epoch"] != 0:
                                caught = checkpoint_meta(copy)
                                break
                output = p.communicate(timeout=300)[0]
            finally:
                watch.close()
            self.assertEqual(p.returncode, 0, output)
            self.assertIn("every 3 steps mid-epoch, written in the background", output)
            self.assertIsNotNone(caught, "no mid-epoch checkpoint was renamed into place:\n" + output)
            self.assertEqual(caught["step_in_epoch"] % kill_resume.SAVE_STEPS, 0)
            r = train("--resume", copy, "--workspace", resumed, "--run-epochs", "1")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"at epoch 1, step {caught['step_in_epoch']}/{steps}", r.stdout)
            r = train(FASHION, *run, "--run-epochs", "1", "--workspace", reference)
            self.assertEqual(r.returncode, 0, r.stderr)
            tensors, meta = kill_resume.read_checkpoint(copy)
            ref_tensors, ref_meta = kill_resume.read_checkpoint(os.path.join(reference, "last.safetensors"))
            self.assertEqual(sorted(tensors), sorted(ref_tensors))
            self.assertEqual([k for k in ref_tensors if tensors[k] != ref_tensors[k]], [],
                             f"resumed from step {caught['step']}, the run differs from one that never saved mid-epoch")
            self.assertEqual((meta["epoch"], meta["step"]), (ref_meta["epoch"], ref_meta["step"]))

    def test_resume_clears_what_a_killed_write_left(self):
        # What a kill in the middle of a save leaves, made on purpose so the test does not depend on timing: a
        # half-written temporary checkpoint of a dead process and a log line cut short.
        with tempfile.TemporaryDirectory() as tmp:
            ws = copy_workspace(os.path.join(tmp, "ws"))
            last, log = os.path.join(ws, "last.safetensors"), os.path.join(ws, "log.json")
            dead = subprocess.Popen(["true"])
            dead.wait()
            stale = f"{last}.tmp.{dead.pid}"
            live = os.path.join(ws, f"best.safetensors.tmp.{os.getpid()}")  # a writer still running: kept
            data = read_bytes(last)
            for path in (stale, live):
                with open(path, "wb") as f:
                    f.write(data[:len(data) // 2])
            whole = read_text(log)
            with open(log, "a") as f:
                f.write('DLLL {"timestamp": "17')
            r = train("--resume", last, "--workspace", ws)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"removed {stale}, left by an interrupted write", r.stdout)
            self.assertFalse(os.path.exists(stale))
            self.assertTrue(os.path.exists(live))
            self.assertIn(f"{log}: dropped its unfinished last line", r.stderr)
            after = read_text(log)
            self.assertTrue(after.startswith(whole))
            self.assertIn(3, epoch_records(log))  # every line parses, and the resumed epoch 3 is there
            self.assertEqual(checkpoint_meta(last)["epoch"], 3)


# ---- image files that vanish or stop being files mid-run

def make_pngs(folder, names):
    from PIL import Image
    import numpy as np
    rng = np.random.default_rng(0)
    for name in names:
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (28, 28, 3), dtype=np.uint8)).save(path)


SMALL_FILES = ["--arch", "resnet8", "--image-size", "28", "--training-only", "--warmup", "0", "--batch-size", "16",
               "--workers", "1", "--device", "cpu", "--precision", "fp32"]


class VanishingFiles(unittest.TestCase):
    def test_files_deleted_or_replaced_mid_run_are_reported_and_skipped(self):
        # Deterministic, not a race with the loader: a list file names the images, and the list is read when the
        # run starts while each image is opened only when its batch is made. Epoch 1 reads all 48 (a first run),
        # then three files are deleted or replaced, and the resumed run meets them mid-run exactly as a loader meets
        # files removed after the dataset was opened (the same FileDataset::load -> Loader::fill path an image
        # folder takes). chmod 000 would not do: the tests run as root, which reads such files anyway.
        with tempfile.TemporaryDirectory() as tmp:
            names = [f"img/{i:03d}.png" for i in range(48)]
            make_pngs(tmp, names)
            listing = os.path.join(tmp, "train.txt")
            with open(listing, "w") as f:
                f.writelines(f"{n} {i % 3}\n" for i, n in enumerate(names))
            ws = os.path.join(tmp, "ws")
            r = train(listing, *SMALL_FILES, "--epochs", "2", "--run-epochs", "1", "--workspace", ws)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("warning", r.stderr)
            deleted, directory, fifo = (os.path.join(tmp, names[i]) for i in (10, 20, 30))  # not neighbours
            os.remove(deleted)
            os.remove(directory)
            os.mkdir(directory)
            os.remove(fifo)
            os.mkfifo(fifo)  # open() of a FIFO waits for a writer: the loader must not
            try:
                r = train("--resume", os.path.join(ws, "last.safetensors"), timeout=120)
            except subprocess.TimeoutExpired:
                self.fail("the run hung on a FIFO in place of an image")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"warning: bad image skipped: {deleted}: cannot open: No such file or directory", r.stderr)
            self.assertIn(f"warning: bad image skipped: {directory}: is a directory, not an image file", r.stderr)
            self.assertIn(f"warning: bad image skipped: {fifo}: is a FIFO (named pipe), not an image file", r.stderr)
            epochs = epoch_records(os.path.join(ws, "log.json"))
            self.assertEqual(epochs[1]["train.bad_images"], 0)
            self.assertEqual(epochs[2]["train.bad_images"], 3)  # each replaced by the next file, training went on
            self.assertEqual(checkpoint_meta(os.path.join(ws, "last.safetensors"))["step"], 6)

    def test_fifo_in_an_image_folder_does_not_hang_the_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            make_pngs(tmp, [f"a/{i}.png" for i in range(7)] + [f"b/{i}.png" for i in range(8)])
            fifo = os.path.join(tmp, "a", "pipe.png")
            os.mkfifo(fifo)  # listed by the folder scan like any .png; 16 samples, so two whole batches use it
            try:
                r = train(tmp, *SMALL_FILES, "--epochs", "1", "--batch-size", "8", "--workspace",
                          os.path.join(tmp, "ws"), timeout=120)
            except subprocess.TimeoutExpired:
                self.fail("the run hung on a FIFO in the image folder")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"bad image skipped: {fifo}: is a FIFO (named pipe), not an image file", r.stderr)


# ---- a damaged last.safetensors on --resume

def damage(path, how):
    data = bytearray(read_bytes(path))
    if how == "truncated":
        data = data[:len(data) // 2]
    elif how == "header byte flipped":
        data[8] ^= 0xFF  # the header's opening '{'
    elif how == "header length flipped":
        data[3] ^= 0x7F
    elif how == "empty":
        data = b""
    with open(path, "wb") as f:
        f.write(data)


@NEEDS_FASHION
class DamagedLastCheckpoint(unittest.TestCase):
    CASES = {
        "truncated": r"data_offsets \[\d+, \d+\] lie outside the \d+-byte data section",
        "header byte flipped": r"header: not valid JSON|header is not valid JSON",
        "header length flipped": r"header length \d+ exceeds the file \(\d+ bytes\)",
        "empty": r"is 0 bytes: too short for the 8-byte header length",
    }

    def test_resume_names_the_file_the_damage_and_the_checkpoints_to_use(self):
        with tempfile.TemporaryDirectory() as tmp:
            for how, what in self.CASES.items():
                with self.subTest(how=how):
                    ws = copy_workspace(os.path.join(tmp, how.replace(" ", "-")))
                    last = os.path.join(ws, "last.safetensors")
                    damage(last, how)
                    before = digest(ws)
                    r = train("--resume", last, "--workspace", ws)
                    self.assertEqual(r.returncode, 1, r.stderr)
                    self.assertIn(f"error: --resume {last}: safetensors file '{last}'", r.stderr)
                    self.assertRegex(r.stderr, what)
                    others = [os.path.join(ws, n) for n in ("epoch-2.safetensors", "best.safetensors",
                                                            "epoch-1.safetensors")]
                    listed = re.search(r"newest first: (.*); e\.g\. --resume (\S+)", r.stderr)
                    self.assertIsNotNone(listed, r.stderr)
                    self.assertEqual(sorted(listed.group(1).split(", ")), sorted(others))
                    self.assertEqual(listed.group(2), others[0])  # epoch 2, as recent as the damaged last
                    self.assertEqual(digest(ws), before)  # nothing written; the damaged file is kept to look at
            # The hint works: resuming from the checkpoint it names finishes the run.
            r = train("--resume", listed.group(2), "--workspace", ws)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(checkpoint_meta(last)["epoch"], 3)

    def test_no_other_checkpoint_says_so(self):
        with tempfile.TemporaryDirectory() as ws:
            last = os.path.join(ws, "last.safetensors")
            with open(last, "wb") as f:
                f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1")  # cut inside the header
            r = train("--resume", last)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(f"--resume {last}", r.stderr)
            self.assertIn(f"no other checkpoint is in {ws}: start a new run", r.stderr)


def _scenario_in_namespace(mnt):
    """`unshare --user --map-root-user --mount` lands here: mount the tmpfs, run the scenario, print its JSON."""
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", mnt], capture_output=True, text=True)
    if m.returncode != 0:
        print("mount -t tmpfs inside the namespace: " + m.stderr.strip(), file=sys.stderr)
        return 77
    print(json.dumps(disk_full_scenario(mnt)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--disk-full-scenario":
        sys.exit(_scenario_in_namespace(sys.argv[2]))
    unittest.main()
