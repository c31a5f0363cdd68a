"""`specmlx bench` on tiny random models: rows, schema, matched outputs, bad input."""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specmlx.bench.run import MLX_LM_PLAIN, NONE, BenchConfig, RowSpec, make_rows, run
from specmlx.bench.suites import SUITES, Prompt, Suite, load_prompts_file, load_suite, suite_names
from specmlx.bench.summary import build_report
from specmlx.cli import app
from specmlx.cli.bench import plan
from specmlx.cli.options import SharedOptions
from specmlx.engine.costs import CostProfile, acceptance_from_tokens
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError
from specmlx.io.files import write_atomic
from tests.bench_helpers import by_name, fake_environment, validate

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_models(tiny_dirs):
    from specmlx.api.load import load

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
    # stderr is not a terminal here: the progress is a plain line, at the end at least.
    assert re.search(r"^benchmarking: (\d+)/\1, \d+:\d\d elapsed", result.stderr, re.M)

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
    # mlx-lm's speculative rows are lossless at T=0 too.
    assert greedy["mlx-lm k=2"]["matched"] is True and greedy["mlx-lm k=3"]["matched"] is True
    # The two plain baselines agree token for token at T=0.
    assert greedy["mlx-lm plain"]["matched"] is True and greedy["none"]["matched"] is True
    assert greedy["none"]["speedup_vs_none"] == pytest.approx(1.0)
    assert 0 < greedy["none"]["speedup_vs_best_plain"] <= 1.0
    # A row's speedups are the medians over prompts of its rate over the baselines' there;
    # its prediction is the cost model's at the α its tokens per call give.
    results = [r for r in report["results"] if r["temperature"] == 0]
    rate = {(r["suite"], r["prompt_id"], r["row"]): r["tokens_per_sec"] for r in results}
    prompts = sorted({(suite, prompt) for suite, prompt, _ in rate})
    assert len(prompts) == 4

    def speedups(row: str, *baselines: str) -> float:
        return statistics.median(
            rate[(*where, row)] / max(rate[(*where, b)] for b in baselines) for where in prompts
        )

    draft = greedy["draft k=2"]
    assert draft["speedup_vs_none"] == pytest.approx(speedups("draft k=2", "none"))
    best_plain = speedups("draft k=2", "none", "mlx-lm plain")
    assert draft["speedup_vs_best_plain"] == pytest.approx(best_plain)
    assert draft["speedup_vs_mlx_lm"] == pytest.approx(speedups("draft k=2", "mlx-lm k=2"))
    mine = [r for r in results if r["row"] == "draft k=2"]
    tokens = sum(sum(r["tokens"]) for r in mine)
    tokens_per_call = tokens / sum(sum(r["target_calls"]) for r in mine)
    assert draft["tokens_per_call"] == pytest.approx(tokens_per_call)
    alpha = acceptance_from_tokens(tokens_per_call, 2)
    assert draft["alpha"] == pytest.approx(alpha)
    costs = report["costs"]
    profile = CostProfile(
        costs["target_call_seconds"],
        costs["draft_call_seconds"],
        {int(k): ratio for k, ratio in costs["v"].items()},
    )
    assert draft["predicted_speedup"] == pytest.approx(profile.speedup(alpha, 2))
    assert draft["predicted_speedup"] > 0
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
    report = build_report(config, measurements, fake_environment(), None)
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


def test_rows_run_in_reverse_every_other_group_and_are_kept_in_their_order(tiny_models):
    """A drift within a group (the machine warming) slows no row more than another over two
    groups; the journal gets each group in the rows' order all the same."""
    rows = (NONE, RowSpec("draft", 2), RowSpec("ngram", 2))
    suite = Suite("one", (Prompt("p1", "def fibonacci(n):"), Prompt("p2", "The capital of")))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=4, warmup=0, repeats=2)
    kept = []
    ran = [
        (m.prompt_id, m.repeat, m.row)
        for m in run(tiny_models, config, None, lambda k, g: kept.append(g))
    ]
    forward, backward = list(rows), list(reversed(rows))
    by_group = [
        [row for p, r, row in ran if (p, r) == group]
        for group in [("p1", 0), ("p1", 1), ("p2", 0), ("p2", 1)]
    ]
    assert by_group == [forward, backward, backward, forward]
    assert [[m.row for m in group.measurements] for group in kept] == [forward] * 4


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
        make_rows(["hydra"], [4])
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
        (["--method", "hydra"], "unknown method 'hydra'"),
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


def test_plan_makes_the_config_of_the_options() -> None:
    """Options not given: the methods that use a draft model at k = 4, T = 0, every suite."""
    config = plan(SharedOptions(max_tokens=8))
    assert [r.name for r in config.rows] == ["none", "mlx-lm plain", "draft k=4", "mlx-lm k=4"]
    assert config.temperatures == (0.0,) and config.max_tokens == 8 and config.needs_draft_model
    assert [s.name for s in config.suites] == list(SUITES)
    chosen = {"suites": ["code"], "limit": 2, "methods": ["ngram"], "ks": ["2,3"]}
    config = plan(SharedOptions(), **chosen, temperatures=[1.0, 0.0, 1.0])  # typer's lists
    assert [r.name for r in config.rows] == ["none", "mlx-lm plain", "ngram k=2", "ngram k=3"]
    assert config.temperatures == (1.0, 0.0) and not config.needs_draft_model
    assert [len(s.prompts) for s in config.suites] == [2]


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

    monkeypatch.setattr("specmlx.bench.report.os.replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "{}")
    assert list(tmp_path.iterdir()) == []


def test_plot(tiny_models, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from specmlx.bench.report import plot_png

    suite = Suite("one", (Prompt("p1", "def fibonacci(n):"),))
    config = BenchConfig(
        suites=(suite,), rows=make_rows(["draft"], [2]), temperatures=(0.0, 1.0), max_tokens=6
    )
    report = build_report(config, list(run(tiny_models, config)), fake_environment(), None)
    png = plot_png(report)
    assert png.startswith(b"\x89PNG")


def test_auto_k_and_draft_free_rows_run_beside_fixed_k(tiny_models):
    rows = make_rows(["draft", "ngram", "lookahead"], [2, None])
    names = [r.name for r in rows]
    assert names[:4] == ["none", "mlx-lm plain", "draft k=2", "draft k=auto"]
    assert names[-1] == "mlx-lm k=2"
    suite = Suite("one", (Prompt("p1", "lazy lazy lazy lazy"),))
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=10, warmup=0)
    report = build_report(config, list(run(tiny_models, config)), fake_environment(), None)
    validate(report)
    matched = by_name(report, "matched")
    assert all(matched[name] for name in names)
    steady = by_name(report, "steady_speedup_vs_none")
    assert steady["none"] == pytest.approx(1.0) and steady["draft k=auto"] > 0
    assert steady["mlx-lm k=2"] is None and steady["mlx-lm plain"] is None  # no steps


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
    report = build_report(config, measurements, fake_environment(), None)
    validate(report)
    matched = {s.row: s.matched for s in report.summary}
    assert matched[MLX_LM_PLAIN] is True and matched[NONE] is True
    assert all(r.matched for r in report.results if r.row == MLX_LM_PLAIN)


def test_an_ordered_suite_is_reported_by_halves_each_row_with_its_own_memory(tiny_models):
    """Suffix rows draft from their own earlier answers only: at T=0 every row writes the
    same text, and a row that read another's would draft the answer whole."""
    rows = make_rows(["suffix", "suffix+draft"], [4], mlx_lm=False)
    prompts = tuple(Prompt(f"p{i}", f"def f{i}(x):") for i in range(4))
    suite = Suite("scripting", prompts, ordered=True)
    config = BenchConfig(suites=(suite,), rows=rows, max_tokens=12, warmup=1, repeats=2)
    measurements = list(run(tiny_models, config))
    report = build_report(config, measurements, fake_environment(), None)
    validate(report)
    assert {s.suite for s in report.summary} == {
        "scripting",
        "scripting 1st half",
        "scripting 2nd half",
    }
    first = [m for m in measurements if m.repeat >= 0 and m.prompt_id == "p0"]
    for m in first:  # nothing to remember yet: the first prompt drafts from its prompt alone
        assert m.stats.accepted < m.stats.tokens - 1
    assert tiny_models.suffix_store is not None
    assert len(tiny_models.suffix_store.documents()) == len(prompts)  # one row, one repeat


def test_a_suffix_cache_in_the_bench_is_refused(tmp_path):
    from specmlx.api.methods import SuffixOptions

    with pytest.raises(UsageError, match="suffix memory apart"):
        BenchConfig(
            suites=(Suite("one", (Prompt("p", "x"),)),),
            rows=make_rows(["suffix"], [4], mlx_lm=False),
            options=(SuffixOptions(cache=str(tmp_path / "m")),),
        )


def test_the_scripting_suite_ships_in_order():
    suite = load_suite("scripting")
    assert suite.ordered and len(suite.prompts) >= 20
    assert "scripting" not in suite_names(["all"])
    first, second = suite.halves()
    assert len(first) == len(second) and not first & second
