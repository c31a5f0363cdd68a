"""Suffix decoding: its index against brute force, its memory's budget and file, its trees,
and its drafts lossless alone and with a draft model, greedy and sampled."""

from __future__ import annotations

import random

import mlx_lm
import pytest

from specmlx.api.config import GenerationConfig
from specmlx.api.methods import METHODS, SuffixOptions
from specmlx.api.models import Models
from specmlx.api.session import Session
from specmlx.drafters.draft_model import DraftModelDrafter
from specmlx.drafters.suffix import SuffixDrafter
from specmlx.drafters.suffix_store import (
    MAX_MATCH,
    PROMPT_TAIL,
    RECENT,
    SuffixIndex,
    SuffixStore,
    Trust,
    load_store,
)
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError
from tests.test_decode import PROMPTS
from tests.test_distribution import chi2_pvalue, exact_joint, sample_pairs
from tests.test_draft_free import REPEATING, run


def brute_match(docs, context):
    """The longest suffix of `context` followed by a token in some document, and every
    (serial, offset) where it continues, by scanning."""
    best, places = 0, []
    for serial, doc in docs.items():
        for offset in range(1, len(doc)):
            length = 0
            while (
                length < min(MAX_MATCH, offset, len(context))
                and doc[offset - length - 1] == context[-length - 1]
            ):
                length += 1
            if length > best:
                best, places = length, [(serial, offset)]
            elif length == best and length:
                places.append((serial, offset))
    return best, places


def test_the_index_finds_the_longest_match_as_brute_force_does():
    rng = random.Random(0)
    for _ in range(200):
        vocab = rng.choice([2, 3, 5, 30])
        index, docs = SuffixIndex(), {}
        for _ in range(rng.randrange(1, 4)):
            serial = index.open()
            docs[serial] = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
            index.extend(serial, docs[serial][:5])
            index.extend(serial, docs[serial][5:])  # in pieces, as a request grows
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        found = index.match(context)
        length, places = brute_match(docs, context)
        if length == 0:
            assert found is None
            continue
        assert found.length == length
        if len(places) <= RECENT:  # past RECENT occurrences a lookup reads the newest only
            assert sorted(found.places) == sorted(places)


def test_dropping_a_document_leaves_the_index_of_the_others():
    rng = random.Random(1)
    docs = [[rng.randrange(4) for _ in range(30)] for _ in range(4)]
    index = SuffixIndex()
    for doc in docs:
        index.extend(index.open(), doc)
    index.drop(0)
    index.drop(2)
    fresh = SuffixIndex()
    for serial in (1, 3):
        fresh._next_serial = serial
        fresh.extend(fresh.open(), docs[serial])
    assert index._where == fresh._where
    assert index.n_tokens == 60


def test_the_memory_keeps_within_its_budget_dropping_the_oldest():
    store = SuffixStore(budget=200, tokenizer_id="t")
    answers = [[i] * 30 for i in range(1, 20)]
    for answer in answers:
        store.record([7] * 40, answer)
        assert store.index.n_tokens <= 200
    kept = store.documents()
    assert kept[-1] == [7] * PROMPT_TAIL + answers[-1]  # the newest, after its prompt's tail
    assert [doc[-1] for doc in kept] == [a[0] for a in answers[-len(kept) :]]  # oldest went
    store.record([], list(range(1000)))  # longer than the whole budget: its end is kept
    assert store.documents() == [list(range(800, 1000))]


def tiny_store(tmp_path=None):
    store = SuffixStore(10_000, "tok", None if tmp_path is None else tmp_path / "m.suffix")
    rng = random.Random(2)
    for _ in range(12):
        store.record([1, 2, 3], [rng.randrange(6) for _ in range(rng.randrange(5, 30))])
    return store


def test_a_saved_memory_reloads_to_the_same_proposals(tmp_path):
    """Its answers and what its proposals earned (trust by match length, which sizes them
    against the verify costs)."""
    store = tiny_store(tmp_path)
    for _ in range(6):  # one-token matches were not kept; longer ones were
        store.trust.observe(1, 1.0, False)
        store.trust.observe(3, 1.0, True)
    store.save()
    again = load_store(tmp_path / "m.suffix", 10_000, "tok")
    assert again.documents() == store.documents()
    assert [again.trust.q(n) for n in range(1, 40)] == [store.trust.q(n) for n in range(1, 40)]
    assert again.trust.q(1) < 0.3 < 0.9 < again.trust.q(3)
    rng = random.Random(3)
    cost = lambda n: 1.0 + 0.3 * (n - 1)  # noqa: E731
    for _ in range(50):
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 10))]
        a = SuffixDrafter(store, tree_size=12, verify_cost=cost).speculate(context, 8)
        b = SuffixDrafter(again, tree_size=12, verify_cost=cost).speculate(context, 8)
        assert a[0].tokens.tolist() == b[0].tokens.tolist() and a[0].tree == b[0].tree


def test_a_memory_of_another_tokenizer_or_no_memory_is_refused(tmp_path):
    tiny_store(tmp_path).save()
    with pytest.raises(UsageError, match="another tokenizer"):
        load_store(tmp_path / "m.suffix", 10_000, "other")
    (tmp_path / "junk.suffix").write_bytes(b"not a store\n\x00\x01")
    with pytest.raises(UsageError, match="not a specmlx suffix memory"):
        load_store(tmp_path / "junk.suffix", 10_000, "tok")
    with pytest.raises(UsageError, match="does not exist"):
        load_store(tmp_path / "nowhere" / "m.suffix", 10_000, "tok")


def test_the_proposal_follows_the_frequencies_of_the_continuations():
    store = SuffixStore(10_000, "t")
    for answer in ([5, 6, 1, 2, 3], [5, 6, 1, 2, 4], [5, 6, 1, 7, 7], [5, 6, 9, 9, 9]):
        store.record([], answer)
    drafter = SuffixDrafter(store, tree_size=32, factor=4.0, min_prob=0.3)
    draft, expected = drafter.speculate([0, 5, 6], 3)
    # After [5, 6]: 1 three times in four, then 2 in two of those three; 9 (a quarter of
    # the paths, under min_prob 0.3 of the root's) and 7 (one in three, kept) beside them.
    tokens, parents = draft.tokens.tolist(), draft.tree.parents
    assert tokens[:3] == [1, 2, 7] and parents[:3] == (0, 1, 1)
    assert 9 not in tokens
    # Shares believed q per level (the prior, before any trial): 1; 2, 7; 3, 4, 7 after 7.
    q = drafter.trust.q(2)
    assert q == Trust.prior(2) == 2 / 3
    assert expected == pytest.approx(q * 0.75 + q**2 * (0.5 + 0.25) + q**3 * 3 * 0.25)
    # The draft holds at most factor x match length tokens: a 2-token match and factor 1.
    short, _ = SuffixDrafter(store, tree_size=32, factor=1.0, min_prob=0.3).speculate([0, 5, 6], 8)
    assert short.size == 2 and short.tree is None  # one path: a chain


def test_trust_learns_what_the_target_went_on_with_and_stops_what_does_not_pay():
    store = SuffixStore(10_000, "t")
    store.record([], [5, 6, 1, 2, 3, 8, 8, 8, 8, 8, 8, 8, 8, 9, 4])
    cost = lambda n: 1 + 0.25 * (n - 1)  # noqa: E731
    short = [0, 5, 6]

    def went_on(tokens: list[int]) -> SuffixDrafter:
        """A request's drafter: a candidate at `short`, then the target's `tokens`."""
        drafter = SuffixDrafter(store, verify_cost=cost)
        drafter.speculate(short, 4)
        drafter.speculate([*short, *tokens], 4)
        return drafter

    drafter = SuffixDrafter(store, verify_cost=cost)
    assert drafter.speculate(short, 4)[0].size > 0  # q = 2/3: a 2-token match drafts
    for _ in range(20):  # ...but the target never goes on as it says
        went_on([7])
    assert drafter.trust.q(2) < 0.1 and drafter.trust.q(3) == drafter.trust.q(2)
    assert drafter.speculate(short, 4)[0].size == 0  # it no longer pays: the step goes plain
    # ...yet its candidates are scored all along: where the target now follows them, the
    # length earns its drafts back, though none was proposed.
    for _ in range(10):
        went_on([1, 2])
    assert drafter.trust.q(2) > 0.5 and drafter.speculate(short, 4)[0].size > 0
    # Another length is another record; a later drafter on the store shares it.
    later = SuffixDrafter(store, verify_cost=cost)
    assert later.trust is drafter.trust and later.trust.q(8) == Trust.prior(8) == 8 / 9
    # A level whose parent came is a trial, won if one of its children came: the chain
    # 3, 8, 8, 8 then the target's 3, 7 is one win and one loss, at shares of 1.
    unpriced = SuffixDrafter(store)  # no verify costs: the whole chain goes
    assert unpriced.speculate([5, 6, 1, 2], 4)[0].size == 4
    unpriced.speculate([5, 6, 1, 2, 3, 7], 4)
    assert unpriced.trust.offered[3] == 2 and unpriced.trust.kept[3] == 1


def test_without_a_match_nothing_is_proposed():
    draft, expected = SuffixDrafter(SuffixStore(100, "t")).speculate([1, 2, 3], 4)
    assert draft.size == 0 and expected == 0.0


@pytest.fixture(scope="module")
def pair(tiny_dirs):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    draft, _ = mlx_lm.load(str(tiny_dirs["llama-draft"]))
    return target, draft, tokenizer


@pytest.mark.parametrize("hybrid", [False, True], ids=["suffix", "suffix+draft"])
def test_greedy_equals_plain_across_requests(pair, hybrid):
    """Every answer goes to the shared memory; later requests draft from it, and the output
    stays the target's own, token for token."""
    target, draft, tokenizer = pair
    store = SuffixStore(100_000, "t")
    accepted = 0
    for prompt in [REPEATING, *PROMPTS, *PROMPTS]:
        ids = tokenizer.encode(prompt)
        plain, _ = run(target, ids, None, k=0)
        for k in (2, 5):
            fallback = DraftModelDrafter(draft, target.args.vocab_size) if hybrid else None
            drafter = SuffixDrafter(store, fallback=fallback)
            spec, steps = run(target, ids, drafter, k=k)
            assert spec == plain, (prompt, k)
            accepted += sum(s.n_accepted for s in steps if s.free)
        store.record(ids, plain)
    assert accepted > 0  # suffix drafts were kept, not only the draft model's


@pytest.mark.parametrize("hybrid", [False, True], ids=["suffix", "suffix+draft"])
def test_sampling_keeps_the_target_distribution(tiny_dirs, hybrid):
    from tests.test_distribution import Sharpened

    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    target = Sharpened(target, 3.0)
    ids = tokenizer.encode("The quick brown fox")
    sampling = SamplingConfig(temperature=1.0, top_p=0.95)
    joint = exact_joint(target, ids, sampling)
    # Earlier answers to this prompt: the likeliest first tokens and what followed them,
    # so the memory proposes trees (several first tokens) and chains.
    store = SuffixStore(10_000, "t")
    first = joint.sum(axis=1).argsort()[::-1][:3]
    for a in first:
        for b in joint[a].argsort()[::-1][:2]:
            store.record(ids, [int(a), int(b)])
    fallback = None
    if hybrid:
        draft, _ = mlx_lm.load(str(tiny_dirs["llama-draft"]))
        fallback = DraftModelDrafter(draft, target.args.vocab_size)
    # min_score 1.5: a tree over the first token goes to the suffix, else the draft model.
    drafter = SuffixDrafter(store, factor=8.0, fallback=fallback, min_score=1.5)
    pairs, n_accepted = sample_pairs(target, drafter, ids, sampling, k=2, max_tokens=3)
    assert n_accepted > 0
    assert chi2_pvalue(pairs, joint) > 0.01


def test_sessions_on_one_model_share_the_memory(tiny_dirs, tmp_path):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    models = Models(target, tokenizer)
    cache = str(tmp_path / "memory.suffix")
    config = GenerationConfig(
        method="suffix", options=SuffixOptions(tree_size=8, cache=cache), k=4, max_tokens=24
    )
    ids = tokenizer.encode(PROMPTS[0])
    first = list(Session(models, config).steps(ids))
    second = list(Session(models, config).steps(ids))  # another session, the same models
    assert [s.tokens for s in first] != [s.tokens for s in second]  # fewer, longer steps
    assert sum(s.n_accepted for s in second) > sum(s.n_accepted for s in first)
    # The file holds both answers; a fresh load of the models starts from it.
    again = Models(target, tokenizer)
    METHODS["suffix"].build(again, config.options)
    assert again.suffix_store.documents() == models.suffix_store.documents()
    assert len(again.suffix_store.documents()) == 2


def test_the_cli_drafts_with_suffix_and_its_fallback(tiny_dirs, tmp_path):
    import json

    from tests.test_cli import invoke, one_line_error

    target, draft = str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"])
    common = ["generate", "hello", "--target", target, "--json", "--max-tokens", "12"]
    plain = json.loads(invoke(*common, "--method", "none").stdout)
    cache = str(tmp_path / "memory.suffix")
    for extra, used in [
        (["--method", "suffix", "--suffix-cache", cache], "suffix"),
        (["--method", "suffix", "--draft", draft, "-k", "3"], "suffix+draft"),
        (["--suffix-min-prob", "0.2"], "suffix"),  # an option of suffix names its method
    ]:
        result = invoke(*common, *extra)
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["method"] == used and out["token_ids"] == plain["token_ids"]
    # The memory file was written, and is refused for a target of another tokenizer.
    other = tiny_other(tmp_path)
    result = invoke(
        "generate", "hi", "--target", str(other), "--method", "suffix", "--suffix-cache", cache
    )
    assert "another tokenizer" in one_line_error(result, 2)


def tiny_other(tmp_path):
    """A tiny model whose tokenizer has other ids: its vocabulary trained on other text."""
    from tests.tiny import make_model_dir

    return make_model_dir(tmp_path / "other", "llama", seed=1, tokenizer_size=300)


def test_a_reply_stopped_early_is_remembered_as_far_as_it_went(tiny_dirs):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    models = Models(target, tokenizer)
    config = GenerationConfig(method="suffix", options=SuffixOptions(tree_size=8), k=2)
    ids = tokenizer.encode(PROMPTS[1])
    events = Session(models, config).stream(ids)
    seen = [t for _, event in zip(range(3), events, strict=False) for t in event.token_ids]
    events.close()  # as Ctrl-C in a chat does
    (kept,) = models.suffix_store.documents()
    assert kept == [*ids[-PROMPT_TAIL:], *seen]


@pytest.mark.parametrize("name", ["suffix+heads", "suffix+draft"])
def test_the_methods_table_builds_each_hybrid_and_it_stays_lossless(name):
    from specmlx.testing import tiny_models

    models = tiny_models()
    drafter = METHODS[name].build(models, SuffixOptions(tree_size=8))
    assert drafter.fallback is not None and drafter.traits.kind.startswith("suffix+")
    prompt = [(7 * i) % 61 + 3 for i in range(24)]
    plain, _ = run(models.target, prompt, None, k=0, n=32)
    models.suffix_store.record(prompt, plain[:16])  # half the answer, remembered
    spec, steps = run(models.target, prompt, drafter, k=4, n=32)
    assert spec == plain
    assert any(s.free and s.n_accepted for s in steps)  # the memory drafted
    # and the fallback had the other steps (drafting as its costs say: heads priced by
    # timing may draft nothing)
    assert any(not s.free for s in steps)
