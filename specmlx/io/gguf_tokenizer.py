"""Rebuilding a Hugging Face `tokenizer.json` from the tokenizer a GGUF file describes.

A GGUF carries no tokenizer file, only llama.cpp's description of one: the vocabulary
(`tokenizer.ggml.tokens`), its merges, a type per token (normal, control, user-defined, ...),
the special token ids, and a name for the pre-tokenizer (`tokenizer.ggml.pre`). Two families
cover the models we convert:

- `gpt2`: byte-level BPE (SmolLM2, Qwen2.5). The merges are in the file; the split regex is
  named by `tokenizer.ggml.pre`.
- `llama` on a Gemma architecture: SentencePiece BPE with byte fallback. Gemma files carry no
  merges, so we recover them from the vocabulary, whose order is the merge order.

Control tokens become special added tokens and user-defined ones plain added tokens, so both
match whole in text, as llama.cpp matches them.
"""

from __future__ import annotations

from gguf import TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pre
from tokenizers.processors import TemplateProcessing

from specmlx.errors import SpecmlxError

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# StarCoder-family vocabularies (SmolLM) see digits one at a time before GPT-2's split.
_DIGITS_FIRST = {"smollm", "starcoder", "refact", "codeshell"}
_GEMMA = {"gemma", "gemma2", "gemma3"}
# Tokens that end a turn or a document; each one the vocabulary has is a stop token.
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end_of_text|>")


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (`bytes_to_unicode`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return spelling


def _byte_level(meta: dict) -> Tokenizer:
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    # Vocabulary tokens are stored in GPT-2's spelling already; a raw one (an added token with a
    # space, say) is respelled so the model's table has no holes.
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(meta["tokenizer.ggml.tokens"])
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab, merges, continuing_subword_prefix="", end_of_word_suffix=""))
    name = meta.get("tokenizer.ggml.pre", "default")
    if name in _SPLITS:
        tok.pre_tokenizer = pre.Sequence(
            [
                pre.Split(Regex(_SPLITS[name]), behavior="isolated"),
                pre.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif name in _DIGITS_FIRST:
        tok.pre_tokenizer = pre.Sequence(
            [pre.Digits(individual_digits=True), pre.ByteLevel(add_prefix_space=False)]
        )
    else:  # "gpt2", "default" and the rest: GPT-2's own split
        tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def sentencepiece_merges(tokens: list[str]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies, best first.

    Every split of a token into two tokens of the vocabulary is a merge producing it; a token
    earlier in the file is a merge learned earlier. Ties go to the longer left piece, then to the
    longer right piece, then to the lower ids (transformers' `generate_merges`).
    """
    vocab = {tok: i for i, tok in enumerate(tokens)}
    rank = {tok: -i for i, tok in enumerate(tokens)}
    found = []
    for merged, score in rank.items():
        pairs = [(merged[:k], merged[k:]) for k in range(1, len(merged)) if merged[:k] in vocab]
        pairs = [(left, right) for left, right in pairs if right in vocab]
        pairs.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found.extend((left, right, score) for left, right in pairs)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _gemma(meta: dict) -> Tokenizer:
    # Gemma stores its whitespace-run tokens as real spaces; the model looks them up as "▁▁".
    tokens = [
        "\u2581" * len(t) if " " in t and not t.strip() else t
        for t in meta["tokenizer.ggml.tokens"]
    ]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    unk = tokens[meta.get("tokenizer.ggml.unknown_token_id", 3)]
    bpe = models.BPE(
        vocab, sentencepiece_merges(tokens), unk_token=unk, fuse_unk=True, byte_fallback=True
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok


def _add_special_tokens(tok: Tokenizer, meta: dict, byte_level: bool) -> None:
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or []
    alphabet = set(_byte_alphabet().values())
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel in a byte-level
    # vocabulary (it is not a token the model has); leave it to the BPE.
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, types, strict=False)
        if kind == TokenType.CONTROL and (not byte_level or set(t) <= alphabet)
    ]
    tok.add_special_tokens(control)
    vocab = tok.get_vocab()
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == TokenType.USER_DEFINED and t in vocab
    ]
    tok.add_tokens(user)


def special_token(meta: dict, key: str) -> str | None:
    """The text of the token `tokenizer.ggml.<key>_token_id` names, if any."""
    token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
    tokens = meta["tokenizer.ggml.tokens"]
    return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None


def build_tokenizer(meta: dict) -> tuple[Tokenizer, dict]:
    """`(tokenizer, tokenizer_config)` for the tokenizer the GGUF metadata `meta` describes."""
    kind = meta.get("tokenizer.ggml.model")
    arch = meta.get("general.architecture")
    if "tokenizer.ggml.tokens" not in meta:
        raise SpecmlxError("the GGUF file has no tokenizer (no tokenizer.ggml.tokens)")
    if kind == "gpt2":
        tok = _byte_level(meta)
    elif kind == "llama" and arch in _GEMMA:
        tok = _gemma(meta)
    else:
        raise SpecmlxError(f"tokenizer {kind!r} of architecture {arch!r} is not supported")
    _add_special_tokens(tok, meta, byte_level=kind == "gpt2")

    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    bos, eos = special_token(meta, "bos"), special_token(meta, "eos")
    single = ([bos] if add_bos and bos else []) + ["$A"] + ([eos] if add_eos and eos else [])
    pair = single + [f"{t}:1" if t != "$A" else "$B:1" for t in single]
    specials = [(t, tok.token_to_id(t)) for t in {bos, eos} if t and t in single]
    tok.post_processor = TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": special_token(meta, "unknown"),
        "pad_token": special_token(meta, "padding"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{arch}.context_length", 0)) or 1 << 30,
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return tok, config


def stop_token_ids(meta: dict) -> list[int]:
    """The GGUF's EOS id, then every other turn- or document-ending token the vocabulary has."""
    tokens = meta["tokenizer.ggml.tokens"]
    ids = [meta["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in meta else []
    index = {t: i for i, t in enumerate(tokens) if t in END_TOKENS}
    return ids + [index[t] for t in END_TOKENS if t in index and index[t] not in ids]
