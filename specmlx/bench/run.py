"""The side-by-side benchmark: the target alone, each method and k, and mlx-lm's own.

Everything runs in one process and interleaved per prompt: for each prompt and repeat, every
row generates in turn from the same seed (in reverse order every other group), so drift of a
shared machine hits all rows alike.
A row is a `RowSpec`, a (method, k) pair: `none` is the target alone, any method of
`specmlx.api.methods.METHODS` drafts with it, `mlx-lm k=N` is mlx-lm's speculative decoding on
the same pair and sampler (the reference competitor), and `mlx-lm plain` (k = 0) is
mlx-lm's own generation on the target alone. `none` and `mlx-lm plain` are the two plain
baselines; the report measures speedups against each (see `specmlx.bench.summary`).

Every row is timed the same way, by this module's clock: time to first token runs from the
call to the first target step's output (prefill included), and decode tokens/s counts the
tokens after the first step over the time after it, so neither prefill nor the first step's
drafting skews the steady-state rate. `plan` checks the bench command's options and makes
its `BenchConfig`, before any model loads; `run` yields one `Measurement` per generation, holding
the run's final `Stats` (for mlx-lm's rows, built from what mlx-lm reports);
`specmlx.bench.summary` turns them into the report, `specmlx.bench.report` renders it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.methods import METHODS, MethodOptions
from specmlx.api.models import Models
from specmlx.api.options import SuffixOptions
from specmlx.api.session import Session
from specmlx.bench.suites import Suite
from specmlx.drafters.suffix_store import SuffixStore, Trust
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.stats import Stats
from specmlx.engine.step import Step
from specmlx.errors import UsageError

MLX_LM = "mlx-lm"
# A group of measurements: every row on one prompt and repeat at one temperature, as
# (temperature, suite, prompt id, repeat).
GroupKey = tuple[float, str, str, int]
# What a suffix memory learnt to trust (`Trust.to_dict`), by the index of its row.
Trusts = dict[int, dict[str, dict[str, float]]]


@dataclass(frozen=True)
class RowSpec:
    """One configuration to measure, and the key every report joins its rows on.
    `sampling` overrides the run's sampler (a test hook)."""

    method: str  # a method of specmlx.api.methods, or "mlx-lm" (k = 0: without a draft model)
    k: int | None = 0  # None: adaptive, chosen per step (`-k auto`)
    sampling: SamplingConfig | None = None

    @property
    def name(self) -> str:
        """For display only: two rows may share a name, never a key."""
        k = "auto" if self.k is None else self.k
        if self.method == "none":
            name = "none"
        elif self.method == MLX_LM and self.k == 0:
            name = f"{MLX_LM} plain"
        else:
            name = f"{self.method} k={k}"
        if self.sampling is not None:
            name += f" (T={self.sampling.temperature:g})"
        return name

    @property
    def is_plain(self) -> bool:
        """A baseline: the target alone, through our loop or through mlx-lm."""
        return self.method == "none" or (self.method == MLX_LM and self.k == 0)

    @property
    def needs_draft_model(self) -> bool:
        if self.method == MLX_LM:
            return self.k != 0
        return METHODS[self.method].needs_draft_model

    def __str__(self) -> str:
        return self.name


NONE = RowSpec("none")
MLX_LM_PLAIN = RowSpec(MLX_LM, 0)


def make_rows(
    methods: list[str],
    ks: list[int | None],
    mlx_lm: bool = True,
    mlx_lm_ks: list[int] | None = None,
) -> tuple[RowSpec, ...]:
    """`none`, then (with `mlx_lm`) mlx-lm plain, then every (method, k), then, when a
    method uses the draft model, mlx-lm's speculative decoding at each k of `mlx_lm_ks`, or
    at each fixed k when that is None.

    A k of None is adaptive (`-k auto`); mlx-lm has no such mode.
    """
    known = [m for m in METHODS if m != "none"]
    for method in methods:
        if method not in known:
            raise UsageError(f"unknown method {method!r}; choose from {', '.join(known)}")
    for k in [*ks, *(mlx_lm_ks or [])]:
        if k is not None and not 1 <= k <= 64:
            raise UsageError(f"k must be between 1 and 64, got {k}")
    rows = [NONE, *([MLX_LM_PLAIN] if mlx_lm else [])]
    rows += [RowSpec(m, k) for m in dict.fromkeys(methods) for k in dict.fromkeys(ks)]
    if mlx_lm and any(METHODS[m].needs_draft_model for m in methods):
        reference = ks if mlx_lm_ks is None else mlx_lm_ks
        rows += [RowSpec(MLX_LM, k) for k in dict.fromkeys(reference) if k is not None]
    return tuple(rows)


@dataclass(frozen=True)
class BenchConfig:
    suites: tuple[Suite, ...]
    rows: tuple[RowSpec, ...]
    temperatures: tuple[float, ...] = (0.0,)
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64
    repeats: int = 1
    warmup: int = 1
    seed: int = 0
    chat_template: bool = True
    # The options of methods run with other than their defaults (`specmlx.api.methods`).
    options: tuple[MethodOptions, ...] = ()

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0 or self.max_tokens < 2:
            raise UsageError("repeats >= 1, warmup >= 0 and max-tokens >= 2, please")
        if not self.rows or self.rows[0] != NONE:
            raise UsageError("the first row must be the target alone (none)")
        if len(set(self.rows)) != len(self.rows):
            raise UsageError("each row may be benched once")
        if any(getattr(o, "cache", None) for o in self.options):
            raise UsageError(
                "the bench keeps each row's suffix memory apart: --suffix-cache is for "
                "generate, chat, batch and serve"
            )

    def sampling(self, temperature: float) -> SamplingConfig:
        return SamplingConfig(temperature, self.top_p, self.top_k)

    def options_of(self, row: RowSpec) -> MethodOptions | None:
        """The options a row's method runs with; None: its defaults."""
        taken = METHODS[row.method].options if row.method in METHODS else None
        return next((o for o in self.options if type(o) is taken), None)

    @property
    def groups(self) -> int:
        """Groups measured: every row on one prompt and repeat at one temperature."""
        return len(self.temperatures) * sum(len(s.prompts) for s in self.suites) * self.repeats

    @property
    def total_runs(self) -> int:
        return (self.groups + self.warmup) * len(self.rows)

    def warmups(self, done: int) -> int:
        """Warm-up runs of each row when `done` groups were measured before: none if none
        are left to measure."""
        return self.warmup if done < self.groups else 0

    @property
    def needs_draft_model(self) -> bool:
        """Whether a row drafts with the draft model (mlx-lm's speculative rows come only
        with a method's that does, so the methods benched decide)."""
        return any(row.needs_draft_model for row in self.rows)


@dataclass(frozen=True)
class Group:
    """Every row's measurement on one prompt and repeat at one temperature, as a run kept
    it, and what each suffix memory had learnt to trust after it."""

    measurements: tuple[Measurement, ...]
    trust: Trusts = field(default_factory=dict)


@dataclass(frozen=True)
class Measurement:
    """One row's generation for one prompt and repeat.

    `stats` is the run's final `Stats`: ours as the loop reported them; for mlx-lm's rows,
    its tokens, target calls (one per step) and, as `accepted`, the tokens that came from
    the draft (it reports no drafted count: 0). The times here are this module's clock.
    """

    row: RowSpec
    token_ids: tuple[int, ...]
    stats: Stats
    temperature: float = 0.0
    suite: str = "warmup"
    prompt_id: str = ""
    repeat: int = -1  # -1 for warm-up runs
    time_to_first_token: float = 0.0
    decode_tokens: int = 0  # tokens after the first step
    decode_seconds: float = 0.0  # time after the first step
    seconds: float = 0.0  # whole call, prefill included
    decode_steps: tuple[Step, ...] = ()  # every step after the first; mlx-lm reports none
    prompt_ids: tuple[int, ...] = ()  # the prompt as the target read it

    @property
    def tokens_per_sec(self) -> float:
        if self.decode_seconds > 0 and self.decode_tokens > 0:
            return self.decode_tokens / self.decode_seconds
        return len(self.token_ids) / self.seconds if self.seconds else 0.0


def run(
    models: Models,
    config: BenchConfig,
    done: dict[GroupKey, Group] | None = None,
    keep: Callable[[GroupKey, Group], None] | None = None,
) -> Iterator[Measurement]:
    """Warm up every row, then measure every row on every prompt, repeat and temperature.

    A method that remembers answers (suffix decoding) keeps one memory per row, temperature,
    suite and repeat, filled in prompt order: a row never drafts from another row's answers
    (the same text at T=0), nor a repeat from an earlier repeat's.

    `done`: groups measured by an earlier run of the same bench (`specmlx.bench.journal`):
    yielded as they were, their answers and trust put back in the rows' memories, not
    measured again. `keep` is handed each group this run finishes, before its last
    measurement is yielded."""
    done = done or {}
    first = config.suites[0].prompts[0]
    first_ids = encode_prompt(models, first.text, config.chat_template)
    memories: dict[tuple[Any, ...], SuffixStore | None] = {}
    for i in range(config.warmups(len(done))):
        for row in config.rows:
            mx.random.seed(config.seed + i)
            sampling = row.sampling or config.sampling(config.temperatures[0])
            options = config.options_of(row)
            models.suffix_store = None  # a warm-up's own memory, dropped after it
            result = run_row(models, row, first_ids, min(8, config.max_tokens), sampling, options)
            yield replace(result, temperature=config.temperatures[0], prompt_id=first.id)
    for temperature in config.temperatures:
        for suite in config.suites:
            for index, prompt in enumerate(suite.prompts):
                prompt_ids = encode_prompt(models, prompt.text, config.chat_template)
                for repeat in range(config.repeats):
                    key = (temperature, suite.name, prompt.id, repeat)
                    if key in done:
                        _refill(models, config, memories, key, done[key])
                        yield from done[key].measurements
                        continue
                    group = []
                    seed = config.seed + 1000 * index + repeat
                    for row in _in_turn(config.rows, index + repeat):
                        mx.random.seed(seed)  # every row draws from the same stream
                        sampling = row.sampling or config.sampling(temperature)
                        options = config.options_of(row)
                        memory = (row, temperature, suite.name, repeat)
                        models.suffix_store = memories.get(memory)
                        result = run_row(
                            models, row, prompt_ids, config.max_tokens, sampling, options
                        )
                        memories[memory] = models.suffix_store
                        group.append(
                            replace(
                                result,
                                temperature=temperature,
                                suite=suite.name,
                                prompt_id=prompt.id,
                                repeat=repeat,
                                prompt_ids=tuple(prompt_ids),
                            )
                        )
                        if keep is not None and len(group) == len(config.rows):
                            kept = sorted(group, key=lambda m: config.rows.index(m.row))
                            keep(key, Group(tuple(kept), _trusts(config, memories, key)))
                        yield group[-1]


def _in_turn(rows: tuple[RowSpec, ...], turn: int) -> tuple[RowSpec, ...]:
    """The rows in the order they run in one group: as given, and reversed every other
    group (by prompt index plus repeat), so a machine that drifts within a group (warming,
    a neighbour starting) slows no row more than another over two groups."""
    return rows if turn % 2 == 0 else rows[::-1]


def _trusts(
    config: BenchConfig, memories: dict[tuple[Any, ...], SuffixStore | None], key: GroupKey
) -> Trusts:
    temperature, suite, _, repeat = key
    stores = [memories.get((row, temperature, suite, repeat)) for row in config.rows]
    return {i: store.trust.to_dict() for i, store in enumerate(stores) if store is not None}


def _refill(
    models: Models,
    config: BenchConfig,
    memories: dict[tuple[Any, ...], SuffixStore | None],
    key: GroupKey,
    group: Group,
) -> None:
    """Put the answers of a group measured by an earlier run into its rows' memories, and
    their trust as it stood after it, as its run had them."""
    temperature, suite, _, repeat = key
    for measured in group.measurements:
        method = METHODS.get(measured.row.method)
        if method is None or not method.remembers:
            continue
        memory = (measured.row, temperature, suite, repeat)
        store = memories.get(memory)
        if store is None:
            options = config.options_of(measured.row)
            budget = getattr(options, "memory", SuffixOptions.memory)
            store = memories[memory] = SuffixStore(budget, models.tokenizer_id)
        store.record(list(measured.prompt_ids), list(measured.token_ids))
    for i, trust in group.trust.items():
        store = memories.get((config.rows[i], temperature, suite, repeat))
        if store is not None:
            store.trust = Trust.from_dict(trust)


def run_row(
    models: Models,
    row: RowSpec,
    prompt_ids: list[int],
    max_tokens: int,
    sampling: SamplingConfig,
    options: MethodOptions | None = None,
) -> Measurement:
    """One generation of one row, from fresh caches, not yet tagged with where it ran.
    (Adaptive k starts from the costs earlier rows measured, as a script's calls do.)"""
    mx.clear_cache()
    if row.method == MLX_LM:
        return _run_mlx_lm(models, row, prompt_ids, max_tokens, sampling)
    # The target alone's k of 0 is no draft length: its session builds no drafter.
    config = GenerationConfig(
        method=row.method,
        options=options,
        k=row.k or None,
        max_tokens=max_tokens,
        sampling=sampling,
    )
    session = Session(models, config)  # calibrates on first use, before the clock
    tokens: list[int] = []
    steps: list[Step] = []
    first_tokens, first_time, stats = 0, 0.0, None
    start = time.perf_counter()
    for event in session.stream(prompt_ids):
        tokens.extend(event.token_ids)
        stats = event.stats
        if not first_time:
            first_time, first_tokens = time.perf_counter(), len(tokens)
        else:
            steps.append(event.step)
    end = time.perf_counter()
    assert stats is not None
    return Measurement(
        row=row,
        token_ids=tuple(tokens),
        stats=stats,
        time_to_first_token=first_time - start,
        decode_tokens=len(tokens) - first_tokens,
        decode_seconds=end - first_time,
        seconds=end - start,
        decode_steps=tuple(steps),
    )


def _run_mlx_lm(
    models: Models, row: RowSpec, prompt_ids: list[int], max_tokens: int, sampling: SamplingConfig
) -> Measurement:
    """mlx-lm's `stream_generate` on the same prompt ids and sampler: speculative with the
    draft model at k > 0, the target alone at k = 0."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    speculative = {"draft_model": models.draft, "num_draft_tokens": row.k} if row.k else {}
    mx.reset_peak_memory()
    tokens: list[int] = []
    from_draft: list[bool] = []
    first_step: tuple[float, int] | None = None
    peak, start = 0.0, time.perf_counter()
    first_time = 0.0
    for response in stream_generate(
        models.target,
        models.tokenizer,
        mx.array(prompt_ids, mx.uint32),
        max_tokens=max_tokens,
        sampler=sampler,
        **speculative,
    ):
        now = time.perf_counter()
        first_time = first_time or now
        tokens.append(int(response.token))
        from_draft.append(bool(response.from_draft))
        peak = response.peak_memory
        # A step ends with the target's own token: the first one closes the first step.
        if first_step is None and not response.from_draft:
            first_step = (now, len(tokens))
    end = time.perf_counter()
    # A step cut short by max_tokens or a stop token ends on a draft token, and still cost a call.
    target_calls = from_draft.count(False) + (1 if from_draft and from_draft[-1] else 0)
    step_time, step_tokens = first_step or (end, len(tokens))
    stats = Stats(
        prompt_tokens=len(prompt_ids),
        tokens=len(tokens),
        target_calls=target_calls,
        accepted=from_draft.count(True),
        time_to_first_token=first_time - start,
        decode_seconds=end - step_time,
        peak_memory_gb=peak,
    )
    return Measurement(
        row=row,
        token_ids=tuple(tokens),
        stats=stats,
        time_to_first_token=first_time - start,
        decode_tokens=len(tokens) - step_tokens,
        decode_seconds=end - step_time,
        seconds=end - start,
    )
