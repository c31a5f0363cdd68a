"""The tokenizer rebuilt from GGUF metadata gives the same ids as transformers' GGUF tokenizer.

The reference is `AutoTokenizer.from_pretrained(folder, gguf_file=name)`. Its file reader imports
torch, which we do not install, so two seams are replaced: the metadata reader (by one over
gguf-py's GGUFReader, same keys, same values) and the config loader, which only picks the
tokenizer class from `general.architecture`. Everything that builds the tokenizer is theirs.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter, TokenType

from specmlx.io.gguf_tensors import open_gguf
from specmlx.io.gguf_tokenizer import build_tokenizer, sentencepiece_merges
from tests.test_convert import convert_gguf, gguf_path, write_gguf
from tests.tiny import CHAT_TEMPLATE, CORPUS

TEXTS = [
    "Hello, world! The capital of France is Paris.",
    "def fibonacci(n):\n    if n <= 0:\n\treturn 0\n",
    "日本語のテキストと中文字符、한국어",
    "emoji 🎉🚀👍🏽 done",
    "  spaces   and\t\ttabs\n\n\nnewlines  \n ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<bos><eos>",
    " 2024-11-30 3.14159 1234567 x²",
    "ünïcödé café naïve ÀÉÎ",
    "   ",
    "\n",
    "x" * 60 + "  y",
]
CHAT = [
    {"role": "user", "content": "Write a function that adds two numbers."},
    {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
    {"role": "user", "content": "Now in one line, please 🙂"},
]


def _read_gguf_metadata(path: str, string_arrays=()) -> tuple[dict, tuple[str, ...]]:
    """transformers' `read_gguf_metadata`, over gguf-py: string arrays not asked for are counts."""
    reader = GGUFReader(path)
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        strings = field.types[0] == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING
        metadata[key] = (
            len(field.data) if strings and key not in string_arrays else field.contents()
        )
    return metadata, tuple(t.name for t in reader.tensors)


@pytest.fixture
def reference(monkeypatch):
    """`reference(path)`: transformers' tokenizer for the GGUF file at `path`."""
    import transformers.integrations.gguf  # noqa: F401  (the lazy package, patched below)
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoTokenizer

    reader = types.ModuleType("transformers.integrations.gguf.reader")
    reader.read_gguf_metadata = _read_gguf_metadata
    monkeypatch.setitem(sys.modules, reader.__name__, reader)
    # The lazy package would cache the name on first use; own it so the undo removes it.
    monkeypatch.setitem(
        vars(sys.modules["transformers.integrations.gguf"]),
        "read_gguf_metadata",
        _read_gguf_metadata,
    )

    def config(path: str, return_tensors: bool = False, **kwargs) -> dict:
        arch = _read_gguf_metadata(path)[0]["general.architecture"]
        return {"config": {"model_type": {"gemma3": "gemma3_text"}.get(arch, arch)}}

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", config)

    def load(path: Path):
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    return load


def ours(path: Path):
    from transformers import PreTrainedTokenizerFast

    tokenizer, config = build_tokenizer(open_gguf(path).meta)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **config)


def assert_same_ids(mine, theirs, texts=TEXTS) -> None:
    for text in texts:
        assert mine(text).input_ids == theirs(text).input_ids, text
    assert mine.get_vocab() == theirs.get_vocab()


def write_sentencepiece_gguf(path: Path) -> Path:
    """A Gemma-style vocabulary: specials, byte fallback, pieces in merge order, no merges."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    chars = sorted({c for line in CORPUS for c in line.replace(" ", "\u2581")})
    pieces = []
    for line in CORPUS[:8]:  # every word, built up left to right, so each has merges
        for word in line.replace(" ", " \u2581").split():
            pieces += [word[:k] for k in range(2, len(word) + 1)]
    pieces = list(dict.fromkeys(p for p in pieces if p not in chars))
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + chars + pieces + ["  ", "   "]
    kinds = (
        [TokenType.CONTROL] * len(specials)
        + [TokenType.BYTE] * 256
        + [TokenType.NORMAL] * (len(chars) + len(pieces))
        + [TokenType.USER_DEFINED] * 2
    )
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types(kinds)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------- tiny files, offline


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_byte_level_matches_transformers(tmp_path, reference, arch):
    src = tmp_path / f"{arch}.gguf"
    write_gguf(src, arch)  # pre-tokenizer "gpt2" for llama, "qwen2" for qwen2
    mine, theirs = ours(src), reference(src)
    assert_same_ids(mine, theirs, TEXTS + CORPUS[:8])
    assert mine.chat_template == theirs.chat_template == CHAT_TEMPLATE
    rendered = mine.apply_chat_template(CHAT, tokenize=False)
    assert rendered == theirs.apply_chat_template(CHAT, tokenize=False)


def test_smollm_sees_digits_one_at_a_time(tmp_path, reference):
    """llama.cpp splits digits off first for "smollm" (as SmolLM's own tokenizer.json does);
    transformers' GGUF path has no entry for it and keeps GPT-2's split, so a vocabulary with
    a " 0" merge (this tiny one) tells them apart. The real SmolLM2 has no such merges."""
    src = tmp_path / "smollm.gguf"
    write_gguf(src, "llama", pre="smollm")
    mine, theirs = ours(src), reference(src)
    tokens = mine.convert_ids_to_tokens(mine("n <= 0: 123").input_ids)
    assert tokens[4:6] == ["Ġ", "0"] and tokens[-4:] == ["Ġ", "1", "2", "3"]
    assert "Ġ0" not in tokens and "Ġ0" in theirs.convert_ids_to_tokens(theirs("n <= 0:").input_ids)
    assert_same_ids(mine, theirs, [t for t in TEXTS if not any(c.isdigit() for c in t)])


def test_sentencepiece_matches_transformers(tmp_path, reference):
    src = write_sentencepiece_gguf(tmp_path / "gemma.gguf")
    mine, theirs = ours(src), reference(src)
    assert_same_ids(mine, theirs, TEXTS + CORPUS[:8])
    assert mine("The capital").input_ids[0] == 2  # <bos>
    text = "The quick brown fox, 🦊!"
    assert mine.decode(mine(text).input_ids, skip_special_tokens=True) == text


def test_sentencepiece_merges_match_transformers():
    from transformers.tokenization_utils_base import generate_merges

    tokens = ["a", "b", "c", "\u2581", "ab", "bc", "abc", "\u2581a", "\u2581ab", "ca", "cab"]
    expected = generate_merges(
        {t: i for i, t in enumerate(tokens)}, {t: -i for i, t in enumerate(tokens)}
    )
    assert sentencepiece_merges(tokens) == expected


def test_converted_folder_tokenizer_loads_like_reference(tmp_path, reference):
    from transformers import AutoTokenizer

    src = tmp_path / "qwen2.gguf"
    write_gguf(src, "qwen2")
    out = convert_gguf(src, tmp_path / "out", progress=False)
    assert_same_ids(AutoTokenizer.from_pretrained(str(out)), reference(src))


# ---------------------------------------------------------------- real files


@pytest.mark.real
@pytest.mark.parametrize(
    "alias", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m"]
)
def test_real_tokenizer_matches_transformers(tmp_path, reference, alias):
    import mlx_lm.utils

    src = gguf_path(alias)
    if src is None:
        pytest.skip(f"{alias}.gguf not found (models/gguf/ or $SPECMLX_GGUF_DIR)")
    meta = open_gguf(src).meta
    tokenizer, config = build_tokenizer(meta)
    folder = tmp_path / "tok"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    mine = mlx_lm.utils.load_tokenizer(folder)._tokenizer  # as mlx_lm.load would load it
    theirs = reference(src)
    assert_same_ids(mine, theirs)
    template = meta.get("tokenizer.chat_template")
    assert mine.chat_template == template
    if template is not None:
        rendered = mine.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        assert rendered == theirs.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=True
        )
        ids = mine.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert list(ids) == theirs(rendered, add_special_tokens=False).input_ids
