"""Answer tokens/s of the 135M target by prompts answered at once: `python results/answer-batch-size-2026-12-07.py MAX_TOKENS BATCH...` (LD_PRELOAD set as the Makefile sets it), after `make heads-smollm2` has written its question draws."""
import time, sys
import mlx.core as mx
from specmlx.api.load import load
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.features import FeatureSpec
from specmlx.training.answers import answer_batch
from specmlx.api.generate import encode_prompt
from specmlx.training.data import read_prompts
from pathlib import Path
models = load("smollm2-135m", default_draft=False)
ps = read_prompts(Path("models/cache/heads/smollm2-135m/magpie-questions-512-seed0.jsonl"))
enc = [encode_prompt(models, p, True) for p in ps]
spec = FeatureSpec((1, 14, 26))
T = int(sys.argv[1]) if len(sys.argv) > 1 else 64
answer_batch(models, enc[:8], 8, SamplingConfig(temperature=0), 0, spec)
for bs in [int(x) for x in sys.argv[2:]]:
    t = time.perf_counter()
    out = answer_batch(models, enc[100:100 + bs], T, SamplingConfig(temperature=0), 0, spec)
    dt = time.perf_counter() - t
    n = sum(len(o.answer) for o in out)
    print(f"batch {bs}: {dt:.1f}s, {n} answer tokens, {n/dt:.1f} tok/s", flush=True)
