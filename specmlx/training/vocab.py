"""What a reduced draft vocabulary saves and what it gives up, measured on a real target.

Heads score only V_d rows of the target's LM head (`train-heads --draft-vocab`). Fewer rows
make every draft step cheaper (Qwen2.5's LM head has 151,936 rows of 1,536: a sixth of the
1.5B model's weights), but a token outside the draft vocabulary can never be proposed.
`vocab_report` measures both sides for several V_d:

- coverage: the share of the target's own next tokens in held-out sequences of the cached
  training data (every `hold_every`-th) that are among the V_d most frequent tokens of the
  other sequences, as `train-heads` counts them: a ceiling on the share of first guesses
  the heads can have accepted. Only answer positions are scored where the prompts of the
  self-distilled sequences can be told (the shipped prompt set): heads never draft inside
  a prompt, and its chat template would count as covered every time;
- c: one proposal of Medusa heads and of an EAGLE head (fixed trees, so every V_d does the
  same work) over the one-token target call timed just before it, median of `reps` pairs.

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

from specmlx.api.models import Models
from specmlx.engine.anatomy import hidden_size
from specmlx.engine.cache import Sequence as TargetSequence
from specmlx.errors import UsageError
from specmlx.heads.base import HeadsConfig, target_vocab
from specmlx.training.data import draft_vocab, prompt_positions, sequence_groups
from specmlx.training.shards import FeatureData, open_shards


@dataclass(frozen=True)
class VocabRow:
    """One draft vocabulary size."""

    draft_vocab: int  # the ids the heads score (the stop tokens are always among them)
    coverage: float  # share of held-out next tokens the heads could propose
    medusa_c: float  # one Medusa proposal / one one-token target call
    eagle_c: float  # one EAGLE proposal / one one-token target call
    answers_only: bool  # coverage scored answer positions only (False: prompts' too)


def coverage(
    data: FeatureData,
    sizes: Sequence[int],
    vocab: int,
    hold_every: int = 4,
    skip: Sequence[int] | None = None,
    groups: Sequence[int] | None = None,
) -> dict[int, float]:
    """Share of the target's next tokens in every `hold_every`-th sequence that fall in the
    `size` most frequent tokens of the other sequences (stop tokens always in). `skip[i]`:
    leading positions of sequence i not scored (its prompt's, but the last). `groups[i]`:
    sequence i's group (`sequence_groups`: the answers to one prompt), held out together;
    default: one sequence each."""
    n_sequences = len(data.starts) - 1
    held = np.zeros(len(data.tokens), bool)
    scored = np.zeros(len(data.tokens), bool)
    for i in range(n_sequences):
        if (groups[i] if groups is not None else i) % hold_every:
            continue
        start, end = data.starts[i], data.starts[i + 1]
        held[start:end] = True
        scored[start + (skip[i] if skip is not None else 0) : end] = True
    if held.all():
        raise UsageError("coverage needs the answers to at least 2 prompts")
    counts = np.bincount(data.tokens[~held], minlength=vocab)[:vocab]
    nexts = data.nexts[scored]
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
    """(Medusa c, EAGLE c) per draft vocabulary size: the median over `reps` rounds of a
    proposal's time over the one-token target call timed just before it, as in decoding
    (the rows' order rotates every round). The heads are fresh (their cost does not depend
    on their weights) and their trees fixed in size."""
    from specmlx.drafters.eagle import EagleDrafter
    from specmlx.drafters.medusa import MedusaDrafter
    from specmlx.engine.features import FeatureSpec
    from specmlx.engine.sampling import SamplingConfig
    from specmlx.engine.step import draft_length
    from specmlx.heads.eagle import EagleHead
    from specmlx.heads.medusa import MedusaHeads
    from specmlx.training.train import target_args

    model = models.target
    vocab, hidden = target_vocab(model), hidden_size(model)
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
        shape = dict(hidden_size=hidden, target_vocab=vocab, draft_vocab=size)
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
        k = draft_length(depth, depth, drafter.traits)  # as decoding caps it (Medusa: heads)

        def run() -> None:
            drafter.propose(context, k, SamplingConfig())  # reads its tree back: one host sync
            drafter.commit(None)

        return run

    runs = [
        (size, kind, proposal(d)) for size, pair in drafters.items() for kind, d in enumerate(pair)
    ]
    for _, _, run in runs:  # warm-up: compiled kernels, caches
        target_call()
        run()
    ratios: dict[tuple[int, int], list[float]] = {(size, kind): [] for size, kind, _ in runs}
    for rep in range(reps):
        turn = rep % len(runs)
        for size, kind, run in runs[turn:] + runs[:turn]:
            call = _seconds(target_call)
            ratios[(size, kind)].append(_seconds(run) / call)
    return {
        size: (statistics.median(ratios[(size, 0)]), statistics.median(ratios[(size, 1)]))
        for size in drafters
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
    eos_ids = data.manifest["eos_ids"]
    sizes = sorted({min(int(s), vocab) for s in sizes})
    if not sizes or sizes[0] <= len(eos_ids):
        raise UsageError(
            f"draft vocabulary sizes must be above {len(eos_ids)} (the stop tokens are always in)"
        )
    source, n = data.manifest["source"], len(data.starts) - 1
    skip = prompt_positions(models, source, n)
    cover = coverage(data, sizes, vocab, skip=skip, groups=sequence_groups(source, n))
    counts = data.index.count_array(vocab)
    costs = proposal_costs(models, sizes, counts, eos_ids, reps=reps)
    return [VocabRow(s, cover[s], *costs[s], answers_only=skip is not None) for s in sizes]


def report_markdown(rows: Sequence[VocabRow], vocab: int) -> str:
    lines = [
        "| V_d | coverage | Medusa c | EAGLE c |",
        "|---|---|---|---|",
    ]
    for row in rows:
        name = f"{row.draft_vocab:,}" + (" (all)" if row.draft_vocab == vocab else "")
        lines.append(f"| {name} | {row.coverage:.1%} | {row.medusa_c:.3f} | {row.eagle_c:.3f} |")
    if rows and not rows[0].answers_only:
        lines.append(
            "\ncoverage counts prompt positions too: the prompts of this data are not known"
        )
    return "\n".join(lines)


def rows_json(rows: Sequence[VocabRow]) -> list[dict]:
    return [asdict(r) for r in rows]
