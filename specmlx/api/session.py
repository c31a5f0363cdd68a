"""A generation session: everything that generating with one loaded pair keeps across
requests, owned by one object.

A `Session` holds the target's `Sequence` (its cache: a prompt that extends the last one
prefills only what is new), the drafter the config's method builds (and the drafter's own
cache), and one policy per sampler (an adaptive one keeps what it learned of acceptance and
costs from one response to the next). `generate`, `stream_generate`, `ChatSession`, the
server's engine and the bench all generate through it. A request brings its own sampling,
length and seed; the drafter stores none of them, so a request with another temperature
reuses the same drafter and its cache.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import mlx.core as mx

from specmlx.api.config import GenerationConfig, method_of, options_of
from specmlx.api.methods import check_trees
from specmlx.api.models import CostKey, Models
from specmlx.engine.cache import Sequence
from specmlx.engine.costs import CostProfile
from specmlx.engine.decode import decode
from specmlx.engine.policy import AdaptiveK, FixedK, LearnedCosts, Policy
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.stats import Stats
from specmlx.engine.step import Drafter, Step
from specmlx.errors import UsageError

# What a request may set for itself; the rest of a config shapes the drafter and the policy.
PER_REQUEST = ("max_tokens", "sampling", "seed", "chat_template")
# Policies kept for the samplers used last: a server's clients may each send another one.
MAX_POLICIES = 16


@dataclass(frozen=True)
class GenerationEvent:
    """One target call's worth of output."""

    text: str  # new text (a token's bytes may complete in a later event)
    token_ids: tuple[int, ...]
    step: Step
    stats: Stats


class Session:
    """One loaded pair's target sequence, drafter and policies, for any number of requests.

    `profile`: the call costs adaptive k prices with; None measures them once per device and
    pair (`specmlx.api.calibration`), when the first adaptive policy is made.
    """

    def __init__(
        self, models: Models, config: GenerationConfig, profile: CostProfile | None = None
    ):
        self.models = models
        self.config = config
        self.method = method_of(models, config)
        self.options = options_of(models, config)
        self.profile = profile
        self.target = Sequence(models.target)
        check_trees(self.method, models.target)
        tokenizer = models.tokenizer  # None for the tiny models of `specmlx.testing`
        self.stop_tokens = frozenset(tokenizer.eos_token_ids if tokenizer is not None else ())
        self.drafter: Drafter | None = self.method.build(models, self.options)
        self._policies: dict[SamplingConfig, Policy] = {}  # in order of last use
        self.policy(config.sampling)  # calibrates now, if it must, not in a request's time

    def reset(self) -> None:
        """Start from empty caches and a new drafter (after a failure left them unknown);
        what the policies learned of this machine stays with the models."""
        self.target = Sequence(self.models.target)
        self.drafter = self.method.build(self.models, self.options)
        self._policies = {}

    def policy(self, sampling: SamplingConfig) -> Policy:
        """The policy of requests with this sampler: fixed k, or adaptive from calibrated
        costs and what earlier steps measured (each sampler adds its own per-step cost:
        greedy, top-p, top-k); made on first use, then kept."""
        policy = self._policies.pop(sampling, None) or self._make_policy(sampling)
        self._policies[sampling] = policy  # the most recent last
        while len(self._policies) > MAX_POLICIES:
            del self._policies[next(iter(self._policies))]
        return policy

    def _make_policy(self, sampling: SamplingConfig) -> Policy:
        p_min = getattr(self.options, "p_min", None)
        if self.drafter is None:
            return FixedK(0)
        if self.config.k is not None:
            return FixedK(self.config.k, p_min)
        traits = self.drafter.traits
        if self.profile is None:
            from specmlx.api.calibration import load_or_measure

            self.profile, _ = load_or_measure(self.models, with_draft=traits.uses_model)
        profile = self.profile
        if traits.token_cost is not None:
            # A drafter that timed its own calls (MTP): its c in place of a draft model's.
            draft_call = traits.token_cost * profile.target_call_seconds
            profile = replace(profile, draft_call_seconds=draft_call)
        # The costs earlier responses measured carry over: they are the machine's; so does
        # what they saw of this drafter's drafts.
        key: CostKey = (
            traits.kind,
            traits.tree_size,
            sampling,
            profile.target_call_seconds,
            profile.draft_call_seconds,
        )
        policy = AdaptiveK(
            profile,
            traits,
            learned=self.models.learned_costs.setdefault(key, LearnedCosts()),
            max_k=self.config.max_k,
            p_min=p_min,
            experience=self.models.experience.get(key),
        )
        self.models.experience[key] = policy.experience  # the next session's start
        return policy

    def request(self, config: GenerationConfig | None) -> GenerationConfig:
        """A request's config: the session's, with the request's own sampling, length, seed
        and template; a request that asks for another method, options or k is refused."""
        if config is None:
            return self.config
        for f in fields(GenerationConfig):
            if f.name not in PER_REQUEST and getattr(config, f.name) != getattr(
                self.config, f.name
            ):
                raise UsageError(f"a session's requests share its {f.name}; start another session")
        return config

    def steps(
        self, prompt_ids: list[int], config: GenerationConfig | None = None
    ) -> Iterator[Step]:
        """The loop's steps for `prompt_ids`, as `decode` yields them: no text, no statistics."""
        return self._decode(prompt_ids, self.request(config))

    def _decode(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        steps = decode(
            self.target,
            prompt_ids,
            self.drafter,
            policy=self.policy(config.sampling),
            max_tokens=config.max_tokens,
            sampling=config.sampling,
            stop_tokens=self.stop_tokens,
        )
        if not self.method.remembers or self.models.suffix_store is None:
            return steps
        return self._remembered(prompt_ids, steps)

    def _remembered(self, prompt_ids: list[int], steps: Iterator[Step]) -> Iterator[Step]:
        """The steps, then the answer kept in the suffix memory (and its file, when it has
        one): a reply stopped early is kept as far as it went."""
        answer: list[int] = []
        try:
            for step in steps:
                answer.extend(step.tokens)
                yield step
        finally:
            store = self.models.suffix_store
            store.record(prompt_ids, answer)
            store.save()

    def stream(
        self, prompt_ids: list[int], config: GenerationConfig | None = None
    ) -> Iterator[GenerationEvent]:
        """Stream the continuation of `prompt_ids`, one event per target call. Stopping
        early (closing the generator) leaves the caches consistent for the next request."""
        config = self.request(config)
        if config.seed is not None:
            mx.random.seed(config.seed)
        mx.reset_peak_memory()
        detokenizer = self.models.tokenizer.detokenizer
        detokenizer.reset()
        stats = Stats(prompt_tokens=len(prompt_ids))
        start = time.perf_counter()
        for step in self._decode(prompt_ids, config):
            stats = stats.add(step, time.perf_counter() - start)
            for token in step.tokens:
                if token not in self.stop_tokens:
                    detokenizer.add_token(token)
            if step.finish is not None:
                detokenizer.finalize()
            yield GenerationEvent(detokenizer.last_segment, step.tokens, step, stats)
