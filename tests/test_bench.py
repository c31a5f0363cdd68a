"""`specmlx bench` on tiny random models: rows, schema, matched outputs, bad input."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specmlx.bench import MLX_LM_PLAIN, NONE, BenchConfig, Measurement, RowSpec, make_rows, run
from specmlx.bench_report import markdown, to_csv, to_json, write_atomic
from specmlx.bench_summary import Report, SummaryRow, build_report
from specmlx.cli import app
from specmlx.decode import Step
from specmlx.errors import UsageError
from specmlx.sampling import SamplingConfig
from specmlx.stats import Stats
from specmlx.suites import SUITES, Prompt, Suite, load_prompts_file, load_suite, suite_names

runner = CliRunner()


def schema() -> dict:
    return json.loads(resources.files("specmlx").joinpath("data/bench.schema.json").read_text())


def validate(report: Report | dict) -> None:
    """The report as its JSON output holds it validates against the shipped schema."""
    import jsonschema

    data = json.loads(to_json(report)) if isinstance(report, Report) else report
    jsonschema.Draft202012Validator(schema()).validate(data)


def by_name(report: Report, field: str, temperature: float = 0.0) -> dict:
    return {s.row.name: getattr(s, field) for s in report.summary if s.temperature == temperature}


@pytest.fixture(scope="module")
def tiny_models(tiny_dirs):
    from specmlx.api import load

    return load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)


def test_end_to_end_cli(tiny_dirs, tmp_path: Path) -> None:
    out = {ext: tmp_path / f"report.{ext}" for ext in ("json", "csv", "md")}
    args = ["bench", "--target", str(tiny_dirs["llama"]), "--draft", str(tiny_dirs["llama-draft"])]
    args += ["--suite", "code", "--suite", "extract", "--limit", "2", "--max-tokens", "8"]
    args += ["-k", "2", "--k", "3", "--temp", "0", "--temp", "1.0", "--bandwidth-gb", "0.01"]
    args += ["--json", str(out["json"]), "--csv", str(out["csv"]), "--markdown", str(out["md"])]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out["json"].read_text())
    validate(report)

    names = ["none", "mlx-lm plain", "draft k=2", "draft k=3", "mlx-lm k=2", "mlx-lm k=3"]
    assert [r["name"] for r in report["config"]["rows"]] == names
    lines = report["summary"]
    for temperature in (0.0, 1.0):
        for suite in ("code", "extract", "all"):
            rows = [
                s["row"] for s in lines if (s["temperature"], s["suite"]) == (temperature, suite)
            ]
            assert rows == names
    greedy = {s["row"]: s for s in lines if s["temperature"] == 0 and s["suite"] == "all"}
    assert greedy["draft k=2"]["matched"] is True and greedy["draft k=3"]["matched"] is True
    assert greedy["mlx-lm k=2"]["matched"] is not None
    # The two plain baselines agree token for token at T=0.
    assert greedy["mlx-lm plain"]["matched"] is True and greedy["none"]["matched"] is True
    assert greedy["none"]["speedup_vs_none"] == pytest.approx(1.0)
    assert 0 < greedy["none"]["speedup_vs_best_plain"] <= 1.0
    assert greedy["draft k=2"]["speedup_vs_best_plain"] is not None
    assert greedy["draft k=2"]["speedup_vs_mlx_lm"] is not None
    assert greedy["draft k=2"]["predicted_speedup"] is not None
    assert len(greedy["draft k=3"]["acceptance_by_position"]) == 3
    sampled = [s for s in lines if s["temperature"] == 1.0]
    assert all(s["matched"] is None for s in sampled)
    # Per-prompt results: 2 temperatures × 2 suites × 2 prompts × 6 rows.
    assert len(report["results"]) == 48
    assert {(r["method"], r["k"]) for r in report["results"]} >= {("mlx-lm", 0), ("none", 0)}
    env = report["environment"]
    assert env["target"]["dtype"] == "float32"
    # The tiny llama has its own lm_head: its input embedding is not read whole per call.
    assert 0 < env["bytes_per_target_call"] < env["target"]["bytes"]
    assert env["backend"] in ("cpu", "metal", "cuda", "gpu")

    with out["csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3 * 6  # temperatures × (2 suites + all) × rows
    assert "| T | suite | row |" in out["md"].read_text()


def test_a_different_sampler_does_not_match(tiny_models) -> None:
    hot = SamplingConfig(temperature=50.0)
    rows = (RowSpec("none"), RowSpec("draft", 2), RowSpec("draft", 2, sampling=hot))
    suite = Suite("one", (Prompt("p1", "def fibonacci(n):"), Prompt("p2", "The capital of")))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=8, warmup=0)
    measurements = list(run(tiny_models, config))
    assert len(measurements) == config.total_runs == 6
    report = build_report(config, measurements, _fake_environment(), None)
    validate(report)
    matched = by_name(report, "matched")
    assert matched == {"none": None, "draft k=2": True, "draft k=2 (T=50)": False}


def test_every_row_sees_the_same_seed(tiny_models) -> None:
    """Two identical sampled rows draw the same tokens: the seed is fixed per prompt, not row."""
    warm = SamplingConfig(temperature=1.0)
    rows = (RowSpec("none"), RowSpec("none", sampling=warm), RowSpec("draft", 2, sampling=warm))
    suite = Suite("one", (Prompt("p1", "Once upon a time"),))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=8, warmup=1, repeats=2)
    measurements = [m for m in run(tiny_models, config) if m.repeat >= 0]
    first, second = (m for m in measurements if m.row == RowSpec("none", sampling=warm))
    assert first.token_ids != () and first.repeat == 0 and second.repeat == 1


def _fake_environment() -> dict:
    model = {"path": None, "dtype": "float32", "quantization": None, "parameters": 1, "bytes": 4}
    return {
        "specmlx": "0",
        "mlx": "0",
        "mlx_lm": "0",
        "device": "cpu",
        "backend": "cpu",
        "blas": "test",
        "target": model,
        "draft": None,
        "bandwidth_gb_s": 1.0,
        "bytes_per_target_call": 4,
        "roofline_tokens_per_sec": 2.5e8,
    }


def test_rows_are_method_k_pairs() -> None:
    rows = make_rows(["draft"], [2, 4, 2])
    assert [r.name for r in rows] == [
        "none",
        "mlx-lm plain",
        "draft k=2",
        "draft k=4",
        "mlx-lm k=2",
        "mlx-lm k=4",
    ]
    assert rows[:2] == (NONE, MLX_LM_PLAIN) and all(r.is_plain for r in rows[:2])
    assert [r.needs_draft_model for r in rows] == [False, False, True, True, True, True]
    assert [r.name for r in make_rows(["draft"], [4], mlx_lm=False)] == ["none", "draft k=4"]
    # The plain mlx-lm baseline runs even when no method uses the draft model.
    assert make_rows(["ngram"], [4]) == (NONE, MLX_LM_PLAIN, RowSpec("ngram", 4))
    only_at_4 = make_rows(["draft"], [1, 4, None], mlx_lm_ks=[4])
    assert [r.name for r in only_at_4] == [
        "none",
        "mlx-lm plain",
        "draft k=1",
        "draft k=4",
        "draft k=auto",
        "mlx-lm k=4",
    ]
    with pytest.raises(UsageError, match="unknown method"):
        make_rows(["medusa"], [4])
    with pytest.raises(UsageError, match="k must be"):
        make_rows(["draft"], [0])


def test_shipped_suites() -> None:
    assert suite_names(["all"]) == list(SUITES)
    assert suite_names(["extract", "code", "extract"]) == ["extract", "code"]
    for name in SUITES:
        suite = load_suite(name)
        assert len(suite.prompts) >= 8
        assert len({p.id for p in suite.prompts}) == len(suite.prompts)
    assert len(load_suite("code", limit=3).prompts) == 3


def test_prompts_files(tmp_path: Path) -> None:
    plain = tmp_path / "mine.txt"
    plain.write_text("first prompt\n\nsecond prompt\n")
    suite = load_prompts_file(plain)
    assert suite.name == "mine" and [p.text for p in suite.prompts] == [
        "first prompt",
        "second prompt",
    ]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text('{"id": "a", "prompt": "one"}\n{"prompt": "two"}\n')
    assert [p.id for p in load_prompts_file(jsonl).prompts] == ["a", "mine-2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(UsageError, match="prompt"):
        load_prompts_file(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "poetry"], "unknown suite 'poetry'"),
        (["--method", "medusa"], "unknown method 'medusa'"),
        (["-k", "two"], "k must be a whole number or auto"),
        (["--prompts", "/nonexistent/prompts.txt"], "cannot read prompts file"),
        (["--temp", "-1"], "temperature must be >= 0"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--json", "/nonexistent/dir/report.json"], "does not exist"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", *args, "--csv", str(tmp_path / "out.csv")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert message in lines[0]
    assert not (tmp_path / "out.csv").exists()


def test_empty_prompts_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    result = runner.invoke(app, ["bench", "--prompts", str(empty)])
    assert result.exit_code == 2
    assert "holds no prompts" in result.output


def test_plot_without_matplotlib_fails_before_any_work(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    json_path = tmp_path / "report.json"
    result = runner.invoke(
        app, ["bench", "--plot", str(tmp_path / "p.png"), "--json", str(json_path)]
    )
    assert result.exit_code == 2
    assert "--plot needs matplotlib" in result.output
    assert not json_path.exists() and not (tmp_path / "p.png").exists()


def test_atomic_write_leaves_nothing_when_interrupted(monkeypatch, tmp_path: Path) -> None:
    target = tmp_path / "report.json"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr("specmlx.bench_report.os.replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "{}")
    assert list(tmp_path.iterdir()) == []


def test_csv_and_markdown_render_missing_values() -> None:
    from dataclasses import fields

    empty = {f.name: None for f in fields(SummaryRow)}
    empty.update(temperature=0.0, suite="code", row=NONE, acceptance_by_position=())
    line = SummaryRow(**empty | {"prompts": 0, "runs": 0, "tokens": 0})
    environment = _fake_environment() | {"python": "3", "cpu": "x", "cpu_count": 1}
    config = BenchConfig(suites=(Suite("code", (Prompt("p", "x"),)),), rows=(NONE,))
    report = Report(config, environment, None, (), (line,))
    text = to_csv(report)
    assert text.splitlines()[1].startswith("0.0,code,none,none,0")
    assert "| 0 | code | none |" in markdown(report)


def test_plot(tiny_models, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from specmlx.bench_report import plot_png

    suite = Suite("one", (Prompt("p1", "def fibonacci(n):"),))
    config = BenchConfig(
        suites=(suite,), rows=make_rows(["draft"], [2]), temperatures=(0.0, 1.0), max_tokens=6
    )
    report = build_report(config, list(run(tiny_models, config)), _fake_environment(), None)
    png = plot_png(report)
    assert png.startswith(b"\x89PNG")


def test_auto_k_and_draft_free_rows_run_beside_fixed_k(tiny_models):
    rows = make_rows(["draft", "ngram", "lookahead"], [2, None])
    names = [r.name for r in rows]
    assert names[:4] == ["none", "mlx-lm plain", "draft k=2", "draft k=auto"]
    assert names[-1] == "mlx-lm k=2"
    suite = Suite("one", (Prompt("p1", "lazy lazy lazy lazy"),))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=10, warmup=0)
    report = build_report(config, list(run(tiny_models, config)), _fake_environment(), None)
    validate(report)
    matched = by_name(report, "matched")
    assert all(matched[name] for name in names)
    steady = by_name(report, "steady_speedup_vs_none")
    assert steady["none"] == pytest.approx(1.0) and steady["draft k=auto"] > 0
    assert steady["mlx-lm k=2"] is None and steady["mlx-lm plain"] is None  # no steps


def _step(drafted: int, emitted: int, seconds: float) -> Step:
    return Step(tuple(range(emitted)), drafted, drafted, drafted, emitted - 1, seconds, None)


def measured(
    row: RowSpec,
    repeat: int,
    steps: list[tuple[int, int, float]],
    prompt_id: str = "p",
    token_ids: tuple[int, ...] | None = None,
) -> Measurement:
    """A synthetic run: a first step of one token, then `steps` (drafted, emitted, seconds)."""
    tokens = 1 + sum(n for _, n, _ in steps)
    drafted = sum(d for d, _, _ in steps)
    stats = Stats(tokens=tokens, target_calls=1 + len(steps), drafted=drafted)
    return Measurement(
        row=row,
        token_ids=tuple(range(tokens)) if token_ids is None else token_ids,
        stats=stats,
        suite="s",
        prompt_id=prompt_id,
        repeat=repeat,
        decode_tokens=tokens - 1,
        decode_seconds=sum(s for _, _, s in steps),
        decode_steps=tuple(_step(*step) for step in steps),
    )


def _synthetic_config(rows: tuple[RowSpec, ...], prompts: int = 1, repeats: int = 1):
    suite = Suite("s", tuple(Prompt(f"p{i}", "x") for i in range(prompts)))
    return BenchConfig(suites=(suite,), rows=rows, repeats=repeats)


def test_steady_speedup_times_each_step_at_its_rows_median() -> None:
    """A slow spell (steps taking three times their usual time) in one run moves the
    measured speedup but not the steady one; the steady one is the ratio of tokens per
    typical step time, which the test works out by hand."""
    draft = RowSpec("draft", 4)
    config = _synthetic_config((NONE, draft), repeats=2)
    plain = [(0, 1, 0.5)] * 12
    # Drafts of 4 (0.9 s, 3 tokens) and of 2 (0.7 s, 2 tokens); the second run slowed down.
    quiet = [(4, 3, 0.9), (2, 2, 0.7), (4, 3, 0.9), (4, 3, 0.9)]
    slow = [(4, 3, 0.9), (2, 2, 0.7), (4, 3, 2.7), (4, 3, 2.7), (2, 2, 2.1), (4, 3, 0.9)]
    runs = [
        measured(NONE, 0, plain),
        measured(draft, 0, quiet),
        measured(NONE, 1, plain),
        measured(draft, 1, slow),
    ]
    report = build_report(config, runs, _fake_environment(), None)
    validate(report)
    row = next(line for line in report.summary if line.row == draft)
    # Typical: a draft of 4 takes 0.9 s (median of 0.9 x5, 2.7 x2), of 2 0.7 s.
    tokens = 11 + 16
    steady = tokens / (7 * 0.9 + 3 * 0.7)
    assert row.steady_speedup_vs_none == pytest.approx(steady / 2.0)
    # Measured: the median over repeats of each run's rate, so the slow run pulls it down.
    measured_rate = (11 / 3.4 + 16 / 10.0) / 2
    assert row.speedup_vs_none == pytest.approx(measured_rate / 2.0)
    assert row.speedup_vs_none < row.steady_speedup_vs_none
    assert row.acceptance_by_position == ()  # the synthetic stats count no positions
    header = {"python": "3", "cpu": "x", "cpu_count": 1}
    report = replace(report, environment=report.environment | header)
    assert "| steady × |" in markdown(report)


def test_best_plain_speedup_uses_the_faster_baseline_per_prompt() -> None:
    """On p0 mlx-lm plain is the faster baseline (15 tok/s against 10), on p1 none is (20
    against 10): the draft row's 30 tok/s is 2.0 and 1.5 times the best plain."""
    draft = RowSpec("draft", 2)
    config = _synthetic_config((NONE, MLX_LM_PLAIN, draft), prompts=2)
    rates = {"p0": {NONE: 10, MLX_LM_PLAIN: 15, draft: 30}, "p1": {NONE: 20, MLX_LM_PLAIN: 10}}
    rates["p1"][draft] = 30
    runs = [
        measured(row, 0, [(0, 1, 1.0 / rate)] * 6, prompt_id=prompt)
        for prompt, by_row in rates.items()
        for row, rate in by_row.items()
    ]
    report = build_report(config, runs, _fake_environment(), None)
    validate(report)
    best = {s.row: s.speedup_vs_best_plain for s in report.summary}
    vs_none = {s.row: s.speedup_vs_none for s in report.summary}
    assert best[draft] == pytest.approx((2.0 + 1.5) / 2)
    assert vs_none[draft] == pytest.approx((3.0 + 1.5) / 2)
    assert best[NONE] == pytest.approx((10 / 15 + 1.0) / 2)
    assert best[MLX_LM_PLAIN] == pytest.approx((1.0 + 0.5) / 2)
    # Without mlx-lm plain, the best plain is the target alone.
    alone = _synthetic_config((NONE, draft), prompts=2)
    kept = [m for m in runs if m.row != MLX_LM_PLAIN]
    report = build_report(alone, kept, _fake_environment(), None)
    line = next(s for s in report.summary if s.row == draft)
    assert line.speedup_vs_best_plain == pytest.approx(line.speedup_vs_none)


def test_plain_baselines_are_matched_against_each_other() -> None:
    """At T=0, none is checked against mlx-lm plain and every other row against none."""
    draft = RowSpec("draft", 2)
    config = _synthetic_config((NONE, MLX_LM_PLAIN, draft))
    same, other = (1, 2, 3), (1, 2, 4)
    runs = [
        measured(NONE, 0, [(0, 1, 0.1)] * 2, token_ids=same),
        measured(MLX_LM_PLAIN, 0, [(0, 1, 0.1)] * 2, token_ids=other),
        measured(draft, 0, [(2, 2, 0.1)], token_ids=same),
    ]
    report = build_report(config, runs, _fake_environment(), None)
    assert {s.row: s.matched for s in report.summary} == {
        NONE: False,
        MLX_LM_PLAIN: False,
        draft: True,
    }


def test_rows_join_on_their_key_not_their_name(monkeypatch) -> None:
    """Two rows whose display names collide (and every name changed on the way) still get
    their own runs and the right baseline."""
    wide = RowSpec("draft", 2, sampling=SamplingConfig(temperature=0.0, top_p=0.9))
    narrow = RowSpec("draft", 2, sampling=SamplingConfig(temperature=0.0, top_p=0.5))
    assert wide.name == narrow.name and wide != narrow
    config = _synthetic_config((NONE, wide, narrow))
    runs = [
        measured(NONE, 0, [(0, 1, 0.1)] * 4),  # 10 tok/s
        measured(wide, 0, [(2, 2, 0.1)] * 2),  # 20 tok/s
        measured(narrow, 0, [(2, 4, 0.1)] * 1, token_ids=(9,) * 5),  # 40 tok/s
    ]
    monkeypatch.setattr(RowSpec, "name", property(lambda self: "renamed"))
    report = build_report(config, runs, _fake_environment(), None)
    summary = {s.row: s for s in report.summary}
    assert summary[NONE].speedup_vs_none == pytest.approx(1.0)
    assert summary[wide].speedup_vs_none == pytest.approx(2.0)
    assert summary[narrow].speedup_vs_none == pytest.approx(4.0)
    assert (summary[wide].matched, summary[narrow].matched) == (True, False)
    assert [r.row for r in report.results] == [NONE, wide, narrow]


def test_plain_mlx_lm_row_runs_and_matches_at_greedy(tiny_models) -> None:
    """mlx-lm plain runs without a draft method benched, and at T=0 it emits what our
    target alone emits, token for token."""
    rows = make_rows(["ngram"], [2])
    assert MLX_LM_PLAIN in rows
    suite = Suite("one", (Prompt("p1", "def fibonacci(n):"), Prompt("p2", "The capital of")))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=10, warmup=0)
    measurements = list(run(tiny_models, config))
    plain = [m for m in measurements if m.row == MLX_LM_PLAIN]
    assert len(plain) == 2 and all(m.stats.drafted == m.stats.accepted == 0 for m in plain)
    assert all(m.stats.target_calls == len(m.token_ids) for m in plain)
    report = build_report(config, measurements, _fake_environment(), None)
    validate(report)
    matched = {s.row: s.matched for s in report.summary}
    assert matched[MLX_LM_PLAIN] is True and matched[NONE] is True
    assert all(r.matched for r in report.results if r.row == MLX_LM_PLAIN)
