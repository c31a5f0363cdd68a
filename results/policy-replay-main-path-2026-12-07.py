"""Medusa's node scores corrected by depth, apart for the heads' best guesses (the main path)
and for the other candidates, against one correction per depth (`DepthCalibration`, as
shipped), replayed: `-k auto` on SmolLM2-135M's own greedy answers under two prices of an
empty proposal and three orders of the suites.

Why: the shipped correction learns, per depth, how much of the mass of all the candidates
the target's tokens reached, and scales every node by it; but the heads' best guess is more
overconfident than the rest. At depth 1 on the target's answers (printed first), the top-1
candidate is right 0.23 of what its probability says in chat, where the top 8 together reach
0.49 of theirs (code 0.64 against 0.75): a one-node tree, chat's usual proposal, is sized
with twice its chance. `main-path`: the path of each head's best guess (the first child at
each depth) learns its own ratio per depth, the other candidates theirs, with the same fade
and pseudo-mass. The replay is `results/policy-replay-2026-12-06.py` (the real policy and
drafter, 4 prompts a suite, each answered twice, 64 tokens, T=0; steps priced at measured
step costs), the prices and orders as in `results/policy-replay-variants-2026-12-07.py`; as
its siblings do, it charges 0.06 of a call for each plain run restarting. Run from the
repository root, OpenBLAS preloaded (about 2 minutes):

  LD_PRELOAD=... .venv/bin/python results/policy-replay-main-path-2026-12-07.py
"""

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx

from specmlx.drafters.calibration import DepthCalibration, node_depths


def _module(name, file):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


variants = _module("variants", "policy-replay-variants-2026-12-07.py")
foresight = _module("foresight", "policy-replay-foresight-2026-12-07.py")
replay = variants.replay


def main_path(parents):
    """Indices (1-based, TreeBuilder's) of the nodes on the path of first children."""
    path, node = set(), 0
    while True:
        child = next((i + 1 for i, parent in enumerate(parents) if parent == node), None)
        if child is None:
            return path
        path.add(child)
        node = child


@contextmanager
def main_path_apart():
    reach, learn, scaled = DepthCalibration._reach, DepthCalibration._learn, DepthCalibration.scaled

    def sums(self):
        if not hasattr(self, "_main"):
            self._main = [[0.0, 0.0] for _ in range(self.max_depth)]  # predicted, reached
            self._other = [[0.0, 0.0] for _ in range(self.max_depth)]
        return self._main, self._other

    def new_reach(self, proposal, following):
        children = {}
        for index, (parent, token) in enumerate(
            zip(proposal.parents, proposal.tokens, strict=True)
        ):
            children.setdefault((parent, token), index + 1)
        node, self._path = 0, []
        for token in following:
            child = children.get((node, token))
            if child is None:
                break
            node = child
            self._path.append(child)
        return reach(self, proposal, following)

    def new_learn(self, proposal, depth):
        learn(self, proposal, depth)
        main, other = sums(self)
        for table in (main, other):
            for values in table:
                values[0] *= self.fade
                values[1] *= self.fade
        on_path = main_path(proposal.parents)
        levels = node_depths(proposal.parents)
        for index, (level, score) in enumerate(zip(levels, proposal.scores, strict=True)):
            if level <= self.max_depth:
                (main if index + 1 in on_path else other)[level - 1][0] += score
        for level, node in enumerate(self._path[: min(depth, self.max_depth)]):
            (main if node in on_path else other)[level][1] += 1.0

    def new_scaled(self, parents, scores):
        main, other = sums(self)
        on_path, out = main_path(parents), []
        for index, (parent, depth, score) in enumerate(
            zip(parents, node_depths(parents), scores, strict=True)
        ):
            predicted, reached = (main if index + 1 in on_path else other)[
                min(depth, self.max_depth) - 1
            ]
            ratio = (reached + self.pseudo_mass) / (predicted + self.pseudo_mass)
            value = min(score * ratio, 1.0)
            out.append(value if parent == 0 else min(value, out[parent - 1]))
        return out

    DepthCalibration._reach, DepthCalibration._learn = new_reach, new_learn
    DepthCalibration.scaled = new_scaled
    try:
        yield
    finally:
        DepthCalibration._reach, DepthCalibration._learn = reach, learn
        DepthCalibration.scaled = scaled


def depth_one(models, data):
    """Per suite, at depth 1: the top-1 candidate's hits over its probability, and the top
    8's reach over theirs, on the target's answers."""
    heads = models.heads["medusa"]
    print("# depth 1, the target's answers: top-1 hits / its probability; top-8 reach / theirs")
    for suite in replay.SUITES:
        top = [0.0, 0]
        eight = [0.0, 0]
        for name, ids, answer, feats in data:
            if name != suite:
                continue
            tokens, rows = ids + answer, mx.array(feats)
            for j in range(len(ids) - 1, len(tokens) - 2):
                ids_, probs = heads.top_candidates(rows[j], 8, 1)
                guesses, p = ids_.tolist()[0], probs.tolist()[0]
                top[0] += p[0]
                top[1] += guesses[0] == tokens[j + 2]
                eight[0] += sum(p)
                eight[1] += tokens[j + 2] in guesses
        print(
            f"{suite:8s} top-1 {top[1] / top[0]:.2f} ({top[1]} hits, {top[0]:.1f} predicted) |"
            f" top-8 {eight[1] / eight[0]:.2f} ({eight[1]} reached, {eight[0]:.1f} predicted)"
        )
    print()


VARIANTS = {"by depth": variants.nothing, "main-path": main_path_apart}


def main():
    models, data = foresight.replayed()
    depth_one(models, data)
    foresight.compare(models, data, VARIANTS)


if __name__ == "__main__":
    sys.exit(main())
