"""`specmlx batch` and `generate_many`: results in order, bad lines reported and passed over,
resumed runs that redo nothing, and the suffix memory shared by every line."""

from __future__ import annotations

import json

import mlx_lm
import pytest

from specmlx.api.batch import Request, generate_many, parse_request, run_batch
from specmlx.api.config import GenerationConfig
from specmlx.api.generate import generate
from specmlx.api.methods import MedusaOptions, NgramOptions, SuffixOptions
from specmlx.api.models import Models
from specmlx.errors import UsageError
from tests.test_cli import invoke, one_line_error

PROMPTS = ["hello there", "The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def models(tiny_dirs):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    return Models(target, tokenizer)


def test_generate_many_yields_each_result_in_order(models):
    config = GenerationConfig(method="suffix", k=4, max_tokens=12)
    results = list(generate_many(models, PROMPTS, config))
    alone = [generate(models, p, GenerationConfig(method="none", max_tokens=12)) for p in PROMPTS]
    assert [r.token_ids for r in results] == [a.token_ids for a in alone]
    # A request of its own sampling and length, in the same call.
    own = Request(PROMPTS[0], GenerationConfig(method="suffix", k=4, max_tokens=5))
    (short,) = generate_many(models, [own], config)
    assert short.token_ids == alone[0].token_ids[:5]
    assert len(models.suffix_store.documents()) == 4  # every answer was remembered


def test_a_line_sets_its_own_options_and_bad_ones_are_named():
    base = GenerationConfig(max_tokens=32)
    request = parse_request(
        {"prompt": "hi", "max_tokens": 8, "temperature": 0.5, "top_k": 3, "k": "auto"}, base
    )
    assert request.config.max_tokens == 8 and request.config.k is None
    assert request.config.sampling.temperature == 0.5 and request.config.sampling.top_k == 3
    chat = parse_request({"messages": [{"role": "user", "content": "hi"}], "k": 2}, base)
    assert chat.prompt == [{"role": "user", "content": "hi"}] and chat.config.k == 2
    for record, needle in [
        ([1, 2], "JSON object"),
        ({"prompt": "hi", "colour": 1}, "unknown key 'colour'"),
        ({"prompt": ""}, "non-empty"),
        ({}, '"prompt"'),
        ({"prompt": "a", "messages": []}, "not both"),
        ({"messages": [{"role": "user"}]}, '"messages"'),
        ({"prompt": "a", "max_tokens": "many"}, "max_tokens must be a whole number"),
        ({"prompt": "a", "chat_template": 1}, "chat_template must be a true or false"),
        ({"prompt": "a", "k": "soon"}, "k must be"),
        ({"prompt": "a", "method": "magic"}, "unknown method"),
    ]:
        with pytest.raises(UsageError, match=needle):
            parse_request(record, base)


def test_a_line_sets_its_methods_options():
    """Any of generate's per-method options, by the CLI's names, over the batch's."""
    base = GenerationConfig(method="suffix", options=SuffixOptions(factor=3.0, memory=500))
    config = parse_request({"prompt": "a", "suffix_min_prob": 0.2, "tree_size": 6}, base).config
    assert config.method == "suffix"
    assert config.options == SuffixOptions(tree_size=6, factor=3.0, min_prob=0.2, memory=500)
    medusa = parse_request({"prompt": "a", "method": "medusa", "width": 2}, base).config
    assert medusa.options == MedusaOptions(width=2)  # another method: its own defaults
    # A hybrid of suffix keeps the batch's suffix options: one memory, its size and file.
    hybrid = parse_request({"prompt": "a", "method": "suffix+draft", "suffix_factor": 1}, base)
    assert hybrid.config.options == SuffixOptions(factor=1, memory=500)
    implied = parse_request({"prompt": "a", "ngram_max": 3}, GenerationConfig()).config
    assert implied.method == "ngram" and implied.options == NgramOptions(max_n=3)
    assert parse_request({"prompt": "a", "p_min": 0.5}, GenerationConfig()).config.method == "draft"
    for record, needle in [
        (
            {"prompt": "a", "width": 2},
            "width is an option of method medusa or eagle, not of suffix",
        ),
        ({"prompt": "a", "tree_size": 2.5}, "tree_size must be a whole number"),
        ({"prompt": "a", "suffix_factor": "big"}, "suffix_factor must be a number"),
        ({"prompt": "a", "suffix_memory": 10}, "suffix_memory is the batch's"),
        ({"prompt": "a", "suffix_factor": -1.0}, "factor > 0"),
    ]:
        with pytest.raises(UsageError, match=needle):
            parse_request(record, base)
    with pytest.raises(UsageError, match="tree_size: name the line's method"):
        parse_request({"prompt": "a", "tree_size": 4}, GenerationConfig())


def write_lines(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batch_reports_bad_lines_and_resumes_without_redoing(tiny_dirs, tmp_path, monkeypatch):
    target = str(tiny_dirs["llama"])
    lines = tmp_path / "in.jsonl"
    out = tmp_path / "out.jsonl"
    write_lines(
        lines,
        [
            {"id": "first", "prompt": PROMPTS[0]},
            "{not json",
            {"prompt": PROMPTS[1], "max_tokens": 6},
            {"id": "first", "prompt": PROMPTS[2]},
            {"prompt": PROMPTS[2], "colour": "red"},
        ],
    )
    args = ["batch", str(lines), "-o", str(out), "--target", target, "--method", "suffix"]
    result = invoke(*args, "-k", "4", "--max-tokens", "10")
    assert result.exit_code == 0, result.output
    records = read_records(out)
    assert [r["id"] for r in records] == ["first", 2, 3, "first", 5]
    assert records[0]["finish_reason"] in ("stop", "length") and records[0]["method"] == "suffix"
    assert records[2]["stats"]["tokens"] <= 6
    assert "not JSON" in records[1]["error"] and "line 1" in records[3]["error"]
    assert "unknown key 'colour'" in records[4]["error"]
    # Fix a bad line and run again: only the lines without a result run.
    write_lines(
        lines,
        [
            {"id": "first", "prompt": PROMPTS[0]},
            {"prompt": PROMPTS[0], "max_tokens": 4},
            {"prompt": PROMPTS[1], "max_tokens": 6},
            {"id": "second", "prompt": PROMPTS[2]},
            {"prompt": PROMPTS[2]},
        ],
    )
    ran = []
    real_run = run_batch

    def counting(models, in_lines, config, done):
        for line in real_run(models, in_lines, config, done):
            ran.append(line.number)
            yield line

    monkeypatch.setattr("specmlx.api.batch.run_batch", counting)
    result = invoke(*args, "-k", "4", "--max-tokens", "10")
    assert result.exit_code == 0, result.output
    assert ran == [2, 4, 5]
    records = read_records(out)
    assert [r["id"] for r in records] == ["first", 3, 2, "second", 5]
    assert all("text" in r for r in records)


def test_a_cut_off_last_line_is_dropped_and_redone(tiny_dirs, tmp_path):
    lines, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(lines, [{"prompt": p} for p in PROMPTS[:2]])
    args = ["batch", str(lines), "-o", str(out), "--target", str(tiny_dirs["llama"])]
    assert invoke(*args, "--max-tokens", "4", "--method", "none").exit_code == 0
    whole = out.read_text()
    out.write_text(whole[: whole.index("\n") + 20])  # as if stopped mid-write
    assert invoke(*args, "--max-tokens", "4", "--method", "none").exit_code == 0
    again = read_records(out)  # the whole first line, and the second line redone
    assert [r["id"] for r in again] == [1, 2]
    assert again[1]["text"] == json.loads(whole.splitlines()[1])["text"]


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["-o", "{in}"], "must not be the input file"),
        (["-o", "{tmp}/no/such/out.jsonl"], "does not exist"),
    ],
)
def test_batch_bad_paths_are_one_line(tiny_dirs, tmp_path, extra, needle):
    lines = tmp_path / "in.jsonl"
    write_lines(lines, [{"prompt": "hi"}])
    extra = [e.format(**{"in": lines, "tmp": tmp_path}) for e in extra]
    result = invoke("batch", str(lines), *extra, "--target", str(tiny_dirs["llama"]))
    assert needle in one_line_error(result, 2)


def test_batch_of_a_missing_file_is_one_line(tmp_path):
    result = invoke("batch", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "out.jsonl"))
    assert "cannot read" in one_line_error(result, 2)
