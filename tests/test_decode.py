"""The loop's promise: output exactly the target's, greedy and sampled."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest

from specmlx.drafters.draft_model import DraftModelDrafter
from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.policy import AdaptiveK, FixedK
from specmlx.engine.sampling import SamplingConfig

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "for i in range(10):",
    "import numpy as np",
    "Hello, world!",
    "The quick brown fox",
    "Speculative decoding lets",
    "x = np.zeros((3, 4))",
    "print(i * i)",
    "How are you today?",
    "The capital of Italy",
    "return fibonacci(n - 1)",
    "a little fox who lived",
    "0123456789",
    "I am fine, thank you.",
    "jumps over the lazy dog",
    "small model draft tokens",
    "if n <= 0:",
    "there was a",
    "lazy lazy lazy lazy",
    "zq",
]
GREEDY = SamplingConfig()


def run(target, tokenizer, prompt, drafter, k, max_tokens=24, sampling=GREEDY, p_min=None):
    ids = tokenizer.encode(prompt)
    policy = FixedK(k, p_min)
    steps = list(
        decode(
            Sequence(target), ids, drafter, policy=policy, max_tokens=max_tokens, sampling=sampling
        )
    )
    return [t for s in steps for t in s.tokens], steps


@pytest.fixture(scope="module")
def llama(tiny_dirs):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    draft, _ = mlx_lm.load(str(tiny_dirs["llama-draft"]))
    return target, tokenizer, draft


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_speculative_equals_plain(llama, k):
    target, tokenizer, draft = llama
    for prompt in PROMPTS:
        plain, _ = run(target, tokenizer, prompt, None, 0)
        spec, _ = run(target, tokenizer, prompt, DraftModelDrafter(draft, 320), k)
        assert spec == plain, prompt


def test_self_draft_accepts_everything(llama):
    target, tokenizer, _ = llama
    for prompt in PROMPTS[:5]:
        _, steps = run(target, tokenizer, prompt, DraftModelDrafter(target, 320), 4)
        assert sum(s.n_accepted for s in steps) == sum(s.n_drafted for s in steps) > 0
        # Every step but the last, capped by max_tokens, yields k + 1 tokens.
        assert all(len(s.tokens) == 5 for s in steps[:-1])


def test_unrelated_draft_has_low_acceptance_and_same_output(llama):
    target, tokenizer, draft = llama
    drafted = accepted = 0
    for prompt in PROMPTS:
        plain, _ = run(target, tokenizer, prompt, None, 0)
        spec, steps = run(target, tokenizer, prompt, DraftModelDrafter(draft, 320), 4)
        assert spec == plain
        drafted += sum(s.n_drafted for s in steps)
        accepted += sum(s.n_accepted for s in steps)
    assert accepted / drafted < 0.3


@pytest.mark.parametrize("arch", ["qwen2", "gemma3_text", "qwen2_moe"])
def test_greedy_equal_on_other_architectures(tiny_dirs, arch):
    target, tokenizer = mlx_lm.load(str(tiny_dirs[arch]))
    draft, _ = mlx_lm.load(str(tiny_dirs[f"{arch}-draft"]))
    for prompt in PROMPTS[:6]:
        plain, _ = run(target, tokenizer, prompt, None, 0, max_tokens=20)
        for k in (1, 3):
            spec, _ = run(target, tokenizer, prompt, DraftModelDrafter(draft, 320), k, 20)
            assert spec == plain, (arch, prompt, k)


@pytest.mark.parametrize("bits", [8, 4])
def test_greedy_equal_with_quantized_weights(tiny_dirs, bits):
    """A quantized pair (the regime users run) keeps the target's greedy output. On the CPU
    a quantized k-row call scores each row as k one-row calls do: exactly on the stock BLAS,
    and within the rounding of the attention's BLAS calls where one is preloaded (the
    README's identity figures); on GPUs the two go through different kernels."""
    import mlx.nn as nn
    from mlx_lm.models.cache import make_prompt_cache

    from specmlx.engine.device import backend, blas_in_use

    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    draft, _ = mlx_lm.load(str(tiny_dirs["llama-draft"]))
    for model in (target, draft):
        nn.quantize(model, group_size=32, bits=bits)
    if backend() == "cpu":
        ids = mx.array([tokenizer.encode(PROMPTS[1])])
        rows, one_by_one = make_prompt_cache(target), make_prompt_cache(target)
        mx.eval(target(ids[:, :3], cache=rows), target(ids[:, :3], cache=one_by_one))
        together = target(ids[:, 3:], cache=rows)[0]
        apart = mx.concatenate(
            [target(ids[:, i : i + 1], cache=one_by_one)[0] for i in range(3, ids.shape[1])]
        )
        exact = blas_in_use().startswith("reference BLAS")
        gap = mx.abs(together - apart).max().item()
        assert gap == 0.0 if exact else gap < 1e-4
    for prompt in PROMPTS[:8]:
        plain, _ = run(target, tokenizer, prompt, None, 0)
        for k in (1, 4):
            spec, _ = run(target, tokenizer, prompt, DraftModelDrafter(draft, 320), k)
            assert spec == plain, (bits, prompt, k)


def test_stop_token_ends_generation_and_max_tokens_is_exact(llama):
    target, tokenizer, draft = llama
    ids = tokenizer.encode(PROMPTS[0])
    plain = [
        t
        for s in decode(
            Sequence(target), ids, None, policy=FixedK(0), max_tokens=30, sampling=GREEDY
        )
        for t in s.tokens
    ]
    stop = plain[7]
    first = plain.index(stop)
    steps = list(
        decode(
            Sequence(target),
            ids,
            DraftModelDrafter(target, 320),
            policy=FixedK(4),
            max_tokens=30,
            sampling=GREEDY,
            stop_tokens=frozenset([stop]),
        )
    )
    out = [t for s in steps for t in s.tokens]
    assert out == plain[: first + 1] and steps[-1].finish == "stop"
    for max_tokens in (1, 2, 5, 13):
        _, steps = run(target, tokenizer, PROMPTS[1], DraftModelDrafter(target, 320), 8, max_tokens)
        assert sum(len(s.tokens) for s in steps) == max_tokens and steps[-1].finish == "length"


def test_sampled_speculation_is_reproducible_with_a_seed(llama):
    target, tokenizer, draft = llama
    sampling = SamplingConfig(temperature=1.0)
    outs = []
    for _ in range(2):
        mx.random.seed(3)
        out, _ = run(
            target,
            tokenizer,
            PROMPTS[2],
            DraftModelDrafter(draft, 320),
            4,
            sampling=sampling,
        )
        outs.append(out)
    assert outs[0] == outs[1]


def test_adaptive_k_keeps_greedy_output(llama):
    from specmlx.engine.costs import CostProfile

    target, tokenizer, draft = llama
    # Costs that make speculation win whatever the tiny models' sub-millisecond calls
    # measure (a calibrated target call of a second, draft calls almost free), so that
    # every prompt drafts and the policy ends drafts from the confidences reported.
    profile = CostProfile(1.0, 0.001, {k: 1.0 for k in range(1, 17)})
    for prompt in PROMPTS[:8]:
        ids = tokenizer.encode(prompt)
        plain, _ = run(target, tokenizer, prompt, None, 0)
        for model in (draft, target):
            drafter = DraftModelDrafter(model, 320)
            policy = AdaptiveK(profile, drafter.traits)
            steps = list(
                decode(
                    Sequence(target), ids, drafter, policy=policy, max_tokens=24, sampling=GREEDY
                )
            )
            assert [t for s in steps for t in s.tokens] == plain
            # The policy decided where each draft ended, from the confidences reported.
            assert any(s.n_drafted for s in steps)
            assert sum(b.evidence for b in policy.confidence.kept) > 0


def test_p_min_stops_drafting_early_and_keeps_output(llama):
    target, tokenizer, _ = llama
    ids = tokenizer.encode(PROMPTS[1])
    plain, _ = run(target, tokenizer, PROMPTS[1], None, 0)
    drafter = DraftModelDrafter(target, 320)
    _, full = run(target, tokenizer, PROMPTS[1], drafter, 6, p_min=0.0)
    out, short = run(target, tokenizer, PROMPTS[1], drafter, 6, p_min=0.999)
    assert out == plain and ids
    assert sum(s.n_drafted for s in short) < sum(s.n_drafted for s in full)
    assert all(s.n_drafted >= 1 for s in short[:-1])  # at least one token per step


def test_p_min_works_at_a_fixed_k_through_the_api(tiny_dirs):
    from specmlx.api.config import GenerationConfig
    from specmlx.api.generate import generate
    from specmlx.api.load import load
    from specmlx.api.methods import DraftOptions

    models = load(str(tiny_dirs["llama"]), str(tiny_dirs["llama"]), progress=False)
    prompt = PROMPTS[1]
    plain = generate(models, prompt, GenerationConfig(method="none", max_tokens=24))
    full = generate(models, prompt, GenerationConfig(k=6, max_tokens=24))
    timid = generate(
        models, prompt, GenerationConfig(k=6, max_tokens=24, options=DraftOptions(p_min=0.999))
    )
    assert full.token_ids == timid.token_ids == plain.token_ids
    assert timid.stats.drafted < full.stats.drafted


@pytest.mark.parametrize(
    "sampling", [GREEDY, SamplingConfig(temperature=1.0)], ids=["greedy", "T1"]
)
def test_a_stop_rule_ends_the_draft_at_the_token_it_stops_at(llama, sampling):
    """The token where the rule says no is the draft's last: no call is spent past it."""
    target, tokenizer, _ = llama
    ids = tokenizer.encode(PROMPTS[1])
    drafter = DraftModelDrafter(target, 320)
    drafter.prefill(ids, Sequence(target))
    asked: list[tuple[float, ...]] = []

    def stop(confidences: tuple[float, ...]) -> bool:
        asked.append(confidences)
        return len(confidences) < 3

    mx.random.seed(0)
    draft = drafter.propose(ids, 8, sampling, stop)
    assert draft.size == 3 and len(draft.confidences) == 3
    assert [len(c) for c in asked] == [1, 2, 3]  # asked once per drafted token
    assert all(0 < c <= 1 for c in draft.confidences)
    assert (draft.probs is None) == sampling.greedy
    # Consumed: all but the last draft, whatever k was asked.
    assert drafter.sequence.n_unconfirmed == len(ids) - len(drafter.sequence.tokens) + 2


def test_the_loop_caps_k_once_by_room_and_by_the_drafters_depth():
    from specmlx.engine.step import DrafterTraits, draft_length

    heads = DrafterTraits("medusa", max_depth=4)
    assert draft_length(16, 100, heads) == 4
    assert draft_length(16, 2, heads) == 2  # max_tokens leaves room for 2 drafts
    assert draft_length(3, 100, DrafterTraits("draft")) == 3
    assert draft_length(8, 0, DrafterTraits("draft")) == 0  # the last token: a plain step


class Scripted:
    """A policy that plays plans in a loop: runs of plain steps between drafts."""

    def __init__(self, plans):
        self.plans, self.i, self.observed = plans, 0, 0

    def start(self):
        pass

    def choose(self):
        from specmlx.engine.step import Plan

        k, run = self.plans[self.i % len(self.plans)]
        self.i += 1
        return Plan(k, run=run)

    def observe(self, step):
        self.observed += 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_runs_of_plain_steps_between_drafts_keep_the_output(llama, temperature):
    """A policy's plain run is double-buffered (one call queued past each read token) and
    ends with nothing queued: the drafts after it, the stop token inside it and the
    cache after it are as if every step had been planned alone."""
    target, tokenizer, draft = llama
    sampling = SamplingConfig(temperature=temperature)
    for prompt in PROMPTS[:6]:
        ids = tokenizer.encode(prompt)
        outs = []
        for plans in ([(0, 1)], [(0, 5), (3, 1), (0, 2), (2, 1), (0, 7)]):
            mx.random.seed(11)
            policy = Scripted(plans)
            sequence = Sequence(target)
            drafter = DraftModelDrafter(target, 320)  # self-draft: every draft token kept
            steps = list(
                decode(sequence, ids, drafter, policy=policy, max_tokens=30, sampling=sampling)
            )
            out = [t for s in steps for t in s.tokens]
            assert len(out) == 30 and policy.observed == len(steps)
            assert sequence.tokens == [*ids, *out[:-1]]  # all but the newest token
            outs.append(out)
        # Greedy, the drafts change nothing; sampled, they keep the same draws only where
        # every step is plain: compare greedy output alone, and at T=1 the plain runs.
        if temperature == 0:
            assert outs[0] == outs[1]
        stop = outs[0][9]
        plans = [(0, 6), (2, 1)] if temperature == 0 else [(0, 30)]
        mx.random.seed(11)
        steps = list(
            decode(
                Sequence(target),
                ids,
                DraftModelDrafter(target, 320),
                policy=Scripted(plans),
                max_tokens=30,
                sampling=sampling,
                stop_tokens=frozenset([stop]),
            )
        )
        out = [t for s in steps for t in s.tokens]
        assert out == outs[0][: outs[0].index(stop) + 1] and steps[-1].finish == "stop"


def test_a_plain_run_builds_the_next_call_before_reading_a_token(llama):
    """Inside a run the next call is built (the cache took in the token it reads) when a
    step is yielded; the run's last step builds nothing, so a draft can follow."""
    target, tokenizer, _ = llama
    sequence = Sequence(target)
    context = tokenizer.encode(PROMPTS[1])
    queued = []  # per plain step: did the cache already take in the token just read?
    for step in decode(
        sequence,
        context,
        DraftModelDrafter(target, 320),
        policy=Scripted([(0, 4), (2, 1)]),
        max_tokens=14,
        sampling=GREEDY,
    ):
        context = [*context, *step.tokens]
        if step.plain:
            queued.append(len(sequence.tokens) - (len(context) - 1))
    assert queued[:4] == [1, 1, 1, 0] and queued[4:8] == [1, 1, 1, 0]


@pytest.mark.parametrize("ahead", [True, False])
def test_plain_steps_time_their_own_call_where_queuing_one_runs_it(llama, monkeypatch, ahead):
    """Where queuing a call does its work before returning (the CPU backend's async_eval
    did most of a call's), a run that queues ahead times two calls in its first step and
    next to none in its last, and the policy learns the speed from those; reading first,
    every step times its own call. Emulated: async_eval evaluates, then takes a call's time."""
    import time

    from specmlx.engine import decode as loop

    call = 0.04

    def runs_it(*arrays):
        mx.eval(*arrays)
        time.sleep(call)

    monkeypatch.setattr(mx, "async_eval", runs_it)
    monkeypatch.setattr(loop, "QUEUE_AHEAD", ahead)
    target, tokenizer, _ = llama
    context = tokenizer.encode(PROMPTS[1])
    steps = list(
        decode(Sequence(target), context, None, policy=FixedK(0), max_tokens=8, sampling=GREEDY)
    )
    seconds = [step.seconds for step in steps]
    if ahead:
        assert seconds[0] > 1.7 * call and seconds[-1] < 0.5 * call, seconds
    else:
        assert all(0.8 * call < s < 1.6 * call for s in seconds), seconds


class ScriptedLookup:
    """A lookup drafter that finds the target's own continuation where the context is at
    least `found_from` tokens long, and nothing before; it records every context asked."""

    def __init__(self, answer: list[int], prompt_len: int, found_from: int, looks_up: bool):
        from specmlx.engine.step import DrafterTraits

        self.traits = DrafterTraits("ngram", looks_up=looks_up)
        self.full, self.found_from, self.asked = [*answer], found_from, []
        self.prompt_len = prompt_len

    def prefill(self, context, target):
        pass

    def propose(self, context, k, sampling, stop=None):
        from specmlx.engine.step import Draft

        self.asked.append(len(context))
        done = len(context) - self.prompt_len
        tokens = self.full[done : done + k] if len(context) >= self.found_from else []
        return Draft(mx.array(tokens, mx.uint32))

    def commit(self, verdict):
        pass


@pytest.mark.parametrize("looks_up", [False, True])
def test_lookups_that_keep_finding_nothing_are_asked_after_every_plain_token(llama, looks_up):
    """After WATCH_AFTER empty lookups in a row a lookup drafter is asked after every token
    of a plain stretch; once it finds something the stretch goes on one token (the one whose
    call is under way), so the first draft is verified one token later; output unchanged."""
    from specmlx.engine import decode as loop

    target, tokenizer, _ = llama
    ids = tokenizer.encode(PROMPTS[2])
    plain, _ = run(target, tokenizer, PROMPTS[2], None, 0, max_tokens=20)
    found_from = len(ids) + 8
    drafter = ScriptedLookup(plain, len(ids), found_from, looks_up)
    steps = list(
        decode(Sequence(target), ids, drafter, policy=FixedK(3), max_tokens=20, sampling=GREEDY)
    )
    assert [t for s in steps for t in s.tokens] == plain
    first_draft = next(i for i, s in enumerate(steps) if s.n_drafted)
    context_then = len(ids) + sum(len(s.tokens) for s in steps[:first_draft])
    if looks_up:
        assert loop.WATCH_AFTER == 2
        # Two lone lookups, then one after every plain token until one finds something.
        assert drafter.asked[:2] == [len(ids), len(ids) + 1]
        assert drafter.asked[2:9] == list(range(len(ids) + 2, found_from + 1))
        assert context_then == found_from + 1
    else:
        assert drafter.asked[:9] == list(range(len(ids), found_from + 1))
        assert context_then == found_from
