"""The CLI: generate, chat with scripted input, the shared options, and one-line errors for
bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specmlx import __version__
from specmlx.api.methods import METHODS, DraftOptions, LookaheadOptions, NgramOptions
from specmlx.cli import app
from specmlx.cli.options import MethodFlags, SharedOptions
from tests.clock import calibrated_clock
from tests.tiny import make_model_dir

runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def one_line_error(result, code):
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("error: "), result.output
    return lines[-1]


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and __version__ in result.output


def test_generate_json_matches_plain(tiny_dirs):
    target, draft = str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"])
    spec = invoke(
        "generate",
        "hello",
        "--target",
        target,
        "--draft",
        draft,
        "--json",
        "--max-tokens",
        "16",
        "-k",
        "4",
    )
    plain = invoke(
        "generate", "hello", "--target", target, "--method", "none", "--json", "--max-tokens", "16"
    )
    assert spec.exit_code == 0 and plain.exit_code == 0, spec.output + plain.output
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["token_ids"] == plain_out["token_ids"]
    assert spec_out["method"] == "draft" and plain_out["method"] == "none"
    stats = spec_out["stats"]
    for key in (
        "tokens",
        "target_calls",
        "drafted",
        "accepted",
        "acceptance_rate",
        "tokens_per_call",
        "tokens_per_sec",
    ):
        assert key in stats
    assert stats["tokens"] == 16 and stats["drafted"] > 0


def test_generate_streams_text_and_a_stats_line(tiny_dirs):
    result = invoke(
        "generate",
        "hello",
        "--target",
        str(tiny_dirs["llama"]),
        "--draft",
        str(tiny_dirs["llama"]),
        "--max-tokens",
        "8",
        "--temp",
        "0.8",
        "--seed",
        "1",
        "-k",
        "3",
    )
    assert result.exit_code == 0, result.output
    assert "acceptance 100%" in result.stderr and "tok/s" in result.stderr


def test_auto_k_falls_back_when_the_draft_costs_as_much_as_the_target(
    tiny_dirs, tmp_path, monkeypatch
):
    """Tiny draft and target are the same size: speculation can only lose (k drafted
    tokens cost k target calls, and a step yields at most k + 1 tokens), so auto decodes
    every step plainly, probes never (no k could win even with every draft kept), and says
    so (every step counts as plain), with output identical to the target alone. The
    calibration says so, and the clock the loop times its steps by agrees with it: what
    the policy learns from step times (speed, the draft's cost, a step's overhead) stays
    what the calibration says, where real sub-ms calls would be at the mercy of a loaded
    machine."""
    from mlx_lm.models import llama

    from specmlx.engine.costs import CostProfile

    same_size = CostProfile(0.001, 0.001, {k: 1 + 0.05 * (k - 1) for k in range(1, 17)})
    clock = calibrated_clock(monkeypatch, same_size, llama.Model, tmp_path)
    target, draft = str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"])
    auto = invoke(
        "generate", "hi", "--target", target, "--draft", draft, "--json", "--max-tokens", "24"
    )
    plain = invoke(
        "generate", "hi", "--target", target, "--method", "none", "--json", "--max-tokens", "24"
    )
    assert auto.exit_code == 0 and plain.exit_code == 0, auto.output + plain.output
    assert clock.now > 0  # the models' calls went through the clock
    auto_out, plain_out = json.loads(auto.stdout), json.loads(plain.stdout)
    assert auto_out["method"] == "draft"
    assert auto_out["token_ids"] == plain_out["token_ids"]
    stats = auto_out["stats"]
    assert stats["plain_steps"] == stats["target_calls"] == stats["tokens"] == 24
    assert stats["drafted"] == 0


def test_chat_scripted(tiny_dirs):
    script = "hello there\n/stats\nand again\n/reset\n/quit\n"
    result = invoke(
        "chat",
        "--target",
        str(tiny_dirs["llama"]),
        "--draft",
        str(tiny_dirs["llama-draft"]),
        "--max-tokens",
        "8",
        input=script,
    )
    assert result.exit_code == 0, result.output
    assert "assistant" in result.output and "conversation reset" in result.output
    assert "acceptance" in result.output and "[draft]" in result.output
    # /stats: the session's totals, on one line (the scripted input is not echoed).
    stats_lines = [line for line in result.output.splitlines() if "you> [draft] " in line]
    assert len(stats_lines) == 1 and "tokens" in stats_lines[0] and "peak" in stats_lines[0]


@pytest.fixture(scope="module")
def odd_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd")
    return {
        "other-tokenizer": make_model_dir(root / "o", "llama", tokenizer_size=300),
        "short-context": make_model_dir(root / "s", "llama", max_position_embeddings=8),
    }


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--target", "no-such-model-alias"], 1, "unknown"),
        (["-k", "0"], 2, "k must be at least 1"),
        (["--temp", "-0.5"], 2, "temperature must be >= 0"),
        (["--top-p", "0"], 2, "top-p must be in (0, 1]"),
        (["--top-p", "1.5"], 2, "top-p must be in (0, 1]"),
        (["--method", "draft"], 2, "needs a draft model"),
        (["--method", "hydra"], 2, "unknown method 'hydra'; choose from none, draft"),
        (["-k", "two"], 2, "k must be a whole number or auto"),
        (["--method", "ngram", "--window", "7"], 2, "--window is an option of --method lookahead"),
        (["--method", "none", "--ngram-min", "2"], 2, "not of --method none"),
        (["--ngram-min", "2", "--guesses", "3"], 2, "options of different methods"),
        (["--method", "ngram", "--ngram-min", "5"], 2, "need 1 <= ngram-min <= ngram-max"),
        (["--method", "lookahead", "--ngram-size", "1"], 2, "ngram-size >= 2"),
        (["--p-min", "1.5"], 2, "p-min must be between 0 and 1"),
        (["--p-min", "0.5"], 2, "--method draft needs a draft model"),  # p-min implies draft
        (["--method", "ngram", "--draft", "x"], 2, "--draft is not used by --method ngram"),
    ],
)
def test_bad_input_is_one_line(tiny_dirs, args, code, needle):
    if "--target" not in args:
        args = ["--target", str(tiny_dirs["llama"]), *args]
    line = one_line_error(invoke("generate", "hello", *args), code)
    assert needle in line


def test_tokenizer_mismatch_is_named(tiny_dirs, odd_dirs):
    result = invoke(
        "generate",
        "hi",
        "--target",
        str(tiny_dirs["llama"]),
        "--draft",
        str(odd_dirs["other-tokenizer"]),
    )
    line = one_line_error(result, 1)
    assert "tokenizers differ" in line and "token id" in line


def test_prompt_longer_than_context(odd_dirs):
    result = invoke(
        "generate",
        "The quick brown fox jumps over the lazy dog",
        "--target",
        str(odd_dirs["short-context"]),
        "--no-chat-template",
    )
    assert "context holds 8" in one_line_error(result, 2)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--method", "hydra"], "unknown method 'hydra'"),
        (["--window", "7"], "--window is an option of --method lookahead, which this bench"),
        (["--method", "ngram", "--target", "t", "--draft", "d"], "--draft is not used"),
        (["-k", "0"], "k must be between 1 and 64"),
        (["--top-p", "0"], "top-p must be in (0, 1]"),
    ],
)
def test_bench_bad_input_is_one_line(args, needle):
    """All fail before any model loads."""
    assert needle in one_line_error(invoke("bench", "--suite", "code", *args), 2)


def test_generate_with_method_options(tiny_dirs):
    """Only the options of the method in use reach its options object; p-min alone implies
    the draft method, and stays lossless under greedy decoding."""
    target, draft = str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"])
    common = ["generate", "hello", "--target", target, "--json", "--max-tokens", "12"]
    ngram = invoke(*common, "--method", "ngram", "--ngram-min", "2", "-k", "3")
    p_min = invoke(*common, "--draft", draft, "--p-min", "0.5", "-k", "4")
    plain = invoke(*common, "--method", "none")
    assert ngram.exit_code == 0 and p_min.exit_code == 0, ngram.output + p_min.output
    ngram_out, p_min_out = json.loads(ngram.stdout), json.loads(p_min.stdout)
    assert ngram_out["method"] == "ngram"
    assert ngram_out["config"] == {"k": 3, "min_n": 2, "max_n": 4}
    assert p_min_out["method"] == "draft" and p_min_out["config"] == {"k": 4, "p_min": 0.5}
    assert p_min_out["token_ids"] == json.loads(plain.stdout)["token_ids"]


def test_method_flags_become_the_options_of_the_method_in_use():
    flags = MethodFlags(ngram_max=6, window=None)
    assert flags.method(None) is METHODS["ngram"]
    assert flags.options(METHODS["ngram"]) == NgramOptions(max_n=6)
    assert MethodFlags(window=7, guesses=2).options(METHODS["lookahead"]) == LookaheadOptions(
        window=7, guesses=2
    )
    assert MethodFlags().options(METHODS["draft"]) == DraftOptions()
    assert MethodFlags().options(None) is None and MethodFlags().method(None) is None


@pytest.mark.parametrize(
    ("command", "max_tokens"), [("generate", 256), ("chat", 512), ("bench", 64)]
)
def test_shared_options_are_listed_with_each_commands_defaults(command, max_tokens):
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())  # undo the wrapping
    for option in ("--target", "--draft", "--top-p", "--top-k", "--p-min", "--ngram-min"):
        assert option in help_text
    for option in ("--ngram-max", "--window", "--ngram-size", "--guesses"):
        assert option in help_text
    assert f"Most tokens to generate. [default: {max_tokens}]" in help_text
    assert "ngram: shortest context suffix to look up. [default: 1]" in help_text
    assert "lookahead: Jacobi window W. [default: 5]" in help_text
    for name in METHODS:  # the --method help comes from the method table
        assert f"{name}: " in help_text


def test_shared_options_default():
    opts = SharedOptions()
    assert opts.max_tokens == 256 and opts.models.target is None
    assert opts.method_flags.given() == []


def test_bench_overhead_calls_the_overhead_module(monkeypatch):
    """--overhead loads no model: it renders what `specmlx.bench.overhead` measured."""
    calls = []
    fake = types.ModuleType("specmlx.bench.overhead")
    fake.measure_overhead = lambda: calls.append("measured") or ["row"]
    fake.render = lambda rows: f"overhead table of {rows}"
    fake.measure_suffix_history = lambda: calls.append("history") or ["point"]
    fake.render_history = lambda points: f"history table of {points}"
    fake.measure_rewind = lambda: calls.append("rewind") or ["rewind row"]
    fake.render_rewind = lambda rows: f"rewind table of {rows}"
    monkeypatch.setitem(sys.modules, "specmlx.bench.overhead", fake)
    result = invoke("bench", "--overhead")
    assert result.exit_code == 0, result.output
    assert calls == ["measured", "history", "rewind"]
    assert "overhead table of ['row']" in result.output
    assert "history table of ['point']" in result.output
    assert "rewind table of ['rewind row']" in result.output


def test_stats_line_shows_ttft_and_acceptance_by_position():
    from specmlx.cli.display import stats_line
    from specmlx.engine.stats import Stats

    stats = Stats(
        tokens=10,
        target_calls=4,
        drafted=9,
        accepted=6,
        drafted_by_position=(4, 3, 2),
        accepted_by_position=(4, 2, 0),
        time_to_first_token=0.012,
        decode_seconds=0.5,
    )
    line = stats_line(stats, "draft")
    assert "\n" not in line
    assert "acceptance 67% (6/9)" in line and "by position 100% 67% 0%" in line
    assert "ttft 12 ms" in line
    merged = Stats(tokens=10, target_calls=4, drafted=9, accepted=6)  # no ttft, no positions
    assert "ttft" not in stats_line(merged, "draft") and "position" not in stats_line(merged, "x")
    assert "acceptance" not in stats_line(merged, "none")


def test_chat_reply_shows_the_whole_stats_line_at_any_width():
    """The rates wrap under the panel: in its border they were cut at the terminal's width
    ("… 15 plain steps (s─╯")."""
    from rich.console import Console

    from specmlx.cli.display import render, stats_line
    from specmlx.engine.stats import Stats

    stats = Stats(
        tokens=100,
        target_calls=40,
        drafted=90,
        accepted=60,
        drafted_by_position=(40, 30, 20),
        accepted_by_position=(30, 20, 10),
        plain_steps=15,
        time_to_first_token=0.012,
        decode_seconds=1.0,
    )
    line = stats_line(stats, "draft")
    assert len(line) > 100 and line.endswith("GB")
    for width in (40, 60, 140):
        console = Console(width=width, record=True)
        console.print(render("hello there", stats, "draft", note="[stopped]"))
        shown = console.export_text()
        assert all(len(row) <= width for row in shown.splitlines())
        assert " ".join(line.split()) in " ".join(shown.split()), shown  # wrapped, not cut
        assert "hello there" in shown and "[stopped]" in shown and "assistant" in shown


def test_models_view_shows_what_is_fetched():
    from rich.console import Console

    from specmlx.cli.display import models_view
    from specmlx.io.registry import load_registry

    registry = load_registry()
    fetched, *missing = registry.models
    console = Console(width=200, record=True)
    console.print(models_view(registry, Path("/m/local"), {fetched: 2_500}))
    text = console.export_text()
    assert "local copies in /m/local" in text and "yes, 2.5 kB" in text
    assert text.count(" no ") == len(missing) and registry.pairs[0].note[:40] in text


def test_help_imports_no_heavy_library():
    """`specmlx --help` answers at once: no mlx, mlx-lm or transformers behind it."""
    code = (
        "import sys, specmlx.cli; "
        "heavy = {m.split('.')[0] for m in sys.modules} & {'mlx', 'mlx_lm', 'transformers'}; "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
