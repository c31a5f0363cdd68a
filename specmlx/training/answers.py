"""The target's answers to a batch of prompts and, from the very calls that answer them, its
features at every token: self-distillation data in one pass over the target.

Generating answers and then caching their features (`target_features`) runs the target over
every token twice: once to say it, once to read its hidden states. Here the calls that
answer are the calls that are read. The prompts go through one batched prefill,
right-padded, so that no real token attends to padding (the cache is then rolled to put the
padding on the left, as mlx-lm's batched generation does); then each call decodes one token
for every row. Each call's hidden states and greedy next tokens are kept at the rows' real
positions. A row also feeds its own last token (its stop token, or its `max_tokens`-th), so
that its sequence has features and a next token at every position, as `target_features`
gives them (a test checks the two agree).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from specmlx.api.models import Models
from specmlx.engine.features import Capture, FeatureSpec, capturing
from specmlx.engine.sampling import SamplingConfig

PREFILL_TOKENS = 512  # prompt tokens per batched prefill call, all rows together (short
# calls: Ctrl-C waits for the one under way)


@dataclass(frozen=True)
class Answered:
    """One row of a batch: the answer's token ids (with the stop token where it ended its
    turn) and, where features were asked for, the target's features, greedy next tokens and
    final hidden states at every position of prompt + answer."""

    answer: list[int]
    features: mx.array | None = None  # (n, width) float16
    nexts: mx.array | None = None  # (n,) int32
    finals: mx.array | None = None  # (n, hidden) float16: beside layers' features only


def answer_batch(
    models: Models,
    prompts: list[list[int]],
    max_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    spec: FeatureSpec | None = None,
) -> list[Answered]:
    """The target's answers to `prompts` (token ids, the chat template applied), greedy or
    drawn by `sampling` from `seed`, at most `max_tokens` each; with `spec`, the features
    that spec names (and, beside layers' features, the final hidden state) at every
    position, from the same calls."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    model = models.target
    stops = frozenset(models.tokenizer.eos_token_ids)
    rows = [make_prompt_cache(model) for _ in prompts]
    cache = [type(layer).merge([row[i] for row in rows]) for i, layer in enumerate(rows[0])]
    greedy = sampling.temperature == 0
    sampler = make_sampler(sampling.temperature, sampling.top_p, top_k=sampling.top_k)
    mx.random.seed(seed)
    n_rows = len(prompts)
    with _taps(model, spec) as (seen, final):
        read = Reader(seen, final)
        # The prompts but their last tokens, right-padded: rows[r] reads [0, lengths[r]).
        lengths = [len(p) - 1 for p in prompts]
        width = max(lengths)
        if width:
            padding = [width - n for n in lengths]
            tokens = mx.array([p[:-1] + [0] * pad for p, pad in zip(prompts, padding, strict=True)])
            for c in cache:
                c.prepare(lengths=lengths, right_padding=padding)
            step = max(1, PREFILL_TOKENS // n_rows)
            for start in range(0, width, step):
                logits = model(tokens[:, start : start + step], cache=cache)
                read.call(logits, cache)
            for c in cache:
                c.finalize()
            mx.eval([c.state for c in cache])
        prefill = read.take()  # each (rows, width, ...)

        answers: list[list[int]] = [[] for _ in prompts]
        fed = [0] * n_rows  # decode positions each row has read (its last prompt token on)
        last = mx.array([p[-1] for p in prompts], mx.uint32)
        for _ in range(max_tokens + 1):
            logits = model(last[:, None], cache=cache)  # (rows, 1, vocab)
            drawn = read.call(logits, cache, sampler=None if greedy else sampler)
            for r, token in enumerate(drawn):
                if fed[r] > len(answers[r]):  # fed its last token already: this is padding
                    continue
                fed[r] += 1
                if not _ended(answers[r], stops, max_tokens):
                    answers[r].append(token)
            if all(fed[r] > len(answers[r]) for r in range(n_rows)):
                break
            last = mx.array(drawn, mx.uint32)
        decoded = read.take()  # each (rows, steps, ...)

    if spec is None:
        return [Answered(answer) for answer in answers]
    out = []
    for r, answer in enumerate(answers):
        parts = [
            None if pre is None else mx.concatenate([pre[r, : lengths[r]], dec[r, : fed[r]]])
            for pre, dec in zip(prefill, decoded, strict=True)
        ]
        out.append(Answered(answer, *parts))
    return out


def _ended(answer: list[int], stops: frozenset[int], max_tokens: int) -> bool:
    return len(answer) >= max_tokens or (bool(answer) and answer[-1] in stops)


class Reader:
    """What each call of a batch yields: its greedy next tokens and, where taps are set, its
    features, kept per call and joined on the positions' axis by `take`."""

    def __init__(self, seen: Capture | None, final: Capture | None):
        self.seen, self.final = seen, final
        self.calls: list[tuple[mx.array, ...]] = []

    def call(self, logits: mx.array, cache: list[Any], sampler: Any = None) -> list[int]:
        """Keep one call's outputs; return the token each row goes on with (greedy, or
        drawn by `sampler` from its last position)."""
        nexts = mx.argmax(logits, axis=-1).astype(mx.int32)  # (rows, n)
        feats = None if self.seen is None else self.seen.latest().astype(mx.float16)
        finals = None if self.final is None else self.final.latest().astype(mx.float16)
        if sampler is None:
            drawn = nexts[:, -1]
        else:
            last = logits[:, -1, :].astype(mx.float32)
            drawn = sampler(last - mx.logsumexp(last, axis=-1, keepdims=True))
        mx.eval(nexts, feats, finals, drawn, [c.state for c in cache])
        self.calls.append((feats, nexts, finals))
        return np.array(drawn).tolist()

    def take(self) -> tuple[mx.array | None, mx.array | None, mx.array | None]:
        """(features, next tokens, final states) of the calls kept since the last `take`,
        joined on the positions' axis. # (rows, n, width), (rows, n), (rows, n, hidden)"""
        calls, self.calls = self.calls, []
        joined = []
        for part in zip(*calls, strict=True) if calls else ((), (), ()):
            present = [a for a in part if a is not None]
            joined.append(mx.concatenate(present, axis=1) if present else None)
        return joined[0], joined[1], joined[2]


@contextmanager
def _taps(model: Any, spec: FeatureSpec | None) -> Iterator[tuple[Capture | None, Capture | None]]:
    """The features `spec` names (none: no taps), and beside layers' features the final
    hidden state too, as `target_features` reads them."""
    with ExitStack() as stack:
        seen = None if spec is None else stack.enter_context(capturing(model, spec))
        wants_final = spec is not None and bool(spec.layers)
        final = stack.enter_context(capturing(model, FeatureSpec())) if wants_final else None
        yield seen, final
