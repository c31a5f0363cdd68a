"""Medusa's node scores corrected by depth and by confidence bin, against by depth alone
(`DepthCalibration`, as shipped), replayed: `-k auto` on SmolLM2-135M's own greedy answers
under two prices of an empty proposal and three orders of the suites.

The replay is `results/policy-replay-2026-12-06.py` (the real policy and drafter, 4 prompts
a suite, each answered twice, 64 tokens, T=0; steps priced at measured step costs), the
prices and orders as in `results/policy-replay-variants-2026-12-07.py`. `bins`: each settled
proposal teaches, per (depth, bin of the node's raw score: edges 0.1, 0.2, 0.4, 0.7), the
scores predicted and how many of those nodes the target's tokens went through; a node's
score is scaled by its own (depth, bin) ratio, with the same fade and pseudo-mass as the
shipped correction. Why: head 0's guesses at 0.6-0.9 are right 17% of the time in chat and
51% in code (`results/gate-signals-2026-12-07.txt`), which one ratio per depth scales alike.
Run from the repository root, OpenBLAS preloaded (about 5 minutes):

  LD_PRELOAD=... .venv/bin/python results/policy-replay-confidence-bins-2026-12-07.py
"""

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

from specmlx.drafters.calibration import DepthCalibration, node_depths

EDGES = (0.1, 0.2, 0.4, 0.7)


def _module(name, file):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


variants = _module("variants", "policy-replay-variants-2026-12-07.py")
foresight = _module("foresight", "policy-replay-foresight-2026-12-07.py")


def bin_of(score):
    return sum(score >= edge for edge in EDGES)


@contextmanager
def confidence_bins():
    reach, learn, scaled = DepthCalibration._reach, DepthCalibration._learn, DepthCalibration.scaled

    def sums(self):
        if not hasattr(self, "_bins"):
            self._bins = {}
        return self._bins

    def new_reach(self, proposal, following):
        children = {}
        for index, (parent, token) in enumerate(
            zip(proposal.parents, proposal.tokens, strict=True)
        ):
            children.setdefault((parent, token), index + 1)
        node, self._path = 0, set()
        for token in following:
            child = children.get((node, token))
            if child is None:
                break
            node = child
            self._path.add(child)
        return reach(self, proposal, following)

    def new_learn(self, proposal, depth):
        learn(self, proposal, depth)
        table = sums(self)
        for values in table.values():
            values[0] *= self.fade
            values[1] *= self.fade
        levels = node_depths(proposal.parents)
        for index, (level, score) in enumerate(zip(levels, proposal.scores, strict=True)):
            key = (min(level, self.max_depth), bin_of(score))
            values = table.setdefault(key, [0.0, 0.0])
            values[0] += score
            values[1] += (index + 1) in self._path

    def new_scaled(self, parents, scores):
        table, out = sums(self), []
        for parent, depth, score in zip(parents, node_depths(parents), scores, strict=True):
            predicted, reached = table.get((min(depth, self.max_depth), bin_of(score)), (0, 0))
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


VARIANTS = {"by depth": variants.nothing, "bins": confidence_bins}


def main():
    models, data = foresight.replayed()
    foresight.compare(models, data, VARIANTS)


if __name__ == "__main__":
    sys.exit(main())
