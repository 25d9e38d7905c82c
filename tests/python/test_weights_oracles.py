"""Weights files against the reference implementations of their formats (issue 75).

PyPI's `safetensors` (the format's reference library) reads every kind of file convnets writes with the tensors and
metadata convnets reads from it, and convnets reads every file the reference library writes: hand-picked cases
(every dtype, empty and 0-d tensors, non-ASCII metadata, headers whose first bytes look like a pickle's) and
Hypothesis' random state dicts in both directions. torch.save's archives as the pinned torch writes them are read or
refused as docs/MODELS.md says. The checksums convnets writes are recomputed here from the format and the polynomial
alone, and a checkpoint whose header was edited is refused through the CLI, naming the tensor.

convnets' side is tests/weights_probe (CONVNETS_WEIGHTS_PROBE): the commands' own loader, one request a line.
"""
import collections
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import fixtures  # the suite's shared trained network (tests/python/fixtures.py)

import safetensors
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import runner

BIN = os.environ["CONVNETS_BIN"]
PROBE = os.environ["CONVNETS_WEIGHTS_PROBE"]
FASHION = fixtures.FASHION
NEEDS_FASHION = unittest.skipUnless(os.path.isdir(FASHION), FASHION + " (Debian's dataset-fashion-mnist) is not installed")

# io/safetensors.h's checksum keys: convnets consumes them, so its metadata is the reference's without them.
CHECKSUM_KEYS = ("convnets.crc32c", "convnets.crc32c.header")
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
# The header lengths (mod 65,536) whose first two bytes are 0x80 and 0..5: a pickle's PROTO to a two-byte guess.
PICKLE_LIKE = (128, 384, 640, 896, 1152, 1408)


def cli(*args):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=600)


def raw_bytes(t):
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def described(tensors):
    """{name: (safetensors dtype, shape, bytes)}: what both sides must agree on."""
    return {name: (DTYPES[t.dtype], list(t.shape), raw_bytes(t)) for name, t in tensors.items()}


def probe_described(answer):
    return {t["name"]: (t["dtype"], t["shape"], bytes.fromhex(t["hex"])) for t in answer["tensors"]}


def without_checksums(metadata):
    return {k: v for k, v in (metadata or {}).items() if k not in CHECKSUM_KEYS}


def reference_read(path):
    """(tensors, metadata) as the reference library reads the file."""
    with safetensors.safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def header_of(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def crc32c(data, crc=0):
    """CRC-32C from the polynomial (0x82F63B78, reflected), as RFC 3720 defines it: independent of convnets'."""
    table = crc32c.table
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 & -(_c & 1))
    crc32c.table.append(_c)


def entry_text(name, info):
    """What convnets.crc32c.header sums for a tensor (io/safetensors.h): its entry's fields, NUL-separated."""
    shape = ",".join(str(d) for d in info["shape"])
    begin, end = info["data_offsets"]
    return ("%s\0%s\0%s\0%d,%d" % (name, info["dtype"], shape, begin, end)).encode()


def reference_write_with_header_length(path, tensors, length, metadata=None):
    """The reference library's file of `tensors` whose header is exactly `length` bytes (a multiple of 8), by the
    length of a metadata value; the reference writer pads headers to 8 itself."""
    meta = dict(metadata or {}, pad="")
    safetensors.torch.save_file(tensors, path, metadata=meta)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        bare = len(f.read(n).rstrip(b" "))  # its own spelling, before its padding
    assert length >= bare, (length, bare)
    meta["pad"] = "p" * (length - bare)
    safetensors.torch.save_file(tensors, path, metadata=meta)
    assert header_of(path)[0] == length, (header_of(path)[0], length)
    return path


class Probe:
    """tests/weights_probe, one process for a whole test class: JSON requests in, JSON answers out."""

    def __init__(self):
        self.process = subprocess.Popen([PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        encoding="utf-8")

    def ask(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError("weights_probe ended (status %s) on %s" % (self.process.wait(), request))
        return json.loads(line)

    def read(self, path):
        return self.ask({"read": path})

    def write(self, path, tensors, metadata=None, checksums=True):
        specs = [{"name": name, "dtype": dtype, "shape": shape, "hex": data.hex()}
                 for name, (dtype, shape, data) in described(tensors).items()]
        return self.ask({"write": path, "tensors": specs, "metadata": metadata or {}, "checksums": checksums})

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


class ProbeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-oracles-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.probe = Probe()
        cls.addClassCleanup(cls.probe.close)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.tmp, name)

    def assert_same(self, answer, tensors, metadata):
        self.assertNotIn("error", answer)
        self.assertEqual(probe_described(answer), described(tensors))
        self.assertEqual(answer["metadata"], without_checksums(metadata))


@NEEDS_FASHION
class ReferenceReadsWhatConvnetsWrites(ProbeTest):
    """Each kind of file convnets writes, from the suite's trained ResNet-8 and short fine-tunes of it."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        ckpt = fixtures.fashion_resnet8()
        cls.files = {"checkpoint (model, EMA, momentum)": ckpt,
                     "best checkpoint": os.path.join(os.path.dirname(ckpt), "best.safetensors")}
        for name, extra in (("plain", []), ("ema", ["--ema"]), ("fp16", ["--dtype", "fp16"])):
            out = cls.path(name + ".safetensors")
            r = cli("export", "--checkpoint", ckpt, "--format", "safetensors", "-o", out, *extra)
            assert r.returncode == 0, r.stderr
            cls.files["export " + name] = out
        short = ["--epochs", "1", "--warmup", "0", "--max-train-images", "256", "--max-val-images", "64",
                 "--batch-size", "64"]
        for name, extra in (("QAT", ["--qat", "--calibration-images", "64"]), ("2:4-sparse", ["--asp"])):
            ws = cls.path(name.replace(":", "-"))
            r = cli("train", FASHION, "--recipe", "fashion-mnist-resnet8", "--fine-tune", ckpt, *short, *extra,
                    "--workspace", ws)
            assert r.returncode == 0, r.stdout + r.stderr
            cls.files[name + " checkpoint"] = os.path.join(ws, "last.safetensors")

    def test_the_reference_reads_each_with_the_tensors_and_metadata_convnets_reads(self):
        kinds = set()
        for kind, path in self.files.items():
            with self.subTest(kind=kind):
                tensors, metadata = reference_read(path)
                answer = self.probe.read(path)
                self.assert_same(answer, tensors, metadata)
                self.assertEqual(answer["verified"], "bytes and header")
                kinds.update(DTYPES[t.dtype] for t in tensors.values())
                if kind.startswith("QAT"):  # its calibrated ranges travel in the record
                    record = json.loads(metadata["convnets"])
                    self.assertTrue(record["config"]["qat"])
                    self.assertGreater(len(record["quantization"]["points"]), 0)
                if kind.startswith("2:4"):
                    self.assertTrue(any(k.startswith("asp_mask.") for k in tensors), sorted(tensors)[:5])
        self.assertTrue({"F32", "F16", "I64"} <= kinds, kinds)

    def test_its_checksums_are_what_any_reader_computes_from_the_format(self):
        path = self.files["checkpoint (model, EMA, momentum)"]
        n, header = header_of(path)
        sums = json.loads(header["__metadata__"]["convnets.crc32c"])
        entries = json.loads(header["__metadata__"]["convnets.crc32c.header"])
        tensors, _ = reference_read(path)
        names = [k for k in header if k != "__metadata__"]
        self.assertEqual(sorted(sums), sorted(names))
        self.assertEqual(sorted(entries), sorted(names))
        for name in names:
            self.assertEqual(sums[name], "%08x" % crc32c(raw_bytes(tensors[name])), name)
            self.assertEqual(entries[name], "%08x" % crc32c(entry_text(name, header[name])), name)


class ConvnetsReadsWhatTheReferenceWrites(ProbeTest):
    def test_every_dtype_empty_and_0d_tensors_and_non_ascii_metadata(self):
        g = torch.Generator().manual_seed(4)
        tensors = {"f64": torch.randn(3, generator=g, dtype=torch.float64),
                   "f32": torch.randn(2, 3, generator=g), "f16": torch.randn(5, generator=g).half(),
                   "bf16": torch.randn(4, 1, generator=g).bfloat16(),
                   "i64": torch.tensor(123456789012), "i32": torch.arange(-3, 3, dtype=torch.int32),
                   "i16": torch.tensor([-32768, 32767], dtype=torch.int16),
                   "i8": torch.tensor([-128, 127], dtype=torch.int8), "u8": torch.arange(7, dtype=torch.uint8),
                   "bool": torch.tensor([True, False, True]), "empty": torch.zeros(0, 3), "empty_i64": torch.zeros(2, 0, dtype=torch.int64),
                   "scalar": torch.tensor(2.5), "名前.重み": torch.ones(2)}
        metadata = {"説明": "ResNet-50 · chat 🐈 naïve", "format": "pt", "empty": ""}
        path = self.path("reference.safetensors")
        safetensors.torch.save_file(tensors, path, metadata=metadata)
        answer = self.probe.read(path)
        self.assert_same(answer, tensors, metadata)
        self.assertEqual((answer["format"], answer["verified"]), ("safetensors", "nothing"))
        # And what convnets writes of the same, read back by both.
        ours = self.path("ours.safetensors")
        self.assertNotIn("error", self.probe.write(ours, tensors, metadata))
        self.assert_same(self.probe.read(ours), tensors, metadata)
        ref_tensors, ref_metadata = reference_read(ours)
        self.assertEqual(described(ref_tensors), described(tensors))
        self.assertEqual(without_checksums(ref_metadata), metadata)

    def test_headers_whose_first_bytes_look_like_a_pickle_are_read_as_safetensors(self):
        tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
        for length in PICKLE_LIKE + (65536 + 640,):
            with self.subTest(header_length=length):
                path = reference_write_with_header_length(self.path("h%d.safetensors" % length), tensors, length)
                with open(path, "rb") as f:
                    self.assertEqual(f.read(2)[0], 0x80)
                answer = self.probe.read(path)
                self.assertEqual(answer.get("format"), "safetensors", answer)
                self.assert_same(answer, tensors, reference_read(path)[1])

    @NEEDS_FASHION
    def test_the_commands_load_such_files_where_the_two_byte_guess_refused_them(self):
        # The suite's checkpoint written again with the same entries and its header padded to 65,536 + 640 bytes
        # (it begins 0x80 0x02): its checksums still hold, and each command reads it.
        ckpt = fixtures.fashion_resnet8()
        padded = fixtures.rewrite_safetensors(ckpt, self.path("padded.safetensors"), pad_to=65536 + 640)
        with open(padded, "rb") as f:
            self.assertEqual(f.read(2), b"\x80\x02")
        self.assertEqual(self.probe.read(padded)["verified"], "bytes and header")
        plain = self.path("plain-640.safetensors")
        r = cli("export", "--checkpoint", padded, "--format", "safetensors", "-o", plain)
        self.assertEqual(r.returncode, 0, r.stderr)
        # The exported weights, written again by the reference library with a header of the same kind of length.
        tensors, metadata = reference_read(plain)
        reference = reference_write_with_header_length(self.path("reference-640.safetensors"), tensors, 65536 + 640,
                                                       without_checksums(metadata))
        for args in (["eval", FASHION, "--checkpoint", padded, "--max-images", "64"],
                     ["classify", os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "docs", "images", "report.png"),
                      "--checkpoint", padded],
                     ["models", "--arch", "resnet8", "--num-classes", "10", "--weights", reference],
                     ["train", "--resume", padded, "--evaluate", "--max-val-images", "64",
                      "--workspace", self.path("resumed")]):
            with self.subTest(command=args[0]):
                r = cli(*args)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertNotIn("legacy format", r.stderr)


# Hypothesis' state dicts: names (any text but the reserved one), every dtype convnets supports, shapes with empty
# and 0-d tensors, bytes from a seed, metadata of any text. Deterministic, so that CI runs the same examples.
NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda s: s != "__metadata__")
SHAPES = st.lists(st.integers(0, 4), max_size=3)
# "convnets" is a checkpoint's record (runtime/checkpoint.h), read as one by every command: not a free key.
META_KEYS = st.text(st.characters(exclude_categories=("Cs",)), max_size=8).filter(
    lambda k: k != "convnets" and k not in CHECKSUM_KEYS)
STATE = st.tuples(st.dictionaries(NAMES, st.tuples(st.sampled_from(sorted(DTYPES.values())), SHAPES,
                                                   st.integers(0, 2**32 - 1)), max_size=6),
                  st.dictionaries(META_KEYS, st.text(st.characters(exclude_categories=("Cs",)), max_size=16),
                                  max_size=3))
EXAMPLES = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
FROM_NAME = {v: k for k, v in DTYPES.items()}


def made(state):
    """(tensors, metadata) of a drawn state: each tensor from (dtype, shape, seed), random bytes, bools 0 or 1."""
    spec, metadata = state
    tensors = collections.OrderedDict()
    for name, (dtype, shape, seed) in spec.items():
        g = torch.Generator().manual_seed(seed)
        t = FROM_NAME[dtype]
        if t == torch.bool:
            tensors[name] = torch.randint(0, 2, shape, generator=g).bool()
        else:
            n = torch.Size(shape).numel() * torch.empty(0, dtype=t).element_size()
            tensors[name] = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(t).reshape(shape)
    return tensors, metadata


class RoundTrips(ProbeTest):
    @EXAMPLES
    @given(STATE)
    def test_what_the_reference_writes_convnets_reads(self, state):
        tensors, metadata = made(state)
        path = self.path("from-reference.safetensors")
        safetensors.torch.save_file(tensors, path, metadata=metadata)
        answer = self.probe.read(path)
        try:
            reference_read(path)
        except safetensors.SafetensorError as e:
            # The reference writer's own file that its reader refuses (0.8.0: no tensors and an empty metadata
            # dict give the header `{},"__metadata__":{}}`): convnets refuses it too.
            self.assertIn("error", answer, "the reference refuses its own file (%s), convnets read it" % e)
            return
        self.assert_same(answer, tensors, metadata)

    @EXAMPLES
    @given(STATE)
    def test_what_convnets_writes_the_reference_reads(self, state):
        tensors, metadata = made(state)
        path = self.path("from-convnets.safetensors")
        self.assertNotIn("error", self.probe.write(path, tensors, metadata))
        ref_tensors, ref_metadata = reference_read(path)
        self.assertEqual(described(ref_tensors), described(tensors))
        self.assertEqual(without_checksums(ref_metadata), metadata)
        self.assert_same(self.probe.read(path), tensors, metadata)


class TorchSaveArchives(ProbeTest):
    """torch.save as the pinned torch writes it, against docs/MODELS.md: zip archives (any pickle protocol) read,
    the pre-1.6 format refused by name."""

    def test_each_archive_is_read_or_refused_as_documented(self):
        sd = collections.OrderedDict(conv=torch.arange(12, dtype=torch.float32).reshape(3, 4),
                                     half=torch.ones(2, dtype=torch.float16), steps=torch.tensor(7),
                                     empty=torch.zeros(0, 2), view=torch.arange(12.0).reshape(3, 4).t())
        cases = {"zip.pth": {}, "zip-protocol4.pth": {"pickle_protocol": 4},
                 "legacy.pth": {"_use_new_zipfile_serialization": False},
                 "legacy-protocol4.pth": {"_use_new_zipfile_serialization": False, "pickle_protocol": 4}}
        for name, kwargs in cases.items():
            with self.subTest(file=name):
                path = self.path(name)
                torch.save(sd, path, **kwargs)
                answer = self.probe.read(path)
                if name.startswith("legacy"):
                    self.assertIn(path + ": a torch.save file in the legacy format (before PyTorch 1.6)",
                                  answer.get("error", ""))
                else:
                    self.assertEqual(answer.get("format"), "torch.save", answer)
                    self.assertEqual(probe_described(answer), described(sd))


@NEEDS_FASHION
class EditedCheckpoints(ProbeTest):
    """The suite's checkpoint with its header edited as a tool or a hand might: refused by every command that
    reads it, the tensor named, the workspace untouched."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ckpt = fixtures.fashion_resnet8()

    def edited(self, name, edit):
        return fixtures.rewrite_safetensors(self.ckpt, self.path(name + ".safetensors"), edit_header=edit)

    def refused(self, path, *fragments):
        for args in (["eval", FASHION, "--checkpoint", path, "--max-images", "64"],
                     ["export", "--checkpoint", path, "--format", "safetensors", "-o", path + ".out"]):
            r = cli(*args)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            for fragment in fragments:
                self.assertIn(fragment, r.stderr)
            self.assertFalse(os.path.exists(path + ".out"))
        ws = self.path(os.path.basename(path) + "-ws")
        os.makedirs(ws)
        last = shutil.copy(path, os.path.join(ws, "last.safetensors"))
        with open(last, "rb") as f:
            before = f.read()
        r = cli("train", "--resume", last, "--workspace", ws)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(fragments[0], r.stderr)
        with open(last, "rb") as f:
            self.assertEqual(f.read(), before, "the checkpoint was overwritten")

    def test_a_relabelled_dtype_a_reshaped_tensor_or_moved_offsets_are_refused_naming_the_tensor(self):
        def relabel(h):
            h["model.fc.weight"]["dtype"] = "I32"

        def reshape(h):
            shape = h["model.fc.weight"]["shape"]
            h["model.fc.weight"]["shape"] = [shape[1], shape[0]]

        def move(h):
            a, b = h["model.fc.bias"], h["ema.fc.bias"]
            a["data_offsets"], b["data_offsets"] = b["data_offsets"], a["data_offsets"]

        for name, edit, tensor in (("relabelled", relabel, "model.fc.weight"), ("reshaped", reshape, "model.fc.weight"),
                                   ("moved", move, "ema.fc.bias")):
            with self.subTest(edit=name):
                self.refused(self.edited(name, edit), "tensor '%s': its header entry" % tensor)

    def test_removed_checksums_are_refused(self):
        def drop_entry(h):
            sums = json.loads(h["__metadata__"]["convnets.crc32c"])
            del sums["model.fc.bias"]
            h["__metadata__"]["convnets.crc32c"] = json.dumps(sums)

        def drop_both(h):
            for key in CHECKSUM_KEYS:
                del h["__metadata__"][key]

        self.refused(self.edited("no-entry", drop_entry), "tensor 'model.fc.bias': no checksum")
        self.refused(self.edited("no-checksums", drop_both), "its metadata says every tensor's bytes and header entry")

    def test_a_file_without_checksums_is_still_checked_for_what_its_dtypes_mean(self):
        # A plain weights file from another writer (no checksums), relabelled F32 -> I32: the bytes are the same, the
        # numbers would be 1e9; refused when it fills the model, naming both dtypes.
        plain = self.path("plain.safetensors")
        self.assertEqual(cli("export", "--checkpoint", self.ckpt, "--format", "safetensors", "-o", plain).returncode, 0)
        tensors, metadata = reference_read(plain)
        other = self.path("other-writer.safetensors")
        safetensors.torch.save_file(tensors, other, metadata=without_checksums(metadata))
        relabelled = fixtures.rewrite_safetensors(other, self.path("other-relabelled.safetensors"),
                             edit_header=lambda h: h["fc.weight"].update(dtype="I32"))
        self.assertEqual(self.probe.read(relabelled)["verified"], "nothing")
        r = cli("models", "--arch", "resnet8", "--num-classes", "10", "--weights", relabelled)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("tensor 'fc.weight' is Int in the file but Float in the model", r.stderr)
        r = cli("models", "--arch", "resnet8", "--num-classes", "10", "--weights", other)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
