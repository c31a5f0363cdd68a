"""What the device is: MLX's backend, and the BLAS that CPU matmuls actually go through.

Call costs depend on both, so the calibration's key holds them (`specmlx.api.calibration`),
and the bench's environment header reports them (`specmlx.bench.environment`).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import mlx.core as mx


def backend() -> str:
    """cpu, metal or cuda: where the default device's work runs."""
    if mx.default_device().type == mx.DeviceType.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return "gpu"


def blas_in_use() -> str:
    """The BLAS library MLX's CPU matmuls resolve to, with its path."""
    if sys.platform == "darwin":
        return "Accelerate"
    path = _symbol_library("cblas_sgemm") or _mapped_blas()
    if path is None:
        return "unknown"
    name = os.path.basename(path)
    if "openblas" in path.lower():
        return f"OpenBLAS ({path})"
    if "mkl" in name.lower():
        return f"MKL ({path})"
    if "mlx_cpu" in path and name.startswith("libblas"):
        return f"reference BLAS, vendored by mlx-cpu ({path})"
    return f"{name} ({path})"


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _symbol_library(symbol: str) -> str | None:
    """The file the global symbol lookup finds `symbol` in (LD_PRELOAD comes first)."""
    try:
        process = ctypes.CDLL(None)
        address = ctypes.cast(getattr(process, symbol), ctypes.c_void_p).value
        info = _DlInfo()
        if not process.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
            return None
        return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError, TypeError):
        return None


def _mapped_blas() -> str | None:
    """A BLAS mapped into this process, preferring OpenBLAS over mlx-cpu's reference one."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    libs = {line.split()[-1] for line in lines if ".so" in line}
    # numpy's scipy_openblas has prefixed symbols; MLX can't call into it.
    openblas = sorted(p for p in libs if os.path.basename(p).startswith("libopenblas"))
    blas = sorted(p for p in libs if os.path.basename(p).startswith("libblas"))
    return (openblas or blas or [None])[0]
