"""The drafting methods, stated once: name, help, options, and how to build the drafter.

Everything that lists or checks methods reads `METHODS`: drafter construction, the CLI's
help text, the bench's rows, the "needs a draft model" check. Each method has a frozen
options type with typed defaults (`specmlx.api.options`: `NgramOptions`, ...); a
generation's `GenerationConfig.options` holds the options of the method it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from specmlx.api.options import (
    DraftOptions,
    EagleOptions,
    LookaheadOptions,
    MedusaOptions,
    MethodOptions,
    MtpOptions,
    NgramOptions,
    NoOptions,
    SuffixOptions,
)
from specmlx.errors import UsageError

if TYPE_CHECKING:
    import mlx.nn as nn

    from specmlx.api.models import Models
    from specmlx.engine.step import Drafter


# The most nodes a cost-sized tree of heads may keep (root included).
MAX_TREE = 64

Builder = Callable[["Models", Any], "Drafter | None"]


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    options: type  # its options dataclass
    needs_draft_model: bool
    build: Builder
    needs_heads: bool = False
    drafts_trees: bool = False  # verifies token trees (not chains)
    # Drafts chains instead where the target cannot verify trees (recurrent layers).
    chains_if_needed: bool = False
    # Its sessions keep every answer in the loaded target's suffix memory (`Models.memory`).
    remembers: bool = False

    def settings(self, options: Any) -> dict[str, Any]:
        """The options as plain data, for reports."""
        return {f.name: getattr(options, f.name) for f in fields(options)}


def _none(models: Models, options: NoOptions) -> None:
    return None


def _draft(models: Models, options: DraftOptions) -> Drafter:
    from specmlx.drafters.draft_model import DraftModelDrafter

    if models.draft is None:
        raise UsageError("--method draft needs a draft model (--draft)")
    return DraftModelDrafter(models.draft, models.vocab_size)


def _ngram(models: Models, options: NgramOptions) -> Drafter:
    from specmlx.drafters.ngram import NgramDrafter

    return NgramDrafter(options.min_n, options.max_n)


def _lookahead(models: Models, options: LookaheadOptions) -> Drafter:
    from specmlx.drafters.lookahead import LookaheadDrafter

    return LookaheadDrafter(options.window, options.ngram, options.guesses)


def _heads(models: Models, name: str) -> Any:
    if name not in models.heads:
        held = ", ".join(models.heads) or "none"
        raise UsageError(f"--method {name} needs {name} heads (--heads DIR); loaded: {held}")
    return models.heads[name]


def _medusa(models: Models, options: MedusaOptions) -> Drafter:
    from specmlx.drafters.medusa import MedusaDrafter
    from specmlx.engine.cache import takes_trees

    heads, chains = _heads(models, "medusa"), not takes_trees(models.target)
    if options.tree_size is not None:
        return MedusaDrafter(heads, options.tree_size, options.width, chains=chains)
    key = ("medusa", MAX_TREE, options.width, chains)
    if key not in models.proposal_costs:
        # Priced as a proposal of every head whatever k. A proposal k deep runs only the
        # first k; priced per head (P0 + k·l), two A/B runs on SmolLM2 disagreed (-2.4% and
        # +4% over all suites: results/ab-medusa-levels-2026-12-07).
        throwaway = MedusaDrafter(heads, MAX_TREE, options.width, chains=chains)
        (cost,) = _proposal_costs(models, throwaway, [heads.config.num_heads])
        models.proposal_costs[key] = (cost, 0.0)
    step_cost, _ = models.proposal_costs[key]
    verify_cost, largest = _verify_cost(models)
    return MedusaDrafter(
        heads, largest, options.width, verify_cost=verify_cost, step_cost=step_cost, chains=chains
    )


def _eagle(models: Models, options: EagleOptions) -> Drafter:
    from specmlx.drafters.eagle import EagleDrafter
    from specmlx.engine.cache import takes_trees

    head, chains = _heads(models, "eagle"), not takes_trees(models.target)
    if options.tree_size is not None:
        return EagleDrafter(head, options.tree_size, options.depth, options.width, chains=chains)
    shape = (MAX_TREE, options.depth, options.width)
    # Its head runs once a level; every proposal also feeds the accepted tokens, runs the
    # first level's LM head and reads the tree back.
    fixed, level = _level_costs(
        models,
        ("eagle", *shape, chains),
        lambda: EagleDrafter(head, *shape, chains=chains),
        options.depth,
    )
    verify_cost, largest = _verify_cost(models)
    return EagleDrafter(
        head,
        largest,
        options.depth,
        options.width,
        verify_cost=verify_cost,
        step_cost=fixed,
        chains=chains,
        level_cost=level,
    )


def _suffix(models: Models, options: SuffixOptions, fallback: Drafter | None = None) -> Drafter:
    from specmlx.drafters.suffix import SuffixDrafter
    from specmlx.engine.cache import takes_trees

    cap, verify_cost = options.tree_size or MAX_TREE, None
    if options.tree_size is None:
        verify_cost, cap = _verify_cost(models)
    return SuffixDrafter(
        models.memory(options.memory, options.cache),
        tree_size=cap,
        factor=options.factor,
        min_prob=options.min_prob,
        verify_cost=verify_cost,
        fallback=fallback,
        min_score=options.min_score,
        chains=not takes_trees(models.target),
    )


def _suffix_draft(models: Models, options: SuffixOptions) -> Drafter:
    return _suffix(models, options, _draft(models, DraftOptions()))


def _suffix_heads(models: Models, options: SuffixOptions) -> Drafter:
    if "eagle" in models.heads:
        return _suffix(models, options, _eagle(models, EagleOptions()))
    if "medusa" in models.heads:
        return _suffix(models, options, _medusa(models, MedusaOptions()))
    raise UsageError("--method suffix+heads needs heads (--heads DIR)")


# The chain an MTP layer's cost is timed over.
MTP_DEPTH = 4


def _mtp(models: Models, options: MtpOptions) -> Drafter:
    from specmlx.drafters.mtp import MtpDrafter
    from specmlx.heads.mtp import target_features

    head = models.mtp()
    features = target_features(models.target, options.hidden)
    post_norm = options.hidden == "post-norm"
    key = ("mtp", options.hidden)
    if key not in models.proposal_costs:
        # c, as a draft model's is calibrated: a chain of DEPTH drafted tokens (its catch-up
        # position and DEPTH - 1 recursions) over a one-token target call, per token.
        throwaway = MtpDrafter(head, features, post_norm)
        (cost,) = _proposal_costs(models, throwaway, [MTP_DEPTH])
        models.proposal_costs[key] = (cost / MTP_DEPTH, 0.0)
    token_cost, _ = models.proposal_costs[key]
    return MtpDrafter(head, features, post_norm, token_cost=token_cost)


def _level_costs(
    models: Models, key: tuple, throwaway: Callable[[], Drafter], depth: int
) -> tuple[float, float]:
    """What every proposal of a tree drafter costs, and what each level it grows adds, in
    one-token target calls: from a one-level and a `depth`-level proposal of a `throwaway`
    drafter, timed once per loaded models under `key`."""
    if key not in models.proposal_costs:
        one, full = _proposal_costs(models, throwaway(), [1, depth])
        level = max(full - one, 0.0) / max(depth - 1, 1)
        models.proposal_costs[key] = (max(one - level, 0.0), level)
    return models.proposal_costs[key]


def _proposal_costs(
    models: Models, drafter: Drafter, depths: list[int], reps: int = 4
) -> list[float]:
    """One proposal of each depth over a one-token target call: the drafting that a
    cost-sized tree adds to every step's verification (an EAGLE proposal of 6 levels runs
    ~0.4 target calls, enough to make bigger trees pay). `drafter` is a throwaway of the
    heads and shape to be built. Proposals and target calls are timed here, alternately,
    after a short prefill; each keeps its fastest time after a warm-up. Timed once per
    loaded models (`Models.proposal_costs`)."""
    import time

    import mlx.core as mx

    from specmlx.engine.cache import Sequence
    from specmlx.engine.sampling import SamplingConfig
    from specmlx.engine.step import Verdict

    target = Sequence(models.target)
    target.capture(drafter.traits.features)
    context = [(17 * i + 11) % models.vocab_size for i in range(33)]
    target.sync(context)  # the target holds context[:-1], as at a step
    drafter.prefill(context, target)
    proposals: list[list[float]] = [[] for _ in depths]
    calls = []
    for _ in range(reps + 1):
        for times, k in zip(proposals, depths, strict=True):
            start = time.perf_counter()
            draft = drafter.propose(context, k, SamplingConfig())
            mx.eval(draft.tokens)
            times.append(time.perf_counter() - start)
            drafter.commit(Verdict([]))
        start = time.perf_counter()
        mx.eval(target.forward(mx.array(context[-1:], mx.uint32)))
        calls.append(time.perf_counter() - start)
        target.settle([])  # dropped: the next proposal sees the same context
    call = min(calls[1:])
    return [min(times[1:]) / call for times in proposals]


def _verify_cost(models: Models) -> tuple[Callable[[int], float], int]:
    """The target's calibrated cost of an n-token call over a one-token call, by which heads
    size their trees per step (no draft model to time), and the most nodes a tree may keep:
    the largest call the calibration timed (at most MAX_TREE). Past it v(n) is extrapolated,
    and where calls are launch-bound the curve is flat at its end (an H200: v(4) = v(16)),
    so an extrapolated 64-node tree was priced as a 4-node one and verified at a loss."""
    from specmlx.api.calibration import load_or_measure

    profile = load_or_measure(models, with_draft=False)[0]
    return profile.verify_cost, min(MAX_TREE, max(profile.v))


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("none", "plain decoding, the baseline", NoOptions, False, _none),
        Method("draft", "a small draft model of the same tokenizer", DraftOptions, True, _draft),
        Method("ngram", "prompt lookup, no draft model", NgramOptions, False, _ngram),
        Method(
            "lookahead",
            "Lookahead decoding, no draft model",
            LookaheadOptions,
            False,
            _lookahead,
            drafts_trees=True,
        ),
        Method(
            "medusa",
            "Medusa heads (--heads), token trees (chains on recurrent targets)",
            MedusaOptions,
            False,
            _medusa,
            needs_heads=True,
            drafts_trees=True,
            chains_if_needed=True,
        ),
        Method(
            "eagle",
            "EAGLE heads (--heads), dynamic token trees (chains on recurrent targets)",
            EagleOptions,
            False,
            _eagle,
            needs_heads=True,
            drafts_trees=True,
            chains_if_needed=True,
        ),
        Method(
            "suffix",
            "suffix decoding over the prompt and earlier answers, no draft model",
            SuffixOptions,
            False,
            _suffix,
            drafts_trees=True,
            chains_if_needed=True,
            remembers=True,
        ),
        Method(
            "suffix+draft",
            "suffix decoding, the draft model where no long match is found",
            SuffixOptions,
            True,
            _suffix_draft,
            drafts_trees=True,
            chains_if_needed=True,
            remembers=True,
        ),
        Method(
            "suffix+heads",
            "suffix decoding, the heads (--heads) where no long match is found",
            SuffixOptions,
            False,
            _suffix_heads,
            needs_heads=True,
            drafts_trees=True,
            chains_if_needed=True,
            remembers=True,
        ),
        Method(
            "mtp",
            "the multi-token-prediction layer of the target's own checkpoint (Qwen3.5, "
            "Qwen3-Next, MiMo), chains",
            MtpOptions,
            False,
            _mtp,
        ),
    )
}


def method(name: str) -> Method:
    """The method called `name`, or a one-line error listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise UsageError(f"unknown method {name!r}; choose from {', '.join(METHODS)}") from None


def owner_of(options: MethodOptions | type) -> Method:
    """The method whose options these are (an options object, or its type): the first of
    the methods that take them (`suffix` before its hybrids)."""
    kind = options if isinstance(options, type) else type(options)
    return next(m for m in METHODS.values() if m.options is kind)


def takers_of(options: MethodOptions | type) -> list[Method]:
    """Every method that takes these options."""
    kind = options if isinstance(options, type) else type(options)
    return [m for m in METHODS.values() if m.options is kind]


def check_trees(used: Method, target: nn.Module) -> None:
    """Refuse, before anything runs, a tree method on a target with recurrent layers (Gated
    DeltaNet, SSM: a cache that can't be trimmed). Such a layer runs a call's tokens in
    order through one state, so it cannot score a tree's branches side by side."""
    from specmlx.engine.cache import takes_trees

    if used.drafts_trees and not used.chains_if_needed and not takes_trees(target):
        chains = [
            m.name
            for m in METHODS.values()
            if (not m.drafts_trees or m.chains_if_needed) and m.name != "none"
        ]
        raise UsageError(
            f"--method {used.name} drafts token trees, which this target's recurrent layers "
            f"cannot verify in one call; use a chain method: {', '.join(chains)}"
        )


def methods_help() -> str:
    """One line for the CLI: every method and what it is."""
    return "; ".join(f"{m.name}: {m.help}" for m in METHODS.values())
