"""`--method mtp`: the MTP layer of the target's own checkpoint, on tiny Qwen3.5,
Qwen3-Next, MiMo and DeepSeek-V3 targets written in the released layouts (`tests.tiny_mtp`,
`tests.tiny_deepseek`).

Its forward pass is checked against a numpy re-implementation of the reference (vLLM's
`Qwen3NextMultiTokenPredictor`: zero-centred norms, fc over [embedding, hidden], one
full-attention block, the final norm, the target's LM head; MiMo's `MiMoMTPLayers`;
vLLM's `DeepSeekMultiTokenPredictorLayer`: enorm / hnorm, eh_proj, an MLA + MoE block,
shared_head); the loop's properties hold with it (greedy equals plain decoding token for
token; a χ² test at T = 1 with top-p); -k auto prices it and falls back where it does not
pay; a bad checkpoint is a one-line error naming the tensor; and the CLI runs it as a user
would.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from typer.testing import CliRunner

from specmlx.api.config import GenerationConfig
from specmlx.api.load import load
from specmlx.api.methods import MtpOptions
from specmlx.api.session import Session
from specmlx.cli import app
from specmlx.drafters.mtp import MtpDrafter
from specmlx.engine.cache import Sequence
from specmlx.engine.features import backbone
from specmlx.engine.sampling import SamplingConfig, warp
from specmlx.heads.mtp import FAMILIES, _converted, load_mtp, target_features
from tests.clock import calibrated_clock
from tests.tiny import ARCHS
from tests.tiny_deepseek import DEEPSEEK, MTP, make_deepseek_dir, mtp_layers_dropped
from tests.tiny_deepseek import released_mtp as released_deepseek_mtp
from tests.tiny_hybrid import TEXT, make_hybrid_dir
from tests.tiny_mtp import (
    MIMO,
    bigram_mtp,
    damp,
    make_mimo_dir,
    released_mimo_mtp,
    released_mtp,
)

KINDS = ("qwen3_5", "qwen3_next")
PROMPT = "The quick brown fox jumps over"
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def _deepseek_next_n_layers_dropped():
    """mlx-lm drops DeepSeek-V3's next-n layer by V3's index (61) alone: the tiny targets'
    (index 2) too, while this module loads them."""
    with mtp_layers_dropped():
        yield


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp")
    out = {}
    for kind in KINDS:
        out[kind] = make_hybrid_dir(root / kind, kind, seed=1, extra_tensors=released_mtp(kind, 3))
        close = make_hybrid_dir(
            root / f"{kind}-close", kind, seed=1, extra_tensors=bigram_mtp(kind)
        )
        out[f"{kind}-close"] = damp(close, 0.05)
    # A target that is the bigram model its MTP layer computes: every draft is kept.
    exact = make_hybrid_dir(
        root / "exact", "qwen3_next", seed=1, extra_tensors=bigram_mtp("qwen3_next")
    )
    out["exact"] = damp(exact, 0.0)
    # Peaked enough that a few hundred responses fill the cells of a χ² test.
    sharp = make_hybrid_dir(root / "sharp", "qwen3_5", seed=1, extra_tensors=bigram_mtp("qwen3_5"))
    out["sharp"] = damp(sharp, 0.3, head=4.0)
    sharp = make_hybrid_dir(
        root / "sharp-next", "qwen3_next", seed=1, extra_tensors=bigram_mtp("qwen3_next")
    )
    out["sharp-next"] = damp(sharp, 0.1, head=3.0)
    out["plain"] = make_hybrid_dir(root / "plain", "qwen3_5", seed=1)
    out["mimo"] = make_mimo_dir(root / "mimo", released_mimo_mtp(3))
    out["mimo-close"] = damp(
        make_mimo_dir(root / "mimo-close", released_mimo_mtp(bigram=True)), 0.05
    )
    # DeepSeek-V3: the layer's own embedding and LM head (here unlike the target's), or none.
    out["deepseek"] = make_deepseek_dir(root / "ds", 1, released_deepseek_mtp(3))
    out["deepseek-shared"] = make_deepseek_dir(
        root / "ds-shared", 1, released_deepseek_mtp(3, own=False)
    )
    close = released_deepseek_mtp(own=False, bigram=True)
    out["deepseek-close"] = damp(make_deepseek_dir(root / "ds-close", 1, close), 0.05)
    return out


# --- the reference forward, in numpy --------------------------------------------------------


# Each family's reference, as its authors' code runs it: Qwen3-Next / Qwen3.5 (vLLM's
# `qwen3_next_mtp.py`, `qwen3_5_mtp.py`): GemmaRMSNorm (x / rms(x) * (1 + w)), fc over
# [embedding, hidden], gated attention with q/k norms and partial RoPE; MiMo
# (`MiMoMTPLayers`): Qwen2RMSNorm (x / rms(x) * w), input_proj over [hidden, embedding], a
# Qwen2 block (q/k/v biases, full RoPE). The checkpoints' names for each part:
REFERENCE = {
    "qwen": dict(
        names={
            "mtp.pre_fc_norm_embedding.": "embed_norm.",
            "mtp.pre_fc_norm_hidden.": "hidden_norm.",
            "mtp.fc.": "fc.",
            "mtp.norm.": "norm.",
            "mtp.layers.0.": "layer.",
        },
        config=None,
        shift=1.0,
        hidden_first=False,
        gated=True,
    ),
    "mimo": dict(
        names={
            "model.mtp_layers.0.token_layernorm.": "embed_norm.",
            "model.mtp_layers.0.hidden_layernorm.": "hidden_norm.",
            "model.mtp_layers.0.input_proj.": "fc.",
            "model.mtp_layers.0.final_layernorm.": "norm.",
            "model.mtp_layers.0.": "layer.",
        },
        config={**ARCHS["qwen2"], **MIMO},
        shift=0.0,
        hidden_first=True,
        gated=False,
    ),
    "deepseek": dict(
        names={
            MTP + "enorm.": "embed_norm.",
            MTP + "hnorm.": "hidden_norm.",
            MTP + "eh_proj.": "fc.",
            MTP + "shared_head.norm.": "norm.",
            MTP + "shared_head.head.": "own_head.",
            MTP + "embed_tokens.": "own_embed.",
            MTP: "layer.",
        },
        config=DEEPSEEK,
    ),
}


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / rms(x) * weight (the caller adds Gemma's 1 to a zero-centred weight)."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def _rope(x: np.ndarray, positions: np.ndarray, dims: int, base: float) -> np.ndarray:
    """Rotary embedding of the first `dims` channels, halves rotated (not interleaved).
    x # (n, heads, hd)"""
    freqs = base ** (-np.arange(0, dims, 2) / dims)  # (dims / 2,)
    angles = positions[:, None, None] * freqs  # (n, 1, dims / 2)
    first, second = x[..., : dims // 2], x[..., dims // 2 : dims]
    rotated = [
        first * np.cos(angles) - second * np.sin(angles),
        second * np.cos(angles) + first * np.sin(angles),
    ]
    return np.concatenate([*rotated, x[..., dims:]], axis=-1)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _mlp(x: np.ndarray, t: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    gate, up = x @ t[prefix + "gate_proj.weight"].T, x @ t[prefix + "up_proj.weight"].T
    return (_silu(gate) * up) @ t[prefix + "down_proj.weight"].T


def _moe(x: np.ndarray, t: dict[str, np.ndarray], c: dict) -> np.ndarray:
    """Qwen3NextSparseMoeBlock: softmax router, top-k experts, a gated shared expert."""
    m = "layer.mlp."
    logits = x @ t[m + "gate.weight"].T  # (n, experts)
    gates = np.exp(logits - logits.max(-1, keepdims=True))
    gates /= gates.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        top = np.argsort(-gates[i])[: c["num_experts_per_tok"]]
        scores = gates[i, top] / (gates[i, top].sum() if c["norm_topk_prob"] else 1.0)
        for e, score in zip(top, scores, strict=True):
            out[i] += score * _mlp(x[i], t, m + f"experts.{e}.")
    shared = 1.0 / (1.0 + np.exp(-(x @ t[m + "shared_expert_gate.weight"].T)))
    return out + shared * _mlp(x, t, m + "shared_expert.")


def reference_mtp(
    t: dict[str, np.ndarray], family: str, c: dict, hidden: np.ndarray, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The MTP rows (h_p, t_{p+1}) at positions 0..n-1, one causal pass: the output after
    the final norm, and the logits. hidden # (n, H); tokens # (n,)"""
    if family == "deepseek":
        return reference_deepseek_mtp(t, c, hidden, tokens)
    ref = REFERENCE[family]
    eps, hd = c["rms_norm_eps"], c["head_dim"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    rope = c.get("rope_parameters", c)
    base, dims = rope["rope_theta"], int(hd * rope["partial_rotary_factor"])

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        return _rms(x, t[name] + ref["shift"], eps)

    embedded = norm(t["embed"][tokens], "embed_norm.weight")
    hidden = norm(hidden, "hidden_norm.weight")
    parts = [hidden, embedded] if ref["hidden_first"] else [embedded, hidden]
    x = np.concatenate(parts, -1) @ t["fc.weight"].T  # (n, H)
    normed = norm(x, "layer.input_layernorm.weight")
    n = x.shape[0]

    def project(name: str) -> np.ndarray:
        out = normed @ t[f"layer.self_attn.{name}.weight"].T
        return out + t.get(f"layer.self_attn.{name}.bias", 0.0)

    q, k, v = project("q_proj"), project("k_proj"), project("v_proj")
    k, v = k.reshape(n, kv_heads, hd), v.reshape(n, kv_heads, hd)
    if ref["gated"]:  # query and gate interleaved per head; q/k normed per head
        q_gate = q.reshape(n, heads, 2 * hd)
        q, gate = q_gate[..., :hd], q_gate[..., hd:].reshape(n, heads * hd)
        q, k = norm(q, "layer.self_attn.q_norm.weight"), norm(k, "layer.self_attn.k_norm.weight")
    else:
        q = q.reshape(n, heads, hd)
    positions = np.arange(n, dtype=np.float64)
    q, k = _rope(q, positions, dims, base), _rope(k, positions, dims, base)
    attn = np.zeros((n, heads, hd))
    for h in range(heads):
        kv = h // (heads // kv_heads)
        scores = q[:, h] @ k[:, kv].T / np.sqrt(hd)  # (n, n)
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        attn[:, h] = (weights / weights.sum(-1, keepdims=True)) @ v[:, kv]
    attn = attn.reshape(n, -1)
    if ref["gated"]:
        attn = attn / (1.0 + np.exp(-gate))
    h1 = x + attn @ t["layer.self_attn.o_proj.weight"].T
    normed = norm(h1, "layer.post_attention_layernorm.weight")
    moe = bool(c.get("num_experts"))
    y = h1 + (_moe(normed, t, c) if moe else _mlp(normed, t, "layer.mlp."))
    out = norm(y, "norm.weight")
    return out, out @ t["lm_head"].T


def _rope_pairs(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotary embedding of channel pairs (2i, 2i + 1), as DeepSeek's (HF de-interleaves
    them first, which permutes q and k alike). x # (n, heads, d)"""
    d = x.shape[-1]
    angles = positions[:, None, None] * base ** (-np.arange(0, d, 2) / d)  # (n, 1, d / 2)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * np.cos(angles) - odd * np.sin(angles)
    out[..., 1::2] = odd * np.cos(angles) + even * np.sin(angles)
    return out


def _mla(x: np.ndarray, t: dict[str, np.ndarray], c: dict) -> np.ndarray:
    """DeepSeek-V3's multi-head latent attention, causal, positions 0..n-1, as HF's
    DeepseekV3Attention (kv_b_proj whole; the low-rank norms' eps 1e-6). x # (n, H)"""
    a, n, heads = "layer.self_attn.", x.shape[0], c["num_attention_heads"]
    nope, rope, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q = _rms(x @ t[a + "q_a_proj.weight"].T, t[a + "q_a_layernorm.weight"], 1e-6)
    q = (q @ t[a + "q_b_proj.weight"].T).reshape(n, heads, nope + rope)
    latent, k_pe = np.split(x @ t[a + "kv_a_proj_with_mqa.weight"].T, [c["kv_lora_rank"]], -1)
    latent = _rms(latent, t[a + "kv_a_layernorm.weight"], 1e-6)
    kv = (latent @ t[a + "kv_b_proj.weight"].T).reshape(n, heads, nope + v_dim)
    positions = np.arange(n, dtype=np.float64)
    q_pe = _rope_pairs(q[..., nope:], positions, c["rope_theta"])
    k_pe = _rope_pairs(k_pe[:, None, :], positions, c["rope_theta"])[:, 0]  # (n, rope): shared
    scores = np.einsum("qhd,khd->hqk", q[..., :nope], kv[..., :nope])
    scores = (scores + np.einsum("qhd,kd->hqk", q_pe, k_pe)) / np.sqrt(nope + rope)
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)  # (heads, n, n)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attn = np.einsum("hqk,khd->qhd", weights, kv[..., nope:]).reshape(n, -1)
    return attn @ t[a + "o_proj.weight"].T


def _deepseek_moe(x: np.ndarray, t: dict[str, np.ndarray], c: dict) -> np.ndarray:
    """DeepseekV3MoE: sigmoid router, experts picked by score + correction bias within the
    best topk_group of n_group groups (a group scored by its two best), weighted by their
    plain scores (normalised) times routed_scaling_factor; plus the shared experts."""
    m, n, groups = "layer.mlp.", x.shape[0], c["n_group"]
    scores = 1.0 / (1.0 + np.exp(-(x @ t[m + "gate.weight"].T)))  # (n, experts)
    choice = (scores + t[m + "gate.e_score_correction_bias"]).reshape(n, groups, -1)
    group_scores = np.sort(choice, -1)[..., -2:].sum(-1)  # (n, groups)
    for i, weakest in enumerate(np.argsort(group_scores, -1)[:, : groups - c["topk_group"]]):
        choice[i, weakest] = 0.0
    choice = choice.reshape(n, -1)
    out = np.zeros_like(x)
    for i in range(n):
        top = np.argsort(-choice[i])[: c["num_experts_per_tok"]]
        weights = scores[i, top] / (scores[i, top].sum() if c["norm_topk_prob"] else 1.0)
        for e, weight in zip(top, weights * c["routed_scaling_factor"], strict=True):
            out[i] += weight * _mlp(x[i], t, m + f"experts.{e}.")
    return out + _mlp(x, t, m + "shared_experts.")


def reference_deepseek_mtp(
    t: dict[str, np.ndarray], c: dict, hidden: np.ndarray, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's DeepSeekMultiTokenPredictorLayer (without its zeroed position 0): eh_proj over
    [enorm(embedding), hnorm(hidden)], the decoder block, shared_head.norm, shared_head.head;
    the layer's own embedding and head where the checkpoint has them."""
    eps = c["rms_norm_eps"]
    embed, head = t.get("own_embed.weight", t["embed"]), t.get("own_head.weight", t["lm_head"])
    parts = [
        _rms(embed[tokens], t["embed_norm.weight"], eps),
        _rms(hidden, t["hidden_norm.weight"], eps),
    ]
    x = np.concatenate(parts, -1) @ t["fc.weight"].T  # (n, H)
    h1 = x + _mla(_rms(x, t["layer.input_layernorm.weight"], eps), t, c)
    y = h1 + _deepseek_moe(_rms(h1, t["layer.post_attention_layernorm.weight"], eps), t, c)
    out = _rms(y, t["norm.weight"], eps)
    return out, out @ head.T


def _checkpoint(folder: Path, family: str) -> dict[str, np.ndarray]:
    """The MTP tensors under the reference's names, the embedding and the LM head."""
    raw = mx.load(str(folder / "model.safetensors"))
    t = {}
    for name, value in raw.items():
        prefix = next((p for p in REFERENCE[family]["names"] if name.startswith(p)), None)
        if prefix is not None:
            t[REFERENCE[family]["names"][prefix] + name[len(prefix) :]] = np.array(
                value, np.float64
            )
    mtp = tuple(REFERENCE[family]["names"])
    embed = next(n for n in raw if n.endswith("embed_tokens.weight") and not n.startswith(mtp))
    t["embed"] = np.array(raw[embed], dtype=np.float64)
    t["lm_head"] = np.array(raw["lm_head.weight"], dtype=np.float64)
    return t


@pytest.mark.parametrize("kind", [*KINDS, "mimo", "deepseek", "deepseek-shared"])
def test_forward_matches_the_numpy_reference(dirs, kind):
    """The module's logits over a prompt's rows, then the drafter's chain (the layer applied
    to its own normed output), against the reference."""
    target, tokenizer = mlx_lm.load(str(dirs[kind]))
    head = load_mtp(dirs[kind], target)
    ids = tokenizer.encode(PROMPT)
    hidden = backbone(target)(mx.array(ids)[None])[0]  # (n, H) after the final norm
    y = head(hidden[:-1], mx.array(ids[1:]), head.make_cache())
    logits = head.logits(head.norm(y))
    family = next((f for f in ("mimo", "deepseek") if kind.startswith(f)), "qwen")
    t, c = _checkpoint(dirs[kind], family), REFERENCE[family]["config"] or TEXT[kind]
    h = np.array(hidden, dtype=np.float64)
    out, expected = reference_mtp(t, family, c, h[:-1], np.array(ids[1:]))
    np.testing.assert_allclose(np.array(logits), expected, atol=1e-4, rtol=1e-4)

    # The drafter: rows for the whole context, then two recursions, at greedy.
    sequence = Sequence(target)
    sequence.capture(target_features(target, "post-norm"))
    sequence.sync(ids)
    drafter = MtpDrafter(head, target_features(target, "post-norm"))
    drafter.prefill(ids, sequence)
    drafted = drafter.propose(ids, 3, SamplingConfig()).tokens.tolist()
    rows, tokens, chain = h[:-1], list(ids[1:]), []
    for _ in range(3):
        out, expected = reference_mtp(t, family, c, rows, np.array(tokens))
        chain.append(int(expected[-1].argmax()))
        rows, tokens = np.concatenate([rows, out[-1:]]), [*tokens, chain[-1]]
    assert drafted == chain


def test_zero_centred_norms_are_shifted_once(dirs, tmp_path):
    """A conversion that stored some norms already shifted (1 + w) loads to the same
    module: each norm is shifted only where its weights average near 0."""
    target, tokenizer = mlx_lm.load(str(dirs["qwen3_5"]))
    tensors = released_mtp("qwen3_5", 3)
    for name in ("mtp.norm.weight", "mtp.layers.0.self_attn.q_norm.weight"):
        tensors[name] = tensors[name] + 1.0
    folder = make_hybrid_dir(tmp_path / "shifted", "qwen3_5", seed=1, extra_tensors=tensors)
    ids = mx.array(tokenizer.encode(PROMPT))
    hidden = backbone(target)(ids[None])[0]

    def logits(folder):
        head = load_mtp(folder, target)
        return head.logits(head.norm(head(hidden[:-1], ids[1:], head.make_cache())))

    np.testing.assert_allclose(
        np.array(logits(folder)), np.array(logits(dirs["qwen3_5"])), atol=1e-5
    )


def test_fused_experts_are_split_as_the_backbone_s():
    """Qwen3.5-MoE stores an MTP layer's experts fused (gate_up_proj, down_proj, as its
    backbone): they load to the same stacked weights as one tensor per expert."""
    split = released_mtp("qwen3_next", 5)
    fused = {n: w for n, w in split.items() if ".experts." not in n}
    m = "mtp.layers.0.mlp.experts."
    n_experts = TEXT["qwen3_next"]["num_experts"]
    gate_up = [
        mx.concatenate([split[f"{m}{e}.gate_proj.weight"], split[f"{m}{e}.up_proj.weight"]])
        for e in range(n_experts)
    ]
    fused[m + "gate_up_proj"] = mx.stack(gate_up)
    fused[m + "down_proj"] = mx.stack([split[f"{m}{e}.down_proj.weight"] for e in range(n_experts)])
    layout = FAMILIES["qwen3_5_moe"]
    from_split, _ = _converted(layout, split, n_experts, "split")
    from_fused, _ = _converted(layout, fused, n_experts, "fused")
    assert from_split.keys() == from_fused.keys()
    for name, value in from_split.items():
        assert mx.array_equal(value, from_fused[name]), name


def test_hidden_states_read_after_or_before_the_final_norm(dirs):
    """post-norm: the state the target's LM head scores; pre-norm: its last layer's output."""
    target, tokenizer = mlx_lm.load(str(dirs["qwen3_5"]))
    ids = tokenizer.encode(PROMPT)
    inner = backbone(target)
    expected = {"post-norm": inner(mx.array(ids)[None])[0]}
    x = inner.embed_tokens(mx.array(ids)[None])
    for layer, cache in zip(inner.layers, target.make_cache(), strict=True):
        x = layer(x, mask=None if layer.is_linear else "causal", cache=cache)
    expected["pre-norm"] = x[0]
    for hidden, rows in expected.items():
        sequence = Sequence(target)
        sequence.capture(target_features(target, hidden))
        sequence.sync([*ids, 0])
        np.testing.assert_allclose(np.array(sequence.feature_rows()), np.array(rows), atol=1e-5)


# --- the loop with it ------------------------------------------------------------------------


def _tokens(models, config: GenerationConfig, ids: list[int]) -> tuple[list[int], int, Session]:
    session = Session(models, config)
    out, accepted = [], 0
    for step in session.steps(ids):
        out.extend(step.tokens)
        accepted += step.n_accepted
    return out, accepted, session


@pytest.mark.parametrize("kind", [*KINDS, "mimo", "deepseek"])
@pytest.mark.parametrize("hidden", ["post-norm", "pre-norm"])
def test_greedy_mtp_equals_plain_decoding(dirs, kind, hidden):
    models = load(str(dirs[f"{kind}-close"]), progress=False)
    ids = models.tokenizer.encode(PROMPT)
    plain, _, _ = _tokens(models, GenerationConfig(method="none", max_tokens=40), ids)
    for k in (1, 3, None):
        config = GenerationConfig(
            method="mtp", options=MtpOptions(hidden), k=k, max_k=4, max_tokens=40
        )
        out, accepted, session = _tokens(models, config, ids)
        assert out == plain, (k, hidden)
        assert accepted > 0 or k is None  # both sides of verification ran
        assert session.drafter.traits.token_cost > 0  # c, measured as a draft model's


def _exact_joint(model, ids, sampling) -> np.ndarray:
    """P(first two tokens) under the target, by enumerating the first. # (vocab, vocab)"""
    first = np.array(warp(model(mx.array(ids)[None])[0, -1], sampling))
    joint = np.zeros((first.size, first.size))
    for a in np.nonzero(first)[0]:
        second = warp(model(mx.array([*ids, int(a)])[None])[0, -1], sampling)
        joint[a] = first[a] * np.array(second)
    return joint


@pytest.mark.parametrize("name", ["sharp", "sharp-next"])  # qwen3_5, qwen3_next
def test_sampling_keeps_the_target_distribution(dirs, name):
    """χ² at T = 1 with top-p: the first two tokens of many responses drafted by the MTP
    layer (k = 1: a kept draft and its bonus token, or the residual's token) follow the
    target's exact joint distribution."""
    from scipy.stats import chisquare

    models = load(str(dirs[name]), progress=False)
    sampling = SamplingConfig(temperature=1.0, top_p=0.9)
    ids = models.tokenizer.encode("The quick")
    joint = _exact_joint(models.target, ids, sampling)
    config = GenerationConfig(method="mtp", k=1, max_tokens=2, sampling=sampling)
    session = Session(models, config)
    mx.random.seed(1234)
    counts, accepted, runs = np.zeros_like(joint), 0, 600
    for _ in range(runs):
        out = []
        for step in session.steps(ids):
            out.extend(step.tokens)
            accepted += step.n_accepted
        counts[out[0], out[1]] += 1
    expected = joint * runs
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    assert observed.size > 10 and accepted > runs / 4
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 0.01


def test_auto_k_prices_mtp_and_decodes_plainly_where_it_does_not_pay(dirs, tmp_path, monkeypatch):
    """-k auto prices each drafted token at the MTP layer's measured c; it drafts ever
    longer chains where every draft is kept, and falls back to plain decoding where none is
    (random MTP weights), probing now and then. The costs are set (memory-bound verify
    calls, c = 0.05) and the loop's clock follows them: a timed calibration of tiny models
    on a loaded machine could price drafting out everywhere."""
    from mlx_lm.models import qwen3_next

    from specmlx.api import methods
    from specmlx.engine.costs import CostProfile

    cheap_rows = CostProfile(0.001, 0.001, {k: 1 + 0.05 * (k - 1) for k in range(1, 17)})
    clock = calibrated_clock(monkeypatch, cheap_rows, qwen3_next.Model, tmp_path)
    monkeypatch.setattr(
        methods,
        "_proposal_costs",
        lambda models, drafter, depths, reps=4: [0.05 * d for d in depths],
    )
    steps = {}
    for name in ("exact", "qwen3_next"):
        models = load(str(dirs[name]), progress=False)
        ids = models.tokenizer.encode(PROMPT)
        session = Session(models, GenerationConfig(method="mtp", max_tokens=48))
        steps[name] = list(session.steps(ids))
        c = session.policy(SamplingConfig()).pricing.c
        assert c == pytest.approx(session.drafter.traits.token_cost) == pytest.approx(0.05)
    assert clock.now > 0  # the target's calls went through the clock
    assert sum(s.n_accepted for s in steps["exact"]) >= 24
    assert max(s.k for s in steps["exact"]) >= 3
    assert sum(s.plain for s in steps["qwen3_next"][-16:]) >= 12


# --- as a user runs it --------------------------------------------------------------------------


def _generate(*args: str) -> dict:
    result = runner.invoke(app, ["generate", "hello", "--json", "--max-tokens", "16", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_generate_with_mtp(dirs):
    """`specmlx generate --target DIR --method mtp` on a Hugging Face layout folder; the
    default method there is mtp, plain decoding where the checkpoint has no MTP tensors."""
    target = str(dirs["qwen3_next-close"])
    plain = _generate("--target", target, "--method", "none")
    spec = _generate("--target", target, "--method", "mtp", "-k", "3")
    assert spec["token_ids"] == plain["token_ids"] and spec["method"] == "mtp"
    assert spec["stats"]["drafted"] > 0
    auto = _generate("--target", target, "--mtp-hidden", "pre-norm")  # -k auto, default method
    assert auto["method"] == "mtp" and auto["config"]["hidden"] == "pre-norm"
    assert auto["token_ids"] == plain["token_ids"]
    assert _generate("--target", str(dirs["plain"]))["method"] == "none"


def _one_line_error(*args: str) -> str:
    result = runner.invoke(app, ["generate", "hello", "--max-tokens", "4", *args])
    assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("error: "), result.output
    return lines[-1]


@pytest.mark.parametrize(
    "change, needle",
    [
        ("missing", "lacks MTP tensor mtp.layers.0.self_attn.k_proj.weight"),
        ("shape", "mtp.fc.weight has shape (64, 64)"),
        ("extra", "does not expect: mtp.layers.0.mlp.shared_expert_gate.weight"),
        ("expert", "lacks MTP tensor mtp.layers.0.mlp.experts.3.up_proj.weight"),
        ("mimo", "lacks MTP tensor model.mtp_layers.0.self_attn.q_proj.bias"),
        ("layers", "has 2 MTP layers"),
        ("fp8", "FP8 MTP tensors (mtp.fc.weight_scale_inv) are not supported"),
    ],
)
def test_a_bad_mtp_checkpoint_is_a_one_line_error_naming_the_tensor(tmp_path, change, needle):
    if change == "mimo":
        tensors = released_mimo_mtp()
        del tensors["model.mtp_layers.0.self_attn.q_proj.bias"]
        folder = make_mimo_dir(tmp_path / change, tensors)
        assert needle in _one_line_error("--target", str(folder), "--method", "mtp", "-k", "2")
        return
    kind = "qwen3_next" if change == "expert" else "qwen3_5"
    tensors = released_mtp(kind)
    if change == "layers":
        tensors["mtp.layers.1.input_layernorm.weight"] = mx.zeros((64,))
    elif change == "missing":
        del tensors["mtp.layers.0.self_attn.k_proj.weight"]
    elif change == "shape":
        tensors["mtp.fc.weight"] = tensors["mtp.fc.weight"][:, :64]
    elif change == "extra":
        tensors["mtp.layers.0.mlp.shared_expert_gate.weight"] = mx.zeros((1, 64))
    elif change == "fp8":
        tensors["mtp.fc.weight_scale_inv"] = mx.ones((1, 1))
    else:
        del tensors["mtp.layers.0.mlp.experts.3.up_proj.weight"]
    folder = make_hybrid_dir(tmp_path / change, kind, seed=1, extra_tensors=tensors)
    assert needle in _one_line_error("--target", str(folder), "--method", "mtp", "-k", "2")


def test_mtp_without_mtp_tensors_is_a_one_line_error(dirs):
    line = _one_line_error("--target", str(dirs["plain"]), "--method", "mtp", "-k", "2")
    assert "needs the MTP tensors (mtp.*)" in line


# --- DeepSeek-V3's next-n layer ---------------------------------------------------------------


def test_fp8_next_n_tensors_are_dequantized_as_the_backbone_s(dirs, tmp_path):
    """A release's FP8 weights (each with its weight_scale_inv over 128 x 128 blocks) load
    as the target's own sanitize dequantizes the backbone's: the same module as their
    values written plainly."""
    target, _ = mlx_lm.load(str(dirs["deepseek"]))
    fp8, plain = released_deepseek_mtp(3), released_deepseek_mtp(3)
    for name in (MTP + "self_attn.q_a_proj.weight", MTP + "mlp.experts.1.gate_proj.weight"):
        fp8[name] = mx.to_fp8(plain[name] * 4.0)
        fp8[name + "_scale_inv"] = mx.full((1, 1), 0.25)
        plain[name] = mx.from_fp8(fp8[name], dtype=mx.float32) * 0.25  # exact: a power of 2
    heads = [
        load_mtp(make_deepseek_dir(tmp_path / kind, 1, tensors), target)
        for kind, tensors in (("fp8", fp8), ("plain", plain))
    ]
    for a, b in zip(*(tree_flatten(h.parameters()) for h in heads), strict=True):
        assert a[0] == b[0] and mx.array_equal(a[1], b[1]), a[0]


def test_cli_generate_with_deepseek_mtp(dirs):
    """`--method mtp` on a DeepSeek-V3 release folder: token for token the plain greedy
    output, drafts kept; mtp is the default method there."""
    target = str(dirs["deepseek-close"])
    plain = _generate("--target", target, "--method", "none")
    spec = _generate("--target", target, "--method", "mtp", "-k", "3")
    assert spec["token_ids"] == plain["token_ids"] and spec["method"] == "mtp"
    assert spec["stats"]["accepted"] > 0
    assert _generate("--target", target, "-k", "2")["method"] == "mtp"


@pytest.mark.parametrize(
    "change, needle",
    [
        ("missing", f"lacks MTP tensor {MTP}self_attn.kv_a_layernorm.weight"),
        ("shape", f"MTP tensor {MTP}eh_proj.weight has shape (64, 64)"),
        ("kv_b", f"MTP tensor {MTP}self_attn.kv_b_proj.weight has shape (128, 16)"),
        ("no kv_b", f"lacks MTP tensor {MTP}self_attn.kv_b_proj.weight"),
        ("expert", f"lacks MTP tensor {MTP}mlp.experts.3.up_proj.weight"),
        ("expert shape", f"MTP tensor {MTP}mlp.experts.2.down_proj.weight has shape (64, 16)"),
        ("head", f"MTP tensor {MTP}shared_head.head.weight has shape (320, 32)"),
        ("layers", "has 2 MTP layers"),
    ],
)
def test_a_bad_next_n_layer_is_a_one_line_error_naming_the_tensor(tmp_path, change, needle):
    tensors, overrides = released_deepseek_mtp(), {}
    if change == "missing":
        del tensors[MTP + "self_attn.kv_a_layernorm.weight"]
    elif change == "shape":
        tensors[MTP + "eh_proj.weight"] = tensors[MTP + "eh_proj.weight"][:, :64]
    elif change == "kv_b":
        tensors[MTP + "self_attn.kv_b_proj.weight"] = tensors[MTP + "self_attn.kv_b_proj.weight"][
            :, :16
        ]
    elif change == "no kv_b":
        del tensors[MTP + "self_attn.kv_b_proj.weight"]
    elif change == "expert":
        del tensors[MTP + "mlp.experts.3.up_proj.weight"]
    elif change == "expert shape":
        name = MTP + "mlp.experts.2.down_proj.weight"
        tensors[name] = tensors[name][:, :16]
    elif change == "head":
        tensors[MTP + "shared_head.head.weight"] = tensors[MTP + "shared_head.head.weight"][:, :32]
    else:
        overrides["num_nextn_predict_layers"] = 2
    folder = make_deepseek_dir(tmp_path / "ds", 1, tensors, **overrides)
    assert needle in _one_line_error("--target", str(folder), "--method", "mtp", "-k", "2")
