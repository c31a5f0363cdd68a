"""Calibration: the measured call costs of a (device, target, drafter, dtype), cached on disk.

The first use of a combination measures, in a few seconds, one draft call and target calls of
1..16 tokens (`specmlx.engine.costs.measure_costs`) and writes them to the user cache folder; later
uses read them back. The key covers everything that changes the costs: the device and its
BLAS, mlx's version, the target's and the draft model's weights (folder, file sizes and
times) and their dtypes. Anything different is a new key, so it is measured again.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from specmlx.engine.costs import CostProfile, measure_costs
from specmlx.io.files import write_atomic

CALIBRATION_KS = (1, 2, 3, 4, 6, 8, 12, 16)
# Bumped whenever `measure_costs` measures differently, so old figures are measured again.
MEASUREMENT = 3


def _model_key(model: nn.Module | None, path: Path | None) -> dict[str, Any] | None:
    if model is None:
        return None
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())})
    files = []
    if path is not None:
        for f in sorted(Path(path).glob("*.safetensors")):
            stat = f.stat()
            files.append([f.name, stat.st_size, int(stat.st_mtime)])
    return {"path": str(path), "files": files, "dtypes": dtypes}


def calibration_key(models: Any, with_draft: bool) -> dict[str, Any]:
    """Everything the costs depend on, as plain data."""
    from specmlx.engine import device

    return {
        "measurement": MEASUREMENT,
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "backend": device.backend(),
        "cpu": platform.processor() or platform.machine(),
        "blas": device.blas_in_use() if device.backend() == "cpu" else None,
        "target": _model_key(models.target, models.target_path),
        "draft": _model_key(models.draft, models.draft_path) if with_draft else None,
    }


def cache_file(key: dict[str, Any]) -> Path:
    from specmlx.io.registry import user_cache_dir

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return user_cache_dir() / "calibration" / f"{digest}.json"


def load_or_measure(
    models: Any, with_draft: bool, *, force: bool = False
) -> tuple[CostProfile, bool]:
    """The cached profile for this combination, or a fresh measurement; and whether fresh."""
    key = calibration_key(models, with_draft)
    path = cache_file(key)
    if not force and path.exists():
        try:
            data = json.loads(path.read_text())
            if data["key"] == key:
                return _profile(data["profile"]), False
        except (OSError, ValueError, KeyError):
            pass  # unreadable: measure again
    profile = measure_costs(
        models.target, models.draft if with_draft else None, CALIBRATION_KS, reps=3
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"key": key, "profile": profile.as_dict()}, indent=2))
    return profile, True


def _profile(data: dict[str, Any]) -> CostProfile:
    return CostProfile(
        target_call_seconds=data["target_call_seconds"],
        draft_call_seconds=data["draft_call_seconds"],
        v={int(k): r for k, r in data["v"].items()},
    )
