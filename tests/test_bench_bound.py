"""The lookup bound: worked by hand, never beaten by the drafters it bounds, and in the report."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from specmlx.bench.bound import Grams, look_up, lookup_bound
from specmlx.bench.report import as_data, markdown
from specmlx.bench.run import NONE, BenchConfig, RowSpec
from specmlx.bench.suites import Prompt, Suite
from specmlx.bench.summary import build_report
from specmlx.drafters.ngram import NgramDrafter
from specmlx.drafters.suffix import SuffixDrafter
from specmlx.drafters.suffix_store import PROMPT_TAIL, SuffixStore
from specmlx.engine.costs import CostProfile
from specmlx.engine.sampling import SamplingConfig
from tests.bench_helpers import fake_environment, validate
from tests.test_bench_summary import measured


def test_the_lookup_drafts_the_longest_continuation_held_verbatim():
    cost = lambda n: 1.0 + 0.1 * (n - 1)  # noqa: E731
    # 3 4 5 is in the prompt, 9 is not: one call keeps 3 tokens and the target's 9; then
    # 3 4 5 9 is in the answer so far, 7 nowhere: a call keeps 4 and the target's 7.
    found = look_up([1, 2, 3, 4, 5], [3, 4, 5, 9, 3, 4, 5, 9, 7], None, cost, 16)
    assert (found.tokens, found.calls) == (9, 2)
    assert found.cost == pytest.approx(cost(4) + cost(5))
    # A step emits the target's token after what it kept: a draft never reaches the end.
    assert look_up([3, 4, 5], [3, 4, 5], None, cost, 16).calls == 1
    assert look_up([3, 4, 5], [3, 4, 5, 6], None, cost, 16).calls == 1
    # At most `depth` tokens a call; nothing held: one token a call, priced as plain.
    assert look_up([3, 4, 5, 6], [3, 4, 5, 6, 0], None, cost, 2).calls == 2
    plain = look_up([1], [7, 8, 9], None, cost, 16)
    assert (plain.calls, plain.cost) == (3, 3.0)
    assert look_up([1], [7, 8], None, None, 16).cost is None
    # Where v jumps, fewer calls cost more: the cheapest way keeps 1 token a call, 3 times,
    # then the last token alone (3 x 1.1 + 1), where one call of 7 would cost 10.
    jumpy = lambda n: {1: 1.0, 2: 1.1}.get(n, 10.0)  # noqa: E731
    copy = look_up([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7], None, jumpy, 16)
    assert copy.calls == 1 and copy.cost == pytest.approx(4.3)
    # Runs never span two documents of the memory.
    memory = Grams(8)
    memory.add([7, 8])
    memory.add([9, 6])
    assert memory.longest([7, 8, 9]) == 2 and memory.longest([8, 9]) == 1


def test_earlier_answers_are_remembered_as_the_suffix_memory_keeps_them():
    cost = lambda n: 1.0  # noqa: E731
    answer = [20, 21, 22, 23, 24, 25]
    (first, first_mem), (again, again_mem) = lookup_bound([([1], answer), ([2], answer)], cost, 16)
    assert first.calls == first_mem.calls == again.calls == len(answer)  # nothing to look up
    assert again_mem.calls == 1  # the whole answer, from the first one
    # The memory holds a prompt's tail, not all of it, as the suffix memory does.
    long_prompt = list(range(100, 100 + 2 * PROMPT_TAIL))
    _, (_, later) = lookup_bound([(long_prompt, [1]), ([2], long_prompt[:4] + [0])], cost, 16)
    assert later.calls == 5  # the head of the prompt was not kept
    _, (_, later) = lookup_bound([(long_prompt, [1]), ([2], long_prompt[-4:] + [0])], cost, 16)
    assert later.calls == 1  # its tail was: 4 kept and the target's 0, one call


def _steps(drafter, prompt, answer, k, verify_cost):
    """Target calls, and their cost, to generate `answer` greedily with `drafter`: each
    step keeps the draft's longest path that the answer goes on with, then the target's
    own token, and costs v(tokens drafted + 1)."""
    drafter.prefill(list(prompt), None)
    pos = calls = 0
    cost = 0.0
    while pos < len(answer):
        context = [*prompt, *answer[:pos]]
        room = min(k, len(answer) - pos - 1)
        kept = drafted = 0
        if room:
            draft = drafter.propose(context, room, SamplingConfig())
            tokens = draft.tokens.tolist()
            drafted = len(tokens)
            parents = draft.tree.parents if draft.tree is not None else range(len(tokens))
            node = 0
            for token in answer[pos : pos + room]:
                children = [i + 1 for i, p in enumerate(parents) if p == node]
                node = next((c for c in children if tokens[c - 1] == token), None)
                if node is None:
                    break
                kept += 1
        calls += 1
        cost += verify_cost(drafted + 1)
        pos += kept + 1
    return calls, cost


def _motif_text(rng: random.Random, motifs: list[list[int]], n: int) -> list[int]:
    """Motifs from a few, with a stray token now and then: text that lookups half-predict."""
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(motifs)
        if rng.random() < 0.5:
            out.append(rng.randrange(40))
    return out[:n]


@pytest.mark.parametrize(("seed", "k"), [(0, 16), (1, 16), (2, 32), (3, 40)])
def test_no_lookup_drafter_keeps_more_or_costs_less_than_the_bound(seed, k):
    """Prompt lookup, and suffix decoding with and without its memory of earlier answers,
    each as eager as it can be (no verify costs, drafts of up to k, trees up to 64 nodes),
    need at least the bound's calls, and cost at least its cost, on every request: the bound
    within the request for the first two, with the earlier answers for the memory. (A bound
    that misplaced the answer so far, or drafted less deep than the drafters, fails this.)"""
    rng = random.Random(seed)
    motifs = [[rng.randrange(40) for _ in range(rng.randint(2, 6))] for _ in range(5)]
    runs = [(_motif_text(rng, motifs, 30), _motif_text(rng, motifs, 60)) for _ in range(6)]
    # And an answer that copies a long stretch of its prompt: drafts as deep as k pay there.
    long = rng.sample(range(100, 400), 100)
    runs.append((long, long[5:]))
    jumpy = lambda n: 1.0 + 0.05 * (n - 1) + (2.0 if n > 5 else 0.0)  # noqa: E731
    bound = lookup_bound(runs, jumpy, k)
    store = SuffixStore(100_000, "t")
    beaten = 0
    for (prompt, answer), (within, remembered) in zip(runs, bound, strict=True):
        eager = {"factor": 64.0, "min_prob": 0.0, "tree_size": 64}
        ngram = _steps(NgramDrafter(1, 4), prompt, answer, k, jumpy)
        alone = _steps(SuffixDrafter(None, **eager), prompt, answer, k, jumpy)
        shared = _steps(SuffixDrafter(store, **eager), prompt, answer, k, jumpy)
        store.record(prompt, answer)
        assert within.calls <= min(ngram[0], alone[0]) and remembered.calls <= shared[0]
        assert within.cost <= min(ngram[1], alone[1]) + 1e-9
        assert remembered.cost <= shared[1] + 1e-9
        assert remembered.calls <= within.calls
        beaten += within.calls < len(answer)
    assert beaten  # the lookups kept something: the comparison was not all plain steps


def test_the_report_gives_each_suite_and_half_its_bound():
    """At T = 0 the report has the bound of each suite and of an ordered suite's halves,
    from the target alone's first repeat, in the JSON (schema-valid) and under the Markdown
    table; a run at T = 1 alone has none."""
    draft = RowSpec("suffix", None)
    suite = Suite("s", tuple(Prompt(f"p{i}", "x") for i in range(4)), ordered=True)
    config = BenchConfig(suites=(suite,), rows=(NONE, draft), repeats=1)
    answer = (5, 6, 7, 8, 9, 10)
    runs = []
    for i in range(4):
        for row in (NONE, draft):
            run = measured(row, 0, [(0, 1, 0.1)] * 5, f"p{i}", answer)
            runs.append(replace(run, prompt_ids=(1, 2, 3)))
    costs = CostProfile(0.1, 0.03, {n: 1.0 + 0.1 * (n - 1) for n in range(1, 17)})
    environment = fake_environment() | {"python": "3", "cpu": "x", "cpu_count": 1}
    report = build_report(config, runs, environment, costs)
    validate(report)
    bounds = {b.suite: b for b in report.bounds}
    assert {b.depth for b in report.bounds} == {16}  # adaptive k's longest draft
    assert set(bounds) == {"s", "s 1st half", "s 2nd half"}
    # Within a request nothing repeats; with memory, each answer after the first is one
    # call (the first p0's 6 calls): 2 halves of 2 answers each.
    assert bounds["s"].calls_within == 24 and bounds["s"].calls_with_memory == 6 + 3
    assert bounds["s 2nd half"].tokens_per_call_with_memory == 6.0
    assert bounds["s 2nd half"].speedup_with_memory == pytest.approx(6 / 1.5)
    assert bounds["s 1st half"].speedup_within == 1.0
    text = markdown(report)
    assert "Lookup bound" in text and "| s 2nd half | 1.00 | 6.00 | 1.00 | 4.00 |" in text
    assert as_data(report)["lookup_bounds"][0]["suite"] == "s"
    hot = BenchConfig(suites=(suite,), rows=(NONE, draft), temperatures=(1.0,))
    hot_runs = [replace(run, temperature=1.0) for run in runs]
    assert build_report(hot, hot_runs, environment, costs).bounds == ()
