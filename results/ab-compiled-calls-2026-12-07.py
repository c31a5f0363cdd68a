"""A/B in one process: compiled target calls against mlx-lm's op-by-op calls
(`Sequence.compile_calls`), the target alone and each method at -k auto, T=0, 64 tokens,
2 prompts a suite, rows interleaved and their order reversed every other draw."""
import sys, time, statistics as st
from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.cache import Sequence
from specmlx.engine.sampling import SamplingConfig

target, draws, suites = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
methods = sys.argv[4].split(",")
heads = sys.argv[5:]
models = load(target, None, heads=heads or None, default_draft=False)
greedy = SamplingConfig(temperature=0.0)
prompts = [(s, encode_prompt(models, p.text, True)) for s in suites for p in load_suite(s).prompts[:2]]
sessions = {}
for comp in (False, True):
    Sequence.compile_calls = comp
    for m in ("none", *methods):
        sessions[(comp, m)] = Session(models, GenerationConfig(method=m, k=None, max_tokens=64, sampling=greedy))
order = list(sessions)
res, outs = {}, {}
for d in range(draws):
    for suite, ids in prompts:
        for key in (order if d % 2 == 0 else order[::-1]):
            Sequence.compile_calls = key[0]
            t = time.perf_counter(); toks = []; calls = 0
            for stp in sessions[key].steps(ids):
                toks.extend(stp.tokens); calls += 1
            dt = time.perf_counter() - t
            res.setdefault((suite, key), []).append((len(toks), dt, calls))
            outs.setdefault(tuple(ids), set()).add(tuple(toks))
print(f"# {target}, {draws} draws x 2 prompts a suite; tok/s over all rows; x: mean over the"
      " prompts and draws of a row's speed over the eager target alone's beside it (± std error)")
for suite in [*suites, "all"]:
    names = suites if suite == "all" else [suite]
    line = [f"{suite:8s}"]
    for key in order:
        rows = [r for n in names for r in res[(n, key)]]
        base = [r for n in names for r in res[(n, (False, "none"))]]
        speed = sum(r[0] for r in rows) / sum(r[1] for r in rows)
        tau = sum(r[0] for r in rows) / sum(r[2] for r in rows)
        ratios = [(a[0] / a[1]) / (b[0] / b[1]) for a, b in zip(rows, base)]
        se = st.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0
        line.append(f"{'compiled' if key[0] else 'eager'} {key[1]}: {speed:.2f} tok/s τ {tau:.2f} {st.mean(ratios):.3f}±{se:.3f}x")
    print(" | ".join(line), flush=True)
print("every row's output the same as the others' for its prompt:", all(len(v) == 1 for v in outs.values()))
