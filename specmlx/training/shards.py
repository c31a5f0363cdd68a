"""The feature cache on disk: shards of tokens and the target's features, with a manifest.

A data folder holds `manifest.json` (the target's fingerprint, the feature layers, where the
data came from: what the shards were made of, checked before anything is added), shards
`shard-00000.safetensors` (`tokens` int32 (n,), `features` float16 (n, width), `nexts` int32
(n,) the target's greedy token after each, `lengths` int32 (sequences,); where the features
are layers' outputs, `final` float16 (n, hidden) the final hidden state too) and `index.json`
(the shards, token counts per id, whether every sequence is in). Each shard and each index
is written under a temporary name and renamed into place, so an interruption leaves the
folder as it was after the last whole shard, and the next run continues from there. Data
that grew (more file tokens, more prompts answered, another part after the others) keeps the
sequences that still begin it (`keep_grown`): only the rest is made again, and a sequence
dropped there whose tokens come back later in the new data (a piece of a file after more
answers) is read from the dropped shards, set aside in `.set-aside/` until the caching is
whole (`SetAside`), not from the target again. Features of other
layers for the same sequences are made beside them in `.features-again/` (a data folder of
its own, so a Ctrl-C resumes it) and swapped in once whole (`swap_in`); a swap cut short is
finished by whoever reads the folder next (`read_manifest`).
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from specmlx.errors import SpecmlxError
from specmlx.io.files import write_atomic

MANIFEST, INDEX = "manifest.json", "index.json"
AGAIN = ".features-again"  # in a data folder: new features of its sequences, being made
ASIDE = ".set-aside"  # in a data folder: shards of sequences it dropped, until it is whole
# What a sequence's features depend on besides its tokens: a set-aside shard serves only a
# folder whose manifest agrees on all of them.
SAME_FEATURES = ("fingerprint", "feature_layers", "width", "final", "chunk", "vocab_size")


@dataclass
class FeatureIndex:
    """What the shards of a data folder hold."""

    shards: list[dict[str, Any]] = field(default_factory=list)  # file, sequences, tokens
    n_sequences: int = 0
    n_tokens: int = 0
    complete: bool = False
    counts: dict[str, int] = field(default_factory=dict)  # token id -> occurrences

    def count_array(self, vocab_size: int) -> np.ndarray:
        counts = np.zeros(vocab_size, np.int64)  # (vocab,)
        for token, n in self.counts.items():
            counts[int(token)] = n
        return counts


def write_json(path: Path, data: Any) -> None:
    """`data` as JSON at `path`, whole or not at all."""
    write_atomic(path, json.dumps(data, indent=1))


def read_index(folder: Path) -> FeatureIndex:
    """What the data folder's shards hold (an empty index where none is written yet)."""
    path = folder / INDEX
    if not path.exists():
        return FeatureIndex()
    index = FeatureIndex(**json.loads(path.read_text()))
    lost = [s["file"] for s in index.shards if not (folder / s["file"]).exists()]
    if lost:
        raise SpecmlxError(f"{folder}: shard {lost[0]} is missing; delete the folder to start over")
    return index


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The data folder's manifest (None: it has none), once a swap of new features cut short
    there is finished (`swap_in`): a folder is never read halfway through one."""
    staged = folder / AGAIN
    if (staged / INDEX).exists() and json.loads((staged / INDEX).read_text()).get("complete"):
        swap_in(folder)
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def swap_in(folder: Path) -> None:
    """The whole shards made in `folder/.features-again` take the place of the folder's own.

    Shards go first (each renamed, overwriting the old one of its name), then the manifest,
    then the folder's shards the new index does not name are dropped, and the new index goes
    last: until it is gone from `.features-again`, a rerun (`read_manifest`) finishes the
    same swap, skipping what was moved already."""
    staged = folder / AGAIN
    index = json.loads((staged / INDEX).read_text())
    for shard in index["shards"]:
        if (staged / shard["file"]).exists():
            os.replace(staged / shard["file"], folder / shard["file"])
    if (staged / MANIFEST).exists():
        os.replace(staged / MANIFEST, folder / MANIFEST)
    named = {shard["file"] for shard in index["shards"]}
    for old in folder.glob("shard-*.safetensors"):
        if old.name not in named:
            old.unlink()
    os.replace(staged / INDEX, folder / INDEX)
    for leftover in staged.iterdir():  # temporary files of a shard cut short
        leftover.unlink()
    staged.rmdir()


def cached_sequences(folder: Path, start: int = 0) -> Iterator[list[int]]:
    """The token ids of each sequence the data folder's shards hold, from sequence `start`."""
    n = 0
    for shard in read_index(folder).shards:
        if n + int(shard["sequences"]) > start:
            pieces = _pieces(mx.load(str(folder / shard["file"])))
            yield from pieces[max(start - n, 0) :]
        n += int(shard["sequences"])


def _pieces(arrays: dict[str, mx.array]) -> list[list[int]]:
    """A shard's sequences, each as its token ids."""
    tokens = np.array(arrays["tokens"]).tolist()
    ends = np.cumsum(np.array(arrays["lengths"])).tolist()
    return [tokens[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


class ShardWriter:
    """Appends sequences to a data folder, one shard at a time; resumes where it stopped."""

    def __init__(self, folder: Path, manifest: dict[str, Any], models: Any, shard_tokens: int):
        folder.mkdir(parents=True, exist_ok=True)
        manifest = json.loads(json.dumps(manifest))  # as it will read back: lists, not tuples
        _check_manifest(folder, manifest, models)
        write_json(folder / MANIFEST, manifest)
        self.folder = folder
        self.total = int(manifest["sequences"])
        self.shard_tokens = shard_tokens
        self.index = read_index(folder)
        self._pending: list[tuple[list[int], mx.array, mx.array, mx.array | None]] = []

    @property
    def n_tokens(self) -> int:
        return self.index.n_tokens + sum(len(p[0]) for p in self._pending)

    def add(
        self, tokens: list[int], features: mx.array, nexts: mx.array, final: mx.array | None
    ) -> None:
        self._pending.append((tokens, features, nexts, final))
        if sum(len(p[0]) for p in self._pending) >= self.shard_tokens:
            self._flush()

    def close(self) -> None:
        """Write what is pending (also on Ctrl-C: nothing made is lost) and the index."""
        self._flush()
        self.index.complete = self.index.n_sequences == self.total
        write_json(self.folder / INDEX, asdict(self.index))

    def _flush(self) -> None:
        if not self._pending:
            return
        name = f"shard-{len(self.index.shards):05d}.safetensors"
        tokens = [t for p in self._pending for t in p[0]]
        arrays = {
            "tokens": mx.array(tokens, mx.int32),
            "features": mx.concatenate([p[1] for p in self._pending]),
            "nexts": mx.concatenate([p[2] for p in self._pending]),
            "lengths": mx.array([len(p[0]) for p in self._pending], mx.int32),
        }
        if self._pending[0][3] is not None:
            arrays["final"] = mx.concatenate([p[3] for p in self._pending])
        _save_shard(self.folder, name, arrays)
        # The index is made whole aside and then swapped in: a Ctrl-C in between leaves the
        # old one, and flushing the same pending sequences again rewrites the same shard.
        counts = _count_tokens(tokens, dict(self.index.counts))
        shard = {"file": name, "sequences": len(self._pending), "tokens": len(tokens)}
        index = FeatureIndex(
            shards=[*self.index.shards, shard],
            n_sequences=self.index.n_sequences + len(self._pending),
            n_tokens=self.index.n_tokens + len(tokens),
            counts=counts,
        )
        write_json(self.folder / INDEX, asdict(index))  # the shard counts from now on
        self.index, self._pending = index, []


def _count_tokens(tokens: list[int], counts: dict[str, int]) -> dict[str, int]:
    """`counts` (token id -> occurrences, as the index keeps them) with `tokens` added."""
    for token, n in zip(*np.unique(np.array(tokens), return_counts=True), strict=True):
        counts[str(int(token))] = counts.get(str(int(token)), 0) + int(n)
    return counts


def _check_manifest(folder: Path, manifest: dict[str, Any], models: Any) -> None:
    saved = read_manifest(folder)
    if saved is None:
        if any(folder.glob("shard-*.safetensors")):
            raise SpecmlxError(f"{folder} holds shards but no {MANIFEST}; delete it to start over")
        return
    if saved.get("fingerprint") != manifest["fingerprint"]:
        from specmlx.heads.base import check_target

        check_target(saved.get("fingerprint", {}), models.target, models.tokenizer)
        raise SpecmlxError(
            f"{folder} holds features of another copy of this target (other weights or "
            "quantization); use another data folder or delete it"
        )
    differ = [key for key in manifest if saved.get(key) != manifest[key]]
    if differ:
        raise SpecmlxError(
            f"{folder} holds features made with other settings ({', '.join(differ)} differ); "
            "use another data folder or delete it"
        )


def keep_grown(
    folder: Path,
    manifest: dict[str, Any],
    unchanged: Callable[[dict[str, Any]], Callable[[int, list[int]], bool]],
) -> tuple[int, int] | None:
    """Where `folder` holds features of other data for the same target and features (only
    the manifest's `source` and `sequences` differ), keep its leading sequences that are
    still sequence i of the new data (`unchanged(saved source)(i, tokens)`): the shards
    they fill whole, and the first of them in the shard where the new data departs (that
    shard cut short, under a new name), drop the others and take the new manifest. Returns
    (sequences kept, sequences held), or None where nothing changed; a folder whose first
    sequence does not begin the new data is left for the manifest check to refuse (it is
    other data, not more of it).

    The cut shard is written first, then the index, then the manifest, and the dropped
    shards go last, so an interruption anywhere leaves a folder the next run reads (and
    trims) alike, whichever data it is run with."""
    path, saved = folder / MANIFEST, read_manifest(folder)
    if saved is None:
        return None
    manifest = json.loads(json.dumps(manifest))
    data_keys = ("source", "sequences")
    if saved == manifest or any(
        saved.get(k) != manifest[k] for k in manifest if k not in data_keys
    ):
        return None
    index = read_index(folder)
    if not index.shards:  # nothing made yet, nothing to lose
        write_json(path, manifest)
        return 0, 0
    same, kept, n = unchanged(saved["source"]), [], 0
    for shard in index.shards:
        arrays = mx.load(str(folder / shard["file"]))
        pieces = _pieces(arrays)
        held_here = len(pieces)
        pieces = pieces[: max(int(manifest["sequences"]) - n, 0)]
        count = next((j for j, piece in enumerate(pieces) if not same(n + j, piece)), len(pieces))
        if count == 0:
            break
        whole = count == held_here
        if not whole:  # the new data departs inside this shard: keep its beginning
            shard = _cut(folder, shard["file"], arrays, count)
        kept.append((shard, [t for piece in pieces[:count] for t in piece]))
        n += count
        if not whole:
            break
    if not kept:
        return None
    grown = FeatureIndex(shards=[shard for shard, _ in kept], n_sequences=n)
    grown.n_tokens = sum(len(tokens) for _, tokens in kept)
    grown.complete = n == int(manifest["sequences"])
    grown.counts = _count_tokens([t for _, tokens in kept for t in tokens], {})
    write_json(folder / INDEX, asdict(grown))
    write_json(path, manifest)
    held = {shard["file"] for shard, _ in kept}
    _set_aside(folder, saved, [s["file"] for s in index.shards if s["file"] not in held])
    return n, index.n_sequences


def _set_aside(folder: Path, manifest: dict[str, Any], files: list[str]) -> None:
    """Move the shards `files` of `folder` (made under `manifest`) to its `ASIDE` folder,
    whose manifest goes first: a shard there is never read under another's. Shards set
    aside under other features are dropped."""
    aside = _aside_for(folder, manifest)
    aside.mkdir(exist_ok=True)
    if not (aside / MANIFEST).exists():
        write_json(aside / MANIFEST, manifest)
    for name in files:
        if not (folder / name).exists():
            continue
        target, n = aside / name, 0
        while target.exists():  # set aside by an earlier change: both are kept
            n += 1
            target = aside / f"{name.removesuffix('.safetensors')}-{n}.safetensors"
        os.replace(folder / name, target)


def _aside_for(folder: Path, manifest: dict[str, Any]) -> Path:
    """`folder`'s `ASIDE` folder, dropped first where it holds shards of other features
    than `manifest`'s (or no manifest of its own)."""
    aside, saved = folder / ASIDE, folder / ASIDE / MANIFEST
    if aside.exists():
        held = json.loads(saved.read_text()) if saved.exists() else {}
        if not saved.exists() or any(held.get(k) != manifest.get(k) for k in SAME_FEATURES):
            shutil.rmtree(aside)
    return aside


Held = tuple[list[int], mx.array, mx.array, mx.array | None]  # tokens, features, nexts, final


class SetAside:
    """The sequences `keep_grown` set aside in a data folder, found again: a sequence of the
    new data whose tokens are known before the target reads them (a piece of a file) by its
    tokens, the target's greedy answer to a prompt by the prompt (`answer`). Shards set
    aside under other features than `manifest`'s are dropped on opening; `clear` drops them
    all once the caching is whole."""

    def __init__(self, folder: Path, manifest: dict[str, Any]):
        self.folder = _aside_for(folder, manifest)
        self.stops = frozenset(int(i) for i in manifest.get("eos_ids", ()))
        # (tokens, shard, start) of every set-aside sequence, sorted by tokens: a sequence
        # and every sequence a prompt begins sit together. None: not read yet.
        self._sorted: list[tuple[tuple[int, ...], str, int]] | None = None
        self._open: tuple[str, dict[str, mx.array]] | None = None

    def take(self, tokens: list[int]) -> Held | None:
        """(tokens, features, nexts, final) of a set-aside sequence of these tokens, or None."""
        key = tuple(tokens)
        for held, name, start in self._beginning(key):
            if held == key:
                return self._read(name, start, start + len(key), tokens)
        return None

    def answer(self, prompt: list[int], max_tokens: int) -> Held | None:
        """A set-aside sequence that is `prompt` and the target's greedy answer to it, cut
        to `max_tokens` answer tokens: every answer token is the target's own next token
        there (its `nexts`), and the answer ends on a stop token or runs `max_tokens` long.
        None where no such sequence is held (an answer sampled, or cut shorter)."""
        head = tuple(prompt)
        for tokens, name, start in self._beginning(head):
            answer = tokens[len(head) :][:max_tokens]
            if not answer or (len(answer) < max_tokens and answer[-1] not in self.stops):
                continue  # cut shorter than this run's answers, or no answer
            if any(t in self.stops for t in answer[:-1]):
                continue
            end = len(head) + len(answer)
            held = self._read(name, start, start + end, list(tokens[:end]))
            nexts = np.array(held[2][len(head) - 1 : end - 1])
            if np.array_equal(nexts, np.array(answer)):  # greedy all along
                return held
        return None

    def _beginning(self, head: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], str, int]]:
        """The set-aside sequences that begin with `head`, in token order."""
        if self._sorted is None:
            self._sorted = self._index()
        for entry in self._sorted[bisect.bisect_left(self._sorted, (head,)) :]:
            if entry[0][: len(head)] != head:
                return
            yield entry

    def _read(self, name: str, start: int, end: int, tokens: list[int]) -> Held:
        if self._open is None or self._open[0] != name:
            self._open = (name, mx.load(str(self.folder / name)))
        arrays = self._open[1]
        final = arrays["final"][start:end] if "final" in arrays else None
        return tokens, arrays["features"][start:end], arrays["nexts"][start:end], final

    def _index(self) -> list[tuple[tuple[int, ...], str, int]]:
        entries: list[tuple[tuple[int, ...], str, int]] = []
        if not self.folder.exists():
            return entries
        for path in sorted(self.folder.glob("shard-*.safetensors")):
            start = 0
            for piece in _pieces(mx.load(str(path))):
                entries.append((tuple(piece), path.name, start))
                start += len(piece)
        return sorted(entries)

    def clear(self) -> None:
        self._open = None
        if self.folder.exists():
            shutil.rmtree(self.folder)


def _cut(folder: Path, name: str, arrays: dict[str, mx.array], count: int) -> dict[str, Any]:
    """Shard `name`'s first `count` sequences, written as a shard of their own (a name no
    writer gives, never the shard it is cut from); its index entry."""
    lengths = np.array(arrays["lengths"])
    n_tokens = int(lengths[:count].sum())
    cut = {k: v[:count] if k == "lengths" else v[:n_tokens] for k, v in arrays.items()}
    new = f"{name.removesuffix('.safetensors')}-{count}of{len(lengths)}.safetensors"
    _save_shard(folder, new, cut)
    return {"file": new, "sequences": count, "tokens": n_tokens}


def _save_shard(folder: Path, name: str, arrays: dict[str, mx.array]) -> None:
    """`arrays` as shard `name` of `folder`, whole or not at all."""
    tmp = folder / f".{name}.tmp.safetensors"  # mlx keeps the suffix it needs
    mx.save_safetensors(str(tmp), arrays, metadata={"format": "specmlx-features"})
    os.replace(tmp, folder / name)


@dataclass(frozen=True)
class FeatureData:
    """Every shard of a data folder, joined, in memory."""

    manifest: dict[str, Any]
    index: FeatureIndex
    tokens: np.ndarray  # (n,) int32
    nexts: np.ndarray  # (n,) int32: the target's greedy token after each
    features: mx.array  # (n, width) float16
    starts: np.ndarray  # (sequences + 1,) where each sequence starts; the last is n


def open_shards(
    folder: Path, *, whole: bool = False, layers: tuple[int, ...] | None = None
) -> FeatureData:
    """The data folder's shards (`whole`: refuse a folder whose caching was cut short).

    `layers`: the features wanted, refused if the folder lacks them; `()` (the final hidden
    state) also reads a folder of layers' features that keeps the final one beside them.
    None: the folder's own features."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise SpecmlxError(f"{folder} holds no cached features (no {MANIFEST})")
    key = "features"
    if layers is not None and tuple(manifest["feature_layers"]) != tuple(layers):
        if layers or not manifest.get("final"):
            raise SpecmlxError(
                f"{folder} holds the features of layers {manifest['feature_layers'] or 'final'}"
                f", not of {list(layers) or 'final'}"
            )
        key = "final"
        hidden = int(manifest["width"]) // len(manifest["feature_layers"])
        manifest = manifest | {"feature_layers": [], "width": hidden}
    index = read_index(folder)
    if whole and not index.complete:
        raise SpecmlxError(
            f"{folder} holds {index.n_sequences} of {manifest['sequences']} sequences: "
            "caching was cut short; run it again to finish"
        )
    parts = [mx.load(str(folder / s["file"])) for s in index.shards]
    width = int(manifest["width"])
    if not parts:
        empty = np.zeros(0, np.int32)
        return FeatureData(manifest, index, empty, empty, mx.zeros((0, width)), np.zeros(1, int))
    lengths = np.concatenate([np.array(p["lengths"]) for p in parts])
    return FeatureData(
        manifest,
        index,
        np.concatenate([np.array(p["tokens"]) for p in parts]),
        np.concatenate([np.array(p["nexts"]) for p in parts]),
        mx.concatenate([p[key] for p in parts]),
        np.concatenate([[0], np.cumsum(lengths)]),
    )
