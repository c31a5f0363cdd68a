"""Compiled target calls (`specmlx.engine.compiled`) give what mlx-lm's own calls give."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest

from specmlx.engine import compiled
from specmlx.engine.cache import Sequence
from specmlx.engine.features import FeatureSpec
from specmlx.engine.tree import Tree
from specmlx.testing import tiny_hybrid

CONTEXT = list(range(3, 254))  # a capacity of 256 after the prefill: the calls grow it


def _calls(model, compile_calls: bool, spec: FeatureSpec | None, monkeypatch):
    """Logits of every call of one scripted exchange (plain calls, a chain, a tree, settles
    that keep part of each), and the features kept for every confirmed token."""
    monkeypatch.setattr(Sequence, "compile_calls", compile_calls)
    seq = Sequence(model)
    seq.capture(spec)
    seq.sync(CONTEXT)
    assert (seq._compiled() is not None) == compile_calls
    out, last = [], CONTEXT[-1]
    for _ in range(3):
        out.append(seq.forward(mx.array([last], mx.uint32)))
        seq.settle([last])
        last = int(mx.argmax(out[-1][-1]).item())
    out.append(seq.forward(mx.array([last, 7, 8, 9], mx.uint32)))
    seq.settle([last, 7])  # crosses the 256 positions of the prefill's buffers
    tree = Tree((0, 0, 1, 2, 2))
    out.append(seq.forward(mx.array([9, 11, 12, 13, 14, 15], mx.uint32), tree=tree))
    seq.settle([9, 12, 14], path=[0, 2, 4])
    out.append(seq.forward(mx.array([3, 4], mx.uint32)))
    seq.settle([])
    out.append(seq.forward(mx.array([3], mx.uint32)))
    seq.settle([3])
    assert seq.cache[0].offset == len(seq.tokens) == len(CONTEXT) - 1 + 9
    return out, seq.feature_rows(0) if spec is not None else None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("layers", [None, (), (0, 1)])
def test_compiled_calls_equal_mlx_lm_calls(tiny_dirs, arch, layers, monkeypatch):
    model, _ = mlx_lm.load(str(tiny_dirs[arch]))
    assert compiled.compilable(model)
    spec = None if layers is None else FeatureSpec(layers)
    eager, eager_rows = _calls(model, False, spec, monkeypatch)
    fused, fused_rows = _calls(model, True, spec, monkeypatch)
    for a, b in zip(eager, fused, strict=True):
        assert a.shape == b.shape
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4)
        assert mx.array_equal(mx.argmax(a, axis=-1), mx.argmax(b, axis=-1))
    if spec is not None:
        assert fused_rows.shape == eager_rows.shape
        assert mx.allclose(eager_rows, fused_rows, atol=1e-4, rtol=1e-4)
    assert fused[-1].shape[0] == 1


def test_models_not_shaped_as_llama_are_called_as_they_are(tiny_dirs, monkeypatch):
    monkeypatch.setattr(Sequence, "compile_calls", True)
    windowed, _ = mlx_lm.load(str(tiny_dirs["gemma3_text"]))
    for model in (tiny_hybrid(), windowed):
        seq = Sequence(model)
        seq.sync([1, 2, 3, 4])
        assert seq._compiled() is None
        assert seq.forward(mx.array([5], mx.uint32)).shape[0] == 1


def test_one_compiled_forward_per_model_and_features(tiny_dirs, monkeypatch):
    monkeypatch.setattr(Sequence, "compile_calls", True)
    model, _ = mlx_lm.load(str(tiny_dirs["llama"]))
    first, second = Sequence(model), Sequence(model)
    for seq in (first, second):
        seq.sync([1, 2, 3])
    assert first._compiled() is second._compiled()
    second.capture(FeatureSpec(()))
    second.sync([1, 2, 3])
    assert first._compiled() is not second._compiled()


@pytest.mark.parametrize("compile_calls", [False, True])
def test_the_bench_header_says_how_target_calls_ran(tiny_dirs, compile_calls, monkeypatch):
    from specmlx.api.load import load
    from specmlx.bench.environment import environment
    from specmlx.bench.report import header_lines
    from specmlx.bench.run import BenchConfig, make_rows
    from specmlx.bench.suites import Prompt, Suite
    from specmlx.bench.summary import build_report

    monkeypatch.setattr(Sequence, "compile_calls", compile_calls)
    env = environment(load(str(tiny_dirs["llama"]), progress=False), bandwidth_gb=0.01)
    assert env["compiled_calls"] is compile_calls  # the tiny target is a llama
    config = BenchConfig(suites=(Suite("one", (Prompt("p", "x"),)),), rows=make_rows([], [2]))
    report = build_report(config, [], env, None)
    said = "compiled" if compile_calls else "op by op (mlx-lm's)"
    assert header_lines(report)[1].endswith(f"target calls {said}")
