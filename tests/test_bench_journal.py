"""A bench stopped midway goes on from its journal: measured groups are not run again, the
suffix memory is refilled, another run's journal is refused, a cut-off line is dropped."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import specmlx.bench.run as bench_run
from specmlx.bench.journal import Journal, from_record, to_record
from specmlx.bench.run import Group, Measurement, RowSpec
from specmlx.cli import app
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.stats import Stats
from specmlx.engine.step import Step
from specmlx.errors import UsageError
from tests.bench_helpers import validate

runner = CliRunner()
RUN_ROW = bench_run.run_row  # the real one, whatever a test patched before


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


def _counting(monkeypatch, stop_at: int | None = None) -> list[tuple[str, Any]]:
    """Record run_row's calls: the row's method and its suffix memory then (documents and
    trust, None without one); with `stop_at`, Ctrl-C on that call."""
    calls: list[tuple[str, Any]] = []
    real = RUN_ROW

    def counted(models, row, *args, **kwargs):
        store = models.suffix_store
        memory = None if store is None else (store.documents(), store.trust.to_dict())
        calls.append((row.method, memory))
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(models, row, *args, **kwargs)

    monkeypatch.setattr(bench_run, "run_row", counted)
    return calls


def test_a_stopped_bench_goes_on_where_it_stopped(tiny_dirs, tmp_path, monkeypatch):
    """Stopped in its third group (a warm-up of each row, then two rows per prompt), the
    bench keeps two groups; run again, it runs only the other two, the suffix row drafting
    from the same memory as an unstopped run (the two answers measured before, with their
    prompts' tails, and the trust journaled with them), and its report, over all four, has
    an unstopped run's answers. The journal goes once the report is written; another
    command's options are refused while it holds groups."""
    out = tmp_path / "report.json"
    journal = tmp_path / "report.json.journal"
    _counting(monkeypatch, stop_at=2 + 2 * 2 + 1)
    stopped = _bench(tiny_dirs, out)
    assert stopped.exit_code == 130
    assert f"kept in {journal}" in stopped.stderr.replace("\n", "")
    assert not out.exists() and len(journal.read_text().splitlines()) == 1 + 2
    kept_trust = json.loads(journal.read_text().splitlines()[2])["trust"]
    assert list(kept_trust) == ["1"]  # the suffix row's memory, after the second prompt

    other = _bench(tiny_dirs, out, "--max-tokens", "6")
    assert other.exit_code != 0 and "journal of another bench run" in other.stderr
    assert len(journal.read_text().splitlines()) == 1 + 2  # refused, nothing lost

    calls = _counting(monkeypatch)
    resumed = _bench(tiny_dirs, out)
    assert resumed.exit_code == 0, resumed.output
    assert "2 of 4 groups measured before" in resumed.stderr.replace("\n", "")
    # Warm-up (no memory), then prompts 3 and 4 (its rows in reverse); nothing else ran.
    assert [method for method, _ in calls] == ["none", "suffix"] * 2 + ["suffix", "none"]
    third = calls[3][1]
    assert len(third[0]) == 2 and third[1] == kept_trust["1"]
    assert not journal.exists()
    report = json.loads(out.read_text())
    validate(report)
    assert report["resumed_groups"] == 2

    fresh = tmp_path / "fresh.json"
    unstopped_calls = _counting(monkeypatch)
    assert _bench(tiny_dirs, fresh).exit_code == 0
    unstopped = json.loads(fresh.read_text())
    assert unstopped["resumed_groups"] == 0

    # The memory the suffix row drafts from at prompts 3 and 4 is the unstopped run's.
    def suffix_memories(made):
        return [memory and memory[0] for method, memory in made[2:] if method == "suffix"]

    assert len(suffix_memories(unstopped_calls)) == 4
    assert suffix_memories(calls) == suffix_memories(unstopped_calls)[2:]

    def answers(data):
        return {(r["prompt_id"], r["row"]): r["token_ids"] for r in data["results"]}

    assert answers(report) == answers(unstopped) and len(answers(report)) == 8
    assert {s["suite"] for s in report["summary"]} == {
        "scripting",
        "scripting 1st half",
        "scripting 2nd half",
    }


def test_a_bench_whose_groups_all_finished_only_reports(tiny_dirs, tmp_path, monkeypatch):
    """Stopped after its last group but before its report, the bench run again measures
    nothing (no warm-up either) and writes the report from the journal."""
    out = tmp_path / "report.json"
    import specmlx.bench.summary as summary

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(summary, "build_report", stop)
    assert _bench(tiny_dirs, out).exit_code == 130
    monkeypatch.undo()
    calls = _counting(monkeypatch)
    again = _bench(tiny_dirs, out)
    assert again.exit_code == 0, again.output
    assert calls == [] and json.loads(out.read_text())["resumed_groups"] == 4
    assert re.search(r"^benchmarking: (\d+)/\1", again.stderr, re.M)  # the bar ends full


def test_another_runs_journal_is_refused_and_a_cut_off_line_dropped(tiny_dirs, tmp_path):
    out = tmp_path / "report.json"
    journal = tmp_path / "report.json.journal"
    measured = Measurement(RowSpec("none"), (1, 2), Stats(tokens=2, target_calls=2))
    Journal.open(journal, {"a": 1}).keep((0.0, "s", "p0", 0), Group((measured,)))
    refused = _bench(tiny_dirs, out)
    assert refused.exit_code != 0
    assert "journal of another bench run" in refused.stderr and "Traceback" not in refused.output
    assert journal.exists() and not out.exists()  # nothing measured is thrown away
    # A group's line cut off by a stop is dropped (that group runs again), the rest kept;
    # so is a line that lost its newline (the next group would run into it).
    with journal.open("a") as f:
        f.write('{"temperature": 0.0, "suite": "s", "prompt_id": "p1", "rep')
    again = Journal.open(journal, {"a": 1})
    assert again.done == {(0.0, "s", "p0", 0): Group((measured,))}
    assert len(journal.read_text().splitlines()) == 2
    journal.write_text(journal.read_text().rstrip("\n"))
    Journal.open(journal, {"a": 1}).keep((0.0, "s", "p1", 0), Group((measured,)))
    assert len(Journal.open(journal, {"a": 1}).done) == 2
    journal.write_text("not a journal\n")
    with pytest.raises(UsageError, match="not a bench journal"):
        Journal.open(journal, {"a": 1})
    # A journal no group of which finished is another run's to replace, not to refuse.
    journal.write_text(json.dumps({"format": "specmlx-bench-journal", "run": {"a": 1}}) + "\n")
    assert _bench(tiny_dirs, out).exit_code == 0 and out.exists() and not journal.exists()


def test_a_prompt_id_twice_in_a_suite_is_refused(tiny_dirs, tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    args = ["bench", "--target", str(tiny_dirs["llama"]), "--prompts", str(prompts)]
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and "appears twice" in result.stderr
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"id": "mine", "prompt": "x"}\n')
    args = ["bench", "--target", str(tiny_dirs["llama"]), "--prompts", str(chat), "--suite", "chat"]
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and "two suites are named 'chat'" in result.stderr
