"""specmlx's own cost per step: host time and host syncs, with the models' time taken away.

`measure_overhead` runs every method (the target alone, the draft model, prompt lookup,
lookahead, Medusa and EAGLE heads, suffix decoding and its hybrids; not MTP, whose layer
comes from a checkpoint on disk) at each k asked for, fixed or adaptive, through the one loop
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
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.table import Table

from specmlx.api.calibration import CALIBRATION_KS
from specmlx.api.config import GenerationConfig
from specmlx.api.methods import METHODS, EagleOptions, MedusaOptions, SuffixOptions
from specmlx.api.models import Models
from specmlx.api.session import Session
from specmlx.bench.syncs import counting_syncs
from specmlx.engine.costs import CostProfile, measure_costs
from specmlx.engine.step import Step
from specmlx.testing import tiny_models

if TYPE_CHECKING:
    import mlx.nn as nn


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
    """Every method of `methods` (all but mtp by default) at every k of `ks` (None: auto), greedy,
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
    # mtp reads the MTP layer of a checkpoint on disk, which the tiny models are not.
    for method in methods or [m for m in METHODS if m != "mtp"]:
        for k in (0,) if method == "none" else dict.fromkeys(ks):
            # k 0 (the target alone) needs none: without a drafter the policy plans k = 0.
            # Fixed trees for heads: sizing them from costs would need a calibration of the
            # tiny target, and would measure the sizing rule rather than the drafter.
            options = {
                "eagle": EagleOptions(tree_size=32),
                "medusa": MedusaOptions(tree_size=32),
                **{name: SuffixOptions(tree_size=16) for name in METHODS if "suffix" in name},
            }.get(method)
            config = GenerationConfig(
                method=method, options=options, k=k or None, max_tokens=max_tokens
            )
            for _ in range(warmup):
                models.suffix_store = None  # suffix rows: no answer from another run
                list(_run(models, config, prompt, profile))
            models.suffix_store = None
            rows.append(_measure(models, config, prompt, profile, method, k))
    return tuple(rows)


def _run(
    models: Models, config: GenerationConfig, prompt: list[int], profile: CostProfile
) -> Iterator[Step]:
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


@dataclass(frozen=True)
class HistoryPoint:
    """The suffix drafter's host time per step (propose and commit, no model) over one
    answer of a long run, with what its memory held then."""

    answer: int  # 1-based
    memory_tokens: int
    ms_per_step: float
    tokens_per_step: float

    @property
    def us_per_token(self) -> float:
        return 1000 * self.ms_per_step / self.tokens_per_step


def measure_suffix_history(
    answers: int = 40,
    tokens_per_answer: int = 1000,
    shown: Seq[int] = (1, 2, 5, 10, 20, 40),
    seed: int = 0,
) -> tuple[HistoryPoint, ...]:
    """A long scripting run without a model: answers of a fixed template with random fields
    (what a script's loop makes a model write), each drafted step by step as the loop would
    (the tokens kept are those the text agrees with, then one more) and kept in the memory
    when done. The work of a step must not grow with what the memory holds: `shown` answers
    (the first `tokens_per_answer` tokens of the run, ..., the last) are reported."""
    import random

    from specmlx.drafters.suffix import SuffixDrafter
    from specmlx.drafters.suffix_store import SuffixStore
    from specmlx.engine.sampling import SamplingConfig
    from specmlx.engine.step import Verdict

    rng = random.Random(seed)
    template = [rng.randrange(3, 400) for _ in range(40)]
    slots = set(rng.sample(range(40), 8))

    def answer() -> list[int]:
        out: list[int] = []
        while len(out) < tokens_per_answer:
            out += [rng.randrange(400, 512) if i in slots else t for i, t in enumerate(template)]
        return out[:tokens_per_answer]

    store = SuffixStore(answers * (tokens_per_answer + 32), "synthetic")
    greedy, points = SamplingConfig(), []
    for number in range(1, answers + 1):
        prompt, text = [rng.randrange(3, 512) for _ in range(32)], answer()
        drafter = SuffixDrafter(store, tree_size=16)
        context = list(prompt)
        drafter.prefill(context, None)
        held, seconds, steps = store.index.n_tokens, 0.0, 0
        while len(context) - len(prompt) < len(text):
            produced = len(context) - len(prompt)
            start = time.perf_counter()
            draft = drafter.propose(context, min(8, len(text) - produced - 1), greedy)
            tokens = draft.tokens.tolist()
            parents = draft.tree.parents if draft.tree is not None else range(len(tokens))
            path, node = [], 0  # the drafts the text agrees with, as the greedy walk keeps
            for child, parent in enumerate(parents, start=1):
                if parent == node and tokens[child - 1] == text[produced + len(path)]:
                    path.append(tokens[child - 1])
                    node = child
            drafter.commit(Verdict(path))
            seconds += time.perf_counter() - start
            steps += 1
            context += text[produced : produced + len(path) + 1]
        store.record(prompt, text)
        if number in shown:
            points.append(HistoryPoint(number, held, 1000 * seconds / steps, len(text) / steps))
    return tuple(points)


def render_history(points: Seq[HistoryPoint]) -> Table:
    table = Table(
        title="the suffix drafter's host time per step as its memory grows",
        caption="A scripting run without a model: answers of 1,000 tokens (a template with "
        "random fields), each kept in the memory; host time of propose and commit per step.",
    )
    for title in ("answer", "memory (tokens)", "ms/step", "tok/step", "µs/token"):
        table.add_column(title, justify="right")
    for p in points:
        table.add_row(
            str(p.answer),
            str(p.memory_tokens),
            f"{p.ms_per_step:.3f}",
            f"{p.tokens_per_step:.2f}",
            f"{p.us_per_token:.1f}",
        )
    return table


@dataclass(frozen=True)
class RewindRow:
    """Steps on a hybrid target, its recurrent layers rewound one way."""

    target: str  # the tiny target's family
    rewind: str  # "trace": the state kept after each position; "replay": the kept tokens again
    steps: int
    tokens_per_step: float
    calls_per_step: float  # target calls, the verify call and any replay
    ms_per_step: float  # median wall time of a step after the first


def measure_rewind(
    draws: int = 3, max_tokens: int = 48, k: int = 4, seed: int = 0
) -> tuple[RewindRow, ...]:
    """The draft model at k on two tiny hybrids (`specmlx.testing`): a Qwen3-Next (two Gated
    DeltaNet layers, two attention layers) and a Nemotron-H (two Mamba-2 mixers, attention,
    an MLP), whose random draft keeps few tokens, so most steps rewind: greedy, `draws`
    generations per rewind, interleaved. Each row counts the target's calls per step and
    times a step."""
    from specmlx.testing import tiny_hybrid, tiny_ssm_hybrid

    rows: list[RewindRow] = []
    for name, make in (("qwen3_next", tiny_hybrid), ("nemotron_h", tiny_ssm_hybrid)):
        rows += _rewinds(name, make(seed=seed), draws, max_tokens, k, seed)
    return tuple(rows)


def _rewinds(
    name: str, target: nn.Module, draws: int, max_tokens: int, k: int, seed: int
) -> list[RewindRow]:
    from specmlx.engine.cache import Sequence
    from specmlx.testing import tiny_llama

    models = Models(target=target, tokenizer=None, draft=tiny_llama(seed=seed + 1))
    config = GenerationConfig(method="draft", k=k, max_tokens=max_tokens)
    prompt = [(7 * i) % 61 + 3 for i in range(32)]
    calls = [0]
    kind = type(target)
    call = kind.__call__

    def counted(self, *args, **kwargs):
        calls[0] += self is target
        return call(self, *args, **kwargs)

    seen: dict[str, tuple[list[float], list[int], list[int]]] = {
        "trace": ([], [], []),
        "replay": ([], [], []),
    }
    kind.__call__ = counted
    try:
        for draw in range(draws + 1):  # draw 0 warms up
            for rewind, (seconds, counts, tokens) in seen.items():
                Sequence.trace_recurrent = rewind == "trace"
                steps = Session(models, config).steps(prompt)
                last = time.perf_counter()
                for n, step in enumerate(steps):
                    if draw and n:  # the first step also prefills
                        seconds.append(time.perf_counter() - last)
                        counts.append(calls[0])
                        tokens.append(len(step.tokens))
                    calls[0], last = 0, time.perf_counter()
    finally:
        kind.__call__ = call
        Sequence.trace_recurrent = True
    return [
        RewindRow(
            name,
            rewind,
            len(seconds),
            statistics.mean(tokens),
            statistics.mean(counts),
            1000 * statistics.median(seconds),
        )
        for rewind, (seconds, counts, tokens) in seen.items()
    ]


def render_rewind(rows: Seq[RewindRow]) -> Table:
    table = Table(
        title="rewinding hybrid targets: kept states vs replay",
        caption="The draft model at k=4 on a tiny random Qwen3-Next (Gated DeltaNet + "
        "attention) and Nemotron-H (Mamba-2 + attention + MLP), greedy, interleaved draws; "
        "calls: target calls per step (the verify call, plus a replay of the kept tokens "
        "where the state was only checkpointed).",
    )
    for title in ("target", "rewind", "steps", "tok/step", "target calls/step", "ms/step"):
        table.add_column(title, justify="left" if title in ("target", "rewind") else "right")
    for row in rows:
        table.add_row(
            row.target,
            row.rewind,
            str(row.steps),
            f"{row.tokens_per_step:.2f}",
            f"{row.calls_per_step:.2f}",
            f"{row.ms_per_step:.2f}",
        )
    return table
