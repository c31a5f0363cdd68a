"""Answer batches old and new, one process, on one batch of the recipe's cached prompts:
the batched prefill of 23f8f66 (all 32 prompts padded to the longest, every row decoded to
the end) against prefill groups of like length and rows that leave once answered. Prints
each's seconds, and whether answers, greedy next tokens and features agree.

    LD_PRELOAD=$(ls /usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3 | head -n 1) \
      .venv/bin/python results/answer-batches-2026-12-07.py FIRST MAX_TOKENS RUNS

FIRST: the batch's first prompt in models/cache/heads/qwen2.5-coder-1.5b (after `make
heads-qwen`): 416 (task prompts) and 64 (chat-like), with MAX_TOKENS 24 and 128, RUNS 2.
Output: results/answer-batches-2026-12-07.txt.
"""

import importlib.util
import json
import sys
import time

sys.path.insert(0, ".")
import subprocess
import tempfile

import mlx.core as mx

from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.engine.features import FeatureSpec
from specmlx.engine.sampling import SamplingConfig
from specmlx.training import answers as new

OLD = "23f8f66"  # the last commit with one padded prefill per batch
source = subprocess.run(
    ["git", "show", f"{OLD}:specmlx/training/answers.py"],
    capture_output=True,
    text=True,
    check=True,
).stdout
path = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
path.write(source)
path.close()
spec_ = importlib.util.spec_from_file_location("old_answers", path.name)
old = importlib.util.module_from_spec(spec_)
sys.modules["old_answers"] = old
spec_.loader.exec_module(old)
models = load("qwen2.5-coder-1.5b", default_draft=False)
prompts = [
    json.loads(line)["prompt"]
    for line in open("models/cache/heads/qwen2.5-coder-1.5b/answered-prompts.jsonl")
]
first, maxt = int(sys.argv[1]), int(sys.argv[2])
ids = [encode_prompt(models, p, True) for p in prompts[first : first + 32]]
spec = FeatureSpec((1, 13, 24))
print("groups", new.prefill_groups([len(p) - 1 for p in ids]), flush=True)
res = {}
for name, mod in [("new", new), ("old", old), ("new", new), ("old", old)][: int(sys.argv[3])]:
    t = time.perf_counter()
    rows = mod.answer_batch(models, ids, maxt, SamplingConfig(), 0, spec)
    mx.eval([r.features for r in rows])
    dt = time.perf_counter() - t
    print(name, round(dt, 1), "s", flush=True)
    res.setdefault(name, rows)
a, b = res["new"], res["old"]
same = sum(x.answer == y.answer for x, y in zip(a, b, strict=False))
print("same answers", same, "/", len(a))

d = max(
    float(mx.abs(x.features.astype(mx.float32) - y.features.astype(mx.float32)).max())
    for x, y in zip(a, b, strict=False)
    if x.answer == y.answer
)
print(
    "max feature diff",
    d,
    "nexts equal",
    sum(x.nexts.tolist() == y.nexts.tolist() for x, y in zip(a, b, strict=False)),
)
