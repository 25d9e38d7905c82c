"""The build backend of `pip install .` (PEP 517): builds convnets with its own CMake project against the torch of
the environment being installed into, and packs the Python package and the `convnets` command into a wheel.

The extension links that torch's LibTorch, so it must be built where that torch is importable: pip's isolated
build environment has none, hence `pip install --no-build-isolation .` (the README says so). Nothing here needs
a package beyond the standard library.

Settings (`pip install --config-settings KEY=VALUE`, or the environment):
    build-dir / CONVNETS_BUILD_DIR   reuse a CMake build folder configured for this Python and torch (e.g. the
                                     project's ./build from scripts/setup.sh): only what changed is rebuilt.
                                     Default: build-pip/<python>-torch<version>/ in the source tree.
    CUDACXX                          the nvcc to use; default the environment's cuda-toolkit wheel, else PATH.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "convnets"
SUMMARY = ("ConvNets (ResNet-50 v1.5 family, GPUNet) from C++: the data loader, checkpoints, inference and export "
           "of the convnets toolkit for PyTorch scripts")


class BuildError(RuntimeError):
    pass


def _version() -> str:
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(convnets\b[^)]*VERSION\s+([0-9.]+)", f.read())
    if not m:
        raise BuildError("CMakeLists.txt: no `project(convnets ... VERSION x.y.z)`")
    return m.group(1)


def _torch():
    try:
        import torch
        import torch.utils
    except ImportError as e:
        raise BuildError(
            f"convnets builds against the torch of the environment it is installed into, and {sys.executable} "
            f"cannot import torch ({e}). Install torch first, then run pip with --no-build-isolation "
            "(pip's isolated build environment has no torch): pip install --no-build-isolation .") from None
    return torch


def _torch_requirement() -> str:
    _torch()
    from importlib.metadata import version
    return f"torch=={version('torch')}"  # the extension is tied to the exact LibTorch it linked


def _tag() -> str:
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{plat}"


def _dist_info() -> str:
    return f"{NAME}-{_version()}.dist-info"


def _openvino_requirement(build_dir):
    """openvino==X where the build links the OpenVINO engine (its libopenvino is a load-time dependency of both the
    command and the extension) from this environment's openvino wheel; None otherwise. Without a configured
    build (metadata before the build) the environment decides, as CMake will."""
    if build_dir is not None:
        cache = _cache(build_dir)
        found = cache.get("OpenVINO_DIR", "")
        if cache.get("CONVNETS_WITH_OPENVINO", "OFF") != "ON" or not found or found.endswith("NOTFOUND"):
            return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"openvino=={version('openvino')}"
    except PackageNotFoundError:
        return None  # an OpenVINO not installed by pip: nothing pip could require


def _metadata(build_dir=None) -> str:
    requirements = [_torch_requirement(), _openvino_requirement(build_dir)]
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        f"Summary: {SUMMARY}",
        "License: see the repository",
        "Requires-Python: >=3.9",
        *[f"Requires-Dist: {r}" for r in requirements if r],
        "",
    ])


# Where the libraries the binaries load at start-up lie in an environment, from where each binary is installed:
# the extension in site-packages/convnets/, the command in the environment's bin/. The build tree's absolute
# paths into the building .venv would tie an installed wheel to that folder.
_LIBRARY_DIRS = ["torch/lib", "nvidia/cu13/lib", "openvino/libs"]


def _site_from_bin() -> str:
    return f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def _relocated(path: str, origin_to_site: str) -> bytes:
    """The ELF file at `path` with its run path replaced by paths relative to itself ($ORIGIN)."""
    import tempfile
    rpath = ":".join(f"$ORIGIN/{origin_to_site}/{d}" for d in _LIBRARY_DIRS)
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copyfile(path, copy)
        script = os.path.join(tmp, "rpath.cmake")
        with open(script, "w") as f:
            f.write(f'file(RPATH_SET FILE "{copy}" NEW_RPATH "{rpath}")\n')
        r = subprocess.run([shutil.which("cmake") or "cmake", "-P", script], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"cannot set the run path of {path} to {rpath}: {r.stderr.strip()}")
        with open(copy, "rb") as f:
            return f.read()


def _wheel_file() -> str:
    return f"Wheel-Version: 1.0\nGenerator: convnets_build\nRoot-Is-Purelib: false\nTag: {_tag()}\n"


def _cache(build_dir: str) -> dict:
    values = {}
    path = os.path.join(build_dir, "CMakeCache.txt")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = re.match(r"([A-Za-z0-9_]+):[A-Z]+=(.*)$", line.rstrip("\n"))
                if m:
                    values[m.group(1)] = m.group(2)
    return values


def _check_reuse(build_dir: str, torch) -> None:
    """A configured folder must be for this Python and this torch: the extension is tied to both."""
    cache = _cache(build_dir)
    torch_dir = cache.get("Torch_DIR", "")
    version_py = os.path.join(torch_dir, "..", "..", "..", "version.py")
    built_torch = None
    if os.path.exists(version_py):
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", open(version_py).read())
        built_torch = m.group(1) if m else None
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    python = cache.get("CONVNETS_PYTHON", "?")
    if built_torch != torch.__version__:
        raise BuildError(f"build-dir {build_dir} was configured against torch {built_torch} ({torch_dir}); "
                         f"this environment has torch {torch.__version__}: leave out build-dir to build afresh")
    probe = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != suffix:
        raise BuildError(f"build-dir {build_dir} was configured for the Python {python} "
                         f"(extension suffix {probe.stdout.strip() or '?'}); this is {sys.executable} ({suffix}): "
                         "leave out build-dir to build afresh")


def _cuda_args(build_dir: str) -> list:
    """nvcc of torch's CUDA: CUDACXX, else the environment's cuda-toolkit wheel laid out as a toolkit, else PATH."""
    if os.environ.get("CUDACXX"):
        return []
    site = sysconfig.get_paths()["purelib"]
    if os.path.exists(os.path.join(site, "nvidia", "cu13", "bin", "nvcc")):
        cuda = os.path.join(build_dir, "cuda")
        subprocess.run([os.path.join(ROOT, "scripts", "cuda-from-wheels.sh"), site, cuda], check=True)
        return [f"-DCMAKE_CUDA_COMPILER={cuda}/bin/nvcc", f"-DCUDAToolkit_ROOT={cuda}", f"-DCUDA_TOOLKIT_ROOT_DIR={cuda}"]
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if not nvcc:
        raise BuildError("no nvcc: convnets compiles its CUDA kernels in every build. Install "
                         "\"cuda-toolkit[nvcc,crt,cccl,cudart]\" of torch's CUDA version into this environment, "
                         "put a CUDA toolkit's nvcc on PATH, or set CUDACXX")
    return [f"-DCMAKE_CUDA_COMPILER={nvcc}"]


def _build_dir(config_settings) -> str:
    settings = config_settings or {}
    build_dir = settings.get("build-dir") or os.environ.get("CONVNETS_BUILD_DIR")
    if build_dir:
        return os.path.abspath(build_dir)
    return os.path.join(ROOT, "build-pip", f"py{sys.version_info.major}{sys.version_info.minor}-torch{_torch().__version__}")


def _build(config_settings) -> str:
    torch = _torch()
    build_dir = _build_dir(config_settings)
    cmake = shutil.which("cmake")
    if not cmake:
        raise BuildError("no cmake on PATH (Debian: apt install cmake; scripts/setup.sh installs all build tools)")
    if os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        _check_reuse(build_dir, torch)
    else:
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        args = [cmake, "-S", ROOT, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
                f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-DCONVNETS_PYTHON={sys.executable}",
                "-DCONVNETS_BUILD_TESTS=OFF", *_cuda_args(build_dir)]
        print("convnets_build:", " ".join(args), file=sys.stderr)
        subprocess.run(args, check=True)
    subprocess.run([cmake, "--build", build_dir, "--target", "convnets", "convnets_python"], check=True)
    return build_dir


def _record_row(path: str, data: bytes) -> list:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [path, f"sha256={digest}", str(len(data))]


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    build_dir = _build_dir(config_settings)  # a configured one says whether OpenVINO is linked; else CMake will ask
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata(build_dir if os.path.exists(os.path.join(build_dir, "CMakeCache.txt")) else None))
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(_wheel_file())
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_dir = _build(config_settings)
    package = os.path.join(build_dir, "python", NAME)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not os.path.exists(os.path.join(package, "_convnets" + suffix)):
        raise BuildError(f"{package}/_convnets{suffix} was not built (CMake said why above)")
    files = []  # (path in the wheel, bytes, executable)
    for name in sorted(os.listdir(package)):
        if name == "_convnets" + suffix:
            files.append((f"{NAME}/{name}", _relocated(os.path.join(package, name), ".."), False))
        elif name.endswith((".py", ".pyi", ".typed")):
            with open(os.path.join(package, name), "rb") as f:  # the staged links resolve to python/convnets
                files.append((f"{NAME}/{name}", f.read(), False))
    files.append((f"{NAME}-{_version()}.data/scripts/convnets",
                  _relocated(os.path.join(build_dir, "convnets"), "../" + _site_from_bin()), True))
    dist = _dist_info()
    files.append((f"{dist}/METADATA", _metadata(build_dir).encode(), False))
    files.append((f"{dist}/WHEEL", _wheel_file().encode(), False))
    wheel_name = f"{NAME}-{_version()}-{_tag()}.whl"
    out = os.path.join(wheel_directory, wheel_name)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for path, data, executable in files:
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            # pip marks a file executable only if its mode says "regular file" too.
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            writer.writerow(_record_row(path, data))
        writer.writerow([f"{dist}/RECORD", "", ""])
        z.writestr(f"{dist}/RECORD", record.getvalue())
    print(f"convnets_build: {out} ({json.dumps([p for p, _, _ in files])})", file=sys.stderr)
    return wheel_name
