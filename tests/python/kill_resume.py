#!/usr/bin/env python3
"""kill -9 at random moments of a training run, then --resume (issue 21, faults during a run).

A small Fashion-MNIST run (8 steps an epoch, checkpoints `last`, `best` and `epoch-N` at every epoch end, and
`last` written in the background every 3 steps mid-epoch) is started once and then, trial after trial, resumed
from WORKSPACE/last.safetensors and SIGKILLed: at a random moment (startup, training, validation or a save), or as
soon as a checkpoint's temporary file appears, which lands the kill inside a checkpoint write (mostly a background
one, while the steps go on). After every kill:

  * every checkpoint left (last, best, epoch-N) is a whole safetensors file holding a convnets record;
  * last.safetensors never goes back: its step is at least that of every save seen completed;
  * the run lost at most the steps since the last whole save: it reached no further than the second save point
    after the step last.safetensors holds (a save every 3 steps, in the background, and one at each epoch's end),
    as one write may still be running when the steps reach the next save, which waits for it;
  * the next --resume starts exactly where last.safetensors says, and clears the temporary files a kill left.

After the trials the run goes on for one epoch without a kill, and its checkpoint must equal bit for bit that of
an uninterrupted run of the same length that saved only at its epochs' ends: nothing a kill left behind, and
nothing the background saves did, leaked into the training state.

    .venv/bin/python tests/python/kill_resume.py --trials 20 [--seed 1] [--bin build/convnets] [--json OUT]

Exit status 0 when every trial passed, 1 otherwise, 77 when Fashion-MNIST is not installed.
"""
import argparse
import ctypes
import glob
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

FASHION = "/usr/share/datasets/fashion-mnist"
STEPS_PER_EPOCH = 8
# --epochs is far beyond what the trials reach, so no invocation ends on its own; --run-epochs 0 undoes the
# first run's --run-epochs 1 (resumed runs take the checkpoint's config).
RUN = ["--recipe", "fashion-mnist-resnet8", "--max-train-images", str(16 * STEPS_PER_EPOCH), "--max-val-images", "32",
       "--batch-size", "16", "--workers", "1", "--print-freq", "1", "--epochs", "1000", "--save-every", "1",
       "--keep", "2"]
SAVE_STEPS = 3  # --checkpoint-every-steps of the killed runs; the reference run saves at epoch ends only
SAVES = ["--checkpoint-every-steps", str(SAVE_STEPS)]


def read_checkpoint(path):
    """(tensor name -> raw bytes, convnets record) of a whole safetensors file; raises ValueError otherwise."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} beyond the file ({len(raw)} bytes)")
    header = json.loads(raw[8:8 + n])
    meta = json.loads(header.pop("__metadata__")["convnets"])
    data = raw[8 + n:]
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], name) for name, info in header.items())
    end = 0
    for b, e, name in spans:
        if b != end:
            raise ValueError(f"{path}: tensor {name} starts at {b}, not {end}")
        end = e
    if end != len(data):
        raise ValueError(f"{path}: tensors cover {end} of {len(data)} data bytes")
    return {name: data[b:e] for b, e, name in spans}, meta


def temporaries(ws):
    return sorted(glob.glob(os.path.join(ws, "*.tmp.*")))


def log_records(path, start=0):
    """The DLLogger records after byte `start`, and whether an unfinished last line follows them."""
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    lines = text.split("\n")
    unfinished = lines.pop() != ""
    records = []
    for line in lines:
        if not line.startswith("DLLL "):
            raise ValueError(f"{path}: not a DLLogger line: {line[:80]!r}")
        records.append(json.loads(line[5:]))
    return records, unfinished


def save_points_after(step, count=2):
    """The first `count` global steps after `step` at which the killed runs save: every SAVE_STEPS steps (in the
    background) and at each epoch's end (after waiting for the write in flight)."""
    points = []
    while len(points) < count:
        step += 1
        if step % SAVE_STEPS == 0 or step % STEPS_PER_EPOCH == 0:
            points.append(step)
    return points


def reached_step(records):
    """The global step of the last training step logged ([epoch, iteration] records; epochs count from 1)."""
    steps = [(r["step"][0] - 1) * STEPS_PER_EPOCH + r["step"][1] for r in records
             if r.get("type") == "LOG" and isinstance(r.get("step"), list) and len(r["step"]) == 2]
    return max(steps) if steps else None


class DirectoryWatch:
    """Names created in (IN_CREATE) or renamed into (IN_MOVED_TO) a folder as it happens (Linux inotify): a kill
    sent on a temporary file's creation lands inside its write, which polling the folder mostly misses."""
    IN_MOVED_TO, IN_CREATE = 0x80, 0x100

    def __init__(self, folder):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(folder), self.IN_CREATE | self.IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), "inotify on " + folder)

    def events(self, timeout):
        if not select.select([self.fd], [], [], max(0.0, timeout))[0]:
            return []
        buf, out, i = os.read(self.fd, 1 << 16), [], 0
        while i < len(buf):
            _, mask, _, length = struct.unpack_from("iIII", buf, i)
            out.append((mask, buf[i + 16:i + 16 + length].rstrip(b"\0").decode(errors="replace")))
            i += 16 + length
        return out

    def close(self):
        os.close(self.fd)


class Loop:
    def __init__(self, binary, workdir, seed, say=print):
        self.bin, self.workdir, self.say = binary, workdir, say
        self.rng = random.Random(seed)
        self.ws = os.path.join(workdir, "run")
        self.last = os.path.join(self.ws, "last.safetensors")
        self.failures, self.trials = [], []

    def cmd(self, *args):
        return [self.bin, "train", *args]

    def check(self, ok, what):
        if not ok:
            self.failures.append(what)
            self.say("  FAIL: " + what)
        return ok

    def start(self):
        t0 = time.monotonic()
        r = subprocess.run(self.cmd(FASHION, *RUN, *SAVES, "--run-epochs", "1", "--workspace", self.ws),
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("the first run failed:\n" + r.stderr)
        self.first_run_s = time.monotonic() - t0

    def trial(self, number):
        mode = "save" if number % 2 == 1 else "random"
        # Which write a "save" trial lands in: `last` itself, or the `best` and `epoch-N` copies made after it
        # (`best` only when validation improved, which gets rarer as the run goes on).
        target = self.rng.choice(["last", "last", "best", "epoch"])
        log_path = os.path.join(self.ws, "log.json")
        log_start = os.path.getsize(log_path)
        before = read_checkpoint(self.last)[1]
        stale = set(temporaries(self.ws))  # left by earlier kills, for this run to clear
        out_path = os.path.join(self.workdir, f"trial-{number}.out")
        watch = DirectoryWatch(self.ws)
        with open(out_path, "w") as out:
            # Niced, so that on a busy machine the watcher wakes at once when a save starts, and kills in it.
            p = subprocess.Popen(self.cmd("--resume", self.last, "--run-epochs", "0"), stdout=out,
                                 stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(10))
        t0 = time.monotonic()
        # Random moments span startup, a first epoch with its validation and saves, and part of a second.
        delay = self.rng.uniform(0, 1.6 * self.first_run_s)
        seen_step, killed = before["step"], None
        try:
            while p.poll() is None:
                now = time.monotonic() - t0
                if now >= delay and (mode == "random" or now > delay + 4 * self.first_run_s):
                    break  # the random moment, or a "save" trial whose save did not come
                killed = None
                for mask, name in watch.events(min(0.05, delay - now) if mode == "random" else 0.05):
                    if mask & DirectoryWatch.IN_MOVED_TO and name == "last.safetensors":
                        # A save completed (renamed into place): the step it holds must never be lost.
                        try:
                            seen_step = max(seen_step, read_checkpoint(self.last)[1]["step"])
                        except (OSError, ValueError, KeyError):
                            pass
                    elif (mode == "save" and mask & DirectoryWatch.IN_CREATE and name.startswith(target)
                          and ".tmp." in name and time.monotonic() - t0 >= delay):
                        p.send_signal(signal.SIGKILL)
                        killed = name
                        break
                if killed:
                    break
        finally:
            watch.close()
        killed_at = time.monotonic() - t0
        trigger = f"on the creation of {killed}" if killed else "at a random moment" if mode == "random" else \
            "no save came"
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()
        left = temporaries(self.ws)
        new = [t for t in left if t not in stale]
        with open(out_path) as f:
            output = f.read()
        result = {"trial": number, "mode": mode if mode == "random" else f"save ({target})",
                  "killed_after_s": round(killed_at, 3), "trigger": trigger, "returncode": p.returncode,
                  "temporaries_left": [os.path.basename(t) for t in new], "during_checkpoint_write": bool(new)}
        self.say(f"trial {number:2d} ({result['mode']:12s}): SIGKILL after {killed_at:6.2f} s {trigger}"
                 + (f", during the write of {', '.join(result['temporaries_left'])}" if new else ""))
        self.check(p.returncode == -signal.SIGKILL, f"trial {number}: exit {p.returncode}, not killed\n{output}")

        # The resumed run said where it started, if it got that far: exactly at last.safetensors.
        m = re.search(r"^resume: \S+ at epoch (\d+), step (\d+)/", output, re.M)
        if m:
            self.check((int(m.group(1)) - 1, int(m.group(2))) == (before["epoch"], before["step_in_epoch"]),
                       f"trial {number}: resumed at {m.group(0)!r}, the checkpoint says epoch {before['epoch']} "
                       f"step {before['step_in_epoch']}")
        result["resumed_at_checkpoint"] = bool(m)
        if "train: " in output:  # the run opened the workspace: what earlier kills left must be gone
            self.check(not stale & set(left), f"trial {number}: {sorted(stale & set(left))} not removed")
        self.previous_left = left

        for path in sorted(glob.glob(os.path.join(self.ws, "*.safetensors"))):
            try:
                read_checkpoint(path)
            except (ValueError, KeyError, OSError) as e:
                self.check(False, f"trial {number}: {os.path.basename(path)} is damaged after the kill: {e}")
        try:
            after = read_checkpoint(self.last)[1]
        except (ValueError, KeyError, OSError) as e:
            self.check(False, f"trial {number}: last.safetensors cannot be read: {e}")
            raise
        self.check(after["step"] >= seen_step,
                   f"trial {number}: last.safetensors went back to step {after['step']} after a save of {seen_step}")
        records, _ = log_records(log_path, log_start)
        reached = reached_step(records)
        lost = 0 if reached is None else reached - after["step"]
        result.update({"saved_step": after["step"], "reached_step": reached, "lost_steps": lost})
        # The save at the point after last's started its write only once last's was done (it waits for it), and the
        # steps reach the save point after that one before its save waits in turn: no further.
        bound = save_points_after(after["step"])[1]
        self.check(reached is None or reached <= bound,
                   f"trial {number}: reached step {reached} but last holds {after['step']}: a save completed after "
                   f"step {bound} was lost")
        self.trials.append(result)

    def finish(self):
        """One uninterrupted epoch more, then the same number of epochs without kills: bit for bit equal."""
        r = subprocess.run(self.cmd("--resume", self.last, "--run-epochs", "1"), capture_output=True, text=True,
                           timeout=600)
        self.check(r.returncode == 0, "the final resume failed:\n" + r.stderr)
        for t in self.previous_left:
            self.check(not os.path.exists(t), f"{t} left by a killed write was not removed")
        self.check(temporaries(self.ws) == [], f"temporary files remain: {temporaries(self.ws)}")
        records, unfinished = log_records(os.path.join(self.ws, "log.json"))
        self.check(not unfinished, "log.json ends in an unfinished line")
        tensors, meta = read_checkpoint(self.last)
        ref_ws = os.path.join(self.workdir, "reference")
        r = subprocess.run(self.cmd(FASHION, *RUN, "--run-epochs", str(meta["epoch"]), "--workspace", ref_ws),
                           capture_output=True, text=True, timeout=1200)
        self.check(r.returncode == 0, "the reference run failed:\n" + r.stderr)
        ref_tensors, ref_meta = read_checkpoint(os.path.join(ref_ws, "last.safetensors"))
        differing = sorted(k for k in ref_tensors if tensors.get(k) != ref_tensors[k])
        self.bit_exact = self.check(sorted(tensors) == sorted(ref_tensors) and not differing,
                                    f"after the kills the run differs from an uninterrupted one in {differing[:5]}")
        for key in ("epoch", "step", "best_top1", "best_epoch"):
            self.bit_exact &= self.check(meta[key] == ref_meta[key],
                                         f"{key}: {meta[key]} after the kills, {ref_meta[key]} without")
        return meta

    def run(self, trials):
        self.previous_left = []
        self.start()
        self.say(f"first run: 1 epoch of {STEPS_PER_EPOCH} steps in {self.first_run_s:.1f} s; workspace {self.ws}")
        for n in range(1, trials + 1):
            self.trial(n)
        meta = self.finish()
        summary = {
            "trials": len(self.trials),
            "killed_during_checkpoint_write": sum(t["during_checkpoint_write"] for t in self.trials),
            "max_lost_steps": max(t["lost_steps"] for t in self.trials),
            "steps_per_epoch": STEPS_PER_EPOCH,
            "steps_between_saves": SAVE_STEPS,
            "final_epoch": meta["epoch"],
            "bit_exact_with_uninterrupted_run": self.bit_exact,
            "failures": self.failures,
            "per_trial": self.trials,
        }
        return summary


def run_trials(binary, trials, seed=1, workdir=None, say=print):
    """The loop, in `workdir` (a temporary folder, removed afterwards, when None). Returns the summary."""
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="convnets-kill-")
    try:
        return Loop(binary, workdir, seed, say).run(trials)
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin", default=os.environ.get("CONVNETS_BIN", os.path.join(here, "..", "..", "build", "convnets")))
    ap.add_argument("--workdir", help="keep the workspaces and each trial's output here")
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    if not os.path.isdir(FASHION):
        print(f"skipped: {FASHION} is not installed (scripts/setup.sh)")
        return 77
    if a.workdir:
        os.makedirs(a.workdir, exist_ok=True)
    t0 = time.monotonic()
    s = run_trials(os.path.abspath(a.bin), a.trials, a.seed, a.workdir)
    s["seconds"] = round(time.monotonic() - t0, 1)
    print(f"{s['trials']} trials, {s['killed_during_checkpoint_write']} killed during a checkpoint write, "
          f"at most {s['max_lost_steps']} steps lost (saves every {SAVE_STEPS}, an epoch is {STEPS_PER_EPOCH}), final epoch "
          f"{s['final_epoch']} bit-exact with an uninterrupted run: {s['bit_exact_with_uninterrupted_run']}; "
          f"{'all resumed OK' if not s['failures'] else str(len(s['failures'])) + ' FAILURES'} ({s['seconds']} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=2)
    return 0 if not s["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
