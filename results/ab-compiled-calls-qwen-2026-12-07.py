"""Qwen pair: compiled calls against op-by-op, target alone and draft -k auto, interleaved."""
import sys, time, statistics as st
from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.cache import Sequence
from specmlx.engine.sampling import SamplingConfig
models = load("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
greedy = SamplingConfig(temperature=0.0)
suites = sys.argv[1].split(","); draws = int(sys.argv[2]); n = int(sys.argv[3])
prompts = [(s, encode_prompt(models, p.text, True)) for s in suites for p in load_suite(s).prompts[:2]]
sessions = {}
for comp in (False, True):
    Sequence.compile_calls = comp
    for m in ("none", "draft"):
        sessions[(comp, m)] = Session(models, GenerationConfig(method=m, k=None, max_tokens=n, sampling=greedy))
order = list(sessions); res = {}; outs = {}
for d in range(draws):
    for suite, ids in prompts:
        for key in (order if d % 2 == 0 else order[::-1]):
            Sequence.compile_calls = key[0]
            t = time.perf_counter(); toks = []; calls = 0
            for stp in sessions[key].steps(ids):
                toks.extend(stp.tokens); calls += 1
            res.setdefault(key, []).append((len(toks), time.perf_counter() - t, calls))
            outs.setdefault(tuple(ids), set()).add(tuple(toks))
base = res[(False, "none")]
for key in order:
    rows = res[key]
    ratios = [(a[0] / a[1]) / (b[0] / b[1]) for a, b in zip(rows, base)]
    print(f"{'compiled' if key[0] else 'eager'} {key[1]}: {sum(r[0] for r in rows)/sum(r[1] for r in rows):.3f} tok/s τ {sum(r[0] for r in rows)/sum(r[2] for r in rows):.2f} {st.mean(ratios):.3f}±{st.stdev(ratios)/len(ratios)**0.5:.3f}x eager none")
print("outputs the same:", all(len(v) == 1 for v in outs.values()))
