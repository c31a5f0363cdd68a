"""GGUF -> mlx-lm conversion: weights, logits, config, errors, CLI; real files behind `real`.

The fast tests write tiny GGUF files with gguf-py's own writer, the way llama.cpp's converter
would: q/k rows permuted for llama, `1 + w` baked into Gemma norms, tensors quantized with
`gguf.quants.quantize`. The proof that the layout is undone is a forward pass: the converted
model's logits equal those of the model the GGUF was written from.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, TokenType
from gguf.quants import dequantize, quantize

from specmlx.errors import SpecmlxError, UsageError
from specmlx.io.convert import convert_gguf
from tests.tiny import ARCHS, CHAT_TEMPLATE, write_tokenizer

Q = GGMLQuantizationType
REPO = Path(__file__).resolve().parent.parent

CONFIGS = {
    "llama": ARCHS["llama"],
    "qwen2": ARCHS["qwen2"],
    # Three layers, one of them global, so the GGUF carries both kinds.
    "gemma3": {**ARCHS["gemma3_text"], "num_hidden_layers": 3, "sliding_window_pattern": 3},
}
# llama.cpp's names for mlx-lm's, per block; `ffn_norm` is the norm before the MLP.
BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
}
NORM_NAMES = {
    "llama": {"post_attention_layernorm": "ffn_norm"},
    "qwen2": {"post_attention_layernorm": "ffn_norm"},
    "gemma3": {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
}
MIXED = (Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)


def gguf_name(name: str, arch: str) -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    stem, kind = name.rsplit(".", 1)
    if stem in top:
        return f"{top[stem]}.{kind}"
    _, _, layer, role = stem.split(".", 3)
    return f"blk.{layer}.{(BLOCK_NAMES | NORM_NAMES[arch])[role]}.{kind}"


def llama_cpp_permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute`, verbatim in numpy."""
    return (
        rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def hf_weights(arch: str, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights of the tiny `arch` model, as its HF checkpoint would have them."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    config = {**CONFIGS[arch], "vocab_size": vocab_size}
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in tree_flatten(model.parameters()):
        value = np.array(value, dtype=np.float32)
        if value.ndim == 1:  # norms and biases: move them off 1 and 0 so mistakes show
            value = value + rng.normal(0, 0.2, value.shape).astype(np.float32)
        out[name] = value * 2 if value.ndim == 2 else value
    if arch == "gemma3":
        del out["lm_head.weight"]  # Gemma ties its embeddings; exercise that path
    return out


def tiny_vocab(folder: Path) -> tuple[list[str], list[int], list[str]]:
    """tokens, llama.cpp token types, merges of tests/tiny.py's byte-level BPE."""
    write_tokenizer(folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    control = {t["content"] for t in spec["added_tokens"]}
    types = [TokenType.CONTROL if t in control else TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges


def write_gguf(
    path: Path,
    arch: str = "llama",
    types=MIXED,
    seed: int = 0,
    gguf_arch: str | None = None,
    pre: str | None = None,
) -> dict[str, np.ndarray]:
    """A tiny GGUF of `arch`, tensor types cycling through `types`; returns the HF weights.

    The tokenizer was trained with GPT-2's split, so its pre-tokenizer is "gpt2" unless `pre`.
    """
    tokens, token_types, merges = tiny_vocab(path.parent / f"{path.stem}-tok")
    weights = hf_weights(arch, len(tokens), seed)
    cfg = CONFIGS[arch]
    writer = GGUFWriter(str(path), gguf_arch or arch)
    writer.add_context_length(4096)
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    if arch == "gemma3":
        writer.add_key_length(cfg["head_dim"])
        writer.add_value_length(cfg["head_dim"])
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_sliding_window_pattern([True, True, False])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre or ("qwen2" if arch == "qwen2" else "gpt2"))
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    matrices = 0
    for name, value in weights.items():
        if arch == "llama" and ".q_proj." in name:
            value = llama_cpp_permute(value, cfg["num_attention_heads"])
        if arch == "llama" and ".k_proj." in name:
            value = llama_cpp_permute(value, cfg["num_key_value_heads"])
        if arch == "gemma3" and name.endswith("norm.weight"):
            value = value + np.float32(1.0)  # llama.cpp's Gemma norm_shift
        qtype = Q.F32 if value.ndim == 1 else types[matrices % len(types)]
        matrices += value.ndim == 2
        if qtype == Q.F32:
            writer.add_tensor(gguf_name(name, arch), value)
        elif qtype == Q.F16:
            writer.add_tensor(gguf_name(name, arch), value.astype(np.float16))
        else:
            writer.add_tensor(gguf_name(name, arch), quantize(value, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def reference_model(arch: str, weights: dict[str, np.ndarray]):
    from mlx_lm.utils import _get_classes

    config = {**CONFIGS[arch], "vocab_size": weights["model.embed_tokens.weight"].shape[0]}
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = model.sanitize({k: mx.array(v) for k, v in weights.items()})
    model.load_weights(list(weights.items()), strict=True)
    return model


def converted_weights(folder: Path) -> dict[str, mx.array]:
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(mx.load(str(shard)))
    return out


def assert_matches_gguf(folder: Path, gguf_path: Path, layers: set[int] | None = None) -> set:
    """Each converted tensor, with llama.cpp's layout applied again, equals gguf-py's
    dequantization of the file. Returns the tensor types compared."""
    reader = GGUFReader(gguf_path)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    heads = int(reader.fields[f"{arch}.attention.head_count"].parts[-1][0])
    kv_heads = int(reader.fields[f"{arch}.attention.head_count_kv"].parts[-1][0])
    ours = converted_weights(folder)
    names = {gguf_name(k, arch): k for k in ours}
    if "output.weight" not in {t.name for t in reader.tensors}:
        assert "lm_head.weight" not in ours
    seen = set()
    for tensor in reader.tensors:
        layer = tensor.name.split(".")[1] if tensor.name.startswith("blk.") else None
        if layers is not None and layer is not None and int(layer) not in layers:
            continue
        expected = dequantize(tensor.data, tensor.tensor_type).reshape(
            tuple(int(n) for n in reversed(tensor.shape))
        )
        got = np.array(ours[names[tensor.name]].astype(mx.float32))
        if arch == "llama" and ".attn_q." in tensor.name:
            got = llama_cpp_permute(got, heads)
        if arch == "llama" and ".attn_k." in tensor.name:
            got = llama_cpp_permute(got, kv_heads)
        if arch == "gemma3" and tensor.name.endswith("norm.weight"):
            np.testing.assert_allclose(got + 1, expected, rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, expected, err_msg=tensor.name)
        seen.add(tensor.tensor_type.name)
    return seen


# ---------------------------------------------------------------- tiny files, offline


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_weights_equal_gguf_dequantization(tmp_path, arch):
    src = tmp_path / f"{arch}.gguf"
    write_gguf(src, arch)
    out = convert_gguf(src, tmp_path / "out", progress=False)
    seen = assert_matches_gguf(out, src)
    assert {"F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0"} <= seen
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == CONFIGS[arch]["model_type"]
    for key, value in CONFIGS[arch].items():
        if key != "model_type":
            assert config[key] == value, key


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_logits_equal_the_original_model(tmp_path, arch):
    import mlx_lm

    src = tmp_path / f"{arch}.gguf"
    weights = write_gguf(src, arch, types=(Q.F32,))
    out = convert_gguf(src, tmp_path / "out", progress=False)
    model, tokenizer = mlx_lm.load(str(out))
    tokens = mx.array([tokenizer.encode("def fibonacci(n):\n    if n <= 0: return 0")])
    assert tokens.shape[1] > CONFIGS["gemma3"]["sliding_window"]  # reach past the window
    expected = reference_model(arch, weights)(tokens)
    np.testing.assert_allclose(np.array(model(tokens)), np.array(expected), atol=1e-4, rtol=1e-4)


def test_stop_tokens_and_tokenizer_files(tmp_path):
    import mlx_lm

    src = tmp_path / "qwen2.gguf"
    write_gguf(src, "qwen2")
    out = convert_gguf(src, tmp_path / "out", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == [2, 0]  # <|im_end|> from the file, then <|endoftext|>
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == CHAT_TEMPLATE
    assert tok_config["eos_token"] == "<|im_end|>" and tok_config["add_bos_token"] is False
    _, tokenizer = mlx_lm.load(str(out))
    assert tokenizer.eos_token_ids == {0, 2}
    text = "<|im_start|>user\nhi<|im_end|>"
    assert tokenizer.encode(text)[:1] == [1] and tokenizer.decode(tokenizer.encode(text)) == text


def test_dtype_and_quantize(tmp_path):
    import mlx_lm

    src = tmp_path / "llama.gguf"
    write_gguf(src, "llama", types=(Q.F32,))
    half = convert_gguf(src, tmp_path / "bf16", dtype="bfloat16", progress=False)
    assert {v.dtype for v in converted_weights(half).values()} == {mx.bfloat16}
    quant = convert_gguf(src, tmp_path / "q4", quantize=4, group_size=32, progress=False)
    config = json.loads((quant / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 4, "mode": "affine"}
    model, tokenizer = mlx_lm.load(str(quant))
    logits = model(mx.array([tokenizer.encode("Hello world")]))
    assert bool(mx.all(mx.isfinite(logits)))


def test_force_replaces_atomically(tmp_path):
    src = tmp_path / "qwen2.gguf"
    write_gguf(src, "qwen2")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(SpecmlxError, match="already exists"):
        convert_gguf(src, out, progress=False)
    assert (out / "stale.txt").exists()
    convert_gguf(src, out, force=True, progress=False)
    assert not (out / "stale.txt").exists() and (out / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _only(folder: Path, names: set[str]) -> None:
    """`folder` holds exactly `names`: no output folder, no temporary leftovers."""
    assert {p.name for p in folder.iterdir()} == names


def _cut(src: Path, dst: Path, n: int) -> Path:
    dst.write_bytes(src.read_bytes()[:n])
    return dst


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", r"no such file"),
        ("random", r"not a GGUF file"),
        ("bad-header", r"truncated or corrupt GGUF"),
        ("truncated-header", r"truncated or corrupt GGUF"),
        ("truncated-data", r"truncated"),
        ("arch", r"architecture 'bert' is not supported"),
        ("hybrid", r"architecture 'qwen3next' is not supported.*hybrids included"),
        ("type", r"tensor blk\.0\.attn_q\.weight has type IQ2_XXS"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, message):
    good = tmp_path / "good.gguf"
    write_gguf(good, "llama", types=(Q.F32,))
    src = tmp_path / f"{case}.gguf"
    if case == "random":
        src.write_bytes(np.random.default_rng(0).bytes(4096))
    elif case == "bad-header":
        src.write_bytes(b"GGUF" + np.random.default_rng(0).bytes(4096))
    elif case == "truncated-header":
        _cut(good, src, 2000)
    elif case == "truncated-data":
        _cut(good, src, good.stat().st_size * 2 // 3)
    elif case == "arch":
        write_gguf(src, "llama", types=(Q.F32,), gguf_arch="bert")
    elif case == "hybrid":  # llama.cpp's name for Qwen3-Next
        write_gguf(src, "llama", types=(Q.F32,), gguf_arch="qwen3next")
    elif case == "type":
        writer = GGUFWriter(str(src), "llama")
        raw = np.zeros((64, 66), dtype=np.uint8)  # one 256-wide IQ2_XXS block per row
        writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=Q.IQ2_XXS)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(SpecmlxError, match=message) as info:
        convert_gguf(src, tmp_path / "out", progress=False)
    assert "\n" not in str(info.value)
    _only(tmp_path, before)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(dtype="float8"), "dtype"),
        (dict(quantize=3), "quantize"),
        (dict(group_size=48), "group-size"),
    ],
)
def test_bad_options(tmp_path, options, message):
    with pytest.raises(UsageError, match=message):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "out", progress=False, **options)


def test_interrupt_leaves_nothing(tmp_path, monkeypatch):
    import mlx_lm.utils

    src = tmp_path / "llama.gguf"
    write_gguf(src, "llama", types=(Q.F32,))

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mlx_lm.utils, "save_config", interrupt)
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(src, tmp_path / "out", progress=False)
    _only(tmp_path, before)


def test_cli_convert(tmp_path):
    from typer.testing import CliRunner

    from specmlx.cli import app

    src = tmp_path / "qwen2.gguf"
    write_gguf(src, "qwen2")
    runner = CliRunner()
    ok = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "out" / "config.json").exists()
    again = runner.invoke(app, ["convert", str(src), str(tmp_path / "out")])
    assert again.exit_code == 1
    lines = [line for line in again.output.splitlines() if line.strip()]
    assert len(lines) == 1 and re.match(r"error: .*already exists", lines[0]), again.output
    bad = runner.invoke(app, ["convert", str(src), str(tmp_path / "o2"), "--quantize", "3"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


# ---------------------------------------------------------------- real files


ALIASES = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m")


def gguf_path(alias: str) -> Path | None:
    """models/gguf/<alias>.gguf in the repo, else $SPECMLX_GGUF_DIR/<alias>.gguf."""
    for folder in (
        REPO / "models" / "gguf",
        Path(os.environ.get("SPECMLX_GGUF_DIR", "/nonexistent")),
    ):
        if (folder / f"{alias}.gguf").is_file():
            return folder / f"{alias}.gguf"
    return None


@pytest.fixture(scope="module", params=ALIASES)
def real(request, tmp_path_factory):
    """(alias, gguf path, fp32 converted folder); the folder is removed afterwards (GBs)."""
    import shutil

    alias = request.param
    src = gguf_path(alias)
    if src is None:
        pytest.skip(f"{alias}.gguf not found (models/gguf/ or $SPECMLX_GGUF_DIR)")
    out = convert_gguf(src, tmp_path_factory.mktemp("real") / alias, progress=False)
    yield alias, src, out
    shutil.rmtree(out, ignore_errors=True)


def greedy(folder: Path, prompt: str, n: int = 16) -> str:
    import mlx_lm
    from mlx_lm.generate import stream_generate

    model, tokenizer = mlx_lm.load(str(folder))
    tokens = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=n)]
    return tokenizer.decode(tokens)


@pytest.mark.real
def test_real_weights_equal_gguf(real):
    alias, src, out = real
    n_layers = json.loads((out / "config.json").read_text())["num_hidden_layers"]
    # The 1.5B: the first and last layers, which hold each tensor type the file uses.
    layers = {0, n_layers - 1} if alias == "qwen2.5-coder-1.5b" else None
    seen = assert_matches_gguf(out, src, layers)
    types = {t.tensor_type.name for t in GGUFReader(src).tensors}
    assert seen == types


@pytest.mark.real
def test_real_greedy_continuation(real):
    alias, _, out = real
    if alias == "smollm2-135m":
        assert greedy(out, "The capital of France is").startswith(" Paris")
    elif alias.startswith("qwen2.5-coder"):
        text = greedy(out, "def fibonacci(n):")
        assert "if n <= 0:" in text.splitlines()[1], text
    else:
        assert greedy(out, "Once upon a time").startswith(", there was a little")
