"""WebDataset tar shards (issue 36): `convnets pack`, shards read by the webdataset library and DALI, foreign shards
read by convnets, the streaming order across ranks and threads, bit-exact resume, hostile shards, and image folders
with symbolic-link cycles and list files with a byte-order mark.
"""
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import unittest

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import pth2safetensors  # noqa: E402
import runner  # noqa: E402

BIN = os.environ["CONVNETS_BIN"]
FASHION = "/usr/share/datasets/fashion-mnist"


def convnets(*args, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def bench_eval(path, *extra, images=1, batch_size=1):
    """`bench data --eval` at 16 px: enough to list a location and load a few samples from it."""
    return convnets("bench", "data", path, "--eval", "--image-size", "16", "--batch-size", str(batch_size),
                    "--images", str(images), *extra, timeout=120)


def make_folder(root, classes=("cat", "dog", "eel"), per_class=10, size=(40, 32), seed=0):
    """Small JPEG (and one PNG) class folders; returns [(path, label)] in ImageFolder order."""
    rng = np.random.default_rng(seed)
    samples = []
    for c, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            ext = "png" if i == 3 else "jpg"
            path = os.path.join(root, name, f"img{i:02d}.{ext}")
            Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
            samples.append((path, c))
    return samples


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def tar_bytes(members):
    """A tar archive (Python's tarfile, PAX format) of [(name, bytes)]."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def jpeg(seed=0, size=(24, 24)):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
        buf, format="JPEG")
    return buf.getvalue()


class PackAndPeers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-shards-")
        cls.folder = os.path.join(cls.tmp, "folder")
        cls.samples = make_folder(cls.folder)
        # Files pack must skip, each with its reason: not an image by extension (never listed),
        # and a .jpg that is no JPEG.
        with open(os.path.join(cls.folder, "cat", "notes.txt"), "w") as f:
            f.write("not an image")
        with open(os.path.join(cls.folder, "dog", "zz_broken.jpg"), "wb") as f:
            f.write(b"this is not a JPEG")
        cls.shards = os.path.join(cls.tmp, "shards")
        cls.pack = convnets("pack", cls.folder, "-o", cls.shards, "--shard-size", "40KB", "--json")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def shard_files(self, ext=".tar"):
        return sorted(os.path.join(self.shards, f) for f in os.listdir(self.shards) if f.endswith(ext))

    def test_pack_writes_shards_indexes_classes_and_a_summary(self):
        self.assertEqual(self.pack.returncode, 0, self.pack.stderr)
        summary = json.loads(self.pack.stdout)["train"]
        self.assertEqual(summary["samples"], len(self.samples))
        self.assertGreater(len(summary["shards"]), 2)  # 40 KB shards of ~4 KB samples
        self.assertEqual(summary["shards"], self.shard_files())
        self.assertEqual([s[:-4] + ".idx" for s in summary["shards"]], self.shard_files(".idx"))
        self.assertEqual(summary["bytes"], sum(os.path.getsize(s) for s in self.shard_files()))
        self.assertEqual(len(summary["skipped"]), 1)
        self.assertIn("zz_broken.jpg: neither a JPEG nor a PNG", summary["skipped"][0])
        with open(os.path.join(self.shards, "classes.txt")) as f:
            self.assertEqual(f.read().split("\n"), ["cat", "dog", "eel", ""])
        for shard in self.shard_files():
            self.assertLessEqual(os.path.getsize(shard), 40_000 + 10240)
            self.assertFalse([f for f in os.listdir(self.shards) if ".tmp." in f])
            # POSIX ustar members KEY.cls then KEY.jpg|png, as tar(1) lists them.
            with tarfile.open(shard) as t:
                names = t.getnames()
                self.assertTrue(all(t.getmember(n).isreg() for n in names))
            self.assertEqual([n.split(".")[1] for n in names[::2]], ["cls"] * (len(names) // 2))
            self.assertTrue(all(n.split(".")[1] in ("jpg", "png") for n in names[1::2]))

    def test_dali_index_files_equal_wds2idx(self):
        wds2idx = os.path.join(os.path.dirname(sys.executable), "wds2idx")
        for shard in self.shard_files():
            out = os.path.join(self.tmp, "check.idx")
            subprocess.run([wds2idx, shard, out], check=True, capture_output=True)
            self.assertEqual(read_bytes(out), read_bytes(shard[:-4] + ".idx"), shard)

    def test_webdataset_library_reads_every_sample_bytes_and_label(self):
        import webdataset as wds
        got = [(s["__key__"], bytes(s.get("jpg", s.get("png"))), int(s["cls"]))
               for s in wds.WebDataset(self.shard_files(), shardshuffle=False, empty_check=False)]
        self.assertEqual([k for k, _, _ in got], [f"{i:09d}" for i in range(len(self.samples))])
        self.assertEqual([(b, c) for _, b, c in got], [(read_bytes(p), c) for p, c in self.samples])

    def test_dali_webdataset_reader_reads_every_sample_bytes_and_label(self):
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def(batch_size=1, num_threads=1, device_id=None)
        def pipe():
            image, cls = fn.readers.webdataset(paths=self.shard_files(), index_paths=self.shard_files(".idx"),
                                               ext=["jpg;png", "cls"], missing_component_behavior="error",
                                               dtypes=[types.UINT8, types.UINT8], random_shuffle=False,
                                               name="reader")
            return image, cls

        p = pipe()
        p.build()
        got = []
        for _ in range(len(self.samples)):
            image, cls = p.run()
            got.append((bytes(np.array(image[0])), int(bytes(np.array(cls[0])).decode())))
        self.assertEqual(got, [(read_bytes(p_), c) for p_, c in self.samples])

    def test_shuffled_pack_mixes_classes_and_keeps_every_sample(self):
        out = os.path.join(self.tmp, "shuffled")
        r = convnets("pack", self.folder, "-o", out, "--shard-size", "40KB", "--shuffle", "--seed", "5", "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        import webdataset as wds
        shards = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))
        first = [int(s["cls"]) for s in wds.WebDataset(shards[:1], shardshuffle=False, empty_check=False)]
        self.assertGreater(len(set(first)), 1)
        every = sorted((bytes(s.get("jpg", s.get("png"))), int(s["cls"]))
                       for s in wds.WebDataset(shards, shardshuffle=False, empty_check=False))
        self.assertEqual(every, sorted((read_bytes(p), c) for p, c in self.samples))

    def test_pack_refuses_to_mix_with_an_older_pack(self):
        r = convnets("pack", self.folder, "-o", self.shards)
        self.assertEqual(r.returncode, 1)
        self.assertIn("already holds", r.stderr)
        self.assertIn("train-*.tar", r.stderr)

    def bench_batches(self, data, *args, batch_size=4, images=4):
        out = os.path.join(tempfile.mkdtemp(dir=self.tmp), "batches.safetensors")
        r = convnets("bench", "data", data, "--image-size", "24", "--batch-size", str(batch_size), "--images",
                     str(images), "--save-batches", out, *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors, _ = pth2safetensors.read_safetensors(out)
        return r, tensors

    def test_folder_and_its_shards_give_identical_evaluation_batches(self):
        _, a = self.bench_batches(self.folder, "--eval", "--workers", "2")
        r, b = self.bench_batches(self.shards, "--eval", "--workers", "2")
        self.assertIn("webdataset", r.stdout)
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertTrue((a[k] == b[k]).all(), k)

    def test_brace_pattern_and_single_shard_are_read(self):
        n = len(self.shard_files())
        r = convnets("bench", "data", os.path.join(self.shards, "train-{000000..%06d}.tar" % (n - 1)), "--eval",
                     "--image-size", "24", "--batch-size", "2", "--images", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{n} shards ({n} indexed), {len(self.samples)} samples, 3 classes", r.stdout)
        r = convnets("bench", "data", os.path.join(self.shards, "train-{000000..%06d}.tar" % n), "--eval")
        self.assertEqual(r.returncode, 1)
        self.assertIn("train-%06d.tar: no such shard" % n, r.stderr)
        r = convnets("bench", "data", os.path.join(self.shards, "train-{000000..}.tar"), "--eval")
        self.assertEqual(r.returncode, 1)
        self.assertIn("is not a range of decimal numbers", r.stderr)

    def test_an_upper_case_tar_name_is_a_shard(self):
        upper = os.path.join(self.tmp, "UPPER.TAR")
        shutil.copyfile(self.shard_files()[0], upper)
        r = bench_eval(upper)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("webdataset " + upper + ": 1 shard", r.stdout)

    def test_training_order_is_thread_independent_and_split_evenly_over_ranks(self):
        _, one = self.bench_batches(self.shards, "--train", "--workers", "1", "--seed", "3")
        _, two = self.bench_batches(self.shards, "--train", "--workers", "2", "--seed", "3")
        for k in one:
            self.assertTrue((one[k] == two[k]).all(), k)
        # 30 samples over 2 ranks: 15 each, every sample once (DistributedSampler's count), and not only the
        # counts: the pixels each rank loads in its first epoch, the two sets disjoint and together the whole set.
        def first_epoch(*rank_args):
            r, tensors = self.bench_batches(self.shards, "--eval", *rank_args, "--workers", "1", "--json",
                                            batch_size=5, images=30)
            images = [tensors[k] for k in sorted(tensors) if k.startswith("images.0.")]
            digests = [hashlib.sha1(x.numpy().tobytes()).hexdigest() for b in images for x in b]
            return json.loads(r.stdout)["samples_per_epoch"], digests
        whole_count, whole = first_epoch()
        self.assertEqual((whole_count, len(whole), len(set(whole))), (30, 30, 30))
        ranks = [first_epoch("--rank", str(rank), "--world-size", "2") for rank in (0, 1)]
        self.assertEqual([(count, len(px)) for count, px in ranks], [(15, 15), (15, 15)])
        both = set(ranks[0][1]) & set(ranks[1][1])
        self.assertEqual(len(both), 0, "%d samples were loaded by both ranks" % len(both))
        self.assertTrue(set(ranks[0][1]) | set(ranks[1][1]) == set(whole), "the two ranks miss samples of the set")


class ShardWriterShards(unittest.TestCase):
    """Shards written by the webdataset library's ShardWriter (PAX headers, cls as text) train and evaluate."""

    def test_train_and_eval_on_shardwriter_shards(self):
        import webdataset as wds
        with tempfile.TemporaryDirectory() as tmp:
            rng = np.random.default_rng(1)
            with wds.ShardWriter(os.path.join(tmp, "part-%06d.tar"), maxcount=10, verbose=0) as sink:
                for i in range(24):
                    buf = io.BytesIO()
                    Image.fromarray(rng.integers(0, 255, (30, 30, 3), dtype=np.uint8)).save(buf, format="JPEG")
                    sink.write({"__key__": f"sample{i:04d}", "jpg": buf.getvalue(), "cls": i % 3})
            ws = os.path.join(tmp, "ws")
            pattern = os.path.join(tmp, "part-{000000..000002}.tar")
            r = convnets("train", pattern, "--arch", "resnet8", "--epochs", "1", "--warmup", "0", "--batch-size", "8",
                         "--image-size", "28", "--device", "cpu", "--precision", "fp32", "--workspace", ws)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("webdataset", r.stdout)
            r = convnets("eval", pattern, "--checkpoint", os.path.join(ws, "last.safetensors"), "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["images"], 24)


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class FashionMnistShards(unittest.TestCase):
    def test_shards_of_idx_resume_bit_exact_and_evaluate_like_the_idx(self):
        with tempfile.TemporaryDirectory() as tmp:
            shards = os.path.join(tmp, "shards")
            r = convnets("pack", FASHION, "-o", shards, "--max-images", "1024", "--shard-size", "200KB", "--quiet")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("val: ", r.stdout)  # the IDX folder's two splits
            args = ["--recipe", "fashion-mnist-resnet8", "--batch-size", "64", "--epochs", "2",
                    "--print-freq", "1", "--max-val-images", "256"]
            a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
            r = convnets("train", shards, *args, "--workspace", a)
            self.assertEqual(r.returncode, 0, r.stderr)
            # The same run stopped after epoch 1, then resumed from its checkpoint.
            r = convnets("train", shards, *args, "--workspace", b, "--run-epochs", "1")
            self.assertEqual(r.returncode, 0, r.stderr)
            r = convnets("train", "--resume", os.path.join(b, "last.safetensors"))
            self.assertEqual(r.returncode, 0, r.stderr)
            ta, _ = pth2safetensors.read_safetensors(os.path.join(a, "last.safetensors"))
            tb, _ = pth2safetensors.read_safetensors(os.path.join(b, "last.safetensors"))
            self.assertEqual([k for k in ta if not (ta[k] == tb[k]).all()], [])
            # The packed PNGs evaluate exactly as the IDX pixels they came from.
            ckpt = os.path.join(a, "last.safetensors")
            e1 = convnets("eval", shards, "--checkpoint", ckpt, "--max-images", "256", "--json")
            e2 = convnets("eval", FASHION, "--checkpoint", ckpt, "--max-images", "256", "--json")
            self.assertEqual(e1.returncode, 0, e1.stderr)
            self.assertEqual(e2.returncode, 0, e2.stderr)
            self.assertEqual(json.loads(e1.stdout)["val.top1"], json.loads(e2.stdout)["val.top1"])
            self.assertEqual(json.loads(e1.stdout)["val.loss"], json.loads(e2.stdout)["val.loss"])


class HostileShards(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="convnets-hostile-shards-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write(self, name, data):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def good(self, n=3):
        out = []
        for i in range(n):
            out += [(f"ok{i}.cls", str(i % 2).encode()), (f"ok{i}.jpg", jpeg(i))]
        return out

    def bench(self, path, *extra):
        return bench_eval(path, "--json", *extra)

    def test_truncated_shard_keeps_whole_members_and_names_the_cut_one(self):
        data = tar_bytes(self.good(3))
        cut = data.index(jpeg(2)) + 100  # inside the last image
        r = self.bench(self.write("cut.tar", data[:cut]))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok2.jpg: cut short by the end of the archive", r.stderr)
        self.assertIn("2 samples", r.stdout if "samples" in r.stdout else r.stderr + r.stdout)

    def header_offset(self, data, name):
        return data.index(name.encode())  # the name field starts the ustar header

    def test_bad_checksum_names_the_shard_and_the_byte(self):
        data = bytearray(tar_bytes(self.good(3)))
        h = self.header_offset(data, "ok1.cls")
        data[h + 1] ^= 0x20  # a flipped bit in the name: the checksum no longer matches
        r = self.bench(self.write("bad.tar", bytes(data)))
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"bad.tar: byte {h}: tar header checksum mismatch", r.stderr)

    def set_size_field(self, data, h, field):
        data[h + 124:h + 136] = field
        data[h + 148:h + 156] = b" " * 8
        data[h + 148:h + 155] = b"%06o\0" % sum(data[h:h + 512]) + b""
        return data

    def test_negative_and_huge_size_fields(self):
        data = bytearray(tar_bytes(self.good(2)))
        h = self.header_offset(data, "ok1.jpg")
        neg = self.set_size_field(bytearray(data), h, b"\xff" * 12)
        r = self.bench(self.write("neg.tar", bytes(neg)))
        self.assertEqual(r.returncode, 1)
        self.assertIn("tar size field is negative", r.stderr)
        huge = self.set_size_field(bytearray(data), h, b"77777777777\0")  # 8 GiB in a file of a few KB
        r = self.bench(self.write("huge.tar", bytes(huge)))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok1.jpg: cut short by the end of the archive (8589934591 bytes promised", r.stderr)

    def test_member_above_the_size_limit_is_skipped_without_reading_it(self):
        data = bytearray(tar_bytes(self.good(1) + [("big.cls", b"1"), ("big.jpg", b"x")]))
        h = self.header_offset(data, "big.jpg")
        size = 3 << 29  # 1.5 GiB: a sparse file holds it without the disk
        data = self.set_size_field(data, h, b"%011o\0" % size)
        path = self.write("big.tar", bytes(data[:h + 512]))
        with open(path, "r+b") as f:
            f.truncate(h + 512 + size + 1024)
        r = self.bench(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("big.jpg: 1610612736 bytes, above the 1024 MiB a member may have", r.stderr)

    def test_long_names_pax_and_gnu_are_honoured_and_oversized_ones_refused(self):
        long_key = "d" * 60 + "/" + "k" * 150
        for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
                for name, data in [(long_key + ".cls", b"1"), (long_key + ".jpg", jpeg(3))] + self.good(1):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
            r = self.bench(self.write("long.tar", buf.getvalue()), "--bad-images", "fail")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("2 samples", r.stdout)
        pax = tarfile.TarInfo("x")
        record = b"%d path=%s\n"
        body = b"x" * 70000
        n = len(record % (0, body))
        pax_data = record % (n + len(str(n)) - 1, body)
        header = bytearray(tarfile.TarInfo("PaxHeader").tobuf(tarfile.USTAR_FORMAT))
        header[156] = ord("x")
        header = self.set_size_field(header, 0, b"%011o\0" % len(pax_data))
        blob = bytes(header) + pax_data + b"\0" * (-len(pax_data) % 512) + tar_bytes(self.good(1))
        r = self.bench(self.write("paxbomb.tar", blob))
        self.assertEqual(r.returncode, 1)
        self.assertIn("PAX extended header of", r.stderr)
        self.assertIn("at most 65536", r.stderr)

    def test_member_names_are_keys_never_paths(self):
        members = [("../escape.cls", b"0"), ("../escape.jpg", jpeg(1)), ("/etc/abs.cls", b"1"),
                   ("/etc/abs.jpg", jpeg(2))]
        inner = os.path.join(self.tmp, "inner")
        os.makedirs(inner)
        path = os.path.join(inner, "names.tar")
        with open(path, "wb") as f:
            f.write(tar_bytes(members))
        before = sorted(os.listdir(self.tmp)), os.path.exists("/etc/abs.jpg")
        r = self.bench(path, "--bad-images", "fail")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 samples", r.stdout)
        self.assertEqual((sorted(os.listdir(self.tmp)), os.path.exists("/etc/abs.jpg")), before)

    def test_bad_labels_are_skipped_samples_naming_the_member(self):
        members = self.good(2) + [("word.cls", b"seven"), ("word.jpg", jpeg(4)), ("far.cls", b"7"),
                                  ("far.jpg", jpeg(5)), ("nolabel.jpg", jpeg(6))]
        path = self.write("labels.tar", tar_bytes(members))
        with open(os.path.join(self.tmp, "classes.txt"), "w") as f:
            f.write("zero\none\n")
        r = bench_eval(path, "--json", images=4)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("nolabel: no .cls/.txt/.json label", r.stderr)
        self.assertIn("word.jpg: its .cls label 'seven' is not a decimal class index", r.stderr)
        self.assertIn("far.jpg: label 7 is out of range for the 2 classes of classes.txt", r.stderr)
        r = bench_eval(path, "--bad-images", "fail", images=4)
        self.assertEqual(r.returncode, 1)
        self.assertIn("labels.tar:word.jpg", r.stderr)

    def test_webp_member_is_a_clear_error(self):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, format="WEBP")
        path = self.write("webp.tar", tar_bytes(self.good(1) + [("w.cls", b"0"), ("w.webp", buf.getvalue())]))
        r = self.bench(path)
        self.assertEqual(r.returncode, 1)
        self.assertIn("member w.webp is a .webp image, which convnets does not decode", r.stderr)

    def test_not_a_tar_is_named(self):
        r = self.bench(self.write("fake.tar", jpeg(0)))
        self.assertEqual(r.returncode, 1)
        self.assertIn("fake.tar: byte 0: not a tar archive", r.stderr)


class FoldersOnRealFileSystems(unittest.TestCase):
    def test_symlink_cycle_and_broken_link_are_skipped_with_warnings(self):
        with tempfile.TemporaryDirectory() as tmp:
            loop = os.path.join(tmp, "loop")
            make_folder(loop, classes=("a", "b"), per_class=2)
            os.symlink("..", os.path.join(loop, "a", "up"))            # a cycle through the root
            os.symlink("/nonexistent/x.jpg", os.path.join(loop, "b", "gone.jpg"))
            os.symlink(os.path.join(loop, "b"), os.path.join(loop, "b", "again"))  # back to itself
            r = bench_eval(loop, "--json", images=2, batch_size=2)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("b/gone.jpg: broken symbolic link", r.stderr)
            self.assertIn("b/again: a folder already listed", r.stderr)
            self.assertIn("a/up/a: a folder already listed", r.stderr)
            self.assertNotIn("Too many levels", r.stderr)
            self.assertNotIn("listing stopped early", r.stderr)  # the broken link's stat errno is not a readdir error

    def test_list_file_with_a_utf8_byte_order_mark(self):
        with tempfile.TemporaryDirectory() as tmp:
            make_folder(os.path.join(tmp, "imgs"), classes=("x",), per_class=2)
            with open(os.path.join(tmp, "list.txt"), "w", encoding="utf-8-sig") as f:
                f.write("imgs/x/img00.jpg 0\nimgs/x/img01.jpg 1\n")
            r = bench_eval(os.path.join(tmp, "list.txt"), images=2, batch_size=2)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("2 images, 2 classes", r.stdout)


if __name__ == "__main__":
    unittest.main()
