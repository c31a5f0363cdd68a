"""A smaller model of the same tokenizer drafts k tokens autoregressively.

Its cache runs behind the context: it holds every token up to the last one it consumed.
Each proposal first feeds whatever the context has that the cache lacks (the last accepted
token, and the final draft token when all k were accepted, since the model drafted it but
never consumed it), then drafts one token per call, each call queued before the host waits
for the one before it.

It samples as the step's `SamplingConfig` says and stores none, so one loaded drafter (and its
cache) serves requests of any temperature. With a stop rule (always under `-k auto`) the host
reads each drafted token's confidence before it drafts the next, one scalar per token: the
draft ends exactly where the rule says, and no call is spent past it: a draft call costs far
more than the sync of one scalar (docs/adaptive-k.md).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from specmlx.engine.cache import Sequence
from specmlx.engine.sampling import SamplingConfig, sample
from specmlx.engine.step import Draft, DrafterTraits, StopRule, Verdict


class DraftModelDrafter:
    """Draft with a small model, sampling exactly as the target is sampled."""

    # A draft model of the target's family agrees with it on most tokens: Leviathan et al.
    # (2023) report acceptance rates of 0.5-0.9 for such pairs; the policy starts in between.
    traits = DrafterTraits("draft", uses_model=True, prior_acceptance=0.7, reports_confidence=True)

    def __init__(self, model: nn.Module, vocab_size: int):
        self.sequence = Sequence(model)
        # Target vocab: draft logits are padded or cut to it before sampling, so that
        # verification compares the two models over one index space, and the draft samples
        # from exactly the distribution it reports.
        self.vocab_size = vocab_size
        self._fed: list[int] = []  # inputs of the current proposal's first call

    def prefill(self, context: list[int], target: Sequence) -> None:
        self.sequence.sync(context)

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        """Draft k tokens, each call queued before the host waits for the one before it.
        With a stop rule the host reads each token's confidence (one scalar per token) and
        ends the draft where the rule says; without one, nothing syncs here."""
        self._fed = context[len(self.sequence.tokens) :]
        inputs = mx.array(self._fed, mx.uint32)
        tokens, probs, confidences = [], [], []
        for i in range(k):
            logits = self._fit_vocab(self.sequence.forward(inputs)[-1])
            token, token_probs = sample(logits, sampling)
            tokens.append(token)
            if token_probs is not None:
                probs.append(token_probs)
            if stop is not None:
                confidences.append(_confidence(logits, token, token_probs).item())
                # An unsure token ends the draft, but is verified with it: its call is spent
                # already, and one more verified token costs little.
                if not stop(tuple(confidences)):
                    break
            if i < k - 1:
                inputs = token[None]
                mx.async_eval(token)
        return Draft(
            mx.stack(tokens),
            mx.stack(probs) if probs else None,
            confidences=tuple(confidences) if confidences else None,
        )

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


def _confidence(logits: mx.array, token: mx.array, token_probs: mx.array | None) -> mx.array:
    """The draft's probability of its token, lazily: the warped one when sampling; at greedy
    the argmax's softmax probability, from one logsumexp (no softmax over the vocabulary)."""
    if token_probs is not None:
        return token_probs[token]
    logits = logits.astype(mx.float32)
    return mx.exp(logits.max() - mx.logsumexp(logits))
