"""What a reduced draft vocabulary saves and what it gives up, measured on a real target.

Heads score only V_d rows of the target's LM head (`train-heads --draft-vocab`). Fewer rows
make every draft step cheaper (Qwen2.5's LM head has 151,936 rows of 1,536: a sixth of the
1.5B model's weights), but a token outside the draft vocabulary can never be proposed.
`vocab_report` measures both sides for several V_d:

- coverage: the share of the target's own next tokens in held-out sequences of the cached
  training data (every `hold_every`-th) that are among the V_d most frequent tokens of the
  other sequences, as `train-heads` counts them: a ceiling on the share of first guesses
  the heads can have accepted;
- c: one proposal of Medusa heads and of an EAGLE head (fixed trees, so every V_d does the
  same work) over a one-token target call, timed interleaved, median of `reps`.

`specmlx train-heads` uses the V_d it is given; `make heads-vocab` prints this table for the
Qwen target so that the recipes' choice can be read off it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from specmlx.api import Models
from specmlx.cache import Sequence as TargetSequence
from specmlx.errors import UsageError
from specmlx.heads.base import HeadsConfig, target_vocab
from specmlx.heads.data import draft_vocab
from specmlx.heads.shards import FeatureData, open_shards


@dataclass(frozen=True)
class VocabRow:
    """One draft vocabulary size (None: the whole vocabulary)."""

    draft_vocab: int
    coverage: float  # share of held-out next tokens the heads could propose
    medusa_c: float  # one Medusa proposal / one one-token target call
    eagle_c: float  # one EAGLE proposal / one one-token target call


def coverage(
    data: FeatureData, sizes: Sequence[int], vocab: int, hold_every: int = 4
) -> dict[int, float]:
    """Share of the target's next tokens in every `hold_every`-th sequence that fall in the
    `size` most frequent tokens of the other sequences (stop tokens always in)."""
    n_sequences = len(data.starts) - 1
    if n_sequences < 2:
        raise UsageError("coverage needs at least 2 cached sequences")
    held = np.zeros(len(data.tokens), bool)
    for i in range(0, n_sequences, hold_every):
        held[data.starts[i] : data.starts[i + 1]] = True
    counts = np.bincount(data.tokens[~held], minlength=vocab)[:vocab]
    nexts = data.nexts[held]
    out = {}
    for size in sizes:
        ids = draft_vocab(counts, min(size, vocab), data.manifest["eos_ids"])
        out[size] = float(np.isin(nexts, ids).mean())
    return out


def _seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def proposal_costs(
    models: Models,
    sizes: Sequence[int],
    counts: np.ndarray,
    eos_ids: Sequence[int],
    reps: int = 7,
    context_tokens: int = 64,
    tree_size: int = 32,
    depth: int = 6,
    width: int = 8,
) -> dict[int, tuple[float, float]]:
    """(Medusa c, EAGLE c) per draft vocabulary size: a proposal's median time over the
    median of one-token target calls timed between them. The heads are fresh (their cost
    does not depend on their weights) and their trees fixed in size."""
    from specmlx.drafters.eagle import EagleDrafter
    from specmlx.drafters.medusa import MedusaDrafter
    from specmlx.features import FeatureSpec
    from specmlx.heads.eagle import EagleHead
    from specmlx.heads.medusa import MedusaHeads
    from specmlx.heads.train import target_args

    model = models.target
    vocab, hidden = target_vocab(model), int(model.args.hidden_size)
    context = [int(i) for i in np.argsort(-counts, kind="stable")[:context_tokens]]
    target = TargetSequence(model)
    target.capture(FeatureSpec())
    target.sync(context)

    def target_call() -> None:
        logits = target.forward(mx.array(context[-1:], mx.uint32))
        mx.eval(logits)
        target.settle([])

    drafters = {}
    for size in sizes:
        d2t = None if size >= vocab else mx.array(draft_vocab(counts, size, eos_ids))
        shape = dict(hidden_size=hidden, target_vocab=vocab, draft_vocab=min(size, vocab))
        medusa = MedusaHeads.create(HeadsConfig(kind="medusa", **shape), model, d2t)
        eagle_config = HeadsConfig(kind="eagle", target_args=target_args(models), **shape)
        eagle = EagleHead.create(eagle_config, model, d2t)
        pair = (
            MedusaDrafter(medusa, tree_size, width),
            EagleDrafter(eagle, tree_size, depth, width),
        )
        for drafter in pair:
            drafter.prefill(context, target)
        drafters[size] = pair

    def proposal(drafter) -> Callable[[], None]:
        def run() -> None:
            drafter.propose(context, depth)  # reads its tree back: one host sync
            drafter.commit(None)

        return run

    target_times: list[float] = []
    times: dict[int, tuple[list[float], list[float]]] = {s: ([], []) for s in sizes}
    for _ in range(2):  # warm-up: compiled kernels, caches
        target_call()
        for medusa, eagle in drafters.values():
            proposal(medusa)()
            proposal(eagle)()
    for _ in range(reps):  # interleaved: a slow spell touches every row alike
        target_times.append(_seconds(target_call))
        for size, (medusa, eagle) in drafters.items():
            times[size][0].append(_seconds(proposal(medusa)))
            times[size][1].append(_seconds(proposal(eagle)))
    call = statistics.median(target_times)
    return {
        size: (statistics.median(m) / call, statistics.median(e) / call)
        for size, (m, e) in times.items()
    }


def vocab_report(
    models: Models, data_dir: Path, sizes: Sequence[int], reps: int = 7
) -> list[VocabRow]:
    """Coverage and proposal cost for each draft vocabulary size, on the cached data of
    `data_dir` (made by `train-heads` for this target)."""
    from specmlx.heads.base import check_target

    data = open_shards(Path(data_dir), whole=True)
    check_target(data.manifest["fingerprint"], models.target, models.tokenizer)
    vocab = target_vocab(models.target)
    sizes = sorted({min(int(s), vocab) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise UsageError("draft vocabulary sizes must be positive")
    cover = coverage(data, sizes, vocab)
    counts = data.index.count_array(vocab)
    costs = proposal_costs(models, sizes, counts, data.manifest["eos_ids"], reps=reps)
    return [VocabRow(s, cover[s], *costs[s]) for s in sizes]


def report_markdown(rows: Sequence[VocabRow], vocab: int) -> str:
    lines = [
        "| V_d | coverage | Medusa c | EAGLE c |",
        "|---|---|---|---|",
    ]
    for row in rows:
        name = f"{row.draft_vocab:,}" + (" (all)" if row.draft_vocab == vocab else "")
        lines.append(f"| {name} | {row.coverage:.1%} | {row.medusa_c:.3f} | {row.eagle_c:.3f} |")
    return "\n".join(lines)


def rows_json(rows: Sequence[VocabRow]) -> list[dict]:
    return [asdict(r) for r in rows]
