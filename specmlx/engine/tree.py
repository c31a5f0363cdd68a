"""Token trees: many candidate continuations scored by the target in one call.

A tree's node 0 is the last accepted token; every other node is a drafted token with a
parent. In the target call each node attends to the cached prefix and to its own ancestors,
and sits at the position of its depth, so every root-to-node path is scored exactly as if
it were the sequence itself. Drafters that propose several candidates (Lookahead, heads)
build their proposals with `TreeBuilder`, which merges identical (parent, token) nodes: a
shared prefix is computed once, and no sibling repeats a token. `tree_call` scopes one such
target call: the model and its caches are changed only for its duration.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specmlx.errors import SpecmlxError


@dataclass(frozen=True)
class Tree:
    """The shape of a proposal: the parent of each drafted node (0 is the root)."""

    parents: tuple[int, ...]  # parents[i] is the parent of node i + 1

    @property
    def size(self) -> int:
        """Nodes including the root."""
        return len(self.parents) + 1

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depths = [0]
        for parent in self.parents:
            depths.append(depths[parent] + 1)
        return tuple(depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        children: list[list[int]] = [[] for _ in range(self.size)]
        for node, parent in enumerate(self.parents, start=1):
            children[parent].append(node)
        return tuple(tuple(c) for c in children)

    def ancestor_mask(self) -> mx.array:
        """mask[i, j]: node j is node i or one of its ancestors. # (size, size)"""
        rows = []
        for node in range(self.size):
            row = [False] * self.size
            while True:
                row[node] = True
                if node == 0:
                    break
                node = self.parents[node - 1]
            rows.append(row)
        return mx.array(rows)


def shape_of(parents: list[int] | tuple[int, ...]) -> Tree | None:
    """The tree of nodes with these parents, or None where they form one chain (each the
    child of the one before): a chain goes to the target as plain tokens, which every target
    verifies, recurrent layers included."""
    if all(parent == i for i, parent in enumerate(parents)):
        return None
    return Tree(tuple(parents))


class TreeBuilder:
    """Grows a tree one token at a time, merging a token its parent already has."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self._index: dict[tuple[int, int], int] = {}

    def add(self, parent: int, token: int) -> int:
        """The node for `token` under `parent`, created if new."""
        key = (parent, token)
        if key not in self._index:
            self.tokens.append(token)
            self.parents.append(parent)
            self._index[key] = len(self.tokens)
        return self._index[key]

    def add_path(self, tokens: list[int], parent: int = 0) -> list[int]:
        """Nodes for a path of tokens under `parent`."""
        nodes = []
        for token in tokens:
            parent = self.add(parent, token)
            nodes.append(parent)
        return nodes

    def tree(self) -> Tree:
        return Tree(tuple(self.parents))


class PositionedRoPE(nn.Module):
    """A model's rotary embedding, rotating token i as if at position offset + depths[i].

    The tokens become a batch of one-token rows, each with its own offset, which
    `mx.fast.rope` supports. It exists only inside `tree_call`.
    """

    def __init__(self, inner: nn.Module, depths: mx.array):
        super().__init__()
        self.inner = inner
        self.depths = depths  # (n,)

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        rows = x.transpose(2, 1, 0, 3)  # (n, heads, 1, dim)
        rotated = self.inner(rows, offset=offset + self.depths)
        return rotated.transpose(2, 1, 0, 3)


# Per model, the modules that hold a `rope`, found once: a tree call then swaps attributes
# instead of walking the module tree. nn.Module is an unhashable dict, so the key is id(model),
# dropped when the model dies; the values are weak too, so the entry never keeps a module alive.
_ROPE_HOLDERS: dict[int, tuple[weakref.ref, tuple[weakref.ref, ...]]] = {}


def _rope_holders(model: nn.Module) -> list[nn.Module]:
    entry = _ROPE_HOLDERS.get(id(model))
    if entry is None or entry[0]() is not model:
        holders = {
            id(module): module
            for _, module in model.named_modules()
            if isinstance(getattr(module, "rope", None), nn.Module)
        }  # by id: a module reachable by two paths is swapped once
        entry = (weakref.ref(model), tuple(weakref.ref(m) for m in holders.values()))
        _ROPE_HOLDERS[id(model)] = entry
        weakref.finalize(model, _ROPE_HOLDERS.pop, id(model), None)
    return [holder for ref in entry[1] if (holder := ref()) is not None]


@contextmanager
def tree_call(model: nn.Module, cache: list[Any], tree: Tree) -> Iterator[None]:
    """Within the block, `model(inputs, cache=cache)` scores `tree`, its node i at inputs[i].

    Each node attends to the cached prefix and to its ancestors (through the caches' tree
    mask) and is rotated at the position of its depth (through a PositionedRoPE put in place
    of each attention's `rope`). On exit, also by an exception, the caches' masks are cleared
    and the original rope objects are back: the model is exactly as it was.
    """
    if not all(hasattr(c, "tree_mask") for c in cache):
        kinds = sorted({type(c).__name__ for c in cache})
        raise SpecmlxError(
            f"tree drafting needs attention KV caches; this model uses {', '.join(kinds)}"
        )
    mask, depths = tree.ancestor_mask(), mx.array(tree.depths)
    try:
        for c in cache:
            c.tree_mask, c.tree_depths = mask, depths
        with rotated_at(model, depths):
            yield
    finally:
        for c in cache:
            c.tree_mask = c.tree_depths = None


@contextmanager
def rotated_at(module: nn.Module, shifts: mx.array) -> Iterator[None]:
    """Within the block, every rope under `module` (itself included) rotates input i at
    (offset + shifts[i]); on exit, also by an exception, the original ropes are back."""
    swapped = [(holder, holder.rope) for holder in _rope_holders(module)]
    try:
        for holder, rope in swapped:
            holder.rope = PositionedRoPE(rope, shifts)
        yield
    finally:
        for holder, rope in swapped:
            holder.rope = rope
