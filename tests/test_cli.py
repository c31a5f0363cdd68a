"""The CLI: generate, chat with scripted input, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specmlx import __version__
from specmlx.cli import app
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
    """Tiny draft and target are the same size: speculation can only lose, so auto decodes
    plainly and says so, with output identical to the target alone. The calibration says
    so (a draft call costs a target call, as the same-size models do): timed, their sub-ms
    calls are at the mercy of the machine, and in one `make test` the measured costs let
    auto speculate on all 23 calls."""
    from specmlx import calibration
    from specmlx.costs import CostProfile

    same_size = CostProfile(0.001, 0.001, {k: 1 + 0.05 * (k - 1) for k in range(1, 17)})
    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "measure_costs", lambda target, draft, ks, reps: same_size)
    target, draft = str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"])
    auto = invoke(
        "generate", "hi", "--target", target, "--draft", draft, "--json", "--max-tokens", "24"
    )
    plain = invoke(
        "generate", "hi", "--target", target, "--method", "none", "--json", "--max-tokens", "24"
    )
    auto_out, plain_out = json.loads(auto.stdout), json.loads(plain.stdout)
    assert auto_out["token_ids"] == plain_out["token_ids"]
    assert auto_out["stats"]["plain_steps"] > auto_out["stats"]["target_calls"] / 2


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
        (["--method", "medusa"], 2, "unknown method"),
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
