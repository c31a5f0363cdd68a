"""A/B in one process: prompt lookup at -k auto whose empty lookups (after 1, 2 or 3 in a row:
`decode.WATCH_AFTER`) start a double-buffered plain stretch watched after every token
(`DrafterTraits.looks_up`, this version) against one lone one-token call per empty lookup
(before), the target alone beside both; T=0, 64 tokens,
2 prompts a suite, rows interleaved, their order reversed every other draw."""
import sys, time, statistics as st
from dataclasses import replace
from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.sampling import SamplingConfig

target, draws, suites = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
models = load(target, None, default_draft=False)
greedy = SamplingConfig(temperature=0.0)
prompts = [(s, encode_prompt(models, p.text, True)) for s in suites for p in load_suite(s).prompts[:2]]
from specmlx.engine import decode as loop
VARIANTS = {"none": None, "before": None, "after1": 1, "after2": 2, "after3": 3}
sessions = {name: Session(models, GenerationConfig(method="none" if name == "none" else "ngram", k=None, max_tokens=64, sampling=greedy))
            for name in VARIANTS}
before = sessions["before"].drafter
before.traits = replace(before.traits, looks_up=False)
order = list(sessions)
res, outs = {}, {}
for d in range(draws):
    for suite, ids in prompts:
        for name in (order if d % 2 == 0 else order[::-1]):
            loop.WATCH_AFTER = VARIANTS[name] or 1
            t = time.perf_counter(); toks = []; calls = 0
            for stp in sessions[name].steps(ids):
                toks.extend(stp.tokens); calls += 1
            dt = time.perf_counter() - t
            res.setdefault((suite, name), []).append((len(toks), dt, calls))
            outs.setdefault(tuple(ids), set()).add(tuple(toks))
print(f"# {target}, {draws} draws x 2 prompts a suite; x: mean over prompts and draws of a row's"
      " speed over the target alone's beside it (± standard error); τ: tokens per target call")
for suite in [*suites, "all"]:
    names = suites if suite == "all" else [suite]
    line = [f"{suite:8s}"]
    for name in order:
        rows = [r for n in names for r in res[(n, name)]]
        base = [r for n in names for r in res[(n, "none")]]
        ratios = [(a[0] / a[1]) / (b[0] / b[1]) for a, b in zip(rows, base)]
        se = st.stdev(ratios) / len(ratios) ** 0.5
        tau = sum(r[0] for r in rows) / sum(r[2] for r in rows)
        line.append(f"{name}: τ {tau:.2f} {st.mean(ratios):.3f}±{se:.3f}x")
    print(" | ".join(line), flush=True)
print("every row's output the same for its prompt:", all(len(v) == 1 for v in outs.values()))
