"""The trained network the CLI and Python tests share, made once per build tree instead of once per test file, and
what the machine offers them (native bf16).

CTest runs `fixtures.py make` as the setup of the `fashion_resnet8` fixture (tests/CMakeLists.txt) before the tests
that require it; each of those reads the checkpoint through `fashion_resnet8()`, which makes it first when a test runs
outside CTest. What made it (the command, the commit, a digest of the convnets binary) is kept in its folder's
`made_by.json`; the command and the binary's digest name the folder (a hash of the two): a rebuilt binary or a changed
command gives a new folder, trained again, while a test still reading the old one keeps it (folders unused for a day
go). The commit is recorded, not keyed: a commit that leaves the binary as it was (tests, documents) cannot change
what it trains, and remaking it then cost every first test run after a commit 25-30 s.
Tests only read it: what they write goes to their own folders. Without Fashion-MNIST the fixture is skipped.
"""
import fcntl
import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

FASHION = "/usr/share/datasets/fashion-mnist"
FASHION_README = "/usr/share/doc/dataset-fashion-mnist/README.md.gz"


def fashion_class_names():
    """Fashion-MNIST's labels as the dataset's own README lists them (Debian's dataset-fashion-mnist ships Zalando's
    file): what a model trained on it must call its classes, read from the data's side, not from convnets'."""
    with gzip.open(FASHION_README, "rt", encoding="utf-8") as f:
        rows = re.findall(r"^\| (\d) \| ([^|]+?) \|$", f.read(), re.MULTILINE)
    names = [name for _, name in sorted((int(label), name) for label, name in rows)]
    assert len(names) == 10, f"{FASHION_README}: {rows}"
    return names

# GPUNet's train.py (timm 0.5.4) flags in DLE's train.params lines: the --print-config field each sets, and how timm
# reads its value. The bare flags (--model-ema, --amp), the dropouts DLE's gpunet_* builders ignore (TIMM_IGNORED)
# and distillation's switch (--enable-distill True|False) are read apart by each test.
TIMM_TRAIN_FLAGS = {
    "--model": ("arch", lambda v: v.replace("_", "-")),
    "--sched": ("lr_schedule", {"step": "staircase", "cosine": "cosine"}.get),
    "--decay-epochs": ("lr_decay_epochs", float), "--decay-rate": ("lr_step_factor", float),
    "--opt": ("optimizer", str), "-b": ("batch_size", int), "--epochs": ("epochs", int),
    "--opt-eps": ("opt_eps", float), "-j": ("workers", int), "--warmup-lr": ("warmup_lr", float),
    "--weight-decay": ("weight_decay", float), "--model-ema-decay": ("ema", float), "--aa": ("augment", str),
    "--remode": ("remode", str), "--reprob": ("reprob", float), "--lr": ("lr", float),
    "--num-classes": ("num_classes", int), "--crop-pct": ("crop_ratio", float), "--img-size": ("image_size", int),
    "--teacher": ("teacher", str), "--teacher-img-size": ("teacher_img_size", int),
    "--test-teacher": ("test_teacher", {"True": True, "False": False}.get),
}
TIMM_IGNORED = {"--drop", "--drop-connect"}

# ResNet-8 that has learnt something (~85 % top-1): enough for predictions, INT8 against fp32 and bf16 against fp32
# to mean something; with an EMA of its weights for the tests that load them; the first 1,000 test images as its
# validation set, the held-out set of the classify tests.
FASHION_RESNET8 = ["train", FASHION, "--recipe", "fashion-mnist-resnet8", "--epochs", "2", "--warmup", "0",
                   "--max-train-images", "12000", "--max-val-images", "1000", "--ema", "0.9"]


def free_port():
    """A TCP port free on the loopback interface now, for a rendezvous the test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json(path):
    """A JSON file's content, the file closed again (a bare json.load(open(...)) leaks it until collected)."""
    with open(path) as f:
        return json.load(f)


def cpu_has_native_bf16():
    """Read independently of convnets: /proc/cpuinfo's flags."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _root():
    root = os.environ.get("CONVNETS_FIXTURES") or os.path.join(tempfile.gettempdir(), "convnets-test-fixtures")
    os.makedirs(root, exist_ok=True)
    return root


def _commit(source):
    # HEAD only: `describe --dirty` would refresh the index (taking git's lock) and change with every edit,
    # where the binary's digest already follows what was built.
    r = subprocess.run(["git", "-C", source, "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _made(name, command):
    """The fixture `name` made by `convnets COMMAND --workspace DIR`: its folder, reused when its record matches."""
    binary = os.environ["CONVNETS_BIN"]
    made_of = {"command": command, "binary_sha256": _digest(binary)}
    record = dict(made_of, commit=_commit(os.environ.get("CONVNETS_SOURCE_DIR", ".")))
    root = _root()
    key = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:12]
    folder = os.path.join(root, name + "-" + key)
    # One maker at a time: a second test process that needs the fixture waits for the first, then reuses it.
    with open(os.path.join(root, name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(folder, "made_by.json")):
            os.utime(folder)  # in use: not pruned
            return folder, False
        for old in glob.glob(os.path.join(root, name + "-*")):
            if os.path.getmtime(old) < time.time() - 86400:
                shutil.rmtree(old, ignore_errors=True)
        ws = folder + ".partial"
        shutil.rmtree(ws, ignore_errors=True)
        r = subprocess.run([binary, *command, "--workspace", ws], capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError("fixture %s: convnets %s failed (%d):\n%s%s" % (
                name, " ".join(command), r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
        with open(os.path.join(ws, "made_by.json"), "w") as f:
            json.dump(record, f, indent=2)
        os.replace(ws, folder)  # complete or absent: a killed maker leaves only the .partial folder
        return folder, True


def randomise_batchnorm(tensors, seed=12):
    """Gives a state dict's BatchNorms statistics and affine parameters far from 0/1, in place: random weights whose
    BN folding matters and whose logits tell images apart. gamma ~ 0.8 sqrt(var) rescales every BN, yet a 101-layer
    network stays well conditioned."""
    import torch  # only the tests that randomise weights pay for it
    g = torch.Generator().manual_seed(seed)
    for k in [k for k in tensors if k.endswith("running_var")]:
        base = k[: -len("running_var")]
        var = torch.rand(tensors[k].shape, generator=g) + 0.5
        tensors[k] = var
        tensors[base + "running_mean"] = torch.randn(var.shape, generator=g) * 0.2
        tensors[base + "bias"] = torch.randn(var.shape, generator=g) * 0.1
        tensors[base + "weight"] = var.sqrt() * (0.7 + 0.2 * torch.rand(var.shape, generator=g))
    return tensors


def random_weights(arch, folder, num_classes=None, seed=5, bn_seed=12):
    """FOLDER/ARCH.safetensors: `convnets models --seed` weights with randomise_batchnorm's statistics, so that BN
    folding matters and images get different classes. Its path."""
    sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
    import pth2safetensors
    import runner
    init = os.path.join(folder, arch + ".init.safetensors")
    classes = ["--num-classes", str(num_classes)] if num_classes else []
    r = runner.run([os.environ["CONVNETS_BIN"], "models", "--arch", arch, *classes, "--seed", str(seed), "--save",
                    init], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    tensors, meta = pth2safetensors.read_safetensors(init)
    randomise_batchnorm(tensors, seed=bn_seed)
    path = os.path.join(folder, arch + ".safetensors")
    pth2safetensors.write_safetensors(path, tensors, meta)
    return path


def rewrite_safetensors(path, out, edit_header=lambda header: None, pad_to=None):
    """`path` written again as `out` with the same data section, its header edited in place (a dict) and, with
    `pad_to`, a metadata entry sized so that the header is exactly that many bytes: a writer that keeps every tensor's
    entry as it was, so convnets' checksums still hold where the edit leaves them. `out`."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    edit_header(header)

    def spelled():
        return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()

    if pad_to is not None:
        header.setdefault("__metadata__", {})["pad"] = ""
        bare = len(spelled())
        assert pad_to >= bare, (pad_to, bare)
        header["__metadata__"]["pad"] = "p" * (pad_to - bare)
    text = spelled()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return out


def imagenet_like_jpegs(n):
    """The first N JPEGs of CTest's ImageNet-like set (its val images, then train), several sizes."""
    root = os.environ.get("CONVNETS_IMAGENET_LIKE", "")
    files = (sorted(glob.glob(os.path.join(root, "val", "*", "*.JPEG"))) +
             sorted(glob.glob(os.path.join(root, "train", "*", "*.JPEG"))))[:n]
    assert len(files) == n, f"{root}: {len(files)} JPEGs, {n} wanted"
    return files


def fashion_resnet8():
    """The shared Fashion-MNIST ResNet-8 training checkpoint (last.safetensors); unittest.SkipTest without the data."""
    if not os.path.isdir(FASHION):
        raise unittest.SkipTest(FASHION + " (Debian's dataset-fashion-mnist) is not installed: no trained network")
    folder, _ = _made("fashion-resnet8", FASHION_RESNET8)
    return os.path.join(folder, "last.safetensors")


if __name__ == "__main__":
    if sys.argv[1:] != ["make"]:
        sys.exit("usage: fixtures.py make   (CONVNETS_BIN, CONVNETS_SOURCE_DIR, CONVNETS_FIXTURES from CTest)")
    if not os.path.isdir(FASHION):
        # Nothing to make; the tests that read it skip (fashion_resnet8()), the rest of their modules still run.
        print("fixture fashion-resnet8: skipped, %s is not installed" % FASHION)
        sys.exit(0)
    folder, made = _made("fashion-resnet8", FASHION_RESNET8)
    print("fixture fashion-resnet8: %s %s" % ("made in" if made else "reused (same command and binary):",
                                             folder))
