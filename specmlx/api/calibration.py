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
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from specmlx.engine.cache import calls_compiled
from specmlx.engine.costs import CostProfile, measure_costs
from specmlx.io.files import write_atomic

CALIBRATION_KS = (1, 2, 3, 4, 6, 8, 12, 16)
# `specmlx calibrate --every-size`: the whole curve, for plots and tables.
EVERY_SIZE = tuple(range(1, 17))
# Seconds a calibration should take: where calls are slow (a 4-bit target on a CPU: seconds
# a call), fewer repetitions and sizes, the others interpolated.
CALIBRATION_BUDGET = 60.0
# A calibration expected to take longer than this shows a progress bar.
BAR_AFTER = 2.0
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
        # Compiled calls cost less to build (`specmlx.engine.compiled`): another curve.
        "compiled_calls": calls_compiled(),
    }


def cache_file(key: dict[str, Any]) -> Path:
    from specmlx.io.registry import user_cache_dir

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return user_cache_dir() / "calibration" / f"{digest}.json"


def load_or_measure(
    models: Any,
    with_draft: bool,
    *,
    force: bool = False,
    budget: float = CALIBRATION_BUDGET,
    progress: bool = True,
    every_size: bool = False,
) -> tuple[CostProfile, bool]:
    """The cached profile for this combination, or a fresh measurement within about
    `budget` seconds (a progress bar on stderr where it takes a while); and whether fresh.
    `every_size`: v(n) timed for every n in 1..16 (a cached profile that interpolated any
    of them is measured again), the repetitions cut to keep the budget, never the sizes."""
    key = calibration_key(models, with_draft)
    path = cache_file(key)
    if not force and path.exists():
        try:
            data = json.loads(path.read_text())
            cached = _profile(data["profile"])
            if data["key"] == key and (not every_size or _times_every_size(cached)):
                return cached, False
        except (OSError, ValueError, KeyError):
            pass  # unreadable: measure again
    with _calibration_bar(progress) as on_call:
        profile = measure_costs(
            models.target,
            models.draft if with_draft else None,
            EVERY_SIZE if every_size else CALIBRATION_KS,
            reps=3,
            budget=budget,
            on_call=on_call,
            thin=not every_size,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"key": key, "profile": profile.as_dict()}, indent=2))
    return profile, True


@contextmanager
def _calibration_bar(enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """`measure_costs`'s `on_call`: a bar opened once the calls left look like taking more
    than BAR_AFTER seconds (a fast calibration shows nothing)."""
    from specmlx.progress import progress_bar

    start = time.perf_counter()
    with ExitStack() as stack:
        bar, seen = None, 0

        def on_call(done: int, total: int) -> None:
            nonlocal bar, seen
            elapsed = time.perf_counter() - start
            if bar is None and enabled and done and elapsed / done * (total - done) > BAR_AFTER:
                bar = stack.enter_context(progress_bar(True, "calibrating", total, done))
            elif bar is not None:
                for _ in range(done - seen):
                    bar.advance()
            seen = done

        yield on_call


def _times_every_size(profile: CostProfile) -> bool:
    return set(EVERY_SIZE) <= set(profile.v) - set(profile.interpolated)


def _profile(data: dict[str, Any]) -> CostProfile:
    return CostProfile(
        target_call_seconds=data["target_call_seconds"],
        draft_call_seconds=data["draft_call_seconds"],
        v={int(k): r for k, r in data["v"].items()},
        interpolated=tuple(data.get("interpolated", ())),
    )
