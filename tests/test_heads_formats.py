"""Published Medusa, EAGLE and EAGLE-3 checkpoints, read as their authors lay them out.

Each test writes a checkpoint for a tiny target in exactly the published layout (tensor
names, shapes, config keys; safetensors written by the `safetensors` package, not by MLX),
loads it, and checks what the heads compute against a plain numpy transcription of the
reference PyTorch code: the mapping is right, not merely shape-compatible.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.features import FeatureSpec, backbone, capturing
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import SpecmlxError
from specmlx.heads import load_heads, save_heads
from specmlx.heads.eagle3 import aux_layers
from specmlx.heads.formats import read_published
from tests.tiny import make_model_dir

save_file = pytest.importorskip("safetensors.numpy").save_file

D, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 4, 2, 16, 96  # the draft layers' shapes
PROMPT = "The capital of France is Paris. The capital of"


@pytest.fixture(scope="module")
def target(tiny_dirs):
    return mlx_lm.load(str(tiny_dirs["llama"]))


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory):
    """A four-layer llama: EAGLE-3 reads three distinct layers."""
    folder = make_model_dir(
        tmp_path_factory.mktemp("deep") / "llama4", "llama", seed=3, num_hidden_layers=4
    )
    return mlx_lm.load(str(folder))


def weights(rng: np.random.Generator, *shape: int, scale: float = 0.15) -> np.ndarray:
    return rng.normal(0.0, scale, shape).astype(np.float32)


def norm_weight(rng: np.random.Generator) -> np.ndarray:
    return (1.0 + rng.normal(0.0, 0.1, D)).astype(np.float32)


def write(folder: Path, filename: str, tensors: dict, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / filename))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def as_np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def ids_and_features(model, tokenizer) -> tuple[list[int], np.ndarray]:
    ids = tokenizer.encode(PROMPT)
    return ids, as_np(backbone(model)(mx.array(ids)[None])[0])  # (n, d) post-norm


# --- numpy references (transcribing Medusa's ResBlock, EAGLE's cnets1.py / cnets.py) -------


def silu(x):
    return x / (1.0 + np.exp(-x))


def rms(x, weight, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def rope(x, base):  # x (n, heads, hd), positions 0..n-1, HF's rotate_half convention
    n, hd = x.shape[0], x.shape[-1]
    angles = np.arange(n)[:, None] * base ** (-np.arange(0, hd, 2) / hd)[None]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None]
    rotated = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    return x * cos + rotated * sin


def attention(x, t, prefix, base):
    """LlamaAttention over x (n, in): GQA, causal, rope from position 0."""
    n = x.shape[0]

    def proj(name, heads):
        out = x @ t[f"{prefix}{name}_proj.weight"].T
        out = out + t.get(f"{prefix}{name}_proj.bias", 0.0)
        return out.reshape(n, heads, HEAD_DIM)

    q, k, v = proj("q", HEADS), proj("k", KV_HEADS), proj("v", KV_HEADS)
    q, k = rope(q, base), rope(k, base)
    k, v = (np.repeat(a, HEADS // KV_HEADS, axis=1) for a in (k, v))
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM)
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", probs, v).reshape(n, HEADS * HEAD_DIM)
    return out @ t[f"{prefix}o_proj.weight"].T


def mlp(x, t, prefix):
    gate, up = x @ t[f"{prefix}gate_proj.weight"].T, x @ t[f"{prefix}up_proj.weight"].T
    return (silu(gate) * up) @ t[f"{prefix}down_proj.weight"].T


def draft_layer_tensors(rng, prefix: str, width: int) -> dict:
    t = {f"{prefix}self_attn.{p}_proj.weight": weights(rng, HEADS * HEAD_DIM, width) for p in "q"}
    t.update(
        {
            f"{prefix}self_attn.{p}_proj.weight": weights(rng, KV_HEADS * HEAD_DIM, width)
            for p in "kv"
        }
    )
    t[f"{prefix}self_attn.o_proj.weight"] = weights(rng, D, HEADS * HEAD_DIM)
    t[f"{prefix}mlp.gate_proj.weight"] = weights(rng, FFN, D)
    t[f"{prefix}mlp.up_proj.weight"] = weights(rng, FFN, D)
    t[f"{prefix}mlp.down_proj.weight"] = weights(rng, D, FFN)
    t[f"{prefix}post_attention_layernorm.weight"] = norm_weight(rng)
    return t


def draft_config(vocab: int, **extra) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": D,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "vocab_size": vocab,
        "torch_dtype": "float16",
        **extra,
    }


def run(model, ids, drafter, k):
    steps = decode(
        Sequence(model), ids, drafter, policy=FixedK(k), max_tokens=16, sampling=SamplingConfig()
    )
    steps = list(steps)
    return [t for s in steps for t in s.tokens], sum(s.n_drafted for s in steps)


# --- Medusa -------------------------------------------------------------------------------


def write_medusa(folder: Path, vocab: int, n_heads: int, n_layers: int, medusa2: bool) -> dict:
    """Medusa-1's medusa_lm_head.safetensors (train_legacy.py), or a Medusa-2 model whose
    model.safetensors keeps the heads under `medusa_head.` beside the base model's weights,
    in float16 as such models ship."""
    rng = np.random.default_rng(n_layers)
    prefix = "medusa_head." if medusa2 else ""
    t = {}
    for i in range(n_heads):
        for j in range(n_layers):
            t[f"{prefix}{i}.{j}.linear.weight"] = weights(rng, D, D)
            t[f"{prefix}{i}.{j}.linear.bias"] = weights(rng, D)
        t[f"{prefix}{i}.{n_layers}.weight"] = weights(rng, vocab, D)
    if medusa2:
        t["model.norm.weight"] = norm_weight(rng)  # a base model weight: not the heads'
    # Medusa's loader notes uploaded configs that undercount the heads: the keys tell.
    config = {
        "medusa_num_heads": n_heads - 1,
        "medusa_num_layers": n_layers,
        "base_model_name_or_path": "tiny",
    }
    if medusa2:
        t = {k: v.astype(np.float16) for k, v in t.items()}
    write(folder, "model.safetensors" if medusa2 else "medusa_lm_head.safetensors", t, config)
    return {k.removeprefix(prefix): v.astype(np.float32) for k, v in t.items()}


@pytest.mark.parametrize("n_layers, medusa2", [(1, False), (2, True)])
def test_medusa_heads_compute_what_medusa_does(target, tmp_path, n_layers, medusa2):
    model, tokenizer = target
    vocab = model.args.vocab_size
    t = write_medusa(tmp_path / "medusa", vocab, 3, n_layers, medusa2)
    heads = read_published(tmp_path / "medusa", model, tokenizer)
    config = heads.config
    assert (config.kind, config.source_format, config.own_lm_head) == ("medusa", "medusa", True)
    assert (config.num_heads, config.num_layers, heads.d2t) == (3, n_layers, None)
    # In the target's dtype, whatever the checkpoint's.
    assert {p.dtype for _, p in tree_flatten(heads.parameters())} == {mx.float32}

    _, features = ids_and_features(model, tokenizer)
    expected = []
    for i in range(3):
        x = features
        for j in range(n_layers):
            x = x + silu(x @ t[f"{i}.{j}.linear.weight"].T + t[f"{i}.{j}.linear.bias"])
        expected.append(x @ t[f"{i}.{n_layers}.weight"].T)
    got = as_np(heads(mx.array(features)))  # (K, n, V)
    np.testing.assert_allclose(got, np.stack(expected), rtol=1e-4, atol=1e-4)


def test_medusa_heads_of_another_width_are_refused(target, tmp_path):
    model, tokenizer = target
    rng = np.random.default_rng(0)
    t = {
        "0.0.linear.weight": weights(rng, 48, 48),
        "0.0.linear.bias": weights(rng, 48),
        "0.1.weight": weights(rng, 9, 48),
    }
    write(tmp_path, "medusa_lm_head.safetensors", t, {"medusa_num_heads": 1})
    with pytest.raises(SpecmlxError, match="hidden size 48"):
        read_published(tmp_path, model, tokenizer)


# --- EAGLE-1 ------------------------------------------------------------------------------


def write_eagle(folder: Path, model, qkv_bias: bool) -> dict:
    """EAGLE-1's checkpoint: fc with bias, layers.0 without input_layernorm, the target's
    embedding copied in; config a one-layer LlamaConfig (+ qkv_bias, as for Qwen2)."""
    rng = np.random.default_rng(7)
    t = {"fc.weight": weights(rng, D, 2 * D), "fc.bias": weights(rng, D)}
    t.update(draft_layer_tensors(rng, "layers.0.", D))
    if qkv_bias:
        t["layers.0.self_attn.q_proj.bias"] = weights(rng, HEADS * HEAD_DIM)
        t.update(
            {f"layers.0.self_attn.{p}_proj.bias": weights(rng, KV_HEADS * HEAD_DIM) for p in "kv"}
        )
    t["embed_tokens.weight"] = as_np(backbone(model).embed_tokens.weight)
    extra = {"bias": True, **({"qkv_bias": True} if qkv_bias else {})}
    write(folder, "model.safetensors", t, draft_config(model.args.vocab_size, **extra))
    return t


def eagle_reference(t, features, tokens):
    """cnets1.py Model.forward: fc(cat(emb, f)), then layer 0 (no input norm), no final norm."""
    x = (
        np.concatenate([t["embed_tokens.weight"][tokens], features], -1) @ t["fc.weight"].T
        + t["fc.bias"]
    )
    h = x + attention(x, t, "layers.0.self_attn.", 10000.0)
    return h + mlp(rms(h, t["layers.0.post_attention_layernorm.weight"], 1e-5), t, "layers.0.mlp.")


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_an_eagle_head_predicts_what_eagle_does(target, tmp_path, qkv_bias):
    model, tokenizer = target
    t = write_eagle(tmp_path / "eagle", model, qkv_bias)
    head = read_published(tmp_path / "eagle", model, tokenizer)
    assert (head.config.kind, head.config.source_format, head.config.own_lm_head) == (
        "eagle",
        "eagle",
        False,
    )

    ids, features = ids_and_features(model, tokenizer)
    # Draft position j: (f_j, token j+1).
    tokens, rows = np.array(ids[1:]), features[:-1]
    expected = eagle_reference(t, rows, tokens)
    got = as_np(head(mx.array(rows), mx.array(tokens)))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # The same through the head's own cache, in two calls.
    cache = head.make_cache()
    first = head(mx.array(rows[:4]), mx.array(tokens[:4]), cache)
    rest = head(mx.array(rows[4:]), mx.array(tokens[4:]), cache)
    np.testing.assert_allclose(as_np(mx.concatenate([first, rest])), expected, rtol=1e-4, atol=1e-4)
    # Scored by the target's own lm_head, with no norm in between.
    logits = as_np(head.logits(mx.array(expected)))
    np.testing.assert_allclose(
        logits, expected @ as_np(model.lm_head.weight).T, rtol=1e-4, atol=1e-4
    )
    # Saved as ours and read back: the same head, still without its input norm.
    again = load_heads(save_heads(head, tmp_path / "ours"), model, tokenizer)
    assert again.config.input_norm is False and again.config.source_format == "eagle"
    got = as_np(again(mx.array(rows), mx.array(tokens)))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


# --- EAGLE-3 ------------------------------------------------------------------------------

AUX = [0, 1, 3]
DRAFT_VOCAB = 40


def write_eagle3(folder: Path, model) -> dict:
    """SpecForge's LlamaForCausalLMEagle3 / EAGLE's cnets.py checkpoint, draft vocab of 40."""
    rng = np.random.default_rng(11)
    vocab = model.args.vocab_size
    used = np.sort(rng.choice(vocab, DRAFT_VOCAB, replace=False))  # the draft's target ids
    t = {"fc.weight": weights(rng, D, 3 * D)}
    t.update(draft_layer_tensors(rng, "midlayer.", 2 * D))
    t["midlayer.input_layernorm.weight"] = norm_weight(rng)
    t["midlayer.hidden_norm.weight"] = norm_weight(rng)
    t["norm.weight"] = norm_weight(rng)
    t["lm_head.weight"] = weights(rng, DRAFT_VOCAB, D, scale=0.5)
    t["d2t"] = (used - np.arange(DRAFT_VOCAB)).astype(np.int64)
    t["t2d"] = np.isin(np.arange(vocab), used)
    t["embed_tokens.weight"] = as_np(backbone(model).embed_tokens.weight)
    config = draft_config(
        vocab,
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=DRAFT_VOCAB,
        eagle_config={"eagle_aux_hidden_state_layer_ids": AUX, "use_aux_hidden_state": True},
    )
    write(folder, "model.safetensors", t, config)
    return {**t, "used": used}


def eagle3_reference(t, inputs, tokens):
    """cnets.py: each input row is the target's 3d features (through fc) or the draft's
    own d-wide hidden state (as is); then the midlayer over [norm(emb), norm(h)]."""
    h = np.stack([row @ t["fc.weight"].T if row.shape[0] == 3 * D else row for row in inputs])
    x = np.concatenate(
        [
            rms(t["embed_tokens.weight"][tokens], t["midlayer.input_layernorm.weight"], 1e-5),
            rms(h, t["midlayer.hidden_norm.weight"], 1e-5),
        ],
        -1,
    )
    h = h + attention(x, t, "midlayer.self_attn.", 10000.0)
    return h + mlp(rms(h, t["midlayer.post_attention_layernorm.weight"], 1e-5), t, "midlayer.mlp.")


def test_an_eagle3_head_predicts_what_eagle3_does(deep_target, tmp_path):
    model, tokenizer = deep_target
    t = write_eagle3(tmp_path / "eagle3", model)
    head = read_published(tmp_path / "eagle3", model, tokenizer)
    config = head.config
    assert (config.kind, config.feature_layers, config.draft_vocab) == (
        "eagle3",
        tuple(AUX),
        DRAFT_VOCAB,
    )

    ids = tokenizer.encode(PROMPT)
    with capturing(model, FeatureSpec(tuple(AUX))) as capture:
        model(mx.array(ids)[None])
    features = as_np(capture.latest()[0])  # (n, 3d): layers 0, 1, 3, in that order
    tokens, rows = np.array(ids[1:]), list(features[:-1])
    expected = eagle3_reference(t, rows, tokens)
    cache = head.make_cache()
    got = as_np(head(mx.array(np.stack(rows)), mx.array(tokens), cache))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)

    # Logits: final norm, the draft lm_head; draft token i is target token i + d2t[i].
    logits = rms(expected, t["norm.weight"], 1e-5) @ t["lm_head.weight"].T
    np.testing.assert_allclose(as_np(head.logits(mx.array(expected))), logits, rtol=1e-4, atol=1e-4)
    best = logits[-1].argmax()
    assert np.array(head.d2t).tolist() == t["used"].tolist()
    next_token = int(head.d2t[int(best)].item())
    assert next_token == best + t["d2t"][best]

    # Drafting on: the head's own last hidden state goes back in, without fc.
    more = as_np(head(mx.array(expected[-1:]), mx.array([next_token]), cache))
    again = eagle3_reference(t, [*rows, expected[-1]], np.array([*tokens, next_token]))
    np.testing.assert_allclose(more, again[-1:], rtol=1e-4, atol=1e-4)


def test_eagle3_reads_the_reference_layers_by_default():
    # The reference captures the inputs of layers 2, L//2, L-3: the outputs of these.
    assert aux_layers({}, 32) == (1, 15, 28)
    assert aux_layers({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 46, 90]}}, 94) == (
        1,
        46,
        90,
    )
    with pytest.raises(SpecmlxError, match="the target has 4"):
        aux_layers({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}}, 4)


def test_eagle3_offsets_that_miss_t2d_are_refused(deep_target, tmp_path):
    model, tokenizer = deep_target
    t = write_eagle3(tmp_path / "a", model)
    t.pop("used")
    t["d2t"] = t["d2t"] + np.arange(DRAFT_VOCAB)  # absolute ids where offsets belong
    write(
        tmp_path / "b",
        "model.safetensors",
        t,
        json.loads((tmp_path / "a" / "config.json").read_text()),
    )
    with pytest.raises(SpecmlxError, match="d2t"):
        read_published(tmp_path / "b", model, tokenizer)


# --- files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "filename, config",
    [
        ("medusa_lm_head.pt", {"medusa_num_heads": 3}),
        ("pytorch_model.bin", {"num_hidden_layers": 1}),
    ],
)
def test_a_pickled_checkpoint_is_refused_in_one_line(target, tmp_path, filename, config):
    model, tokenizer = target
    (tmp_path / filename).write_bytes(b"PK\x03\x04 not to be unpickled")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecmlxError) as caught:
        read_published(tmp_path, model, tokenizer)
    message = str(caught.value)
    assert "\n" not in message and "safetensors" in message and filename in message


def test_a_published_config_without_safetensors_says_so(target, tmp_path):
    model, tokenizer = target
    # What a Hub snapshot of a .bin-only repo holds: the weights are not fetched.
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 3}))
    with pytest.raises(SpecmlxError, match="no safetensors"):
        read_published(tmp_path, model, tokenizer)


def test_other_folders_are_not_published_heads(target, tiny_dirs, tmp_path):
    model, tokenizer = target
    assert read_published(tiny_dirs["llama"], model, tokenizer) is None  # a plain model
    assert read_published(tmp_path, model, tokenizer) is None  # nothing at all


# --- through load_heads, then decoding ----------------------------------------------------


def test_greedy_decoding_with_published_heads_equals_plain(target, deep_target, tmp_path):
    from specmlx.drafters.eagle import EagleDrafter
    from specmlx.drafters.medusa import MedusaDrafter

    model, tokenizer = target
    write_medusa(tmp_path / "medusa", model.args.vocab_size, 3, 1, medusa2=False)
    write_eagle(tmp_path / "eagle", model, qkv_bias=True)
    deep_model, deep_tokenizer = deep_target
    write_eagle3(tmp_path / "eagle3", deep_model)
    cases = [
        (
            model,
            tokenizer,
            MedusaDrafter(load_heads(tmp_path / "medusa", model, tokenizer), tree_size=10, width=4),
        ),
        (
            model,
            tokenizer,
            EagleDrafter(
                load_heads(tmp_path / "eagle", model, tokenizer), tree_size=10, depth=3, width=3
            ),
        ),
        (
            deep_model,
            deep_tokenizer,
            EagleDrafter(
                load_heads(tmp_path / "eagle3", deep_model, deep_tokenizer),
                tree_size=10,
                depth=3,
                width=3,
            ),
        ),
    ]
    for m, tok, drafter in cases:
        for prompt in [PROMPT, "def fibonacci(n):"]:
            ids = tok.encode(prompt)
            plain, _ = run(m, ids, None, 0)
            for k in (1, 3):
                out, drafted = run(m, ids, drafter, k)
                assert out == plain, (drafter.traits.kind, prompt, k)
                assert drafted > 0


def test_published_heads_come_from_a_hub_repo_id(target, tmp_path, monkeypatch):
    """A repo id not in the local cache is fetched (the network faked here), only its json
    and safetensors files; once cached, it is read without asking the Hub again."""
    import huggingface_hub
    from huggingface_hub import errors as hub_errors

    model, tokenizer = target
    snapshot = tmp_path / "hub" / "someone--eagle-heads"
    calls = []

    def fake_snapshot_download(repo_id, *, allow_patterns=None, local_files_only=False, **_):
        calls.append((repo_id, local_files_only, tuple(allow_patterns)))
        if not snapshot.exists():
            if local_files_only:
                raise hub_errors.LocalEntryNotFoundError("not in the cache")
            write_eagle(snapshot, model, qkv_bias=False)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    head = load_heads("someone/eagle-heads", model, tokenizer)
    assert head.config.source_format == "eagle"
    assert [c[:2] for c in calls] == [("someone/eagle-heads", True), ("someone/eagle-heads", False)]
    assert set(calls[-1][2]) == {"*.json", "*.safetensors"}  # never a pickle
    load_heads("someone/eagle-heads", model, tokenizer)
    assert calls[-1][:2] == ("someone/eagle-heads", True)  # cached: no second download
