#!/usr/bin/env python3
"""Convert a PyTorch .pth/.pt state_dict into a safetensors file that convnets loads.

Needs only PyTorch (not the `safetensors` package). Handles checkpoints that
wrap the weights (`{"state_dict": ...}`, `{"model": ...}`) and DataParallel's
`module.` prefix. Usage:

    python3 tools/pth2safetensors.py resnet50.pth resnet50.safetensors
    python3 tools/pth2safetensors.py ckpt.pth out.safetensors --key model
    python3 tools/pth2safetensors.py timm_ckpt.pth.tar out.safetensors --allow-pickle

Files are read as torch.load(weights_only=True) does by default since PyTorch
2.6: tensors and plain containers only. A checkpoint that also pickles other
objects (timm's training checkpoints keep their argparse arguments) needs
--allow-pickle, which unpickles everything: it runs code from the file, so
only for files you trust.

Also importable: write_safetensors(path, tensors, metadata) and
read_safetensors(path) -> (OrderedDict of tensors, metadata).
"""
import argparse
import collections
import json
import os
import pickle
import struct
import sys

import torch

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_FROM_NAME = {v: k for k, v in _DTYPES.items()}


def _tensor_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the same bits
        t = t.view(torch.int16)
    return t.numpy().tobytes()


CHECKSUM_KEY = "convnets.crc32c"  # io/safetensors.h: each tensor's CRC-32C, checked by every convnets load
HEADER_CHECKSUM_KEY = "convnets.crc32c.header"  # and each tensor's header entry's


def write_safetensors(path, tensors, metadata=None, checksums=None):
    """Write name->tensor (in the given order) to `path` in safetensors format.

    A convnets file's checksums in `metadata` describe the bytes and header entries it was read with, not
    necessarily these: they are dropped (convnets then loads the file unverified, unless its checkpoint record says
    it was written with them) unless `checksums` ({name: 8 hex digits of its bytes}) gives the bytes' anew.
    """
    header = collections.OrderedDict()
    metadata = {k: v for k, v in (metadata or {}).items() if k not in (CHECKSUM_KEY, HEADER_CHECKSUM_KEY)}
    if checksums is not None:
        metadata[CHECKSUM_KEY] = json.dumps(checksums)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise SystemExit(f"tensor {name!r}: dtype {t.dtype} has no safetensors equivalent")
        data = _tensor_bytes(t)
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """Return (OrderedDict name->tensor in data order, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = collections.OrderedDict()
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = info["data_offsets"]
        dtype = _FROM_NAME[info["dtype"]]
        view_dtype = torch.int16 if dtype == torch.bfloat16 else dtype
        t = torch.frombuffer(bytearray(data[b:e]), dtype=view_dtype) if e > b else torch.empty(0, dtype=view_dtype)
        out[name] = t.view(dtype).reshape(info["shape"]).clone()
    return out, metadata


def extract_state_dict(obj, key=None):
    """Find the tensor dict inside a loaded checkpoint and drop a `module.` prefix."""
    if key is not None:
        obj = obj[key]
    elif isinstance(obj, dict) and not any(torch.is_tensor(v) for v in obj.values()):
        for k in ("state_dict", "model", "model_state_dict"):
            if k in obj and isinstance(obj[k], dict):
                obj = obj[k]
                break
    if hasattr(obj, "state_dict") and not isinstance(obj, dict):
        obj = obj.state_dict()
    tensors = collections.OrderedDict()
    for k, v in obj.items():
        if not torch.is_tensor(v):
            continue
        tensors[k[len("module."):] if k.startswith("module.") else k] = v
    if not tensors:
        raise SystemExit("no tensors found in the checkpoint; pass --key to name the entry holding them")
    return tensors


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input", help=".pth/.pt file saved with torch.save")
    p.add_argument("output", help="safetensors file to write")
    p.add_argument("--key", help="entry of the checkpoint dict that holds the state_dict")
    p.add_argument("--arch", help="recorded as metadata (e.g. resnet50)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="unpickle objects other than tensors and containers (runs code from the file: trusted files only)")
    a = p.parse_args(argv)
    try:
        obj = torch.load(a.input, map_location="cpu", weights_only=not a.allow_pickle)
    except pickle.UnpicklingError as e:
        lines = [l.strip() for l in str(e).splitlines() if l.strip()]
        # torch's message is a page long; the line naming the object is the useful one.
        first = next((l for l in lines if "Unsupported global" in l), lines[0] if lines else type(e).__name__)
        raise SystemExit("%s: holds objects other than tensors and containers (%s); if you trust the file, "
                         "convert it with --allow-pickle" % (a.input, first))
    tensors = extract_state_dict(obj, a.key)
    meta = {"format": "pt"}
    if a.arch:
        meta["arch"] = a.arch
    write_safetensors(a.output, tensors, meta)
    print(f"wrote {len(tensors)} tensors to {a.output}")


if __name__ == "__main__":
    sys.exit(main())
