"""Token trees: many candidate continuations scored by the target in one call.

A tree's node 0 is the last accepted token; every other node is a drafted token with a
parent. In the target call each node attends to the cached prefix and to its own ancestors,
and sits at the position of its depth, so every root-to-node path is scored exactly as if
it were the sequence itself. Drafters that propose several candidates (Lookahead, heads)
build their proposals with `TreeBuilder`, which merges identical (parent, token) nodes: a
shared prefix is computed once, and no sibling repeats a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mlx.core as mx
import mlx.nn as nn


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

    @classmethod
    def chain(cls, length: int) -> Tree:
        return cls(tuple(range(length)))


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
    """Wraps a model's rotary embedding so a call can place tokens at chosen positions.

    With `depths` unset it is the wrapped module, unchanged. With depths set, token i is
    rotated as if at position offset + depths[i]: tokens become a batch of one-token rows,
    each with its own offset, which `mx.fast.rope` supports.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.depths: mx.array | None = None

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        if self.depths is None:
            return self.inner(x, offset=offset)
        rows = x.transpose(2, 1, 0, 3)  # (L, heads, 1, dim)
        rotated = self.inner(rows, offset=offset + self.depths)
        return rotated.transpose(2, 1, 0, 3)


def positioned_ropes(model: nn.Module) -> list[PositionedRoPE]:
    """Wrap (once) every attention's `rope` in `model`; return the wrappers."""
    wrappers = []
    for _, module in model.named_modules():
        rope = getattr(module, "rope", None)
        if isinstance(rope, PositionedRoPE):
            wrappers.append(rope)
        elif isinstance(rope, nn.Module):
            module.rope = PositionedRoPE(rope)
            wrappers.append(module.rope)
    return wrappers
