"""What suffix decoding remembers: token documents, indexed by where each suffix continues.

A `SuffixIndex` holds documents (an earlier answer, or the current prompt and what has been
generated of it) and, for every n in ORDERS, where each n-gram of them is followed by a
token. Appending a token registers the n-grams that end just before it, so work per token is
len(ORDERS) dict probes however long the history; `match` finds the longest suffix of a
context (up to MAX_MATCH tokens) that occurred before and the places it continues, reading at
most RECENT occurrences; dropping a document removes exactly its entries. n-grams are keyed
by their hash and checked against the tokens when read, so a key costs an int, not a tuple.

A `SuffixStore` is the memory across requests of one loaded target: earlier answers (each
with the tail of its prompt, which is what the next request's prompt ends with) within a
token budget, oldest dropped first; `save` writes it atomically, `load_store` reads it back
and refuses a store made for another tokenizer.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specmlx.errors import UsageError
from specmlx.io.files import write_atomic

# The n-gram lengths indexed: a match is found at the longest of them, then extended token
# by token (up to MAX_MATCH) at each of its occurrences.
ORDERS = (1, 2, 4, 8, 16, 32)
MAX_MATCH = 64
# Occurrences read per lookup, the most recent first: enough for frequencies, and a cap on
# a lookup's work when a short pattern occurred thousands of times.
RECENT = 64
# Of an earlier request's prompt, the tokens kept before its answer: the chat template's
# assistant header and the end of the request, which the next request's prompt also ends with.
PROMPT_TAIL = 24
# A position packs (document serial, offset): serials grow, so lists stay sorted.
_SHIFT = 32
_OFFSET = (1 << _SHIFT) - 1
FORMAT = "specmlx-suffix-store"
VERSION = 1


@dataclass(frozen=True)
class Match:
    """The longest suffix of a context found earlier: its length, and where each of its
    occurrences continues (document serial, offset of the next token), most recent first."""

    length: int
    places: tuple[tuple[int, int], ...]


class SuffixIndex:
    """Documents of token ids, and where each of their n-grams (n in ORDERS) continues."""

    def __init__(self) -> None:
        self.docs: dict[int, array] = {}  # serial -> tokens, oldest document first
        self.n_tokens = 0
        self._next_serial = 0
        self._where: dict[int, list[int]] = {}  # n-gram hash -> positions, ascending

    def open(self) -> int:
        """A new, empty document: its serial."""
        serial = self._next_serial
        self._next_serial += 1
        self.docs[serial] = array("I")
        return serial

    def extend(self, serial: int, tokens: Sequence[int]) -> None:
        """Append tokens to a document; each registers the n-grams that end just before it."""
        doc = self.docs[serial]
        base = serial << _SHIFT
        for token in tokens:
            offset = len(doc)
            for n in ORDERS:
                if n > offset:
                    break
                self._where.setdefault(hash(tuple(doc[offset - n : offset])), []).append(
                    base | offset
                )
            doc.append(token)
        self.n_tokens += len(tokens)

    def drop(self, serial: int) -> None:
        """Forget a document and every entry it registered."""
        doc = self.docs.pop(serial)
        self.n_tokens -= len(doc)
        low, high = serial << _SHIFT, (serial + 1) << _SHIFT
        for offset in range(1, len(doc)):
            for n in ORDERS:
                if n > offset:
                    break
                key = hash(tuple(doc[offset - n : offset]))
                positions = self._where.get(key)
                if positions is None:
                    continue  # an earlier offset of this document removed them all
                first = bisect_left(positions, low)
                del positions[first : bisect_left(positions, high, first)]
                if not positions:
                    del self._where[key]

    def match(self, context: Sequence[int]) -> Match | None:
        """The longest suffix of `context` that some document holds with a token after it."""
        for n in reversed(ORDERS):
            if n > len(context):
                continue
            pattern = tuple(context[-n:])
            positions = self._where.get(hash(pattern))
            if not positions:
                continue
            found = []
            for position in reversed(positions[-RECENT:]):
                serial, offset = position >> _SHIFT, position & _OFFSET
                doc = self.docs[serial]
                if tuple(doc[offset - n : offset]) != pattern:
                    continue  # another n-gram of the same hash
                length, limit = n, min(MAX_MATCH, offset, len(context))
                while length < limit and doc[offset - length - 1] == context[-length - 1]:
                    length += 1
                found.append((length, serial, offset))
            if found:
                longest = max(length for length, _, _ in found)
                places = tuple((s, o) for length, s, o in found if length == longest)
                return Match(longest, places)
        return None

    def continuation(self, serial: int, offset: int, depth: int) -> list[int]:
        """Up to `depth` tokens of a document from `offset` on."""
        return self.docs[serial][offset : offset + depth].tolist()


class Trust:
    """How far a suffix proposal is to be believed, by the length of its match.

    A node's share of the occurrences is not its chance of acceptance: a single earlier
    occurrence of a one-token match gives its continuation share 1, yet chat text rarely goes
    on as it did once before. Per match length (1, 2-3, 4-7, ... 32+ tokens) this keeps q,
    the chance that the target keeps one of a node's children, per unit of the children's
    share: a child's chance is q times its share of its parent's occurrences, so a node d
    deep expects q^d times its share. Each level of a proposal whose parent the target went
    on with is one trial: offered the shares of the children proposed there, won if the
    target went on with one of them (q = kept / offered, at most 1). Before any trial a
    length L believes L / (L + 1), SuffixDecoding's premise that a longer match predicts
    further (1: 0.5, 32: 0.97), worth two trials. Where short matches do not pay, their q falls until the verify
    costs price them out and the step goes plain; the drafter goes on scoring what it
    would have proposed, so a q that was unlucky recovers.
    """

    PRIOR_TRIALS = 2.0

    def __init__(self) -> None:
        self.kept: dict[int, float] = {}
        self.offered: dict[int, float] = {}

    @staticmethod
    def bucket(match_length: int) -> int:
        return min(match_length.bit_length(), 6)

    @classmethod
    def prior(cls, match_length: int) -> float:
        """What a length believes before any trial: L / (L + 1) for the bucket's shortest L."""
        shortest = 1 << (cls.bucket(match_length) - 1)
        return shortest / (shortest + 1)

    def q(self, match_length: int) -> float:
        b = self.bucket(match_length)
        kept = self.PRIOR_TRIALS * self.prior(match_length) + self.kept.get(b, 0.0)
        return min(1.0, kept / (self.PRIOR_TRIALS + self.offered.get(b, 0.0)))

    def observe(self, match_length: int, offered: float, kept: bool) -> None:
        b = self.bucket(match_length)
        self.offered[b] = self.offered.get(b, 0.0) + offered
        self.kept[b] = self.kept.get(b, 0.0) + kept

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {
            "kept": {str(b): v for b, v in self.kept.items()},
            "offered": {str(b): v for b, v in self.offered.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, float]]) -> Trust:
        trust = cls()
        trust.kept = {int(b): float(v) for b, v in data["kept"].items()}
        trust.offered = {int(b): float(v) for b, v in data["offered"].items()}
        return trust


class SuffixStore:
    """Earlier answers of one target, within `budget` tokens (the oldest dropped first), for
    the suffix drafter of every session on the loaded models. `path`: where `save` writes
    it; `tokenizer_id` names the tokenizer its token ids belong to."""

    def __init__(self, budget: int, tokenizer_id: str, path: Path | None = None):
        if budget < 1:
            raise UsageError(f"the suffix memory needs a budget of at least 1 token, got {budget}")
        self.budget = budget
        self.tokenizer_id = tokenizer_id
        self.path = path
        self.index = SuffixIndex()
        # How often its proposals were kept, learnt by every drafter that reads it.
        self.trust = Trust()

    def record(self, prompt_ids: Sequence[int], answer: Sequence[int]) -> None:
        """Keep an answer, after the tail of its prompt; drop the oldest beyond the budget."""
        if not answer:
            return
        serial = self.index.open()
        self.index.extend(serial, [*prompt_ids[-PROMPT_TAIL:], *answer])
        while self.index.n_tokens > self.budget and len(self.index.docs) > 1:
            self.index.drop(next(iter(self.index.docs)))
        if self.index.n_tokens > self.budget:  # one answer longer than the whole budget
            doc = self.index.docs[serial]
            self.index.drop(serial)
            self.index.extend(self.index.open(), doc[-self.budget :])

    def documents(self) -> list[list[int]]:
        return [doc.tolist() for doc in self.index.docs.values()]

    def save(self, path: Path | None = None) -> None:
        """Write the store atomically: a reader finds the old file or the new one."""
        path = path or self.path
        if path is None:
            return
        docs = list(self.index.docs.values())
        header = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": self.tokenizer_id,
            "budget": self.budget,
            "lengths": [len(doc) for doc in docs],
            "trust": self.trust.to_dict(),  # what its proposals earned, kept with them
        }
        body = array("I")
        for doc in docs:
            body.extend(doc)
        if body.itemsize != 4:  # pragma: no cover - every platform MLX runs on
            raise UsageError("the suffix memory needs 4-byte unsigned ints")
        write_atomic(path, json.dumps(header).encode() + b"\n" + body.tobytes())


def load_store(path: Path, budget: int, tokenizer_id: str) -> SuffixStore:
    """The store saved at `path` (a new one if there is no file yet), within `budget`."""
    store = SuffixStore(budget, tokenizer_id, path)
    if not path.exists():
        if not path.parent.is_dir():
            raise UsageError(f"--suffix-cache {path}: the folder {path.parent} does not exist")
        return store
    try:
        raw = path.read_bytes()
        head, _, body = raw.partition(b"\n")
        header = json.loads(head)
        lengths = [int(n) for n in header["lengths"]]
        ok = header.get("format") == FORMAT and 4 * sum(lengths) == len(body)
        trust = Trust.from_dict(header["trust"]) if "trust" in header else Trust()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise UsageError(f"--suffix-cache {path} is not a specmlx suffix memory")
    if header.get("version") != VERSION:
        raise UsageError(f"--suffix-cache {path} has version {header.get('version')}")
    if header.get("tokenizer") != tokenizer_id:
        raise UsageError(
            f"--suffix-cache {path} was made for a target with another tokenizer; "
            "use another file for this one"
        )
    store.trust = trust
    tokens = array("I")
    tokens.frombytes(body)
    start = 0
    for length in lengths:
        serial = store.index.open()
        store.index.extend(serial, tokens[start : start + length])
        start += length
    while store.index.n_tokens > budget and len(store.index.docs) > 1:
        store.index.drop(next(iter(store.index.docs)))
    return store
