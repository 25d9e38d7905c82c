"""convnets' data loader for PyTorch training scripts: C++ threads decode and augment, Python gets torch tensors.

The loader is the one ``convnets train`` and ``convnets bench data`` use (the
same library, the same options), so for the same source, options, seed and
epoch it yields exactly the batches the command line loads.
"""
import os
from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import _convnets

__all__ = ["Loader"]

_StrPath = Union[str, os.PathLike]


def _dist_rank_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """The shard of this process: as given, else torch.distributed's group, else torchrun's environment."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        r, w = _convnets.environment_rank()
    return (r if rank is None else rank), (w if world_size is None else world_size)


def _dtype_name(dtype: torch.dtype) -> str:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (torch.float32, torch.float16, torch.bfloat16), not {dtype!r}")
    return str(dtype).replace("torch.", "")


def _format_name(memory_format: torch.memory_format) -> str:
    if not isinstance(memory_format, torch.memory_format):
        raise TypeError(f"memory_format must be torch.channels_last or torch.contiguous_format, not {memory_format!r}")
    return str(memory_format).replace("torch.", "")


# The C++ pipeline's own defaults (data/pipeline.h), so that the two fronts cannot drift apart.
_DEFAULTS = _convnets.PipelineOptions()


class Loader(_convnets._Loader):
    """Batches of decoded, transformed images from a dataset, made by C++ worker threads.

    ``source`` is what ``convnets train DATA`` takes: an image folder
    (``DIR/<class>/<image>``), a root with ``train/`` and ``val/`` (the split
    ``train`` selects), a list file (``relative/path label`` per line), a
    folder with IDX files (Fashion-MNIST: ``/usr/share/datasets/fashion-mnist``),
    WebDataset tar shards (one ``.tar``, a folder of ``train-*.tar`` and
    ``val-*.tar`` as ``convnets pack`` writes them, or a brace pattern such as
    ``"shards/train-{000000..000146}.tar"``) or ``synthetic[:N]``. Shards are
    streamed: each epoch a seeded shard order, each rank an equal contiguous
    stretch of it, then a 1024-sample shuffle buffer in training.

    Iterating yields ``(images, labels)`` as torch tensors, without a copy:

    - by default ``images`` is ``uint8`` ``[B, H, W, C]`` (NHWC) on the host,
      in pinned memory when CUDA is present, and ``labels`` is ``int64`` ``[B]``;
    - with ``device="cuda"`` (or ``normalize=True``) ``images`` is
      ``(x / 255 - mean) / std`` as ``[B, 3, H, W]`` of ``dtype`` in
      ``memory_format``, computed on ``device`` from the uint8 batch (a
      grayscale source gives R = G = B), with random erasing filled there, and
      ``labels`` are on ``device`` too.

    Training (``train=True``): torchvision's RandomResizedCrop
    (``crop_scale_min``..1 of the area, ratio 3/4..4/3) to ``image_size`` and a
    horizontal flip, optionally then torchvision's RandomCrop with
    ``crop_padding`` (a shift, drawn after the crop and flip), then an optional
    ``augment`` policy (``"autoaugment"``, DLE's ImageNet policy, or timm's
    RandAugment string such as ``"rand-m9-mstd0.5"``) and timm's random erasing
    (``reprob``, ``recount``, ``remode``). Evaluation (``train=False``): resize the short side to
    ``image_size / crop_ratio`` and centre-crop ``image_size``, as torchvision
    does, bit for bit. Each sample's randomness depends only on ``seed``, the
    epoch and its index, so any ``workers`` count gives the same batches.

    Each pass (``for ... in loader``) is an epoch: the one ``set_epoch(e)``
    gave (``torch.utils.data.DistributedSampler``'s convention), else the one
    after the previous pass, starting at 0. Training shuffles with
    ``torch.randperm`` seeded by ``seed + epoch``, as DistributedSampler does.
    Breaking out of a loop ends the pass; the next ``iter()`` starts another.

    With several processes (``rank``/``world_size``, by default from
    ``torch.distributed`` when it is initialised, else from torchrun's
    environment, else 0 and 1) each rank loads its own shard: in training with
    ``drop_last``, whole batches dealt in turn, so rank r's k-th batch is batch
    ``k * world_size + r`` of a single process; otherwise samples dealt as
    DistributedSampler deals them (evaluation: each sample exactly once).

    Files that cannot be decoded are replaced by the next good sample and
    reported once each as a :class:`convnets.BadImageWarning`
    (``bad_images="skip"``), or raise :class:`convnets.BadImageError`
    (``bad_images="fail"``). Images above ``max_image_pixels`` (read from the
    header, before decoding) are refused as PIL refuses decompression bombs
    (:class:`convnets.ImageTooLargeError`, an OSError); 0 lifts the limit.

    Ctrl-C during iteration raises KeyboardInterrupt at once and stops the
    workers; ``close()`` (or ``with Loader(...) as loader:``, or dropping the
    last reference) joins them. The GIL is released while workers decode.

    Args:
        source: the dataset, as above.
        batch_size: images per batch.
        train: training transform and shuffling (True) or evaluation (False).
        image_size: output height and width in pixels.
        workers: decoding threads; 0 means one per CPU.
        seed: shuffle and augmentation seed.
        augment: training augmentation policy ("" for none).
        reprob: random erasing probability per image (needs normalised output).
        recount: random erasing boxes per erased image.
        remode: random erasing fill: "const", "rand" or "pixel" (timm's).
        interpolation: "bilinear" or "bicubic" (training also "random": either, per image).
        drop_last: drop each epoch's last partial batch; default: ``train``.
        bad_images: "skip" or "fail".
        max_image_pixels: refuse larger images (0: no limit; default PIL's 2 x MAX_IMAGE_PIXELS).
        rank: this process's shard; default as described above.
        world_size: shards; default as described above.
        device: "cpu" or "cuda"/"cuda:N": where the batches are delivered.
        normalize: normalise (default: True on CUDA, False on the CPU).
        dtype: dtype of normalised images.
        memory_format: layout of normalised images.
        mean: RGB mean on the 0..1 scale (default ImageNet's); also the policy's fill colour.
        std: RGB standard deviation (default ImageNet's).
        crop_scale_min: smallest RandomResizedCrop area fraction (1: no crop).
        crop_padding: then torchvision's ``RandomCrop(image_size, padding=crop_padding)``:
            a shift of up to this many pixels each way, zero fill (0: off).
        flip: random horizontal flip in training.
        crop_ratio: evaluation crop to resize ratio (0.875: 256 then 224).
        split: "train" or "val": which part of a train/+val/ root, IDX folder or shard folder; default by ``train``.
        max_images: use only the first N samples (0: all).
        prefetch: batches each worker prepares ahead.
        dct_scaling: JPEG DCT-domain downscaling; default on for training, off for evaluation.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: an option out of range, or a source that is not a dataset.
    """

    def __init__(
        self,
        source: _StrPath,
        *,
        batch_size: int = _DEFAULTS.batch_size,
        train: bool = _DEFAULTS.train,
        image_size: int = _DEFAULTS.image_size,
        workers: int = _DEFAULTS.workers,
        seed: int = _DEFAULTS.seed,
        augment: str = _DEFAULTS.augment,
        reprob: float = _DEFAULTS.reprob,
        recount: int = _DEFAULTS.recount,
        remode: str = _DEFAULTS.remode,
        interpolation: str = _DEFAULTS.interpolation,
        drop_last: Optional[bool] = None,
        bad_images: str = _DEFAULTS.bad_images,
        max_image_pixels: int = _DEFAULTS.max_image_pixels,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        device: Union[str, torch.device] = "cpu",
        normalize: Optional[bool] = None,
        dtype: torch.dtype = torch.float32,
        memory_format: torch.memory_format = torch.channels_last,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        crop_scale_min: float = _DEFAULTS.crop_scale_min,
        crop_padding: int = _DEFAULTS.crop_padding,
        flip: bool = _DEFAULTS.flip,
        crop_ratio: float = _DEFAULTS.crop_ratio,
        split: Optional[str] = None,
        max_images: int = 0,
        prefetch: int = _DEFAULTS.prefetch,
        dct_scaling: Optional[bool] = None,
    ) -> None:
        """A loader of ``source``; the class documentation describes every argument."""
        o = _convnets.PipelineOptions()
        o.train = train
        o.batch_size = batch_size
        o.image_size = image_size
        o.workers = workers
        o.seed = seed
        o.augment = augment
        o.reprob = reprob
        o.recount = recount
        o.remode = remode
        o.interpolation = interpolation
        o.drop_last = drop_last
        o.bad_images = bad_images
        o.max_image_pixels = max_image_pixels
        o.rank, o.world_size = _dist_rank_world(rank, world_size)
        o.crop_scale_min = crop_scale_min
        o.crop_padding = crop_padding
        o.flip = flip
        o.crop_ratio = crop_ratio
        o.prefetch = prefetch
        o.dct_scaling = dct_scaling
        super().__init__(
            os.fspath(source),
            split if split is not None else ("train" if train else "val"),
            o,
            max_images,
            str(device),
            normalize,
            _dtype_name(dtype),
            _format_name(memory_format),
            None if mean is None else [float(v) for v in mean],
            None if std is None else [float(v) for v in std],
        )

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<convnets.data.Loader (closed)>"
        return (f"<convnets.data.Loader {self.dataset}; {len(self)} batches per epoch, "
                f"{self.num_samples} samples, {self.workers} workers>")

