"""The environment header of a benchmark report: what ran, where, and how fast it could go.

Versions, device and backend, the BLAS that CPU matmuls actually go through, the weights
(dtype, quantization, parameters, bytes) of both models, and a memory-bandwidth roofline:
decoding one token reads every weight once (an untied input embedding only one row of it), so
tokens/s can't beat bandwidth / those bytes.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from specmlx.engine.cache import calls_compiled
from specmlx.engine.compiled import compilable
from specmlx.engine.device import backend, blas_in_use


def model_info(model: nn.Module, path: Path | None) -> dict[str, Any]:
    """Dtype, quantization, parameter count and bytes of a loaded model's weights."""
    from mlx_lm.utils import get_total_parameters

    named = tree_flatten(model.parameters())
    weights = [w for _, w in named]
    # An untied input embedding is read one row per token, not whole as the lm_head is.
    untied = any("lm_head" in name for name, _ in named)
    embedding = sum(w.nbytes for name, w in named if "embed_tokens" in name) if untied else 0
    dtypes = Counter(str(w.dtype).removeprefix("mlx.core.") for w in weights)
    config = {}
    if path is not None and (Path(path) / "config.json").is_file():
        config = json.loads((Path(path) / "config.json").read_text())
    return {
        "path": str(path) if path is not None else None,
        "model_type": config.get("model_type"),
        "dtype": dtypes.most_common(1)[0][0] if dtypes else None,
        "quantization": config.get("quantization"),
        "parameters": int(get_total_parameters(model)),
        "bytes": int(sum(w.nbytes for w in weights)),
        "bytes_per_call": int(sum(w.nbytes for w in weights) - embedding),
    }


def measure_bandwidth(gigabytes: float = 1.0, reps: int = 3) -> dict[str, float]:
    """Read bandwidth in GB/s: the median time of a sum over a float32 array this large.

    Measured twice, through MLX (on its default device) and through numpy (whose CPU sum is
    vectorized where MLX's CPU reduction may not be); `best` is the higher, the one a roofline
    should use.
    """
    n = max(int(gigabytes * 1e9) // 4, 1)
    mlx_rate, numpy_rate = _mlx_rate(n, reps), _numpy_rate(n, reps)
    return {"mlx": mlx_rate, "numpy": numpy_rate, "best": max(mlx_rate, numpy_rate)}


def _mlx_rate(n: int, reps: int) -> float:
    data = mx.ones((n,), dtype=mx.float32)
    mx.eval(data)
    rate = data.nbytes / _median_time(lambda: mx.eval(data.sum()), reps) / 1e9
    mx.clear_cache()
    return rate


def _numpy_rate(n: int, reps: int) -> float:
    import numpy as np

    array = np.ones(n, dtype=np.float32)
    return array.nbytes / _median_time(array.sum, reps) / 1e9


def _median_time(work: Any, reps: int) -> float:
    work()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def environment(models: Any, bandwidth_gb: float = 1.0) -> dict[str, Any]:
    """The whole header for a loaded `specmlx.api.models.Models`."""
    from specmlx import __version__

    target = model_info(models.target, models.target_path)
    draft = model_info(models.draft, models.draft_path) if models.draft is not None else None
    bandwidth = measure_bandwidth(bandwidth_gb)
    return {
        "specmlx": __version__,
        "mlx": mx.__version__,
        "mlx_lm": _version("mlx-lm"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "device": str(mx.default_device()),
        "backend": backend(),
        "blas": blas_in_use() if backend() == "cpu" else "not used (matmuls run on the GPU)",
        "ld_preload": os.environ.get("LD_PRELOAD") or None,
        # Whether the target's calls run as one compiled graph (`specmlx.engine.compiled`).
        "compiled_calls": calls_compiled() and compilable(models.target),
        "target": target,
        "draft": draft,
        "bandwidth_gb_s": bandwidth["best"],
        "bandwidth_probes_gb_s": {"mlx": bandwidth["mlx"], "numpy": bandwidth["numpy"]},
        "bytes_per_target_call": target["bytes_per_call"],
        "roofline_tokens_per_sec": bandwidth["best"] * 1e9 / target["bytes_per_call"],
    }


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
