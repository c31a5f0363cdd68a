"""`specmlx.bench.overhead`: per-step host time and syncs of every method, on tiny
in-process models."""

from __future__ import annotations

import math

import pytest
from rich.table import Table

from specmlx.api.methods import METHODS
from specmlx.bench.overhead import OverheadRow, measure_overhead, render
from specmlx.testing import tiny_models

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def rows() -> tuple[OverheadRow, ...]:
    return measure_overhead(max_tokens=MAX_TOKENS, warmup=0)


def test_a_row_for_each_method_and_k(rows) -> None:
    """Every step is timed, and the steps measured hold what was generated after the first
    (nothing stops early: the generation runs to max_tokens)."""
    names = [r.name for r in rows]
    drafting = [m for m in METHODS if m not in ("none", "mtp")]  # mtp: a checkpoint's layer
    expected = ["none"] + [f"{m} k={k}" for m in drafting for k in (4, "auto")]
    assert names == expected
    assert {r.method for r in rows} == set(METHODS) - {"mtp"}
    for row in rows:
        assert 0 < row.ms_per_step < math.inf, row
        assert row.steps >= 1 and row.tokens_per_step >= 1, row
        measured = row.tokens_per_step * row.steps  # the first step made at least one token
        assert measured == pytest.approx(round(measured)) and measured <= MAX_TOKENS - 1, row
    none = rows[0]
    assert none.method == "none" and none.k == 0
    assert none.steps == MAX_TOKENS - 1 and none.tokens_per_step == 1.0


def test_syncs_per_step_are_counted(rows) -> None:
    """One host sync per step where nothing else is read: the target alone (double
    buffered), and chains drafted without a stop rule (fixed k; n-grams and lookahead never
    stop on a confidence). Heads read their tree back first: one more at most."""
    for row in rows:
        assert 1 <= row.syncs_per_step <= row.max_syncs_per_step, row
    one_sync = [
        r for r in rows if r.method in ("none", "ngram", "lookahead") or r.name == "draft k=4"
    ]
    assert len(one_sync) == 6
    for row in one_sync:
        assert row.syncs_per_step == row.max_syncs_per_step == 1, row
    heads = [r for r in rows if r.method in ("medusa", "eagle")]
    assert len(heads) == 4
    for row in heads:
        assert row.max_syncs_per_step <= 2, row


def test_choosing_methods_ks_and_models() -> None:
    models = tiny_models(vocab_size=128, seed=3)
    assert models.vocab_size == 128 and models.draft is not None
    rows = measure_overhead(["ngram"], [2, 2, 3], max_tokens=6, warmup=0, models=models)
    assert [(r.method, r.k) for r in rows] == [("ngram", 2), ("ngram", 3)]


def test_render_is_a_table_of_the_rows(rows) -> None:
    table = render(rows)
    assert isinstance(table, Table)
    assert table.row_count == len(rows)
    assert [c.header for c in table.columns][:2] == ["method", "k"]
    assert render(()).row_count == 0


def test_the_suffix_drafter_reads_a_bounded_number_of_occurrences():
    """However often a pattern occurred, a lookup reads at most RECENT of its occurrences,
    and the drafter's proposal at most RECENT continuations: its work does not grow with
    the memory."""
    from specmlx.drafters.suffix import SuffixDrafter
    from specmlx.drafters.suffix_store import RECENT, SuffixStore

    store = SuffixStore(1_000_000, "t")
    for i in range(500):
        store.record([], [1, 2, 3, 4, 5 + i % 7])
    found = store.index.match([9, 1, 2, 3, 4])
    assert found.length == 4 and len(found.places) == RECENT
    draft, expected = SuffixDrafter(store, tree_size=8, factor=4.0).speculate([1, 2, 3, 4], 4)
    assert draft.size >= 1 and 0 < expected <= draft.size


def test_suffix_history_reports_each_shown_answer():
    from specmlx.bench.overhead import measure_suffix_history

    points = measure_suffix_history(answers=6, tokens_per_answer=200, shown=(1, 6))
    assert [p.answer for p in points] == [1, 6]
    assert points[0].memory_tokens == 0 and points[1].memory_tokens > 5 * 200
    # Answers from one template: the later ones draft from the earlier ones.
    assert points[1].tokens_per_step > points[0].tokens_per_step
