"""`specmlx bench` on tiny random models: rows, schema, matched outputs, bad input."""

from __future__ import annotations

import csv
import json
import sys
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specmlx.bench import BenchConfig, RowSpec, make_rows, run
from specmlx.bench_report import markdown, to_csv, write_atomic
from specmlx.bench_summary import build_report
from specmlx.cli import app
from specmlx.errors import UsageError
from specmlx.sampling import SamplingConfig
from specmlx.suites import SUITES, Prompt, Suite, load_prompts_file, load_suite, suite_names

runner = CliRunner()


def schema() -> dict:
    return json.loads(resources.files("specmlx").joinpath("data/bench.schema.json").read_text())


def validate(report: dict) -> None:
    import jsonschema

    jsonschema.Draft202012Validator(schema()).validate(report)


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

    names = ["none", "draft k=2", "draft k=3", "mlx-lm k=2", "mlx-lm k=3"]
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
    assert greedy["none"]["speedup_vs_none"] == pytest.approx(1.0)
    assert greedy["draft k=2"]["speedup_vs_mlx_lm"] is not None
    assert greedy["draft k=2"]["predicted_speedup"] is not None
    assert len(greedy["draft k=3"]["acceptance_by_position"]) == 3
    sampled = [s for s in lines if s["temperature"] == 1.0]
    assert all(s["matched"] is None for s in sampled)
    # Per-prompt results: 2 temperatures × 2 suites × 2 prompts × 5 rows.
    assert len(report["results"]) == 40
    env = report["environment"]
    assert env["target"]["dtype"] == "float32"
    # The tiny llama has its own lm_head: its input embedding is not read whole per call.
    assert 0 < env["bytes_per_target_call"] < env["target"]["bytes"]
    assert env["backend"] in ("cpu", "metal", "cuda", "gpu")

    with out["csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3 * 5  # temperatures × (2 suites + all) × rows
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
    matched = {s["row"]: s["matched"] for s in report["summary"]}
    assert matched == {"none": None, "draft k=2": True, "draft k=2 (T=50)": False}


def test_every_row_sees_the_same_seed(tiny_models) -> None:
    """Two identical sampled rows draw the same tokens: the seed is fixed per prompt, not row."""
    warm = SamplingConfig(temperature=1.0)
    rows = (RowSpec("none"), RowSpec("none", sampling=warm), RowSpec("draft", 2, sampling=warm))
    suite = Suite("one", (Prompt("p1", "Once upon a time"),))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=8, warmup=1, repeats=2)
    measurements = [m for m in run(tiny_models, config) if m.repeat >= 0]
    first, second = (m for m in measurements if m.row == "none (T=1)")
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
    assert [r.name for r in rows] == ["none", "draft k=2", "draft k=4", "mlx-lm k=2", "mlx-lm k=4"]
    assert [r.name for r in make_rows(["draft"], [4], mlx_lm=False)] == ["none", "draft k=4"]
    only_at_4 = make_rows(["draft"], [1, 4, None], mlx_lm_ks=[4])
    assert [r.name for r in only_at_4] == [
        "none",
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
    from specmlx.bench_report import CSV_FIELDS

    line = dict.fromkeys(CSV_FIELDS)
    line.update(temperature=0.0, suite="code", row="none", method="none", k=0)
    environment = _fake_environment() | {"python": "3", "cpu": "x", "cpu_count": 1}
    report = {"summary": [line], "environment": environment}
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
    assert names[:3] == ["none", "draft k=2", "draft k=auto"] and names[-1] == "mlx-lm k=2"
    suite = Suite("one", (Prompt("p1", "lazy lazy lazy lazy"),))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=10, warmup=0)
    report = build_report(config, list(run(tiny_models, config)), _fake_environment(), None)
    validate(report)
    matched = {s["row"]: s["matched"] for s in report["summary"]}
    assert all(matched[name] for name in names[1:])
    steady = {s["row"]: s["steady_speedup_vs_none"] for s in report["summary"]}
    assert steady["none"] == pytest.approx(1.0) and steady["draft k=auto"] > 0
    assert steady["mlx-lm k=2"] is None  # mlx-lm reports no steps


def test_steady_speedup_times_each_step_at_its_rows_median() -> None:
    """A slow spell (steps taking three times their usual time) in one run moves the
    measured speedup but not the steady one; the steady one is the ratio of tokens per
    typical step time, which the test works out by hand."""
    from specmlx.bench import Measurement

    config = BenchConfig(
        suites=(Suite("s", (Prompt("p", "x"),)),),
        rows=(RowSpec("none", None), RowSpec("draft", 4)),
        repeats=2,
    )

    def measured(row: str, repeat: int, steps: list[tuple[int, int, float]]) -> Measurement:
        return Measurement(
            row=row,
            token_ids=tuple(range(1 + sum(n for _, n, _ in steps))),
            target_calls=1 + len(steps),
            drafted=sum(d for d, _, _ in steps),
            accepted=0,
            suite="s",
            prompt_id="p",
            repeat=repeat,
            decode_tokens=sum(n for _, n, _ in steps),
            decode_seconds=sum(s for _, _, s in steps),
            decode_steps=tuple(steps),
        )

    plain = [(0, 1, 0.5)] * 12
    # Drafts of 4 (0.9 s, 3 tokens) and of 2 (0.7 s, 2 tokens); the second run slowed down.
    quiet = [(4, 3, 0.9), (2, 2, 0.7), (4, 3, 0.9), (4, 3, 0.9)]
    slow = [(4, 3, 0.9), (2, 2, 0.7), (4, 3, 2.7), (4, 3, 2.7), (2, 2, 2.1), (4, 3, 0.9)]
    runs = [
        measured("none", 0, plain),
        measured("draft k=4", 0, quiet),
        measured("none", 1, plain),
        measured("draft k=4", 1, slow),
    ]
    report = build_report(config, runs, _fake_environment(), None)
    validate(report)
    row = next(line for line in report["summary"] if line["row"] == "draft k=4")
    # Typical: a draft of 4 takes 0.9 s (median of 0.9 x5, 2.7 x2), of 2 0.7 s.
    tokens = 11 + 16
    steady = tokens / (7 * 0.9 + 3 * 0.7)
    assert row["steady_speedup_vs_none"] == pytest.approx(steady / 2.0)
    # Measured: the median over repeats of each run's rate, so the slow run pulls it down.
    measured_rate = (11 / 3.4 + 16 / 10.0) / 2
    assert row["speedup_vs_none"] == pytest.approx(measured_rate / 2.0)
    assert row["speedup_vs_none"] < row["steady_speedup_vs_none"]
    report["environment"] |= {"python": "3", "cpu": "x", "cpu_count": 1}
    assert "| steady × |" in markdown(report)
