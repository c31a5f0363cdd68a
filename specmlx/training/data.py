"""Training data for heads: token sequences, and the target's features over them.

Heads learn to guess what the target will say next from the target's own hidden states, so
the best data is the target's own output (self-distillation, as Medusa-2 and EAGLE do):
`generate_corpus` has the target answer a set of prompts (the shipped `train_prompts.jsonl`,
held out from the bench suites, or the user's). `file_corpus` cuts the user's own text or
code into sequences instead. Either is a `Corpus`: sequences produced on demand, so that a
resumed `cache_features` does not generate again what its shards already hold.

`cache_features` runs the target once over every sequence and keeps, per token, the hidden
state its drafters read (`FeatureSpec`) and the target's own next token (the argmax of the
same call's logits), in shards on disk (`specmlx.training.shards`). Training then never runs
the target again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import shutil
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Sequence as SequenceABC
from contextlib import contextmanager
from dataclasses import replace
from fnmatch import fnmatch
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt, generate
from specmlx.api.models import Models
from specmlx.engine.anatomy import hidden_size
from specmlx.engine.cache import make_cache
from specmlx.engine.features import FeatureSpec, capturing
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import SpecmlxError, UsageError
from specmlx.io.files import write_atomic
from specmlx.progress import note, progress_bar
from specmlx.training.answers import Answered, answer_batch
from specmlx.training.shards import (
    AGAIN,
    FeatureIndex,
    SetAside,
    ShardWriter,
    cached_sequences,
    keep_grown,
    open_shards,
    read_index,
    read_manifest,
    swap_in,
)

CHUNK = 512  # tokens per target call when caching features (long sequences go in pieces)
SHARD_TOKENS = 1 << 16


Featured = tuple[list[int], mx.array, mx.array, mx.array | None]  # as ShardWriter.add takes
# A prompt's greedy answer made before (prompt ids, max tokens -> the row), or None.
Known = Callable[[list[int], int], Answered | None]


class Leaf(NamedTuple):
    """One part of a corpus (`Corpus.leaves`): its source, its count of sequences, and the
    prompts it answers, where it is the target's answers."""

    source: dict[str, Any]
    count: int
    prompts: list[str] | None = None


class Corpus(SequenceABC):
    """Token sequences made on demand (`make(i)`), and a record of where they come from.

    `source` is plain data: the feature cache keeps it in its manifest and refuses to
    resume over shards made from other data. `featured(i, spec, known)`, where given, makes
    sequence i with the target's features over it from the same calls (the target's own
    answers: `specmlx.training.answers`), tokens, features, next tokens, final states;
    `known` (None, or `Known`) gives the greedy answers already made to prompts, which it
    takes instead of answering them again."""

    def __init__(
        self,
        source: dict[str, Any],
        count: int,
        make: Callable[[int], list[int]],
        featured: Callable[[int, FeatureSpec, Known | None], Featured] | None = None,
        prompts: list[str] | None = None,
    ):
        self.source = source
        self._count = count
        self._make = make
        self._featured = featured
        self.leaves = [Leaf(source, count, prompts)]  # the parts it joins

    def with_features(
        self, i: int, spec: FeatureSpec, known: Known | None = None
    ) -> Featured | None:
        """Sequence i and the target's features over it, where the corpus makes them
        together; None where they are to be read by a pass of their own."""
        if not 0 <= i < self._count:
            raise IndexError(i)
        return None if self._featured is None else self._featured(i, spec, known)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> list[int]:  # type: ignore[override]
        if not 0 <= i < self._count:
            raise IndexError(i)
        return self._make(i)

    def __add__(self, other: Corpus) -> Corpus:  # type: ignore[override]
        def make(i: int) -> list[int]:
            return self[i] if i < len(self) else other[i - len(self)]

        def featured(i: int, spec: FeatureSpec, known: Known | None) -> Featured | None:
            n = len(self)
            if i < n:
                return self.with_features(i, spec, known)
            return other.with_features(i - n, spec, known)

        count = len(self) + len(other)
        joined = Corpus({"parts": [self.source, other.source]}, count, make, featured)
        joined.leaves = self.leaves + other.leaves
        return joined


def train_prompts() -> list[str]:
    """The shipped self-distillation prompts: code in several languages, explanations,
    extraction to JSON, summaries, chat, creative writing; none of them a bench prompt."""
    text = resources.files("specmlx").joinpath("data/train_prompts.jsonl").read_text("utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


ANSWERED = "answered-prompts.jsonl"  # in a data folder: the prompts its answers answer


def write_answered(folder: Path, prompts: list[str]) -> None:
    """Keep the prompts a data folder's answers answer, in order, beside its features: where
    each answer starts is told from them later (`prompt_positions`, eval-heads)."""
    _write_prompts(folder / ANSWERED, prompts)


def read_answered(folder: Path) -> list[str] | None:
    """The prompts `write_answered` kept in `folder`, if it did."""
    path = folder / ANSWERED
    return read_prompts(path) if path.is_file() else None


def kept_prompts(path: Path, make: Callable[[], list[str]]) -> list[str]:
    """The prompts kept in `path` where it exists, else those `make` makes, kept there
    (written whole or not at all): a resumed run answers the same prompts without making
    them again."""
    if path.is_file():
        return read_prompts(path)
    prompts = make()
    _write_prompts(path, prompts)
    return prompts


def read_prompts(path: Path) -> list[str]:
    """The prompts of a JSONL file of {"prompt": ...} lines."""
    return [json.loads(line)["prompt"] for line in path.read_text("utf-8").splitlines()]


def _write_prompts(path: Path, prompts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


def generate_corpus(
    models: Models,
    prompts: Iterable[str] | None = None,
    max_tokens: int = 256,
    seed: int = 0,
    sampling: SamplingConfig | None = None,
    chat_template: bool = True,
    batch_size: int = 1,
    samples: int = 1,
    temperature: float = 0.8,
) -> Corpus:
    """The target's own answers to `prompts` (default: `train_prompts()`), each as one
    sequence of prompt ids (through the chat template) + answer ids (the stop token too).

    Greedy by default. `samples` > 1 adds answers sampled at `temperature` (top-p 0.95):
    sequence k·n + i is the k-th answer to prompt i of n, so the data holds the target's
    likely turns as well as its single most likely one (its greedy next tokens stay the
    labels). `batch_size` 1 decodes plainly through `specmlx.api`, with a sampler drawing
    sequence j from seed `seed + j`; more answers `batch_size` prompts at once
    (`specmlx.training.answers`: several times the tokens per second on a memory-bound
    machine, and the features cached from the very calls that answer; block b of answer k
    drawn from seed `seed + k·blocks + b`). Either way a sequence is the same whenever it
    is made, alone or in a resumed run. Batched, a block's greedy answers that `known`
    already holds (what an earlier run of the cache made) are taken from there: only the
    other prompts of the block are answered."""
    prompts = list(train_prompts() if prompts is None else prompts)
    if not prompts:
        raise UsageError("no prompts to generate training data from")
    if batch_size < 1 or samples < 1:
        raise UsageError(f"batch size and samples must be at least 1, got {batch_size}, {samples}")
    sampling = sampling or SamplingConfig()
    sampled = SamplingConfig(temperature=temperature, top_p=0.95) if samples > 1 else sampling
    n = len(prompts)
    n_blocks = -(-n // batch_size)
    # The newest block of a batched run, and the features made with it (None: none).
    blocks: dict[tuple[int, int], tuple[FeatureSpec | None, list[Answered]]] = {}

    def answered(
        j: int, spec: FeatureSpec | None, known: Known | None = None
    ) -> tuple[list[int], Answered]:
        k, i = divmod(j, n)
        block = i // batch_size
        made = blocks.get((k, block))
        if made is None or (spec is not None and made[0] != spec):
            first = block * batch_size
            ids = [
                encode_prompt(models, p, chat_template) for p in prompts[first : first + batch_size]
            ]
            blocks.clear()
            how = sampling if k == 0 else sampled
            rows: list[Answered | None] = [None] * len(ids)
            if known is not None and spec is not None and how.temperature == 0:
                rows = [known(p, max_tokens) for p in ids]
            missing = [r for r, row in enumerate(rows) if row is None]
            if missing:
                draw = seed + k * n_blocks + block
                fresh = answer_batch(models, [ids[r] for r in missing], max_tokens, how, draw, spec)
                for r, row in zip(missing, fresh, strict=True):
                    rows[r] = row
            blocks[k, block] = made = spec, [row for row in rows if row is not None]
        return encode_prompt(models, prompts[i], chat_template), made[1][i % batch_size]

    def make(j: int) -> list[int]:
        if batch_size > 1:
            prompt_ids, row = answered(j, None)
            return prompt_ids + row.answer
        k, i = divmod(j, n)
        config = GenerationConfig(
            method="none",
            max_tokens=max_tokens,
            sampling=sampling if k == 0 else sampled,
            chat_template=chat_template,
        )
        prompt_ids = encode_prompt(models, prompts[i], chat_template)
        return prompt_ids + generate(models, prompts[i], replace(config, seed=seed + j)).token_ids

    def featured(j: int, spec: FeatureSpec, known: Known | None) -> Featured:
        prompt_ids, row = answered(j, spec, known)
        assert row.features is not None and row.nexts is not None
        return prompt_ids + row.answer, row.features, row.nexts, row.finals

    source = {
        "kind": "generated",
        "prompts": len(prompts),
        "prompts_sha256": prompt_set_sha256(prompts),
        "max_tokens": max_tokens,
        "seed": seed,
        "sampling": vars(sampling),
        "chat_template": chat_template,
        "batch_size": batch_size,
    }
    if samples > 1:
        source |= {"samples": samples, "sampled": vars(sampled)}
    featuring = featured if batch_size > 1 else None
    return Corpus(source, n * samples, make, featuring, prompts=prompts)


def sequence_groups(source: dict[str, Any], n: int) -> list[int]:
    """A group per cached sequence: the answers to one prompt share one (held out together,
    or trained on together); any other sequence is a group of its own. # (n,)

    Reads the corpus' recorded `source`: generated parts are laid out as `generate_corpus`
    makes them, k·prompts + i; the first part that is not generated ends the reading."""
    groups: list[int] = []
    first = 0  # the next part's first group
    for part in source_parts(source):
        if part.get("kind") != "generated":
            break
        prompts = int(part["prompts"])
        groups += [first + j % prompts for j in range(prompts * int(part.get("samples", 1)))]
        first += prompts
    return groups[:n] + list(range(first, first + n - len(groups)))


def answer_sequences(source: dict[str, Any]) -> int:
    """How many of a cache's first sequences are the target's answers: those of its leading
    generated parts (pieces of files come after them)."""
    count = 0
    for part in source_parts(source):
        if part.get("kind") != "generated":
            break
        count += int(part["prompts"]) * int(part.get("samples", 1))
    return count


def split_parts(source: dict[str, Any], ids: list[int]) -> dict[str, list[int]]:
    """The cached sequences `ids` by what they are: the target's answers, pieces of files
    (a part with none of them left out). Held-out top-1 is scored on each apart: heads draft
    answers, and a few pieces of files outweigh many short answers in positions."""
    answers = answer_sequences(source)
    parts = {"answers": [i for i in ids if i < answers], "files": [i for i in ids if i >= answers]}
    return {part: members for part, members in parts.items() if members}


def prompt_positions(
    models: Models, source: dict[str, Any], n: int, prompts: list[str] | None = None
) -> list[int] | None:
    """Per cached sequence, its prompt's positions but the last (whose next token is the
    answer's first): those whose next token is a prompt token. 0 for pieces of files. # (n,)

    Read from the corpus' recorded `source`, its prompts told by their hash among `prompts`
    and the shipped set; None when a part's prompts are neither, or when a generated part
    follows files (whose count of pieces is not recorded)."""
    candidates = [c for c in (prompts, train_prompts()) if c is not None]
    parts = source_parts(source)
    skip: list[int] = []
    for i, part in enumerate(parts):
        if part.get("kind") != "generated":
            if i != len(parts) - 1:
                return None
            continue
        count = int(part["prompts"])
        texts = next(
            (
                c[:count]
                for c in candidates
                if prompt_set_sha256(c[:count]) == part["prompts_sha256"]
            ),
            None,
        )
        if texts is None:
            return None
        lengths = [len(encode_prompt(models, p, part["chat_template"])) - 1 for p in texts]
        skip += lengths * int(part.get("samples", 1))  # answer k to prompt i: sequence k·n + i
    return skip[:n] + [0] * (n - len(skip))


def source_parts(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The leaf parts of a corpus' recorded source, in order (joined corpora nest them)."""
    if "parts" not in source:
        return [source]
    return [leaf for part in source["parts"] for leaf in source_parts(part)]


def file_corpus(
    paths: Iterable[str | Path],
    tokenizer: Any,
    seq_len: int = 512,
    min_tokens: int = 16,
    max_tokens: int | None = None,
    seed: int = 0,
    exclude: Iterable[str] = (),
) -> Corpus:
    """The user's text or code files cut into sequences of `seq_len` tokens.

    `paths` are files, folders (every file under them, hidden ones skipped) or glob patterns
    (`src/**/*.py`); a file whose path matches a pattern in `exclude` (`*/test/*`) is left
    out. Files that are not UTF-8 text are skipped; each file is cut on its own,
    and a last piece shorter than `min_tokens` is dropped. `max_tokens` reads files in an
    order drawn from `seed` (a sample of a large tree, not its first folders) until that
    many tokens are in; None reads them all, in path order."""
    if seq_len < 2:
        raise UsageError(f"seq-len must be at least 2, got {seq_len}")
    if max_tokens is not None and max_tokens < 1:
        raise UsageError(f"file tokens must be at least 1, got {max_tokens}")
    exclude = list(exclude)
    files = matching_files(paths, exclude)
    if max_tokens is not None:
        files = [files[i] for i in np.random.default_rng(seed).permutation(len(files))]
    pieces: list[list[int]] = []
    digest = hashlib.sha256()
    n_read = n_tokens = 0
    for file in files:
        if max_tokens is not None and n_tokens >= max_tokens:
            break
        try:
            text = file.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        n_read += 1
        digest.update(str(file).encode() + b"\0" + text.encode() + b"\0")
        ids = tokenizer.encode(text, add_special_tokens=False)
        if max_tokens is not None:
            ids = ids[: max_tokens - n_tokens]
        for start in range(0, len(ids), seq_len):
            piece = ids[start : start + seq_len]
            if len(piece) >= min_tokens:
                pieces.append(piece)
                n_tokens += len(piece)
    if not pieces:
        raise UsageError(f"no text in {', '.join(map(str, paths))} to train on")
    source = {
        "kind": "files",
        "files": n_read,
        "sha256": digest.hexdigest(),
        "seq_len": seq_len,
    }
    if max_tokens is not None:
        source |= {"max_tokens": max_tokens, "seed": seed}
    if exclude:
        source["exclude"] = exclude
    return Corpus(source, len(pieces), pieces.__getitem__)


def matching_files(paths: Iterable[str | Path], exclude: Iterable[str] = ()) -> list[Path]:
    """The files `paths` name (files, folders: every file under them, hidden ones skipped,
    or glob patterns), sorted, those whose path matches a pattern in `exclude` left out."""
    exclude = list(exclude)
    return [f for f in _expand(paths) if not any(fnmatch(str(f), x) for x in exclude)]


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    files: set[Path] = set()
    for path in map(str, paths):
        matches = glob.glob(path, recursive=True) if glob.has_magic(path) else [path]
        if not matches:
            raise UsageError(f"no files match {path}")
        for match in map(Path, matches):
            if match.is_dir():
                files.update(
                    f
                    for f in match.rglob("*")
                    if f.is_file()
                    and not any(p.startswith(".") for p in f.relative_to(match).parts)
                )
            elif match.is_file():
                files.add(match)
            else:
                raise UsageError(f"no such file or folder: {match}")
    return sorted(files)


def prompt_set_sha256(prompts: list[str]) -> str:
    """What a generated corpus records of its prompts."""
    return _sha256(json.dumps(prompts).encode())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def target_features(
    model: Any, tokens: list[int], spec: FeatureSpec, chunk: int = CHUNK
) -> tuple[mx.array, mx.array, mx.array | None]:
    """The target's features at each token, its greedy next token after each and, when the
    features are layers' outputs, its final hidden state too (what Medusa and EAGLE-1 heads
    read: one cache then trains every kind), from one pass over `tokens` (in pieces of
    `chunk` through a cache). # (n, width), (n,), (n, hidden) | None"""
    cache = make_cache(model)
    rows, nexts, finals = [], [], []
    # The final state is tapped apart only beside layers (the spec's own tap otherwise).
    final_spec = FeatureSpec() if spec.layers else None
    with capturing(model, spec) as seen, _maybe_capturing(model, final_spec) as final:
        for start in range(0, len(tokens), chunk):
            piece = mx.array(tokens[start : start + chunk], mx.uint32)[None]
            logits = model(piece, cache=cache)[0]  # (m, vocab)
            rows.append(seen.latest()[0].astype(mx.float16))
            nexts.append(mx.argmax(logits, axis=-1).astype(mx.int32))
            if final is not None:
                finals.append(final.latest()[0].astype(mx.float16))
            mx.eval(rows[-1], nexts[-1], finals[-1:], [c.state for c in cache])
    final_rows = mx.concatenate(finals) if finals else None
    return mx.concatenate(rows), mx.concatenate(nexts), final_rows


@contextmanager
def _maybe_capturing(model: Any, spec: FeatureSpec | None) -> Iterator[Any]:
    if spec is None:
        yield None
        return
    with capturing(model, spec) as seen:
        yield seen


def cache_features(
    models: Models,
    corpus: Corpus,
    spec: FeatureSpec,
    out_dir: Path,
    shard_tokens: int = SHARD_TOKENS,
    chunk: int = CHUNK,
    progress: bool = True,
) -> FeatureIndex:
    """Features of the target over every sequence of `corpus`, cached in `out_dir`.

    Shards already there are kept: a run cut short (Ctrl-C) resumes at the first sequence
    no shard holds. A manifest records the target's fingerprint, the features and the data;
    resuming with a different one is an error, never a mix, but data that grew or shrank
    keeps what still begins it (`keep_grown`). The prompts the cache answers are kept beside
    it (`write_answered`): eval-heads tells prompts from answers by them, and the next run
    tells which cached answers its own prompts share. Layers' features come with the
    final hidden state beside them (`open_shards(..., layers=())` reads that). A folder that
    holds other features of the same target keeps its sequences: they are read again for
    the features wanted (`_features_again`, only those that begin the new data), and its
    answers are never made again."""
    from specmlx.heads.base import fingerprint

    folder = Path(out_dir)
    spec = cached_spec(folder, spec)  # a cache of layers serves the final state too
    manifest: dict[str, Any] = {
        "format": "specmlx-features",
        "version": 1,
        "fingerprint": fingerprint(models.target, models.tokenizer),
        "feature_layers": list(spec.layers),
        "width": spec.width(hidden_size(models.target)),
        "vocab_size": models.vocab_size,
        "eos_ids": sorted(int(i) for i in models.tokenizer.eos_token_ids),
        "chunk": chunk,
        "sequences": len(corpus),
        "source": corpus.source,
    }
    if spec.layers:
        manifest["final"] = True
    manifest = json.loads(json.dumps(manifest))  # as it reads back: lists, not tuples
    unchanged = partial(_unchanged, corpus=corpus, folder=folder)
    saved = read_manifest(folder)
    if saved is not None and _features_differ(saved, manifest):
        # What the folder holds of the new data first, then only that is read again.
        held_as = {k: v for k, v in manifest.items() if k not in REDONE}
        held_as |= {k: saved[k] for k in REDONE if k in saved}
        _say_kept(keep_grown(folder, held_as, unchanged), folder, progress)
        if read_manifest(folder) == held_as:
            _features_again(models, folder, manifest, spec, shard_tokens, progress)
    if (folder / AGAIN).exists():  # features begun for a run that no longer wants them
        shutil.rmtree(folder / AGAIN)
    _say_kept(keep_grown(folder, manifest, unchanged), folder, progress)
    writer = ShardWriter(folder, manifest, models, shard_tokens)
    # What growing dropped: a piece of a file found again by its tokens, an answer by its
    # prompt (the target's greedy answer, made by an earlier run).
    aside = SetAside(folder, manifest)

    def known(prompt: list[int], max_tokens: int) -> Answered | None:
        found = aside.answer(prompt, max_tokens)
        return None if found is None else Answered(found[0][len(prompt) :], *found[1:])

    answered = [p for leaf in corpus.leaves for p in leaf.prompts or []]
    if answered:  # what the cache now answers: the next run's data is told against it
        write_answered(folder, answered)
    with progress_bar(progress, "caching features", len(corpus), writer.index.n_sequences) as bar:
        try:
            for i in range(writer.index.n_sequences, len(corpus)):
                made = corpus.with_features(i, spec, known)  # answers: as the target answers
                if made is None:
                    tokens = corpus[i]
                    made = aside.take(tokens) or (
                        tokens,
                        *target_features(models.target, tokens, spec, chunk),
                    )
                writer.add(*made)
                bar.advance(f"{writer.n_tokens:,} tokens")
        finally:  # on Ctrl-C too: the sequences made so far go to a shard, a rerun goes on
            writer.close()
    if writer.index.complete:
        aside.clear()
    return open_shards(folder).index


REDONE = ("feature_layers", "width", "final", "chunk")  # what a prefill makes again


def _features_differ(saved: dict[str, Any], manifest: dict[str, Any]) -> bool:
    """Whether a folder with manifest `saved` holds what `manifest` wants but its features:
    the same target and tokens, other layers (or chunking)."""
    mine = ("source", "sequences", *REDONE)
    others = {k for k in saved.keys() | manifest.keys() if k not in mine}
    return any(saved.get(k) != manifest.get(k) for k in REDONE) and all(
        saved.get(k) == manifest.get(k) for k in others
    )


def _say_kept(grown: tuple[int, int] | None, folder: Path, progress: bool) -> None:
    if grown is not None and grown[1]:
        kept, held = grown
        note(progress, f"{folder}: other data; {kept:,} of its {held:,} sequences begin it, kept")


def _features_again(
    models: Models,
    folder: Path,
    manifest: dict[str, Any],
    spec: FeatureSpec,
    shard_tokens: int,
    progress: bool,
) -> None:
    """The features `manifest` wants, over the sequences `folder` holds of its data (one
    prefill each: answers cost a generation, this a fraction of one), made aside in
    `.features-again` and swapped in once whole. The folder then holds the sequences it
    held, with new features; a Ctrl-C resumes the making, never a mix."""
    staged = folder / AGAIN
    held = read_index(folder).n_sequences
    again = manifest | {"sequences": held}
    if read_manifest(staged) not in (None, again):
        shutil.rmtree(staged)  # made for features no longer wanted
    writer = ShardWriter(staged, again, models, shard_tokens)
    chunk, done = int(manifest["chunk"]), writer.index.n_sequences
    note(progress, f"{folder}: other features; its {held:,} sequences are read again for these")
    with progress_bar(progress, "features again", held, done) as bar:
        try:
            for tokens in cached_sequences(folder, done):
                writer.add(tokens, *target_features(models.target, tokens, spec, chunk))
                bar.advance(f"{writer.n_tokens:,} tokens")
        finally:  # on Ctrl-C too: what was made is kept, a rerun goes on from there
            writer.close()
    if not writer.index.complete:
        raise SpecmlxError(f"{staged}: features of {writer.index.n_sequences} of {held} sequences")
    swap_in(folder)


def _unchanged(
    saved_source: dict[str, Any], *, corpus: Corpus, folder: Path
) -> Callable[[int, list[int]], bool]:
    """Whether cached sequence i (its tokens) is sequence i of `corpus` too: a generated
    one where both data begin with the same generated parts (the same answers, as a resumed
    run trusts them to be: they are never made again to compare), or where the cached part
    and the new one begin with the same prompts (`_answers_kept`), any other by its tokens
    (pieces of files cost a tokenisation)."""
    trusted = 0  # the sequences of the generated parts both data begin with
    for saved, leaf in zip(source_parts(saved_source), corpus.leaves, strict=False):
        if leaf.source.get("kind") != "generated":
            break
        if saved == leaf.source:
            trusted += leaf.count
            continue
        trusted += _answers_kept(saved, leaf, read_answered(folder))
        break
    made_by: list[tuple[int, int, str | None]] = []  # (first, end, kind) of each part
    offset = 0
    for leaf in corpus.leaves:
        made_by.append((offset, offset + leaf.count, leaf.source.get("kind")))
        offset += leaf.count

    def same(i: int, tokens: list[int]) -> bool:
        if i < trusted:
            return True
        kind = next((k for first, end, k in made_by if first <= i < end), None)
        return kind == "files" and corpus[i] == tokens

    return same


def _answers_kept(saved: dict[str, Any], leaf: Leaf, answered: list[str] | None) -> int:
    """How many cached answers of the generated part `saved` are answers of `leaf` too: the
    greedy answers to the prompts both begin with (more prompts appended, fewer, or others
    after the same ones), made with the same settings. The cached part's prompts are known
    where a list hashes to what it recorded: the data folder's `answered` prompts, or the
    first of `leaf`'s."""

    def settings(source: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in source.items() if k not in ("prompts", "prompts_sha256")}

    if leaf.prompts is None or settings(saved) != settings(leaf.source):
        return 0
    count = int(saved.get("prompts", 0))
    for known in (answered, leaf.prompts):
        if known is None or len(known) < count:
            continue
        if prompt_set_sha256(known[:count]) == saved.get("prompts_sha256"):
            pairs = zip(known[:count], leaf.prompts, strict=False)
            return next(
                (i for i, (a, b) in enumerate(pairs) if a != b), min(count, len(leaf.prompts))
            )
    return 0


def cached_spec(folder: Path, wanted: FeatureSpec) -> FeatureSpec:
    """The features to cache in `folder` for heads that read `wanted`: the folder's own
    where it holds layers' features with the final hidden state beside them and the final
    one is wanted (one cache trains EAGLE-3 and then Medusa and EAGLE-1), else `wanted`."""
    manifest = None if wanted.layers else read_manifest(Path(folder))
    if manifest is not None and manifest.get("final") and manifest.get("feature_layers"):
        return FeatureSpec(tuple(manifest["feature_layers"]))
    return wanted


def draft_vocab(counts: np.ndarray, size: int, always: Iterable[int] = ()) -> np.ndarray:
    """The `size` most frequent token ids (most frequent first, ties by id), with the ids in
    `always` (the stop tokens) forced in at the end in place of the rarest. # (size,) int32"""
    order = np.argsort(-counts, kind="stable")[:size]
    chosen = set(order.tolist())
    missing = [i for i in dict.fromkeys(always) if i not in chosen]
    if missing:
        order = np.concatenate([order[: size - len(missing)], np.array(missing)])
    return order.astype(np.int32)
