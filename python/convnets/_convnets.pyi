# Type stubs of the extension module convnets._convnets (src/python/module.cpp). Users import convnets, not this.
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

__version__: str
default_max_image_pixels: int

class BadImageError(OSError): ...
class ImageTooLargeError(BadImageError): ...
class BadImageWarning(UserWarning): ...

def engine_versions() -> str: ...
def engines() -> List[str]: ...
def environment_rank() -> Tuple[int, int]: ...
def models(num_classes: int = 1000) -> List[Dict[str, Any]]: ...
def export(options: ExportOptions) -> str: ...
def choices() -> Dict[str, List[str]]: ...

class ExportOptions:
    checkpoint: str
    output: str
    format: str
    key_style: str
    dtype: str
    arch: str
    key_layout: str
    ema: bool
    dynamic_batch: bool
    fold_bn: bool
    image_size: int
    opset: int
    batch_size: int
    int8: bool
    reduce_range: bool
    calibration: str
    calibration_method: Optional[str]  # None: percentile, or a QAT checkpoint's own
    activations: Optional[str]  # None: uint8, or a QAT checkpoint's own
    silu: Optional[str]  # None: ops, or a QAT checkpoint's own
    device: str
    calibration_images: int
    calibration_batch: int
    max_image_pixels: int
    workers: int
    triton: TritonSettings
    def __init__(self) -> None: ...

class DynamicBatching:
    max_batch_size: int
    preferred_batch_sizes: List[int]
    max_queue_delay_us: int
    instances: int
    max_queue_size: int
    def __init__(self) -> None: ...

class TritonSettings:
    name: str
    batching: DynamicBatching
    instance_kind: str
    backend: str
    accelerator: str
    trt_precision: str
    preprocessing: str
    def __init__(self) -> None: ...

class PipelineOptions:
    train: bool
    image_size: int
    batch_size: int
    workers: int
    prefetch: int
    seed: int
    drop_last: Optional[bool]
    rank: int
    world_size: int
    crop_scale_min: float
    crop_padding: int
    flip: bool
    interpolation: str
    augment: str
    reprob: float
    recount: int
    remode: str
    crop_ratio: float
    dct_scaling: Optional[bool]
    bad_images: str
    max_image_pixels: int
    def __init__(self) -> None: ...

class _Loader:
    def __init__(self, source: str, split: str, options: PipelineOptions, max_images: int, device: str,
                 normalize: Optional[bool], dtype: str, memory_format: str, mean: Optional[Sequence[float]],
                 std: Optional[Sequence[float]]) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> "_Loader": ...
    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]: ...
    def set_epoch(self, epoch: int) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def epoch(self) -> int: ...
    @property
    def stats(self) -> Dict[str, Any]: ...
    @property
    def bad_files(self) -> List[str]: ...
    @property
    def classes(self) -> List[str]: ...
    @property
    def dataset(self) -> str: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def channels(self) -> int: ...

class InferenceOptions:
    ema: bool
    device: str
    precision: str
    memory_format: str
    fold_bn: bool
    engine: str
    image_size: int
    as_float: bool
    arch: str
    num_classes: Optional[int]
    key_layout: str
    cuda_graph: bool
    graph_batch_sizes: List[int]
    graph_memory_mb: float
    fused_conv: bool
    def __init__(self) -> None: ...

class _Model:
    def __init__(self, checkpoint: str, options: InferenceOptions) -> None: ...
    def __call__(self, images: torch.Tensor) -> torch.Tensor: ...
    def predict(self, paths: List[str], top_k: int, batch_size: int, max_image_pixels: int) -> List[Dict[str, Any]]: ...
    @property
    def arch(self) -> str: ...
    @property
    def classes(self) -> List[str]: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def checkpoint(self) -> str: ...
    @property
    def quantized(self) -> bool: ...
    @property
    def weights(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def kernel_precisions(self) -> Dict[str, int]: ...
    @property
    def preprocessing(self) -> Dict[str, Any]: ...
