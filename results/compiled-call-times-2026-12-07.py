"""Target calls compiled (`specmlx.engine.compiled`) against op by op, per call; and plain
decoding double-buffered against one call at a time.

Per call: the median of 4-8 calls after one warm-up, 95 tokens cached, chains of n tokens and
trees of n nodes (each node the child of node i // 2), wall time of the call and its eval.
Plain decoding: 48 greedy tokens, the best of 3 runs, ms a token. Run from the repository
root, OpenBLAS preloaded:

  LD_PRELOAD=... .venv/bin/python results/compiled-call-times-2026-12-07.py smollm2-135m 1,2,4,8,16
"""

import statistics
import sys
import time

import mlx.core as mx

from specmlx.api.load import load
from specmlx.engine.cache import Sequence
from specmlx.engine.tree import Tree

name, sizes = sys.argv[1], [int(n) for n in sys.argv[2].split(",")]
model = load(name, None, default_draft=False).target
reps = 8 if "smollm2" in name else 4


def call_ms(compiled: bool, n: int, tree: bool) -> float:
    Sequence.compile_calls = compiled
    seq = Sequence(model)
    seq.sync(list(range(5, 100)))
    shape = Tree(tuple([0] + [i // 2 for i in range(1, n - 1)])) if tree else None
    inputs = mx.array([5] * n, mx.uint32)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        mx.eval(seq.forward(inputs, tree=shape))
        times.append(time.perf_counter() - start)
        seq.settle([])
    return 1000 * statistics.median(times[1:])


def plain_ms(compiled: bool, double_buffered: bool, n: int = 48) -> float:
    Sequence.compile_calls = compiled
    seq = Sequence(model)
    seq.sync(list(range(5, 60)))
    start, last = time.perf_counter(), 60
    if double_buffered:
        pending = mx.argmax(seq.forward(mx.array([last], mx.uint32))[0])
        mx.async_eval(pending)
        seq.settle([last])
        for _ in range(n):
            queued = mx.argmax(seq.forward(pending[None].astype(mx.uint32))[0])
            mx.async_eval(queued)
            seq.settle([pending.item()])
            pending = queued
        pending.item()
        seq.settle([])
    else:
        for _ in range(n):
            token = mx.argmax(seq.forward(mx.array([last], mx.uint32))[0]).item()
            seq.settle([last])
            last = token
    return 1000 * (time.perf_counter() - start) / n


print(f"# {name}: ms a call, op by op -> compiled")
for n in sizes:
    for tree in (False, True) if n >= 4 else (False,):
        eager, fused = call_ms(False, n, tree), call_ms(True, n, tree)
        print(f"{'tree' if tree else 'chain'} of {n:2d}: {eager:6.1f} -> {fused:6.1f}")
print("# plain decoding, ms a token: double-buffered / one call at a time")
for compiled in (False, True):
    runs = [(plain_ms(compiled, True), plain_ms(compiled, False)) for _ in range(3)]
    print(
        f"{'compiled' if compiled else 'op by op'}: {min(r[0] for r in runs):.1f} / "
        f"{min(r[1] for r in runs):.1f}"
    )
