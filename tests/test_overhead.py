"""`specmlx.bench.overhead`: per-step host time and syncs of every method, on tiny in-process models."""

from __future__ import annotations

import pytest
from rich.table import Table

from specmlx.api.methods import METHODS
from specmlx.bench.overhead import OverheadRow, measure_overhead, render, tiny_models


@pytest.fixture(scope="module")
def rows() -> tuple[OverheadRow, ...]:
    return measure_overhead(max_tokens=12, warmup=0)


def test_a_row_for_each_method_and_k(rows) -> None:
    names = [r.name for r in rows]
    expected = ["none"] + [f"{m} k={k}" for m in METHODS if m != "none" for k in (4, "auto")]
    assert names == expected
    assert {r.method for r in rows} == set(METHODS)
    for row in rows:
        assert row.steps >= 1 and row.tokens_per_step >= 1
        assert row.ms_per_step >= 0


def test_syncs_per_step_are_counted(rows) -> None:
    """Every step reads its tokens back at least once; the target alone's step, double
    buffered, makes the same small whole number of syncs every step."""
    for row in rows:
        assert row.syncs_per_step >= 1
        assert row.max_syncs_per_step >= row.syncs_per_step
    none = rows[0]
    assert none.method == "none" and none.k == 0
    assert none.syncs_per_step.is_integer() and 1 <= none.syncs_per_step <= 2
    assert none.max_syncs_per_step == none.syncs_per_step
    assert none.tokens_per_step == 1.0


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
