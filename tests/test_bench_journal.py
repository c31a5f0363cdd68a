"""A bench stopped midway goes on from its journal: measured groups are not run again, the
suffix memory is refilled, another run's journal is refused, a cut-off line is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import specmlx.bench.run as bench_run
from specmlx.bench.journal import Journal, from_record, to_record
from specmlx.bench.run import Measurement, RowSpec
from specmlx.cli import app
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.stats import Stats
from specmlx.engine.step import Step
from specmlx.errors import UsageError
from tests.bench_helpers import validate

runner = CliRunner()


def test_a_measurement_reads_back_as_it_was_written():
    step = Step((3, 4), 4, 3, 3, 1, 0.25, None, 0.01, 4, (0.9, 0.5, 0.2), False, True)
    measured = Measurement(
        row=RowSpec("draft", None, SamplingConfig(0.7, 0.9, 5)),
        token_ids=(1, 2, 3, 4),
        stats=Stats(tokens=4, target_calls=2, drafted_by_position=(1, 1), peak_memory_gb=0.1),
        temperature=0.7,
        suite="code",
        prompt_id="p",
        repeat=1,
        time_to_first_token=0.123456789,
        decode_tokens=3,
        decode_seconds=1 / 3,
        seconds=0.5,
        decode_steps=(step, step),
        prompt_ids=(9, 8),
    )
    assert from_record(json.loads(json.dumps(to_record(measured)))) == measured


def _bench(tiny_dirs, out: Path, *extra: str):
    args = ["bench", "--target", str(tiny_dirs["llama"]), "--suite", "scripting"]
    args += ["--limit", "4", "--max-tokens", "8", "--method", "suffix", "-k", "auto"]
    args += ["--no-mlx-lm", "--bandwidth-gb", "0.01", "--json", str(out), *extra]
    return runner.invoke(app, args)


def _counting(monkeypatch, stop_at: int | None = None) -> list[tuple[str, int | None]]:
    """Count run_row's calls (the row, and the documents its suffix memory held then);
    with `stop_at`, Ctrl-C on that call."""
    calls: list[tuple[str, int | None]] = []
    real = bench_run.run_row

    def counted(models, row, *args, **kwargs):
        store = models.suffix_store
        calls.append((row.method, None if store is None else len(store.documents())))
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(models, row, *args, **kwargs)

    monkeypatch.setattr(bench_run, "run_row", counted)
    return calls


def test_a_stopped_bench_goes_on_where_it_stopped(tiny_dirs, tmp_path, monkeypatch):
    """Stopped in its third group (a warm-up of each row, then two rows per prompt), the
    bench keeps two groups; run again, it runs only the other two, the suffix row drafting
    from the memory of the two answers measured before, and its report, over all four,
    equals an unstopped run's at T=0. The journal goes once the report is written."""
    out = tmp_path / "report.json"
    journal = tmp_path / "report.json.journal"
    _counting(monkeypatch, stop_at=2 + 2 * 2 + 1)
    stopped = _bench(tiny_dirs, out)
    assert stopped.exit_code == 130
    assert f"kept in {journal}" in stopped.stderr.replace("\n", "")
    assert not out.exists() and len(journal.read_text().splitlines()) == 1 + 2

    calls = _counting(monkeypatch)
    resumed = _bench(tiny_dirs, out)
    assert resumed.exit_code == 0, resumed.output
    assert "2 groups measured before" in resumed.stderr.replace("\n", "")
    # Warm-up (memory: none), then prompts 3 and 4: the suffix row's memory held the two
    # answers measured before the stop, then three.
    assert calls == [("none", None), ("suffix", None)] + [
        ("none", None),
        ("suffix", 2),
        ("none", None),
        ("suffix", 3),
    ]
    assert not journal.exists()
    report = json.loads(out.read_text())
    validate(report)
    fresh = tmp_path / "fresh.json"
    _counting(monkeypatch)
    assert _bench(tiny_dirs, fresh).exit_code == 0
    unstopped = json.loads(fresh.read_text())

    def answers(data):
        return {(r["prompt_id"], r["row"]): r["token_ids"] for r in data["results"]}

    assert answers(report) == answers(unstopped) and len(answers(report)) == 8
    assert {s["suite"] for s in report["summary"]} == {
        "scripting",
        "scripting 1st half",
        "scripting 2nd half",
    }


def test_another_runs_journal_is_refused_and_a_cut_off_line_dropped(tiny_dirs, tmp_path):
    out = tmp_path / "report.json"
    journal = tmp_path / "report.json.journal"
    identity = {"a": 1}
    Journal.open(journal, identity)
    refused = _bench(tiny_dirs, out)
    assert refused.exit_code != 0
    assert "journal of another bench run" in refused.stderr and "Traceback" not in refused.output
    assert journal.exists() and not out.exists()  # nothing measured is thrown away
    # A group's line cut off by a stop is dropped (that group runs again), the rest kept.
    measured = Measurement(RowSpec("none"), (1, 2), Stats(tokens=2, target_calls=2))
    Journal.open(journal, identity).keep((0.0, "s", "p0", 0), [measured])
    with journal.open("a") as f:
        f.write('{"temperature": 0.0, "suite": "s", "prompt_id": "p1", "rep')
    again = Journal.open(journal, identity)
    assert list(again.done) == [(0.0, "s", "p0", 0)] and again.done[(0.0, "s", "p0", 0)] == [
        measured
    ]
    assert len(journal.read_text().splitlines()) == 2
    journal.write_text("not a journal\n")
    with pytest.raises(UsageError, match="not a bench journal"):
        Journal.open(journal, identity)
