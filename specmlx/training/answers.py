"""The target's answers to a batch of prompts and, from the very calls that answer them, its
features at every token: self-distillation data in one pass over the target.

Generating answers and then caching their features (`target_features`) runs the target over
every token twice: once to say it, once to read its hidden states. Here the calls that
answer are the calls that are read. The prompts are prefilled in groups of like length, each
group right-padded, so that no real token attends to padding and little padding is read
(each group's cache is then rolled to put its padding on the left, as mlx-lm's batched
generation does, and the rows' caches are joined into one); then each call decodes one
token for every row still answering. Each call's hidden states and greedy next tokens are
kept at the rows' real positions. A row also feeds its own last token (its stop token, or
its `max_tokens`-th), so that its sequence has features and a next token at every position,
as `target_features` gives them (a test checks the two agree), and then leaves the batch.
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
# What one more prefill call costs beyond its tokens, in tokens (the weights read once, at
# least): prompts are prefilled in groups of like length, and a longer prompt joins a group
# while the padding it puts on the group's rows costs less than a call of its own. (Qwen2.5
# 1.5B here, fp32: a one-token call takes about 384 ms, a prompt token in a batched prefill
# about 22 ms.)
PREFILL_CALL_TOKENS = 16


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
    position, from the same calls.

    No call reads padding it can skip: prompts are prefilled in groups of like length
    (`prefill_groups`), and a row leaves the batch once its answer is read to its end."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    model = models.target
    stops = frozenset(models.tokenizer.eos_token_ids)
    greedy = sampling.temperature == 0
    sampler = make_sampler(sampling.temperature, sampling.top_p, top_k=sampling.top_k)
    mx.random.seed(seed)
    n_rows = len(prompts)
    # The prompts but their last tokens: rows[r] holds [0, lengths[r]) once prefilled.
    lengths = [len(p) - 1 for p in prompts]
    with _taps(model, spec) as (seen, final):
        read = Reader(seen, final)
        rows = [make_prompt_cache(model) for _ in prompts]
        prefill: dict[int, list[mx.array | None]] = {}
        for group in prefill_groups(lengths):
            caches = _prefill(model, [prompts[r][:-1] for r in group], group, read)
            for r, row in zip(group, caches, strict=True):
                rows[r] = row
            prefill |= {
                r: [_head(part, lengths[r]) for part in parts] for r, parts in read.take().items()
            }
        cache = _joined(rows)

        answers: list[list[int]] = [[] for _ in prompts]
        fed = [0] * n_rows  # decode positions each row has read (its last prompt token on)
        live = list(range(n_rows))  # the rows still in the batch, in its order
        last = mx.array([p[-1] for p in prompts], mx.uint32)
        for _ in range(max_tokens + 1):
            logits = model(last[:, None], cache=cache)  # (rows, 1, vocab)
            drawn = read.call(logits, cache, live, sampler=None if greedy else sampler)
            for r, token in zip(live, drawn, strict=True):
                fed[r] += 1
                if not _ended(answers[r], stops, max_tokens):
                    answers[r].append(token)
            # A row that has read its last token (its stop token, or its max_tokens-th) leaves.
            going = [j for j, r in enumerate(live) if fed[r] <= len(answers[r])]
            if not going:
                break
            if len(going) < len(live):
                for c in cache:
                    c.filter(mx.array(going))
                live = [live[j] for j in going]
            last = mx.array([drawn[j] for j in going], mx.uint32)
        decoded = read.take()

    if spec is None:
        return [Answered(answer) for answer in answers]
    out = []
    for r, answer in enumerate(answers):
        parts = [
            None if dec is None else dec if pre is None else mx.concatenate([pre, dec])
            for pre, dec in zip(prefill.get(r, [None] * 3), decoded[r], strict=True)
        ]
        out.append(Answered(answer, *parts))
    return out


def prefill_groups(lengths: list[int]) -> list[list[int]]:
    """The rows to prefill together, each group right-padded to its longest prompt: rows
    taken shortest first, and a row joins the group before it while the padding it adds to
    that group's rows costs less than a call of its own (`PREFILL_CALL_TOKENS`). Rows with
    nothing to prefill are in none."""
    groups: list[list[int]] = []
    longest = 0
    for r in sorted((r for r, n in enumerate(lengths) if n > 0), key=lambda r: lengths[r]):
        if groups and len(groups[-1]) * (lengths[r] - longest) <= PREFILL_CALL_TOKENS:
            groups[-1].append(r)
        else:
            groups.append([r])
        longest = lengths[r]
    return groups


def _prefill(
    model: Any, prompts: list[list[int]], rows: list[int], read: Reader
) -> list[list[Any]]:
    """Each row's cache after one right-padded, batched prefill of `prompts` (all of one
    token or more), the calls kept in `read` as those of `rows` (the prompts' rows)."""
    from mlx_lm.models.cache import make_prompt_cache

    lengths = [len(p) for p in prompts]
    width = max(lengths)
    cache = _joined([make_prompt_cache(model) for _ in prompts])
    padding = [width - n for n in lengths]
    tokens = mx.array([p + [0] * pad for p, pad in zip(prompts, padding, strict=True)])
    for c in cache:
        c.prepare(lengths=lengths, right_padding=padding)
    step = max(1, PREFILL_TOKENS // len(prompts))
    for start in range(0, width, step):
        logits = model(tokens[:, start : start + step], cache=cache)
        read.call(logits, cache, rows)
    for c in cache:
        c.finalize()
    mx.eval([c.state for c in cache])
    return [[c.extract(j) for c in cache] for j in range(len(prompts))]


def _joined(rows: list[list[Any]]) -> list[Any]:
    """One batch cache per layer from the rows' own caches (each a list of layers)."""
    return [type(layer).merge([row[i] for row in rows]) for i, layer in enumerate(rows[0])]


def _head(part: mx.array | None, n: int) -> mx.array | None:
    return None if part is None else part[:n]


def _ended(answer: list[int], stops: frozenset[int], max_tokens: int) -> bool:
    return len(answer) >= max_tokens or (bool(answer) and answer[-1] in stops)


class Reader:
    """What each call of a batch yields: its greedy next tokens and, where taps are set, its
    features, kept per call and joined per row on the positions' axis by `take`."""

    def __init__(self, seen: Capture | None, final: Capture | None):
        self.seen, self.final = seen, final
        # Each call's (features, next tokens, final states) and the row each batch row is.
        self.calls: list[tuple[tuple[mx.array | None, ...], list[int]]] = []

    def call(
        self, logits: mx.array, cache: list[Any], rows: list[int], sampler: Any = None
    ) -> list[int]:
        """Keep one call's outputs for `rows` (a row's number at each of the call's batch
        rows); return the token each row goes on with (greedy, or drawn by `sampler` from
        its last position)."""
        nexts = mx.argmax(logits, axis=-1).astype(mx.int32)  # (rows, n)
        feats = None if self.seen is None else self.seen.latest().astype(mx.float16)
        finals = None if self.final is None else self.final.latest().astype(mx.float16)
        if sampler is None:
            drawn = nexts[:, -1]
        else:
            last = logits[:, -1, :].astype(mx.float32)
            drawn = sampler(last - mx.logsumexp(last, axis=-1, keepdims=True))
        mx.eval(nexts, feats, finals, drawn, [c.state for c in cache])
        self.calls.append(((feats, nexts, finals), list(rows)))
        return np.array(drawn).tolist()

    def take(self) -> dict[int, list[mx.array | None]]:
        """Per row, the (features, next tokens, final states) of the calls kept since the
        last `take` that read it, joined on the positions' axis.
        # row -> [(n, width), (n,), (n, hidden)]"""
        calls, self.calls = self.calls, []
        pieces: dict[int, list[list[mx.array]]] = {}
        for outputs, rows in calls:
            for j, r in enumerate(rows):
                kept = pieces.setdefault(r, [[], [], []])
                for into, output in zip(kept, outputs, strict=True):
                    if output is not None:
                        into.append(output[j])
        return {
            r: [mx.concatenate(parts) if parts else None for parts in kept]
            for r, kept in pieces.items()
        }


@contextmanager
def _taps(model: Any, spec: FeatureSpec | None) -> Iterator[tuple[Capture | None, Capture | None]]:
    """The features `spec` names (none: no taps), and beside layers' features the final
    hidden state too, as `target_features` reads them."""
    with ExitStack() as stack:
        seen = None if spec is None else stack.enter_context(capturing(model, spec))
        wants_final = spec is not None and bool(spec.layers)
        final = stack.enter_context(capturing(model, FeatureSpec())) if wants_final else None
        yield seen, final
