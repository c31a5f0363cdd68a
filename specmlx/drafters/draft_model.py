"""A smaller model of the same tokenizer drafts k tokens autoregressively.

Its cache runs behind the context: it holds every token up to the last one it consumed.
Each proposal first feeds whatever the context has that the cache lacks (the last accepted
token, and the final draft token when all k were accepted, since the model drafted it but
never consumed it), then drafts one token per call.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from specmlx.cache import Sequence
from specmlx.drafters.base import Draft, Verdict
from specmlx.sampling import SamplingConfig, sample


class DraftModelDrafter:
    """Draft with a small model, sampling exactly as the target is sampled."""

    def __init__(
        self,
        model: nn.Module,
        sampling: SamplingConfig,
        vocab_size: int,
        p_min: float = 0.0,
    ):
        self.sequence = Sequence(model)
        self.draft_model = model  # its calls enter the cost model of adaptive k
        self.sampling = sampling
        # Stop drafting after a token whose own probability is below p_min (as llama.cpp's
        # p_min, which drops that token); 0 drafts all k. Checking costs a host sync per
        # token.
        self.p_min = p_min
        # Or a rule that sees the confidences of the draft so far and says whether to draft
        # one more token (adaptive k sets `AdaptiveK.goes_on`).
        self.goes_on: Callable[[tuple[float, ...]], bool] | None = None
        # Target vocab: draft logits are padded or cut to it before sampling, so that
        # verification compares the two models over one index space, and the draft samples
        # from exactly the distribution it reports.
        self.vocab_size = vocab_size
        self._fed: list[int] = []  # inputs of the current proposal's first call

    def prefill(self, context: list[int]) -> None:
        self.sequence.sync(context)

    def propose(self, context: list[int], k: int) -> Draft:
        self._fed = context[len(self.sequence.tokens) :]
        inputs = mx.array(self._fed, mx.uint32)
        tokens, probs, confidences = [], [], []
        for i in range(k):
            logits = self._fit_vocab(self.sequence.forward(inputs)[-1])
            token, token_probs = sample(logits, self.sampling)
            tokens.append(token)
            if token_probs is not None:
                probs.append(token_probs)
            if self.p_min > 0 or self.goes_on is not None:
                confidences.append(self._confidence(logits, token, token_probs))
                # An unsure token ends the draft, but is verified with it: its call is spent
                # already, and one more verified token costs little.
                if confidences[-1] < self.p_min or (
                    self.goes_on is not None and not self.goes_on(tuple(confidences))
                ):
                    break
            if i < k - 1:
                inputs = token[None]
                mx.async_eval(token)
        return Draft(
            mx.stack(tokens),
            mx.stack(probs) if probs else None,
            confidences=tuple(confidences) if confidences else None,
        )

    @staticmethod
    def _confidence(logits: mx.array, token: mx.array, token_probs: mx.array | None) -> float:
        if token_probs is None:
            return mx.softmax(logits.astype(mx.float32)).max().item()
        return token_probs[token].item()

    def commit(self, verdict: Verdict) -> None:
        # The model consumed the first k-1 drafts; the k-th is fed next time if it was kept.
        n_consumed = self.sequence.n_unconfirmed - len(self._fed)
        self.sequence.settle(self._fed + verdict.accepted[:n_consumed])

    def _fit_vocab(self, logits: mx.array) -> mx.array:
        size = logits.shape[-1]
        if size > self.vocab_size:
            return logits[: self.vocab_size]
        if size < self.vocab_size:
            return mx.pad(logits, [(0, self.vocab_size - size)], constant_values=-float("inf"))
        return logits
