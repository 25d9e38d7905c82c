"""Writes the fuzz targets' seed corpora (fuzz/corpus/TARGET/), small files of every kind the parsers accept.

The committed corpus is this script's output plus the inputs the fuzzers found (crashes fixed, then kept as
regression cases); rerun it only to regenerate the seeds: `.venv/bin/python fuzz/make_seeds.py`.
"""
import gzip
import io
import json
import os
import struct
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))


def put(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def image_seeds(rng):
    pixels = rng.integers(0, 255, (24, 20, 3), dtype=np.uint8)
    files = {}
    for name, mode, kwargs in [("baseline.jpg", "RGB", {"quality": 90}),
                               ("progressive.jpg", "RGB", {"progressive": True, "quality": 75}),
                               ("444.jpg", "RGB", {"subsampling": 0}),
                               ("gray.jpg", "L", {}),
                               ("cmyk.jpg", "CMYK", {}),
                               ("rgb.png", "RGB", {}),
                               ("gray.png", "L", {}),
                               ("rgba.png", "RGBA", {}),
                               ("palette.png", "P", {}),
                               ("interlaced.png", "RGB", {"interlace": 1})]:
        im = Image.fromarray(pixels).convert(mode)
        buf = io.BytesIO()
        im.save(buf, format="JPEG" if name.endswith(".jpg") else "PNG", **kwargs)
        files[name] = buf.getvalue()
    im16 = Image.fromarray((rng.integers(0, 65535, (12, 10))).astype(np.uint16))
    buf = io.BytesIO()
    im16.save(buf, format="PNG")
    files["gray16.png"] = buf.getvalue()
    # The 16 parameter bytes fuzz_image.cpp reads first: each mode (train, eval,
    # region decode, PNG) with a spread of crop and augmentation choices.
    for i, (name, data) in enumerate(sorted(files.items())):
        for mode in range(4):
            header = bytes([mode, 8 + 7 * i, 40 * i % 256, 13, 200, 50, i % 2, 1, mode % 3, 7, 9, 1, 2, 3, 4, 5])
            put("image", f"{mode}-{name}", header + data)


def dataset_seeds(rng):
    images = rng.integers(0, 255, (3, 4, 5), dtype=np.uint8)
    idx3 = struct.pack(">BBBBIII", 0, 0, 8, 3, 3, 4, 5) + images.tobytes()
    idx1 = struct.pack(">BBBBI", 0, 0, 8, 1, 3) + bytes([0, 9, 4])
    for name, a, b in [("idx-raw", idx3, idx1), ("idx-gz", gzip.compress(idx3), gzip.compress(idx1))]:
        # fuzz_dataset.cpp: mode byte 0, the split as 16-bit little-endian, images then labels.
        put("dataset", name, bytes([0]) + struct.pack("<H", len(a)) + a + b)
    put("dataset", "list", bytes([1]) + b"a/1.jpg 0\nb/2.png 1\n# comment\n\nc d.jpg 2\n")
    put("dataset", "list-tabs", bytes([1]) + b"x.jpg\t3\r\ny.jpg\t0\r\n")


def json_seeds():
    for name in sorted(os.listdir(os.path.join(ROOT, "recipes"))):
        with open(os.path.join(ROOT, "recipes", name), "rb") as f:
            put("json", "recipe-" + name, f.read())
    tiny = [{"layer_type": "data", "img_resolution": 32, "distill": False},
            {"layer_type": "head", "num_in_channels": 3, "num_out_channels": 8},
            {"layer_type": "conv", "num_in_channels": 8, "num_out_channels": 8, "stride": 1, "kernel_size": 3,
             "act": "relu", "stage": 1},
            {"layer_type": "fused_irb", "num_in_channels": 8, "num_out_channels": 8, "stride": 2, "expansion": 2,
             "kernel_size": 3, "act": "relu", "use_se": False, "stage": 2},
            {"layer_type": "irb", "num_in_channels": 8, "num_out_channels": 8, "stride": 1, "expansion": 3,
             "kernel_size": 5, "act": "swish", "use_se": True, "stage": 3},
            {"layer_type": "tail", "num_in_channels": 8, "num_out_channels": 16, "num_classes": 10}]
    put("json", "gpunet-tiny.json", json.dumps(tiny).encode())
    distill = [{"layer_type": "data", "img_resolution": 32, "distill": True},
               {"layer_type": "head_large", "num_in_channels": 3, "num_out_channels": 16},
               {"layer_type": "irb", "num_in_channels": 16, "num_out_channels": 16, "stride": 1, "expansion": 2,
                "kernel_size": 3, "groups": 2, "stage": 1},
               {"layer_type": "fused_irb", "num_in_channels": 16, "num_out_channels": 32, "stride": 2,
                "expansion": 1, "kernel_size": 3, "groups": 1, "stage": 2},
               {"layer_type": "tail", "num_in_channels": 32, "num_out_channels": 64, "num_classes": 10}]
    put("json", "gpunet-distill.json", json.dumps(distill).encode())
    meta = {"format": "convnets-checkpoint/1", "arch": "resnet8", "num_classes": 10, "epoch": 1, "step": 3,
            "class_names": ["a", "b\\xe9"], "config": {"lr": 0.1, "epochs": 2},
            "preprocessing": {"input_size": 28, "crop_ratio": 0.875, "interpolation": "bilinear"}}
    put("json", "checkpoint-meta.json", json.dumps(meta).encode())
    put("json", "dllogger-line.json", b'{"type":"LOG","step":[1,3],"data":{"train.loss":0.75,"train.lr":0.256}}')


def gpunet_build_seeds():
    # fuzz_gpunet_build.cpp reads bytes as layer choices: random strings of a few layers' length.
    import random
    rnd = random.Random(21)
    for i in range(8):
        put("gpunet_build", f"layers-{i}", bytes(rnd.randrange(256) for _ in range(4 + 8 * (i + 2))))


def safetensors_seeds():
    import torch
    from pth2safetensors import write_safetensors
    tensors = {"model.conv.weight": torch.arange(8, dtype=torch.float32).reshape(2, 1, 2, 2),
               "model.bn.num_batches_tracked": torch.tensor(3, dtype=torch.int64),
               "half": torch.ones(3, dtype=torch.float16), "flags": torch.tensor([True, False]),
               "bytes": torch.arange(5, dtype=torch.uint8), "empty": torch.zeros(0, 4)}
    path = os.path.join(HERE, "corpus", "safetensors", "small.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_safetensors(path, tensors, {"convnets": json.dumps({"format": "convnets-checkpoint/1"}), "format": "pt"})
    write_safetensors(os.path.join(os.path.dirname(path), "plain.safetensors"), {"w": torch.ones(2, 2)})
    # With the checksums convnets writes (io/safetensors.h: CRC-32C of each tensor's bytes), computed here from the
    # polynomial alone, as any other reader can.
    sums = {name: "%08x" % crc32c(t.contiguous().numpy().tobytes()) for name, t in tensors.items()}
    write_safetensors(os.path.join(os.path.dirname(path), "checksummed.safetensors"), tensors, checksums=sums)


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def torch_save_seeds():
    # What torch.save writes (a zip with data.pkl and one record per storage): a bare state dict with shared
    # storage and a strided view, and a training checkpoint with argparse arguments beside it.
    import argparse
    import collections
    import torch
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    sd = collections.OrderedDict([("conv.weight", w), ("conv.t", w.t()), ("bn.num_batches_tracked", torch.tensor(3)),
                                  ("half", torch.ones(2, dtype=torch.float16)), ("empty", torch.zeros(0, 2))])
    for name, obj in [("state_dict.pth", sd),
                      ("checkpoint.pth.tar", {"epoch": 2, "arch": "resnet8", "best_prec1": 1.5,
                                              "state_dict": sd, "args": argparse.Namespace(lr=0.1, amp=True)})]:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        put("torch_save", name, buffer.getvalue())


def weights_format_seeds():
    # fuzz_weights_format.cpp: any bytes. Each format as it begins, and the look-alikes: safetensors headers whose
    # length begins 0x80 0x02 (a pickle's PROTO) or "PK", the pre-1.6 pickle (protocol 2, and 4 with a FRAME), a zip
    # without data.pkl, and bytes that are none of them.
    import torch
    import zipfile
    tensors = {"w": torch.arange(6, dtype=torch.float32), "n": torch.tensor(3)}
    from pth2safetensors import write_safetensors
    for length in (640, 0x4b50):  # 0x80 0x02 ..., and "PK" ...
        path = os.path.join(HERE, "corpus", "weights_format", "header-%d.safetensors" % length)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_safetensors(path, tensors, {"pad": ""})
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
        write_safetensors(path, tensors, {"pad": "p" * (length - n)})
        with open(path, "rb") as f:
            assert struct.unpack("<Q", f.read(8))[0] == length, path
    for name, kwargs in (("zip.pth", {}), ("legacy2.pth", {"_use_new_zipfile_serialization": False}),
                         ("legacy4.pth", {"_use_new_zipfile_serialization": False, "pickle_protocol": 4})):
        buffer = io.BytesIO()
        torch.save(tensors, buffer, **kwargs)
        put("weights_format", name, buffer.getvalue())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("archive/version", "3\n")
    put("weights_format", "zip-without-data-pkl", buffer.getvalue())
    put("weights_format", "pickle-like", b"\x80\x02" + b"x" * 30)


def tar_seeds(rng):
    # fuzz_tar.cpp: byte 0 picks the mode (0 header scan, 1 DALI index, 2 shard as a dataset; the latter with
    # a world-size and a shuffle byte); the rest is the tar or index. Small PNG members keep inputs short.
    import tarfile
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)).save(buf, format="PNG")
    png = buf.getvalue()

    def tar(fmt, members):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 0
                t.addfile(info, io.BytesIO(data))
        return out.getvalue()

    plain = [("000000.cls", b"3"), ("000000.png", png), ("000001.cls", b"1"), ("000001.png", png),
             ("000002.txt", b"x"), ("000002.json", b'{"label": 2}'), ("000002.png", png)]
    ustar = tar(tarfile.USTAR_FORMAT, plain)
    pax = tar(tarfile.PAX_FORMAT, [("d/" + "a" * 120 + ".cls", b"0"), ("d/" + "a" * 120 + ".png", png)])
    gnu = tar(tarfile.GNU_FORMAT, [("d/" + "b" * 120 + ".cls", b"1"), ("d/" + "b" * 120 + ".png", png)])
    put("tar", "scan-ustar", b"\x00" + ustar)
    put("tar", "scan-pax", b"\x00" + pax)
    put("tar", "scan-gnu", b"\x00" + gnu)
    # The index wds2idx writes for the first two samples: data follows each 512-byte header.
    with tarfile.open(fileobj=io.BytesIO(ustar)) as t:
        m = {i.name: (i.offset_data, i.size) for i in t.getmembers()}
    lines = ["cls %d %d 000000.cls png %d %d 000000.png" % (*m["000000.cls"], *m["000000.png"]),
             "cls %d %d 000001.cls png %d %d 000001.png" % (*m["000001.cls"], *m["000001.png"])]
    index = ("v1.2 2\n" + "\n".join(lines) + "\n").encode()
    put("tar", "index-v12", b"\x01" + struct.pack("<H", len(ustar) // 512) + index)
    put("tar", "shard-ustar", b"\x02\x01\x00" + ustar)
    put("tar", "shard-pax-2ranks", b"\x02\x02\x01" + pax)
    put("tar", "shard-gnu-3ranks", b"\x02\x03\x01" + gnu)


def kserve_seeds():
    # fuzz_kserve.cpp: a flags byte (bit 0: binary extension), the header length (2 bytes), the body.
    def request(name, body, header=None):
        flags = 1 if header is not None else 0
        put("kserve", name, bytes([flags]) + struct.pack("<H", header or 0) + body)

    request("json-fp32.json", json.dumps({"id": "a", "inputs": [{"name": "input", "shape": [1, 2, 2],
                                                                   "datatype": "FP32", "data": [[1, 2], [3.5, -4]]}],
                                          "outputs": [{"name": "logits", "parameters": {"classification": 3}}]}).encode())
    request("json-types.json", json.dumps({"inputs": [
        {"name": "b", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "u", "shape": [2], "datatype": "UINT16", "data": [1, 65535]},
        {"name": "i", "shape": [1], "datatype": "INT64", "data": [-9]},
        {"name": "s", "shape": [1], "datatype": "BYTES", "data": ["label"]}]}).encode())
    image = b"\xff\xd8\xff\xe0" + bytes(range(40))
    items = struct.pack("<I", len(image)) + image + struct.pack("<I", 3) + b"abc"
    floats = struct.pack("<2f", 0.5, -1.0)
    head = json.dumps({"inputs": [
        {"name": "image", "shape": [2, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(items)}},
        {"name": "t", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
        "parameters": {"binary_data_output": True}}).encode()
    request("binary.bin", head + items + floats, header=len(head))
    # Triton's system shared memory: inputs that name a region's range instead of carrying data.
    request("shared-memory.json", json.dumps({"inputs": [
        {"name": "input", "shape": [1, 2], "datatype": "FP32",
         "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": 64}},
        {"name": "INPUT", "shape": [1, 1], "datatype": "BYTES",
         "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 44}}],
        "outputs": [{"name": "logits", "parameters": {"shared_memory_region": "out",
                                                      "shared_memory_byte_size": 40}}]}).encode())


if __name__ == "__main__":
    rng = np.random.default_rng(21)
    image_seeds(rng)
    dataset_seeds(rng)
    json_seeds()
    gpunet_build_seeds()
    safetensors_seeds()
    torch_save_seeds()
    weights_format_seeds()
    tar_seeds(rng)
    kserve_seeds()
