"""convnets from Python: the C++ toolkit's data loader, checkpoints, inference and export for PyTorch scripts.

The package is a thin front over the same C++ library as the ``convnets``
command line, linked against the same LibTorch as the ``torch`` it imports, so
the two give the same answers for the same inputs::

    import convnets
    loader = convnets.data.Loader("data/train", batch_size=256, device="cuda")
    for images, labels in loader:          # normalised float batches on the GPU
        ...
    model = convnets.load("runs/x/best.safetensors")
    model.predict(["cat.jpg"], top_k=5)    # what `convnets classify` prints
    convnets.models()                      # what `convnets models --json` lists
    convnets.export("runs/x/best.safetensors", "model.onnx", format="onnx")

Errors are Python exceptions carrying the command line's messages:
FileNotFoundError for a missing path, ValueError for a bad option or file,
OSError for a failed write, :class:`BadImageError` (an OSError) for an image
that cannot be decoded, :class:`ImageTooLargeError` for one above the pixel limit.
"""
import os
from typing import Any, Dict, List, Optional, Sequence, Union

# LibTorch's libraries, which the extension links, come from torch's own import.
import torch

from . import _convnets, data
from ._convnets import BadImageError, BadImageWarning, ImageTooLargeError

__version__: str = _convnets.__version__

__all__ = ["BadImageError", "BadImageWarning", "ImageTooLargeError", "Model", "__version__", "data", "engine_versions",
           "engines", "export", "load", "models"]

_StrPath = Union[str, os.PathLike]


def engine_versions() -> str:
    """The LibTorch, CUDA, cuDNN and OpenVINO versions the extension was built with (what ``convnets --version`` prints)."""
    return _convnets.engine_versions()


def engines() -> List[str]:
    """The inference engines this build runs: ``"torch"``, and ``"openvino"`` where it was built with OpenVINO."""
    return _convnets.engines()


class Model(_convnets._Model):
    """A trained network from a ``convnets train`` checkpoint, ready for inference (eval mode, no gradients).

    Call it on a batch to get float32 logits on its device: ``uint8``
    ``[B, H, W, 3]`` pixels (what :class:`convnets.data.Loader` yields by
    default; normalised here with the checkpoint's mean and std) or an already
    normalised float ``[B, 3, H, W]`` batch. ``predict(paths)`` classifies
    image files through the checkpoint's own evaluation preprocessing, as
    ``convnets classify --json`` does, and returns the same list.

    Attributes (read-only): ``arch``, ``classes`` (the checkpoint's class
    names), ``num_classes``, ``preprocessing`` (input_size, crop_ratio, mean,
    std, interpolation), ``checkpoint``, ``weights`` ("model" or "ema"),
    ``quantized`` (a QAT checkpoint or INT8 ONNX file run as its INT8
    network), ``device``, ``precision``, ``engine`` ("torch" or "openvino").

    Build it with :func:`convnets.load`.
    """

    def predict(self, paths: Union[_StrPath, Sequence[_StrPath]], top_k: int = 5, *, batch_size: int = 64,
                max_image_pixels: int = _convnets.default_max_image_pixels) -> List[Dict[str, Any]]:
        """Top-k classes of image files, as ``convnets classify --json`` reports them.

        Returns one dict per path, in order: ``{"path", "top": [{"class",
        "index", "probability"}, ...]}`` best first, or ``{"path", "error"}``
        for a file that could not be read or decoded (the others are still
        classified, as on the command line).
        """
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        return super().predict([os.fspath(p) for p in paths], top_k, batch_size, max_image_pixels)

    def __repr__(self) -> str:
        return (f"<convnets.Model {self.arch} ({self.weights} weights{', INT8' if self.quantized else ''}) "
                f"from {self.checkpoint}, {self.num_classes} classes, {self.engine} {self.device} {self.precision}>")


def load(checkpoint: _StrPath, *, ema: bool = False, device: str = "auto", precision: str = "fp32",
         memory_format: str = "nhwc", fold_bn: bool = False, float_weights: bool = False,
         arch: Optional[str] = None, num_classes: Optional[int] = None, engine: str = "auto",
         image_size: int = 0, key_layout: str = "auto", cuda_graph: bool = True,
         graph_batch_sizes: Optional[Sequence[int]] = None, graph_memory_mb: float = 4096,
         fused_conv: bool = True) -> Model:
    """The network of a checkpoint, as ``convnets classify`` and ``convnets eval`` load it.

    Args:
        checkpoint: a ``.safetensors`` checkpoint written by ``convnets train``
            (or plain weights, with ``arch`` and ``num_classes``), or an ONNX
            file ``convnets export`` wrote (float or INT8; OpenVINO runs it).
        ema: the checkpoint's EMA weights instead of the model's.
        device: "auto" (CUDA when present), "cpu" or "cuda".
        precision: "fp32", "tf32", "amp" or "bf16" ("tf32" and "amp" need a
            GPU; "bf16" a GPU of compute capability 8.0+ or a CPU with
            AVX512_BF16 or AMX).
        engine: "auto" (OpenVINO on the CPU where built, LibTorch on CUDA),
            "torch" or "openvino" (``--engine``).
        image_size: the input's side (0: the checkpoint's; ``--image-size``).
        memory_format: "nhwc" (channels-last) or "nchw".
        fold_bn: fold each BatchNorm into the preceding convolution.
        float_weights: a quantization-aware (QAT) checkpoint runs as its INT8
            network unless this asks for its float weights (``--float``).
        arch: the arch of a plain weights file (checked against a checkpoint's).
        num_classes: the class count of a plain weights file (default: the
            width of its classifier). A 1000-class network without class
            names of its own gets ImageNet-1k's, in the standard order.
        key_layout: how a plain weights file names its tensors
            (``--key-layout``): "auto" (the arch's layout most of them fit),
            "torchvision" (timm's ResNets too), "timm", "dle" (DLE's ResNets,
            ``layers.N``) or "gpunet" (DLE's GPUNets). ``convnets.choices()``
            lists them.
        cuda_graph: on CUDA, replay a captured CUDA graph per batch size
            instead of running each pass eagerly (``--no-cuda-graph``: False).
        graph_batch_sizes: on CUDA, the batch sizes to capture (each on first
            use); a batch is padded up to the smallest that holds it (None:
            each new batch size captured on first use; ``--graph-batch-sizes``).
        graph_memory_mb: on CUDA, the graphs' memory together, in MiB; past
            it no new graph is captured (``--graph-memory-mb``).
        fused_conv: on CUDA graphs with ``fold_bn``, each convolution with
            its bias, activation and skip as one cuDNN graph where cuDNN has
            an engine (``--no-fused-conv``: False).

    Raises:
        FileNotFoundError: no such checkpoint.
        ValueError: not a checkpoint, or an option it cannot meet.
    """
    o = _convnets.InferenceOptions()
    o.ema = ema
    o.device = device
    o.precision = precision
    o.memory_format = memory_format
    o.fold_bn = fold_bn
    o.engine = engine
    o.image_size = image_size
    o.as_float = float_weights
    o.arch = arch or ""
    o.num_classes = num_classes
    o.key_layout = key_layout
    o.cuda_graph = cuda_graph
    o.graph_batch_sizes = list(graph_batch_sizes or [])
    o.graph_memory_mb = graph_memory_mb
    o.fused_conv = fused_conv
    return Model(os.fspath(checkpoint), o)


def models(num_classes: int = 1000) -> List[Dict[str, Any]]:
    """Every architecture, as ``convnets models --json`` lists them.

    Each dict has name, description, num_classes, params, gmacs (at its input
    size), input_size, crop_ratio, mean, std, interpolation and reference.
    """
    return _convnets.models(num_classes)


def export(checkpoint: _StrPath, output: _StrPath, *, format: str = "safetensors", ema: bool = False,
           arch: Optional[str] = None, key_layout: str = "auto", dtype: str = "fp32", key_style: str = "reference",
           fold_bn: bool = False,
           dynamic_batch: bool = False, batch_size: int = 1, image_size: int = 0, opset: int = 13, int8: bool = False,
           calibration: Optional[_StrPath] = None, calibration_images: int = 512,
           calibration_method: Optional[str] = None, int8_activations: Optional[str] = None,
           int8_reduce_range: bool = False, int8_silu: Optional[str] = None, calibration_batch_size: int = 32, device: str = "cpu", workers: int = 2,
           max_image_pixels: int = _convnets.default_max_image_pixels, model_name: Optional[str] = None,
           max_batch_size: int = 64, preferred_batch_sizes: Sequence[int] = (), max_queue_delay_us: int = 100,
           engine_count_per_device: int = 1, max_queue_size: int = 64, instance_kind: str = "gpu",
           backend: str = "onnxruntime",
           backend_accelerator: str = "none",
           trt_precision: str = "fp16", preprocessing: str = "dali") -> str:
    """Does what ``convnets export`` does; each keyword is its flag (``key_style`` is ``--key-style``).

    ``format="safetensors"`` writes the weights with the reference
    implementation's names (torchvision's for ResNets, DLE's for GPUNets),
    which ``torchvision.models.resnet50(num_classes=N).load_state_dict(...)``
    takes as is. ``format="onnx"`` writes the network as ONNX (opset 13, BN
    folded with ``fold_bn``, a symbolic batch with ``dynamic_batch``); with
    ``int8=True`` as a QDQ graph calibrated on ``calibration`` images (or with
    a QAT checkpoint's own ranges); ``int8_silu`` is ``"ops"`` (a SiLU
    quantized as its Sigmoid and Mul, for ONNX Runtime; the default) or
    ``"float"`` (in float after its conv, quantized once, for OpenVINO). The
    file is written atomically. ``format="triton"`` makes ``output`` a Triton
    Inference Server model repository and writes the entry
    ``output/NAME/{config.pbtxt, labels.txt, 1/model.onnx}`` (NAME:
    ``model_name``, default the arch) for Triton's onnxruntime backend (or
    ``backend="openvino"``, CPU instances), with
    dynamic batching up to ``max_batch_size`` (at most ``max_queue_size``
    requests queued); an existing entry is never
    overwritten. With ``preprocessing="dali"`` (the default) it also writes
    ``NAME_preprocessing`` (the eval transform for Triton's DALI backend, from
    encoded image bytes) and ``NAME_ensemble`` (bytes in, logits out).
    Returns the line the command prints.
    """
    o = _convnets.ExportOptions()
    o.checkpoint = os.fspath(checkpoint)
    o.output = os.fspath(output)
    o.format = format
    o.ema = ema
    o.arch = arch or ""
    o.key_layout = key_layout
    o.dtype = dtype
    o.key_style = key_style
    o.fold_bn = fold_bn
    o.dynamic_batch = dynamic_batch
    o.batch_size = batch_size
    o.image_size = image_size
    o.opset = opset
    o.int8 = int8
    o.calibration = "" if calibration is None else os.fspath(calibration)
    o.calibration_images = calibration_images
    o.calibration_method = calibration_method
    o.activations = int8_activations
    o.reduce_range = int8_reduce_range
    o.silu = int8_silu
    o.calibration_batch = calibration_batch_size
    o.device = device
    o.workers = workers
    o.max_image_pixels = max_image_pixels
    t = o.triton
    t.name = model_name or ""
    b = t.batching
    b.max_batch_size = max_batch_size
    b.preferred_batch_sizes = list(preferred_batch_sizes)
    b.max_queue_delay_us = max_queue_delay_us
    b.instances = engine_count_per_device
    b.max_queue_size = max_queue_size
    t.batching = b
    t.instance_kind = instance_kind
    t.backend = backend
    t.accelerator = backend_accelerator
    t.trt_precision = trt_precision
    t.preprocessing = preprocessing
    return _convnets.export(o)

