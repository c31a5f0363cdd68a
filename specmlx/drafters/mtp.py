"""Multi-token prediction: the target's own MTP layer drafts a chain of k tokens.

The MTP layer (`specmlx.heads.mtp`) has its own KV cache over positions p, each fed (h_p,
token p+1) with h_p the target's real hidden state, so the cache runs one position behind
the target: position p needs the token after it. A proposal first feeds the positions the
cache lacks: the tokens the last step accepted and its bonus token, and any the loop decoded
plainly in between (the drafter is not told of those; the target's feature rows cover
them). The last position's output predicts the token after `last`: the first draft.

Beyond it the layer is applied to its own output, as the reference implementations do: the
drafted token with the output that drafted it, at the next position, one call per token.
Those entries are speculative; `commit` drops them, and the next proposal feeds the kept
tokens again with the target's real hidden states.

Each token is drawn as the step's sampling says, with its warped distribution reported, so
the loop's rejection sampling keeps the target's distribution exactly at T > 0. Nothing
syncs here: the chain is one lazy graph that the verify call evaluates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from specmlx.drafters.behind import OneBehind
from specmlx.engine.features import FeatureSpec
from specmlx.engine.sampling import SamplingConfig, sample
from specmlx.engine.step import Draft, DrafterTraits, StopRule, Verdict
from specmlx.heads.mtp import MtpHead

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence as TargetSequence


class MtpDrafter(OneBehind):
    """Chains of k tokens from the target's MTP layer, applied recursively.

    features: what the target keeps for it (`specmlx.heads.mtp.target_features`); post_norm:
    whether that state is taken after the final norm, and so the layer's own output is fed
    back after its norm too. token_cost: one drafted token over a one-token target call, as
    measured on this machine (`-k auto` prices drafts with it); None: not measured.
    """

    # Qwen3.5's MTP layer keeps its first drafted token ~0.7-0.8 of the time (llama.cpp#24025,
    # kekzl/imp#1800, greedy); the policy starts at the low end of that.
    PRIOR_ACCEPTANCE = 0.7

    def __init__(
        self,
        head: MtpHead,
        features: FeatureSpec,
        post_norm: bool = True,
        token_cost: float | None = None,
    ):
        self.head = head
        self.post_norm = post_norm
        self.cache = head.make_cache()
        self.target: TargetSequence | None = None
        # Positions p < n_consumed are in the cache, from confirmed tokens; position p read
        # tokens x_0..x_{p+1}, which `_context` keeps to tell when they still hold.
        self.n_consumed = 0
        self._context: list[int] = []
        self.traits = DrafterTraits(
            "mtp",
            uses_model=True,  # one layer call per drafted token
            prior_acceptance=self.PRIOR_ACCEPTANCE,
            features=features,
            token_cost=token_cost,
        )

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        """k tokens after `context`, each with the distribution it was drawn from."""
        assert self.target is not None, "propose before prefill"
        assert len(self.target.tokens) == len(context) - 1, "the target must hold context[:-1]"
        if len(context) < 2 or k < 1:
            return Draft(mx.array([], mx.uint32))  # no hidden state yet: a plain step
        self._reuse(context)
        hidden = self._feed(context, len(context) - 1)[-1:]  # (1, H): predicts after `last`
        tokens, probs = [], []
        for i in range(k):
            out = self.head.norm(hidden)
            token, token_probs = sample(self.head.logits(out)[0], sampling)
            tokens.append(token)
            if token_probs is not None:
                probs.append(token_probs)
            if i < k - 1:
                # A speculative position (len(context) - 1 + i), dropped in `commit`.
                recycled = out if self.post_norm else hidden
                hidden = self.head(recycled, token[None], self.cache)
        return Draft(mx.stack(tokens), mx.stack(probs) if probs else None)

    def commit(self, verdict: Verdict) -> None:
        """Drop the drafted positions: the kept tokens come back with the target's states."""
        self._rewind(self.n_consumed)
