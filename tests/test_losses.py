"""The cross-entropy the heads train on, and the softmax of EAGLE-3's test steps: taken in
NumPy on MLX's CPU backend (its exp is slow there), they give what MLX's own give, value and
gradient."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specmlx.training import losses


def _masked_loss(logits: mx.array, labels: mx.array) -> mx.array:
    per_position = losses.cross_entropy(logits, labels)
    return losses.masked_mean(per_position * mx.arange(1, labels.shape[-1] + 1), labels >= 0)


def _value_and_grad(logits: mx.array, labels: mx.array, host: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(losses, "host_math", lambda: host)
    loss, grad = mx.value_and_grad(_masked_loss)(logits, labels)
    mx.eval(loss, grad)
    return np.array(loss), np.array(grad.astype(mx.float32))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_host_cross_entropy_matches_mlx(dtype, monkeypatch):
    mx.random.seed(0)
    logits = (4 * mx.random.normal((2, 3, 5, 97))).astype(dtype)  # (B, steps, L, V)
    labels = mx.random.randint(0, 97, (2, 3, 5))
    labels = mx.where(mx.random.uniform(shape=labels.shape) < 0.2, -1, labels)  # left out
    host_loss, host_grad = _value_and_grad(logits, labels, True, monkeypatch)
    mlx_loss, mlx_grad = _value_and_grad(logits, labels, False, monkeypatch)
    tol = 1e-5 if dtype == mx.float32 else 2e-3
    np.testing.assert_allclose(host_loss, mlx_loss, rtol=tol)
    np.testing.assert_allclose(host_grad, mlx_grad, atol=tol * np.abs(mlx_grad).max())
    assert np.abs(host_grad).max() > 0
    # A position left out of the loss gets no gradient; a scored one sums to zero over V.
    left_out = np.array(labels) < 0
    assert np.all(host_grad[left_out] == 0)
    np.testing.assert_allclose(host_grad[~left_out].sum(-1), 0, atol=1e-3)


def test_host_softmax_matches_mlx(monkeypatch):
    mx.random.seed(1)
    scores = 3 * mx.random.normal((2, 4, 7, 11))
    scores = mx.where(mx.random.uniform(shape=scores.shape) < 0.3, -mx.inf, scores)  # masked
    scores[..., 0] = 0.5  # every row sees one
    weights = mx.random.normal(scores.shape)

    def value_and_grad(host: bool) -> tuple:
        monkeypatch.setattr(losses, "host_math", lambda: host)
        value, grad = mx.value_and_grad(lambda s: (losses.softmax(s) * weights).sum())(scores)
        return np.array(value), np.array(grad), np.array(losses.softmax(scores))

    host, reference = value_and_grad(True), value_and_grad(False)
    for got, want in zip(host, reference, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.abs(host[1]).max() > 0 and np.all(host[2][np.isinf(np.array(scores))] == 0)
