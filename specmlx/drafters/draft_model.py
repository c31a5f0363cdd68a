"""A smaller model of the same tokenizer drafts k tokens autoregressively.

Its cache runs behind the context: it holds every token up to the last one it consumed.
Each proposal first feeds whatever the context has that the cache lacks (the last accepted
token, and the final draft token when all k were accepted, since the model drafted it but
never consumed it), then drafts one token per call, each call queued before the host waits
for the one before it.

It samples as the step's `SamplingConfig` says and stores none, so one loaded drafter (and its
cache) serves requests of any temperature. With a stop rule it drafts `stop.lookahead` tokens,
reads their confidences back in one transfer and cuts the draft after the first token the rule
stops at; only a draft that goes on past them all drafts (and reads back) more.
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
        self._n_kept = 0  # drafted tokens the proposal kept (after a stop rule's cut)

    def prefill(self, context: list[int], target: Sequence) -> None:
        self.sequence.sync(context)

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        """Draft k tokens lazily; with a stop rule, read their confidences back once per
        `stop.lookahead` tokens and end the draft where the rule says."""
        self._fed = context[len(self.sequence.tokens) :]
        inputs = mx.array(self._fed, mx.uint32)
        tokens: list[mx.array] = []
        probs: list[mx.array] = []
        confidences: list[mx.array] = []
        read: tuple[float, ...] = ()
        n_kept = None  # where the stop rule cut the draft, once it has
        while len(tokens) < k and n_kept is None:
            chunk = k - len(tokens) if stop is None else min(stop.lookahead, k - len(tokens))
            for _ in range(chunk):
                logits = self._fit_vocab(self.sequence.forward(inputs)[-1])
                token, token_probs = sample(logits, sampling)
                tokens.append(token)
                if token_probs is not None:
                    probs.append(token_probs)
                if stop is not None:
                    confidences.append(_confidence(logits, token, token_probs))
                inputs = token[None]
                mx.async_eval(token)
            if stop is not None:
                read = tuple(mx.stack(confidences).tolist())  # this chunk's one read-back
                n_kept = stop.cut(read, start=len(read) - chunk)
        n_kept = len(tokens) if n_kept is None else n_kept
        self._n_kept = n_kept
        return Draft(
            mx.stack(tokens[:n_kept]),
            mx.stack(probs[:n_kept]) if probs else None,
            confidences=read[:n_kept] if stop is not None else None,
            calls=len(tokens),
        )

    def commit(self, verdict: Verdict) -> None:
        # The model consumed every drafted token but its last; those past a stop rule's cut
        # were never proposed. The last kept draft is fed next time if the target kept it.
        n_consumed = min(self.sequence.n_unconfirmed - len(self._fed), self._n_kept)
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
