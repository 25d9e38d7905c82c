#!/usr/bin/env python3
"""Triton Inference Server itself, serving an ONNX classifier as a Triton user deploys one on a CPU (issue 77).

Runs in .venv-triton (scripts/triton-env.sh): PyPI's nvidia-pytriton, whose wheel ships the `tritonserver` binary
and its Python backend. The ONNX file `convnets export` wrote is compiled by OpenVINO for the CPU (bf16 or fp32, the
precision pinned as convnets' OpenVINO engine pins it) and called from a PyTriton model, bound three times, one
model per request kind, all sharing the one compiled network:

  NAME         FP32 tensors [B, 3, S, S], already normalised (what perf_analyzer sends by default)
  NAME_pixels  UINT8 pixels [B, S, S, 3]: scaled to [0, 1] and normalised with ImageNet's mean and std
  NAME_jpeg    BYTES, one encoded image a row: PIL decodes it, then torchvision's eval transform as its PIL path
               computes it (the shorter side resized to S / 0.875 with PIL's bilinear filter, the centre S x S
               cropped, scaled and normalised), written here with PIL and numpy so that this environment needs no
               second copy of torch

Each with Triton's dynamic batcher (--max-batch-size, --max-queue-delay-us), on 127.0.0.1 only. It prints
"triton peer: ready HTTP PORT gRPC PORT metrics PORT" once Triton answers, and serves until SIGTERM or SIGINT.

    .venv-triton/bin/python bench/triton_peer_server.py --onnx model.onnx --name resnet50 --image-size 224
"""
import argparse
import io
import signal
import sys
import threading

import numpy as np
import openvino as ov
from PIL import Image
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def eval_transform(data: bytes, side: int) -> np.ndarray:
    """torchvision's Resize(side / 0.875) + CenterCrop(side) + ToTensor + Normalize on a PIL image, CHW float32."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    short = int(side / 0.875)
    # torchvision's Resize(int) keeps the aspect ratio, truncating the long side (functional._compute_resized_output_size).
    nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    image = image.resize((nw, nh), Image.BILINEAR)
    # CenterCrop rounds the offsets as torchvision does: int(round((size - crop) / 2)).
    left, top = int(round((nw - side) / 2.0)), int(round((nh - side) / 2.0))
    image = image.crop((left, top, left + side, top + side))
    return pixels_to_chw(np.asarray(image, dtype=np.uint8)[None])[0]


def pixels_to_chw(pixels: np.ndarray) -> np.ndarray:
    """[B, S, S, 3] uint8 -> [B, 3, S, S] float32, normalised."""
    x = (pixels.astype(np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", required=True, help="the network, as `convnets export --format onnx --dynamic-batch` wrote it")
    ap.add_argument("--name", required=True, help="the model's name (NAME, NAME_pixels, NAME_jpeg)")
    ap.add_argument("--image-size", type=int, required=True)
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--threads", type=int, default=0, help="OpenVINO's threads (0: its default, every core)")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--max-queue-delay-us", type=int, default=2000)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    a = ap.parse_args()

    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "bf16" if a.precision == "bf16" else "f32"}
    if a.threads:
        config["INFERENCE_NUM_THREADS"] = a.threads
    compiled = core.compile_model(core.read_model(a.onnx), "CPU", config)
    # One request object per bound model: Triton runs one instance of each, so no two calls share one.
    lock = threading.Lock()

    def run(x: np.ndarray) -> np.ndarray:
        with lock:
            return np.asarray(compiled(x)[0], dtype=np.float32)

    side = a.image_size

    @batch
    def infer_tensor(input):  # noqa: A002 (the input's name)
        return {"output": run(np.ascontiguousarray(input, dtype=np.float32))}

    @batch
    def infer_pixels(pixels):
        return {"output": run(pixels_to_chw(pixels))}

    @batch
    def infer_jpeg(image):
        return {"output": run(np.stack([eval_transform(bytes(row[0]), side) for row in image]))}

    batching = DynamicBatcher(max_queue_delay_microseconds=a.max_queue_delay_us)
    model_config = ModelConfig(max_batch_size=a.max_batch_size, batcher=batching)
    classes = compiled.output(0).get_partial_shape()[1].get_length()
    output = (Tensor(name="output", dtype=np.float32, shape=(classes,)),)
    config = TritonConfig(http_address="127.0.0.1", http_port=a.http_port, grpc_address="127.0.0.1",
                          grpc_port=a.grpc_port, metrics_address="127.0.0.1", metrics_port=a.metrics_port,
                          allow_gpu_metrics=False, log_verbose=0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # PyTriton closes shared memory to clients without its token by default; the load generator registers its
    # region as any Triton client does (convnets serve, on loopback, restricts nothing by default either).
    security = TritonSecurityConfig(restricted_endpoints=["model-repository", "statistics", "trace", "logging"])
    with Triton(config=config, security_config=security) as triton:
        triton.bind(model_name=a.name, infer_func=infer_tensor,
                    inputs=[Tensor(name="input", dtype=np.float32, shape=(3, side, side))], outputs=output,
                    config=model_config)
        triton.bind(model_name=a.name + "_pixels", infer_func=infer_pixels,
                    inputs=[Tensor(name="pixels", dtype=np.uint8, shape=(side, side, 3))], outputs=output,
                    config=model_config)
        triton.bind(model_name=a.name + "_jpeg", infer_func=infer_jpeg,
                    inputs=[Tensor(name="image", dtype=np.bytes_, shape=(1,))], outputs=output, config=model_config)
        triton.run()
        print(f"triton peer: ready HTTP {a.http_port} gRPC {a.grpc_port} metrics {a.metrics_port}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
