"""Seconds per training step of the recipe's EAGLE-3 and Medusa settings on its cache:
`python results/train-step-times-2026-12-07.py eagle3|medusa` with LD_PRELOAD set as the
Makefile sets it; OLD=<a checkout> runs that checkout's specmlx instead of this one."""
import os, sys
if os.environ.get("OLD"):
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f) and "editable" not in getattr(f, "__module__", "")]
    sys.path.insert(0, os.environ["OLD"])
import sys, time, math
from functools import partial
from pathlib import Path
import mlx.core as mx, mlx.optimizers as optim, numpy as np
from specmlx.api.load import load
from specmlx.training import train as T
from specmlx.training.objectives import Windows, step_function
from specmlx.training.shards import open_shards
from specmlx.training.data import prompt_positions, sequence_groups
from specmlx.training.train import split_sequences
from specmlx.training.objectives import t2d_table
from specmlx.heads.base import target_vocab
kind = sys.argv[1]; compile_ = True
models = load("/work/main/models/local/smollm2-135m", default_draft=False)
import specmlx.training.losses as _l; print("code", _l.__file__, flush=True)
if kind == "eagle3":
    config = T.TrainConfig(kind="eagle3", steps=400, seq_len=512, batch_tokens=2048, draft_vocab=8192, unroll=3, lr=1e-3, feature_layers=(1,14,26), compile=compile_)
else:
    config = T.TrainConfig(kind="medusa", steps=900, seq_len=256, batch_tokens=1024, draft_vocab=4096, compile=compile_)
data_dir = Path("models/cache/heads/smollm2-135m")
data = open_shards(data_dir, whole=True, layers=config.feature_layers)
vocab = target_vocab(models.target)
source, n = data.manifest["source"], data.index.n_sequences
skip = prompt_positions(models, source, n, None)
train_ids, held_ids = split_sequences(sequence_groups(source, n), config.holdout)
d2t = T._draft_ids(config, data, vocab, train_ids)
windows = Windows(data, config.seq_len, config.batch_tokens // config.seq_len, config.seed, train_ids, None)
heads = T._create(models, config, d2t)
optimizer = optim.AdamW(1e-4, betas=[0.9, 0.95])
optimizer.init(heads.trainable_parameters())
objective = T.OBJECTIVES[kind]
loss_fn = objective.loss(heads, config)
batch_of = objective.batches(data, t2d_table(d2t, vocab), config)
step_fn = step_function(heads, optimizer, loss_fn, config.grad_clip, config.compile)
ts = []
for s in range(8):
    t = time.perf_counter()
    batch = batch_of(*windows.positions(s))
    loss, terms, acc = step_fn(*batch)
    mx.eval(heads.state, optimizer.state, loss)
    ts.append(time.perf_counter() - t)
print(kind, "compile", compile_, "step s:", " ".join(f"{x:.2f}" for x in ts), "median", f"{sorted(ts[2:])[3]:.2f}", "loss", loss.item(), flush=True)

