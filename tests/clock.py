"""The loop's clock for tests of `-k auto`: steps timed as the calibration prices them.

Real calls of tiny models take fractions of a millisecond, so the policy's choices would
follow the load of the machine; these tests' choices follow the costs they set."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class CalibratedClock:
    """A `time` for the loop that runs only while the models compute, and as the
    calibration prices their calls: `n` tokens through a charged model take
    `target_call_seconds * v(n)`. The steps' times then say what the costs say, on any
    machine, however loaded."""

    def __init__(self, profile):
        self.profile = profile
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def charge(self, n_tokens: int) -> None:
        self.now += self.profile.target_call_seconds * self.profile.verify_cost(n_tokens)


def calibrated_clock(monkeypatch, profile, model_class: Any, cache_dir: Path) -> CalibratedClock:
    """Calibration measures `profile` (cached under `cache_dir`), and the loop's clock runs
    only while a `model_class` model computes, as `profile` prices its calls."""
    from specmlx.api import calibration
    from specmlx.engine import decode

    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(
        calibration, "measure_costs", lambda target, draft, ks, reps, **timing: profile
    )
    clock = CalibratedClock(profile)
    monkeypatch.setattr(decode, "time", clock)
    call = model_class.__call__

    def charged(model, inputs, *args, **kwargs):
        clock.charge(inputs.shape[-1])
        return call(model, inputs, *args, **kwargs)

    monkeypatch.setattr(model_class, "__call__", charged)
    return clock
