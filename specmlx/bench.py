"""The side-by-side benchmark: the target alone, each method and k, and mlx-lm's own.

Everything runs in one process and interleaved per prompt: for each prompt and repeat, every
row generates in turn from the same seed, so drift of a shared machine hits all rows alike.
A row is a (method, k) pair: `none` is the target alone (the baseline), any method the API
knows drafts with it, and `mlx-lm` is mlx-lm's speculative decoding on the same pair and
sampler, the reference competitor.

Every row is timed the same way, by this module's clock: time to first token runs from the
call to the first target step's output (prefill included), and decode tokens/s counts the
tokens after the first step over the time after it, so neither prefill nor the first step's
drafting skews the steady-state rate. `run` yields one `Measurement` per generation;
`specmlx.bench_summary` turns them into the report, `specmlx.bench_report` renders it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import mlx.core as mx

from specmlx.api import (
    METHODS,
    GenerationConfig,
    Models,
    encode_prompt,
    make_drafter,
    make_policy,
    stream_ids,
)
from specmlx.cache import Sequence
from specmlx.errors import UsageError
from specmlx.sampling import SamplingConfig
from specmlx.suites import Suite

MLX_LM = "mlx-lm"
DRAFT_MODEL_METHODS = frozenset({"draft", MLX_LM})  # methods whose drafts cost a model call


@dataclass(frozen=True)
class RowSpec:
    """One configuration to measure. `sampling` overrides the run's sampler (a test hook)."""

    method: str  # "none", a method of specmlx.api, or "mlx-lm"
    k: int | None = 0  # None: adaptive, chosen per step (`-k auto`)
    sampling: SamplingConfig | None = None

    @property
    def name(self) -> str:
        k = "auto" if self.k is None else self.k
        name = self.method if self.method == "none" else f"{self.method} k={k}"
        if self.sampling is not None:
            name += f" (T={self.sampling.temperature:g})"
        return name


def make_rows(
    methods: list[str],
    ks: list[int | None],
    mlx_lm: bool = True,
    mlx_lm_ks: list[int] | None = None,
) -> tuple[RowSpec, ...]:
    """`none`, then every (method, k), then mlx-lm when a draft model is used: at each k of
    `mlx_lm_ks`, or at each fixed k when that is None.

    A k of None is adaptive (`-k auto`); mlx-lm has no such mode.
    """
    known = [m for m in METHODS if m != "none"]
    for method in methods:
        if method not in known:
            raise UsageError(f"unknown method {method!r}; choose from {', '.join(known)}")
    for k in [*ks, *(mlx_lm_ks or [])]:
        if k is not None and not 1 <= k <= 64:
            raise UsageError(f"k must be between 1 and 64, got {k}")
    rows = [RowSpec("none")]
    rows += [RowSpec(m, k) for m in dict.fromkeys(methods) for k in dict.fromkeys(ks)]
    if mlx_lm and "draft" in methods:
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

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0 or self.max_tokens < 2:
            raise UsageError("repeats >= 1, warmup >= 0 and max-tokens >= 2, please")
        if not self.rows or self.rows[0].method != "none":
            raise UsageError("the first row must be the target alone (none)")

    def sampling(self, temperature: float) -> SamplingConfig:
        return SamplingConfig(temperature, self.top_p, self.top_k)

    @property
    def total_runs(self) -> int:
        prompts = sum(len(s.prompts) for s in self.suites)
        runs = len(self.temperatures) * prompts * self.repeats
        return (runs + self.warmup) * len(self.rows)


@dataclass(frozen=True)
class Measurement:
    """One row's generation for one prompt and repeat."""

    row: str
    token_ids: tuple[int, ...]
    target_calls: int
    drafted: int  # ours: drafted tokens; mlx-lm: not reported (0)
    accepted: int  # ours: accepted drafts; mlx-lm: tokens that came from the draft
    temperature: float = 0.0
    suite: str = "warmup"
    prompt_id: str = ""
    repeat: int = -1  # -1 for warm-up runs
    drafted_by_position: tuple[int, ...] = ()
    accepted_by_position: tuple[int, ...] = ()
    time_to_first_token: float = 0.0
    decode_tokens: int = 0  # tokens after the first step
    decode_seconds: float = 0.0  # time after the first step
    seconds: float = 0.0  # whole call, prefill included
    peak_memory_gb: float = 0.0
    # Every step after the first: (tokens it drafted, tokens it emitted, seconds). mlx-lm's
    # rows report no steps.
    decode_steps: tuple[tuple[int, int, float], ...] = ()

    @property
    def tokens_per_sec(self) -> float:
        if self.decode_seconds > 0 and self.decode_tokens > 0:
            return self.decode_tokens / self.decode_seconds
        return len(self.token_ids) / self.seconds if self.seconds else 0.0


def run(models: Models, config: BenchConfig) -> Iterator[Measurement]:
    """Warm up every row, then measure every row on every prompt, repeat and temperature."""
    first = config.suites[0].prompts[0]
    first_ids = encode_prompt(models, first.text, config.chat_template)
    for i in range(config.warmup):
        for row in config.rows:
            mx.random.seed(config.seed + i)
            sampling = row.sampling or config.sampling(config.temperatures[0])
            result = run_row(models, row, first_ids, min(8, config.max_tokens), sampling)
            yield replace(result, temperature=config.temperatures[0], prompt_id=first.id)
    for temperature in config.temperatures:
        for suite in config.suites:
            for index, prompt in enumerate(suite.prompts):
                prompt_ids = encode_prompt(models, prompt.text, config.chat_template)
                for repeat in range(config.repeats):
                    seed = config.seed + 1000 * index + repeat
                    for row in config.rows:
                        mx.random.seed(seed)  # every row draws from the same stream
                        sampling = row.sampling or config.sampling(temperature)
                        result = run_row(models, row, prompt_ids, config.max_tokens, sampling)
                        yield replace(
                            result,
                            temperature=temperature,
                            suite=suite.name,
                            prompt_id=prompt.id,
                            repeat=repeat,
                        )


def run_row(
    models: Models, row: RowSpec, prompt_ids: list[int], max_tokens: int, sampling: SamplingConfig
) -> Measurement:
    """One generation of one row, from fresh caches, not yet tagged with where it ran.
    (Adaptive k starts from the costs earlier rows measured, as a script's calls do.)"""
    mx.clear_cache()
    if row.method == MLX_LM:
        return _run_mlx_lm(models, row, prompt_ids, max_tokens, sampling)
    k = None if row.k is None else max(row.k, 1)
    config = GenerationConfig(method=row.method, k=k, max_tokens=max_tokens, sampling=sampling)
    drafter = make_drafter(models, config)
    policy = make_policy(models, config, drafter)  # calibrates on first use, before the clock
    tokens: list[int] = []
    steps: list[tuple[int, int, float]] = []
    first_tokens, first_time, stats = 0, 0.0, None
    start = time.perf_counter()
    for event in stream_ids(models, Sequence(models.target), drafter, prompt_ids, config, policy):
        tokens.extend(event.token_ids)
        stats = event.stats
        if not first_time:
            first_time, first_tokens = time.perf_counter(), len(tokens)
        else:
            step = event.step
            steps.append((step.n_drafted, len(event.token_ids), step.seconds))
    end = time.perf_counter()
    assert stats is not None
    return Measurement(
        row=row.name,
        token_ids=tuple(tokens),
        target_calls=stats.target_calls,
        drafted=stats.drafted,
        accepted=stats.accepted,
        drafted_by_position=stats.drafted_by_position,
        accepted_by_position=stats.accepted_by_position,
        time_to_first_token=first_time - start,
        decode_tokens=len(tokens) - first_tokens,
        decode_seconds=end - first_time,
        seconds=end - start,
        peak_memory_gb=stats.peak_memory_gb,
        decode_steps=tuple(steps),
    )


def _run_mlx_lm(
    models: Models, row: RowSpec, prompt_ids: list[int], max_tokens: int, sampling: SamplingConfig
) -> Measurement:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
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
        draft_model=models.draft,
        num_draft_tokens=row.k,
        sampler=sampler,
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
    n_target_tokens = from_draft.count(False)
    # A step cut short by max_tokens or a stop token ends on a draft token, and still cost a call.
    target_calls = n_target_tokens + (1 if from_draft and from_draft[-1] else 0)
    step_time, step_tokens = first_step or (end, len(tokens))
    return Measurement(
        row=row.name,
        token_ids=tuple(tokens),
        target_calls=target_calls,
        drafted=0,
        accepted=from_draft.count(True),
        time_to_first_token=first_time - start,
        decode_tokens=len(tokens) - step_tokens,
        decode_seconds=end - step_time,
        seconds=end - start,
        peak_memory_gb=peak,
    )
