"""A training run's state on disk, its log, and the files a finished run leaves.

The checkpoint is one file, `checkpoint/state.safetensors`: the heads' trainable weights,
the optimizer's state (moments, step, learning rate), the weights of the best held-out score
so far and, in its metadata, the step, the seconds spent, the log so far, the best score and
its step, and the settings it was made with. It is written under a
temporary name and renamed, so a Ctrl-C or a crash leaves the previous one whole. The data
order needs no saved state: it is a function of (seed, step).

A finished run replaces the output folder at once: heads (`save_heads`), `train_log.json`
and `loss.png` are written to a folder beside it that is renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from specmlx.errors import SpecmlxError, UsageError

CHECKPOINT = "checkpoint"
STATE_FILE = "state.safetensors"
LOG_FILE = "train_log.json"
PLOT_FILE = "loss.png"
OURS = {"config.json", "model.safetensors", LOG_FILE, PLOT_FILE, CHECKPOINT}
# Settings that change nothing a run computes: a resumed run may differ in them.
FREE_SETTINGS = ("checkpoint_every", "save_dtype")


@dataclass
class RunState:
    """How far a run has got."""

    step: int = 0
    seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)  # one entry per step
    best_score: float = -1.0  # the best held-out score so far (`train.heldout_score`)
    best_step: int = 0
    best: dict[str, mx.array] = field(default_factory=dict)  # the heads' weights then
    stale: int = 0  # held-out evaluations since the best one

    def improved(self, score: float, weights: dict[str, mx.array], min_gain: float) -> bool:
        """Count a held-out evaluation: keep `weights` if `score` is the best yet, and count
        it stale unless it beats the best before it by `min_gain`. Returns whether it did."""
        gained = score > self.best_score + min_gain
        if score > self.best_score or not self.best:
            self.best_score, self.best_step, self.best = score, self.step, weights
        self.stale = 0 if gained else self.stale + 1
        return gained

    def record(self, values: list[float], n_terms: int) -> str:
        """Count a step done: `values` are its loss, learning rate, `n_terms` loss terms and
        accuracies. Returns a line for the progress bar."""
        self.step += 1
        loss, lr, terms, accuracy = (
            values[0],
            values[1],
            values[2 : 2 + n_terms],
            values[2 + n_terms :],
        )
        entry = {"step": self.step, "loss": loss, "lr": lr, "losses": terms, "accuracy": accuracy}
        self.log.append(entry)
        return f"loss {loss:.3f}  top-1 {'/'.join(f'{a:.2f}' for a in accuracy)}"

    def final(self, last: int = 10) -> dict[str, Any]:
        """The losses and accuracies of the last steps, averaged (one step is noisy)."""
        tail = self.log[-last:]
        if not tail:
            return {"loss": float("nan"), "losses": [], "accuracy": []}

        def mean(key: str) -> Any:
            return np.round(np.mean([entry[key] for entry in tail], axis=0), 4).tolist()

        return {"loss": mean("loss"), "losses": mean("losses"), "accuracy": mean("accuracy")}


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output folder that holds anything but heads and their training files."""
    if out_dir.exists() and (not out_dir.is_dir() or {p.name for p in out_dir.iterdir()} - OURS):
        raise UsageError(f"{out_dir} exists and is not a heads folder: not writing into it")


def save_checkpoint(
    out_dir: Path, heads: nn.Module, optimizer: optim.Optimizer, run: RunState, record: dict
) -> None:
    """Write the run's state, whole or not at all. `record`: settings and data, checked on
    resume."""
    folder = out_dir / CHECKPOINT
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {f"heads.{k}": v for k, v in tree_flatten(heads.trainable_parameters())}
    arrays.update({f"optimizer.{k}": v for k, v in tree_flatten(optimizer.state)})
    arrays.update({f"best.{k}": v for k, v in run.best.items()})
    meta = {"step": run.step, "seconds": run.seconds, "log": run.log, **record}
    meta |= {"best_score": run.best_score, "best_step": run.best_step, "stale": run.stale}
    tmp = folder / f".{STATE_FILE[: -len('.safetensors')]}.tmp.safetensors"
    try:
        mx.save_safetensors(str(tmp), arrays, metadata={"specmlx": json.dumps(meta)})
        os.replace(tmp, folder / STATE_FILE)
    finally:
        tmp.unlink(missing_ok=True)


def has_checkpoint(out_dir: Path) -> bool:
    return (out_dir / CHECKPOINT / STATE_FILE).is_file()


def load_checkpoint(
    out_dir: Path, heads: nn.Module, optimizer: optim.Optimizer, record: dict
) -> RunState:
    """Put the saved weights and optimizer state in place; refuse one made otherwise."""
    path = out_dir / CHECKPOINT / STATE_FILE
    arrays, metadata = mx.load(str(path), return_metadata=True)
    meta = json.loads(metadata["specmlx"])
    differ = [
        f"{kind} {key}"
        for kind in record
        for key in sorted(set(record[kind]) | set(meta.get(kind, {})))
        if key not in FREE_SETTINGS and record[kind].get(key) != meta.get(kind, {}).get(key)
    ]
    if differ:
        raise UsageError(
            f"the checkpoint in {out_dir} was made with other settings ({', '.join(differ)} "
            "differ); run with those, or delete the checkpoint to start over"
        )
    weights = [(k.removeprefix("heads."), v) for k, v in arrays.items() if k.startswith("heads.")]
    state = [
        (k.removeprefix("optimizer."), v) for k, v in arrays.items() if k.startswith("optimizer.")
    ]
    heads.load_weights(weights)  # strict: every trainable weight, nothing else
    optimizer.state = tree_unflatten(state)
    optimizer.init(heads.trainable_parameters())  # marks it ready; keeps the loaded moments
    mx.eval(heads.parameters(), optimizer.state)
    best = {k.removeprefix("best."): v for k, v in arrays.items() if k.startswith("best.")}
    return RunState(
        int(meta["step"]),
        float(meta["seconds"]),
        list(meta["log"]),
        float(meta.get("best_score", -1.0)),
        int(meta.get("best_step", 0)),
        best,
        int(meta.get("stale", 0)),
    )


def publish(
    heads: nn.Module, out_dir: Path, log: dict[str, Any], dtype: mx.Dtype | None = None
) -> Path | None:
    """Replace `out_dir` by the finished heads (their weights stored in `dtype`, if given),
    their log and plot; the checkpoint goes. Returns the plot's path (None without
    matplotlib)."""
    from specmlx.heads.store import save_heads

    staging = out_dir.with_name(f".{out_dir.name}.finished-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    old = out_dir.with_name(f".{out_dir.name}.replaced-{os.getpid()}")
    try:
        save_heads(heads, staging, dtype)
        (staging / LOG_FILE).write_text(json.dumps(log, indent=1))
        plotted = plot(log["steps"], staging / PLOT_FILE)
        if out_dir.exists():
            out_dir.rename(old)
        staging.rename(out_dir)
    except BaseException:
        if old.exists() and not out_dir.exists():
            old.rename(out_dir)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out_dir / PLOT_FILE if plotted else None


def plot(steps: list[dict[str, Any]], path: Path) -> bool:
    """Loss and top-1 accuracy per step (and on the held-out answers, else sequences, where
    measured), as a PNG (False when matplotlib is missing)."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend to set
    except ImportError:
        return False
    if not steps:
        return False
    x = [entry["step"] for entry in steps]
    figure = Figure(figsize=(10, 4), layout="tight")
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    loss_axes.plot(x, [entry["loss"] for entry in steps], linewidth=0.8)
    loss_axes.set(xlabel="step", ylabel="loss", title="training loss")
    held = [entry for entry in steps if entry.get("heldout")]
    # The held-out answers, which choose the heads, where every evaluation scored some.
    answers = bool(held) and all("answers" in entry.get("heldout_parts", {}) for entry in held)
    for i in range(len(steps[0]["accuracy"])):
        label = f"head {i}" if len(steps[0]["accuracy"]) > 1 else "top-1"
        accuracy_axes.plot(
            x, [entry["accuracy"][i] for entry in steps], f"C{i}", linewidth=0.8, label=label
        )
        if held:  # the same heads on sequences they never trained on
            accuracy_axes.plot(
                [entry["step"] for entry in held],
                [
                    (entry["heldout_parts"]["answers"] if answers else entry["heldout"])[i]
                    for entry in held
                ],
                f"C{i}o--",
                label=f"{label}, held-out {'answers' if answers else 'sequences'}",
            )
    accuracy_axes.set(xlabel="step", ylabel="top-1 accuracy", title="accuracy", ylim=(0, 1))
    accuracy_axes.legend()
    try:
        figure.savefig(path, dpi=100)
    except OSError as exc:
        raise SpecmlxError(f"could not write {path}: {exc}") from None
    return True


class Interrupt:
    requested = False  # a Ctrl-C came: stop after the step under way


@contextmanager
def deferred_interrupt() -> Iterator[Interrupt]:
    """Within the block, a first Ctrl-C only asks the loop to stop after the step under way
    (so that it checkpoints a whole step); a second one interrupts at once."""
    flag = Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers belong to the main thread: Ctrl-C acts as usual
        return
    previous = signal.getsignal(signal.SIGINT) or signal.default_int_handler

    def handler(signum: int, frame: object) -> None:
        flag.requested = True
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
