"""specmlx's own cost per step: host time and host syncs, with the models' time taken away.

`measure_overhead` runs every method (the target alone, the draft model, prompt lookup,
lookahead, Medusa and EAGLE heads) at each k asked for, fixed or adaptive, through the one loop
(`specmlx.engine.decode.decode`) on tiny random-weight llamas built in-process
(`specmlx.testing.tiny_models`: hidden 64, 2 layers, a vocabulary of 512; the draft model is a
second one, other weights, same vocabulary; the heads have small random weights, their trees a
fixed 32 nodes). Their calls take a fraction of a millisecond, so what a step costs here is
what specmlx adds around the calls: drafting logic, verification, rewinds, the policy. No
tokenizer is involved: the loop takes token ids, and nothing stops a generation early.

Per row it reports the median wall time of a step (as the caller sees it: from one step's
output to the next's) and the host syncs a step makes, counted by
`specmlx.bench.syncs.counting_syncs`; both over the steps after the first, which also pays for
prefill. `specmlx bench --overhead` prints `render(measure_overhead())`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from rich.table import Table

from specmlx.api.calibration import CALIBRATION_KS
from specmlx.api.config import GenerationConfig
from specmlx.api.methods import METHODS, EagleOptions, MedusaOptions
from specmlx.api.models import Models
from specmlx.api.session import Session
from specmlx.bench.syncs import counting_syncs
from specmlx.engine.costs import CostProfile, measure_costs
from specmlx.testing import tiny_models


@dataclass(frozen=True)
class OverheadRow:
    """One method at one k: what a step costs beyond the models' calls."""

    method: str
    k: int | None  # None: adaptive (`-k auto`); 0 for the target alone
    steps: int  # the steps measured: all but the first
    tokens_per_step: float
    ms_per_step: float  # median wall milliseconds of a step
    syncs_per_step: float  # mean host syncs of a step
    max_syncs_per_step: int

    @property
    def name(self) -> str:
        if self.method == "none":
            return "none"
        return f"{self.method} k={'auto' if self.k is None else self.k}"


def measure_overhead(
    methods: Seq[str] | None = None,
    ks: Seq[int | None] = (4, None),
    *,
    max_tokens: int = 48,
    prompt_tokens: int = 32,
    vocab_size: int = 512,
    warmup: int = 1,
    seed: int = 0,
    models: Models | None = None,
) -> tuple[OverheadRow, ...]:
    """Every method of `methods` (all by default) at every k of `ks` (None: auto), greedy,
    `max_tokens` tokens after a repetitive prompt of `prompt_tokens` ids (so prompt lookup
    and lookahead find drafts). The target alone runs once, at k = 0. Each row first runs
    `warmup` unmeasured generations."""
    models = models or tiny_models(vocab_size, seed)
    pattern = [(7 * i) % 61 + 3 for i in range(8)]  # ids below any tiny vocabulary's end
    prompt = (pattern * (prompt_tokens // len(pattern) + 1))[:prompt_tokens]
    # Adaptive k's costs, measured here and kept in memory: the tiny models have no
    # calibration of their own in the user's cache.
    profile = measure_costs(models.target, models.draft, CALIBRATION_KS, reps=3)
    rows = []
    for method in methods or list(METHODS):
        for k in (0,) if method == "none" else dict.fromkeys(ks):
            # k 0 (the target alone) needs none: without a drafter the policy plans k = 0.
            # Fixed trees for heads: sizing them from costs would need a calibration of the
            # tiny target, and would measure the sizing rule rather than the drafter.
            options = {"eagle": EagleOptions(tree_size=32), "medusa": MedusaOptions(tree_size=32)}
            options = options.get(method)
            config = GenerationConfig(
                method=method, options=options, k=k or None, max_tokens=max_tokens
            )
            for _ in range(warmup):
                _run(models, config, prompt, profile)
            rows.append(_measure(models, config, prompt, profile, method, k))
    return tuple(rows)


def _run(models: Models, config: GenerationConfig, prompt: list[int], profile: CostProfile):
    """One generation's steps, lazily (the caller times and counts them), from fresh caches."""
    return Session(models, config, profile).steps(prompt)


def _measure(
    models: Models,
    config: GenerationConfig,
    prompt: list[int],
    profile: CostProfile,
    method: str,
    k: int | None,
) -> OverheadRow:
    seconds: list[float] = []
    syncs: list[int] = []
    tokens: list[int] = []
    steps = _run(models, config, prompt, profile)  # built outside the count: only steps are counted
    with counting_syncs() as counter:
        before, last = counter.count, time.perf_counter()
        for step in steps:
            now = time.perf_counter()
            seconds.append(now - last)
            syncs.append(counter.count - before)
            tokens.append(len(step.tokens))
            before, last = counter.count, time.perf_counter()
    # The first step also prefills the target (and maybe the draft model): not a step's cost.
    seconds, syncs, tokens = seconds[1:], syncs[1:], tokens[1:]
    return OverheadRow(
        method=method,
        k=k,
        steps=len(seconds),
        tokens_per_step=float(statistics.mean(tokens)) if tokens else 0.0,
        ms_per_step=1000 * statistics.median(seconds) if seconds else 0.0,
        syncs_per_step=float(statistics.mean(syncs)) if syncs else 0.0,
        max_syncs_per_step=max(syncs, default=0),
    )


def render(rows: Seq[OverheadRow]) -> Table:
    """The rows as a table: one line per method and k."""
    table = Table(
        title="specmlx overhead per step, on tiny random models (their calls cost ~nothing)",
        caption="ms/step: median wall time of a step after the first; syncs: host syncs "
        "(mx.eval, item, tolist, int, bool) per step after the first, mean and most. "
        "The loop aims at one per step.",
    )
    for title in ("method", "k", "steps", "tok/step", "ms/step", "syncs/step", "max syncs"):
        table.add_column(title, justify="left" if title == "method" else "right")
    for row in rows:
        k = "—" if row.method == "none" else "auto" if row.k is None else str(row.k)
        table.add_row(
            row.method,
            k,
            str(row.steps),
            f"{row.tokens_per_step:.2f}",
            f"{row.ms_per_step:.2f}",
            f"{row.syncs_per_step:.2f}",
            str(row.max_syncs_per_step),
        )
    return table
