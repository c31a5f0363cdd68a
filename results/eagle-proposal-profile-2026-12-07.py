"""Where an EAGLE-3 proposal's time goes on this CPU: `python results/eagle-proposal-profile-2026-12-07.py HEADS_DIR` (LD_PRELOAD set as the Makefile sets it), SmolLM2-135M target."""
import sys, time
import mlx.core as mx
import specmlx
from specmlx.api.methods import _proposal_costs
from specmlx.drafters.eagle import EagleDrafter, _top
heads = sys.argv[1]
models = specmlx.load("smollm2-135m", heads=heads, progress=False, default_draft=False)
head = models.heads["eagle"]
for depth in (1, 2, 4, 6):
    d = EagleDrafter(head, 32, 6, 8)
    print("proposal depth", depth, "in target calls:", [round(x, 3) for x in _proposal_costs(models, d, [depth], reps=6)], flush=True)
def tm(f, n=20):
    f(); r = []
    for _ in range(n):
        t = time.perf_counter(); f(); r.append(time.perf_counter() - t)
    return 1000 * sorted(r)[n // 2]
d = head.config.hidden_size
hidden = mx.random.normal((8, d)); mx.eval(hidden)
dr = EagleDrafter(head, 32, 6, 8)
print("log_probs (8 nodes)", tm(lambda: mx.eval(dr._log_probs(hidden, 1))), "ms")
print("logits only", tm(lambda: mx.eval(head.logits(hidden))), "ms")
lp = dr._log_probs(hidden, 1); mx.eval(lp)
print("top-8 of (8, V)", tm(lambda: mx.eval(_top(lp, 8))), "ms")
cache = head.make_cache()
feats = mx.random.normal((300, 3 * d)); toks = mx.random.randint(0, 40000, (300,))
mx.eval(head(feats, toks, cache))
pos = mx.full((8,), 300, mx.int32); mask = mx.concatenate([mx.ones((8, 300), mx.bool_), mx.eye(8, dtype=mx.bool_)], axis=1)
def level():
    out = head(hidden, toks[:8], cache, pos, mask); mx.eval(out); cache[0].trim(8) if hasattr(cache[0], "trim") else None
print("head call, 8 nodes after 300", tm(level), "ms")
tok = mx.array([[5]])
from mlx_lm.models.cache import make_prompt_cache
tc = make_prompt_cache(models.target)
mx.eval(models.target(mx.random.randint(0, 40000, (1, 300)), cache=tc))
def tcall():
    mx.eval(models.target(tok, cache=tc)); [c.trim(1) for c in tc]
print("target call, 1 token after 300", tm(tcall), "ms")
