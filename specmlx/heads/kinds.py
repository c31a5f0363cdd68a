"""The kinds of draft heads, stated once: `KINDS`, every kind's module, method and formats.

Everything that lists or checks kinds reads this table: `HeadsConfig` validation, the store
(which module a folder of ours is loaded into), the published layouts tried
(`specmlx.heads.formats`), the `--method` that drafts with loaded heads, the kinds
`train-heads` offers and their default learning rates. An unknown kind is one line naming
the known ones, never loaded as another.

A kind's module class and its published readers are named by path and imported on first use,
as mlx-lm's `_get_classes` imports a model's module by its name: those modules build on
`specmlx.heads.base`, which checks kinds here, so importing them would close a circle; and
this way the table imports no MLX, so the CLI reads it and `specmlx --help` stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from specmlx.errors import SpecmlxError, UsageError


@dataclass(frozen=True)
class HeadKind:
    """One kind of draft heads."""

    name: str  # HeadsConfig.kind, and the source_format of its published layout
    title: str  # as its authors write it, for messages
    module: str  # its nn.Module class, `package.module.Class`, with `create(config, target, d2t)`
    method: str  # the drafting method that runs it: a name in specmlx.api.methods.METHODS
    # Functions `(folder, config, tensor files, target) -> heads | None` that read its
    # published layouts (`specmlx.heads.formats`), tried in this table's order.
    readers: tuple[str, ...] = ()
    # The peak learning rate `train-heads` trains it at by default; None: it is not trained
    # here. `specmlx.training.objectives.OBJECTIVES` must hold exactly the trainable kinds
    # (tests/test_heads_kinds.py checks it).
    train_lr: float | None = None

    @property
    def trainable(self) -> bool:
        return self.train_lr is not None

    def module_class(self) -> Any:
        """The heads' module class (imports it, and MLX with it)."""
        return _imported(self.module)

    def published_readers(self) -> list[Any]:
        """The functions reading its published layouts (imports them)."""
        return [_imported(path) for path in self.readers]


KINDS: dict[str, HeadKind] = {
    k.name: k
    for k in (
        HeadKind(
            "medusa",
            "Medusa",
            "specmlx.heads.medusa.MedusaHeads",
            method="medusa",
            readers=("specmlx.heads.formats.read_medusa",),
            train_lr=1e-3,
        ),
        HeadKind(
            "eagle",
            "EAGLE",
            "specmlx.heads.eagle.EagleHead",
            method="eagle",
            readers=("specmlx.heads.formats.read_eagle",),
            train_lr=3e-4,
        ),
        HeadKind(
            "eagle3",
            "EAGLE-3",
            "specmlx.heads.eagle3.Eagle3Head",
            method="eagle",  # the EAGLE drafter runs both heads
            readers=("specmlx.heads.formats.read_eagle3",),
            # The reference's 1e-4 serves epochs of multi-GPU batches; runs here are short
            # (thousands of steps of 1-2k tokens): EAGLE's rate, for a layer of its size.
            train_lr=3e-4,
        ),
    )
}

TRAINABLE: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.trainable)


def head_kind(name: str) -> HeadKind:
    """The kind called `name`, or a one-line error naming the known ones."""
    if name not in KINDS:
        raise SpecmlxError(f"unknown heads kind {name!r} (known: {', '.join(KINDS)})")
    return KINDS[name]


def trainable_kind(name: str) -> HeadKind:
    """The kind called `name` if `train-heads` trains it, else a one-line UsageError."""
    if name not in KINDS:
        raise UsageError(
            f"unknown heads kind {name!r}; train-heads trains {' or '.join(TRAINABLE)}"
        )
    if not KINDS[name].trainable:
        raise UsageError(
            f"train-heads does not train {name} heads (they are read as published); "
            f"it trains {' or '.join(TRAINABLE)}"
        )
    return KINDS[name]


def published_titles() -> str:
    """The kinds with a published layout we read, for messages: "Medusa, EAGLE or EAGLE-3"."""
    titles = [k.title for k in KINDS.values() if k.readers]
    return " or ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 1 else titles)


def _imported(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
