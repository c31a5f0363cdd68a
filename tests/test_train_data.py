"""Training data at scale: packed windows, file budgets, one cache for every kind, Magpie
prompts, an EAGLE layer copied from the target. Tiny random models, offline."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import specmlx
from specmlx.engine.features import FeatureSpec, backbone
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import SpecmlxError, UsageError
from specmlx.heads.base import HeadsConfig, target_vocab
from specmlx.heads.eagle import EagleHead
from specmlx.training.data import (
    Corpus,
    answer_sequences,
    cache_features,
    cached_spec,
    file_corpus,
    generate_corpus,
    read_answered,
)
from specmlx.training.losses import segment_mask
from specmlx.training.objectives import Windows, eagle_batch, t2d_table
from specmlx.training.shards import open_shards
from specmlx.training.train import TrainConfig, _create, target_args
from tests.tiny import make_model_dir

PROMPTS = ["def add(a, b):", "The capital of France is", "Once upon a time", "import os"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-data")
    return specmlx.load(str(make_model_dir(root / "target", "llama", seed=3)), progress=False)


@pytest.fixture(scope="module")
def corpus(models):
    return generate_corpus(models, PROMPTS, max_tokens=24, seed=0)


@pytest.fixture(scope="module")
def layered(models, corpus, tmp_path_factory):
    """A cache of two layers' outputs (as EAGLE-3 reads), the final state beside them."""
    folder = tmp_path_factory.mktemp("layered")
    cache_features(models, corpus, FeatureSpec((0, 1)), folder, shard_tokens=50, progress=False)
    return folder


@pytest.fixture(scope="module")
def final(models, corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("final")
    cache_features(models, corpus, FeatureSpec(), folder, shard_tokens=50, progress=False)
    return folder


def test_one_cache_of_layers_also_serves_heads_that_read_the_final_state(layered, final):
    as_final, plain = open_shards(layered, layers=()), open_shards(final)
    assert as_final.manifest["width"] == plain.manifest["width"]
    assert (as_final.tokens == plain.tokens).all() and (as_final.nexts == plain.nexts).all()
    assert mx.allclose(as_final.features, plain.features, atol=1e-3)
    assert open_shards(layered).features.shape[1] == 2 * plain.features.shape[1]
    assert cached_spec(layered, FeatureSpec()) == FeatureSpec((0, 1))  # resumes that cache
    assert cached_spec(final, FeatureSpec()) == FeatureSpec()
    with pytest.raises(SpecmlxError, match="layers"):
        open_shards(final, layers=(0, 1))
    with pytest.raises(SpecmlxError, match="layers"):
        open_shards(layered, layers=(1,))


def test_sequences_are_packed_and_attention_stays_inside_each(models, final):
    data = open_shards(final)
    windows = Windows(data, 32, 8, seed=0)
    lengths = np.diff(data.starts)
    assert windows.n_tokens == lengths.sum()
    used = windows.segments >= 0
    assert sorted(windows.pos[used].tolist()) == list(range(int(lengths.sum())))
    assert used.mean() > 0.75  # pieces packed side by side
    # Every piece starts at its sequence's start or 32 positions on from one.
    for w in range(len(windows)):
        for piece in set(windows.segments[w][used[w]].tolist()):
            at = windows.pos[w][windows.segments[w] == piece]
            owner = int(np.searchsorted(data.starts, at[0], side="right") - 1)
            assert (at[0] - data.starts[owner]) % 32 == 0
            assert (np.diff(at) == 1).all()
    # A window that holds the end of one sequence and the start of the next.
    row = next(r for r in range(len(windows)) if len(set(windows.segments[r].tolist())) > 1)
    span = tuple(a[row : row + 1] for a in windows._span(np.arange(len(windows))))
    pos, end, first, segments = span
    mask = np.array(segment_mask(segments))[0, 0]
    j = int(np.flatnonzero(segments[0] != segments[0, 0])[0])  # the next sequence's start
    assert not mask[j:, :j].any() and mask[j:, j:].sum() == (32 - j) * (32 - j + 1) // 2
    # The head reads each sequence as if alone: the next one's positions equal a window of
    # its own (the same features, from its first token on).
    vocab = target_vocab(models.target)
    config = HeadsConfig(
        kind="eagle",
        hidden_size=models.target.args.hidden_size,
        target_vocab=vocab,
        draft_vocab=vocab,
        target_args=target_args(models),
    )
    mx.random.seed(0)
    head = EagleHead.create(config, models.target)
    for name, module in head.layer.named_modules():  # not the identity: attention matters
        if name.endswith(("o_proj", "down_proj")):
            module.weight = mx.random.normal(module.weight.shape) * 0.1
    t2d = t2d_table(None, vocab)
    batch = eagle_batch(data, *span, t2d, unroll=1)
    packed = head(batch[0], batch[2], mask=batch[1])[0, j:]
    alone = tuple(a[:, j:] for a in span)
    own = eagle_batch(data, *alone, t2d, unroll=1)
    by_itself = head(own[0], own[2])[0]  # plain causal attention over that sequence alone
    assert mx.allclose(packed, by_itself, atol=1e-4)
    leaky = head(batch[0], batch[2])[0, j:]  # causal across the boundary: sees the other
    assert not mx.allclose(leaky, by_itself, atol=1e-4)


def test_file_tokens_sample_a_tree_within_a_budget(models, tmp_path):
    for i in range(30):
        (tmp_path / f"m{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 20)
    whole = file_corpus([tmp_path], models.tokenizer, seq_len=64)
    some = file_corpus([tmp_path], models.tokenizer, seq_len=64, max_tokens=500, seed=1)
    again = file_corpus([tmp_path], models.tokenizer, seq_len=64, max_tokens=500, seed=1)
    other = file_corpus([tmp_path], models.tokenizer, seq_len=64, max_tokens=500, seed=2)
    total = sum(len(some[i]) for i in range(len(some)))
    assert 500 - 16 < total <= 500 < sum(len(whole[i]) for i in range(len(whole)))
    assert [some[i] for i in range(len(some))] == [again[i] for i in range(len(again))]
    assert some.source["sha256"] != other.source["sha256"]  # another sample of the files
    assert some.source["max_tokens"] == 500 and some.source["files"] < 30
    with pytest.raises(UsageError, match="at least 1"):
        file_corpus([tmp_path], models.tokenizer, max_tokens=0)
    fewer = file_corpus([tmp_path], models.tokenizer, seq_len=64, exclude=["*/m1*.py"])
    assert fewer.source["files"] == 20 and fewer.source["exclude"] == ["*/m1*.py"]


def test_a_cache_grows_with_its_data_and_makes_only_what_is_new(models, corpus, tmp_path):
    """More file tokens after the same answers: the shards that still begin the new data are
    kept (their answers never made again), the rest made; the result is the cache a fresh
    run makes. A first shard that does not begin the new data is other data: refused."""
    for i in range(12):
        (tmp_path / f"m{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 12)

    def data(tokens: int, answers=corpus):
        return answers + file_corpus([tmp_path], models.tokenizer, max_tokens=tokens, seed=0)

    small, large = data(300), data(900)
    assert len(small) < len(large)
    assert answer_sequences(large.source) == len(corpus)  # files come after the answers
    grown, fresh = tmp_path / "grown", tmp_path / "fresh"
    spec = FeatureSpec((0, 1))
    cache_features(models, small, spec, grown, shard_tokens=50, progress=False)
    before = open_shards(grown, whole=True).index
    old = {(grown / s["file"]).stat().st_mtime_ns for s in before.shards}
    made: list[int] = []

    def make(i: int) -> list[int]:
        made.append(i)
        return large[i]

    counted = Corpus(large.source, len(large), make)
    counted.leaves = large.leaves
    cache_features(models, counted, spec, grown, shard_tokens=50, progress=False)
    after = open_shards(grown, whole=True)
    stayed = [s for s in after.index.shards if (grown / s["file"]).stat().st_mtime_ns in old]
    kept = sum(s["sequences"] for s in stayed)
    assert stayed == after.index.shards[: len(stayed)]
    assert len(corpus) <= kept < before.n_sequences  # the last piece of the small data grew
    assert min(made) >= len(corpus)  # no answer made again (pieces of files are compared)
    # The first piece that differs is compared, then made; every later one made once.
    assert [i for i in made if i > kept] == list(range(kept + 1, len(large)))
    cache_features(models, large, spec, fresh, shard_tokens=50, progress=False)
    again = open_shards(fresh, whole=True)
    assert np.array_equal(after.tokens, again.tokens)
    assert np.array_equal(after.starts, again.starts)
    assert mx.allclose(after.features, again.features, atol=1e-3)
    assert after.index.counts == again.index.counts
    assert after.manifest["source"] == large.source
    assert sorted(p.name for p in grown.glob("shard-*")) == [s["file"] for s in after.index.shards]
    # Other answers first: nothing of the cache begins that data.
    other = generate_corpus(models, PROMPTS[1:3], max_tokens=24, seed=0)
    with pytest.raises(SpecmlxError, match="source"):
        cache_features(models, data(900, other), spec, grown, progress=False)
    assert open_shards(grown, whole=True).index == after.index


def counted(corpus: Corpus, made: list[int]) -> Corpus:
    """`corpus`, noting in `made` each sequence it is asked to make (answer or cut)."""

    def make(i: int) -> list[int]:
        made.append(i)
        return corpus[i]

    def featured(i: int, spec: FeatureSpec, known=None):
        made.append(i)
        return corpus.with_features(i, spec, known)

    out = Corpus(corpus.source, len(corpus), make, featured)
    out.leaves = corpus.leaves
    return out


def test_more_prompts_keep_the_answers_already_cached(models, tmp_path, monkeypatch):
    """Prompts appended to a cached run's (more task prompts, another session): the answers
    cached are kept and never made again, the shard where the new data departs is cut
    short, the pieces of files after the answers are read from the shards the change set
    aside, not from the target, and the result is the cache a fresh run of the new data
    makes. Fewer prompts again: the answers they share stay. Other prompts first: refused."""
    from specmlx.training import data as data_module

    read_by_target: list[int] = []  # lengths of the sequences the target read for features
    target_features = data_module.target_features

    def counting(model, tokens, spec, chunk=512):
        read_by_target.append(len(tokens))
        return target_features(model, tokens, spec, chunk)

    monkeypatch.setattr(data_module, "target_features", counting)
    for i in range(4):
        (tmp_path / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 6)

    def data(prompts: list[str]) -> Corpus:
        answers = generate_corpus(models, prompts, max_tokens=24, seed=0, batch_size=2)
        return answers + file_corpus([tmp_path], models.tokenizer, max_tokens=200, seed=0)

    small, large = data(PROMPTS[:3]), data(PROMPTS)
    grown, fresh = tmp_path / "grown", tmp_path / "fresh"
    spec = FeatureSpec((0, 1))
    SHARD = 100  # tokens: answers 0-1 fill a shard, answer 2 and the file the next
    cache_features(models, small, spec, grown, shard_tokens=SHARD, progress=False)
    first = open_shards(grown, whole=True)
    assert any(s["sequences"] > 1 for s in first.index.shards)  # several sequences a shard
    made: list[int] = []
    read_by_target.clear()
    cache_features(models, counted(large, made), spec, grown, shard_tokens=SHARD, progress=False)
    assert min(made) == 3  # the three answers cached stay; the fourth prompt's is made
    assert read_by_target == []  # the piece of file moved after it: read from what was set aside
    assert not (grown / ".set-aside").exists()  # dropped once the cache is whole
    after = open_shards(grown, whole=True)
    assert any("of" in s["file"] for s in after.index.shards)  # a shard cut short
    assert sorted(p.name for p in grown.glob("shard-*")) == sorted(
        s["file"] for s in after.index.shards
    )
    cache_features(models, large, spec, fresh, shard_tokens=SHARD, progress=False)
    again = open_shards(fresh, whole=True)
    assert np.array_equal(after.tokens, again.tokens)
    assert np.array_equal(after.starts, again.starts)
    assert np.array_equal(after.nexts, again.nexts)
    assert mx.allclose(after.features, again.features, atol=1e-3)
    assert after.index.counts == again.index.counts and after.index.complete
    assert after.manifest["source"] == large.source
    # Back to the first prompts: their answers begin the cache (its prompts are kept beside
    # it), the fourth answer and what follows it go, and nothing of the first data is made.
    made.clear()
    cache_features(models, counted(small, made), spec, grown, shard_tokens=SHARD, progress=False)
    assert min(made) == 3  # the piece of file after the answers is compared, then made
    back = open_shards(grown, whole=True)
    assert np.array_equal(back.tokens, first.tokens) and np.array_equal(back.nexts, first.nexts)
    assert back.manifest["source"] == small.source and back.index.complete
    assert read_answered(grown) == PROMPTS[:3]
    # Other prompts first: nothing of the cache begins that data.
    with pytest.raises(SpecmlxError, match="source"):
        cache_features(models, data(PROMPTS[1:]), spec, grown, progress=False)


def test_what_growing_set_aside_outlives_a_ctrl_c_and_serves_only_its_features(
    models, tmp_path, monkeypatch
):
    """Cut short while answering the new prompt, a grown cache keeps what it set aside: the
    rerun reads the pieces of files from there. Set aside under other features (the run
    after the Ctrl-C asks for layers), it is dropped and the target reads them."""
    from specmlx.training import data as data_module

    (tmp_path / "m.py").write_text("def f(x):\n    return x * 2\n" * 6)
    read_by_target: list[int] = []
    target_features = data_module.target_features

    def counting(model, tokens, spec, chunk=512):
        read_by_target.append(len(tokens))
        return target_features(model, tokens, spec, chunk)

    monkeypatch.setattr(data_module, "target_features", counting)

    def data(prompts: list[str]) -> Corpus:
        answers = generate_corpus(models, prompts, max_tokens=24, seed=0, batch_size=2)
        return answers + file_corpus([tmp_path], models.tokenizer, max_tokens=200, seed=0)

    def interrupted(corpus: Corpus, at: int) -> Corpus:
        def featured(i: int, spec: FeatureSpec, known=None):
            if i == at:
                raise KeyboardInterrupt
            return corpus.with_features(i, spec, known)

        out = Corpus(corpus.source, len(corpus), corpus.__getitem__, featured)
        out.leaves = corpus.leaves
        return out

    small, large = data(PROMPTS[:2]), data(PROMPTS[:3])
    for spec_after in (FeatureSpec(), FeatureSpec((0, 1))):
        folder = tmp_path / f"cache-{len(spec_after.layers)}"
        cache_features(models, small, FeatureSpec(), folder, shard_tokens=60, progress=False)
        with pytest.raises(KeyboardInterrupt):
            cache_features(models, interrupted(large, 2), FeatureSpec(), folder, progress=False)
        assert any((folder / ".set-aside").glob("shard-*"))
        read_by_target.clear()
        cache_features(models, large, spec_after, folder, shard_tokens=60, progress=False)
        pieces = len(large) - answer_sequences(large.source)
        # Layers: the two answers held are read again for them, and the pieces of files too.
        assert len(read_by_target) == (2 + pieces if spec_after.layers else 0)
        assert not (folder / ".set-aside").exists() and open_shards(folder, whole=True)


def test_answers_behind_new_prompts_are_taken_back_not_made_again(models, tmp_path, monkeypatch):
    """Prompts put before cached answers (another writer's Magpie prompts ahead of the task
    prompts): the answers behind them are set aside and taken back by their prompts, so
    the target answers the new prompt alone, and the cache is the one a fresh run makes."""
    from specmlx.training import data as data_module

    answered_rows: list[int] = []
    answer_batch = data_module.answer_batch

    def counting(models, prompts, *args, **kwargs):
        answered_rows.append(len(prompts))
        return answer_batch(models, prompts, *args, **kwargs)

    monkeypatch.setattr(data_module, "answer_batch", counting)

    def data(*parts: list[str]) -> Corpus:
        corpora = [
            generate_corpus(models, prompts, max_tokens=24, seed=0, batch_size=2)
            for prompts in parts
        ]
        joined = corpora[0]
        for corpus in corpora[1:]:
            joined = joined + corpus
        return joined

    before = data(PROMPTS[:1], PROMPTS[1:])
    after = data(PROMPTS[:1], ["What is a list?"], PROMPTS[1:])
    spec, grown, fresh = FeatureSpec((0, 1)), tmp_path / "grown", tmp_path / "fresh"
    cache_features(models, before, spec, grown, shard_tokens=60, progress=False)
    answered_rows.clear()
    cache_features(models, after, spec, grown, shard_tokens=60, progress=False)
    assert answered_rows == [1]  # the new prompt; the three behind it were set aside
    assert not (grown / ".set-aside").exists()
    cache_features(models, after, spec, fresh, shard_tokens=60, progress=False)
    ours, theirs = open_shards(grown, whole=True), open_shards(fresh, whole=True)
    assert np.array_equal(ours.tokens, theirs.tokens)
    assert np.array_equal(ours.starts, theirs.starts)
    assert np.array_equal(ours.nexts, theirs.nexts)
    assert mx.allclose(ours.features, theirs.features, atol=1e-3)


def test_a_set_aside_answer_is_found_by_its_prompt_only_where_it_is_greedy(models, tmp_path):
    """`SetAside.answer`: the greedy answer among a prompt's answers (a sampled one beside
    it is not the target's own), cut to fewer tokens with its features; none where the
    answer held is shorter than asked for and did not end its turn."""
    import shutil

    from specmlx.api.generate import encode_prompt
    from specmlx.training.shards import ASIDE, SetAside, read_manifest

    corpus = generate_corpus(
        models, PROMPTS[:1], max_tokens=24, seed=0, batch_size=2, samples=2, temperature=5.0
    )
    made = tmp_path / "made"
    cache_features(models, corpus, FeatureSpec((0, 1)), made, progress=False)
    held = open_shards(made, whole=True)
    greedy = held.tokens[held.starts[0] : held.starts[1]].tolist()
    sampled = held.tokens[held.starts[1] : held.starts[2]].tolist()
    prompt = encode_prompt(models, PROMPTS[0], True)
    assert greedy[: len(prompt)] == sampled[: len(prompt)] == prompt and greedy != sampled
    folder = tmp_path / "folder"
    shutil.copytree(made, folder / ASIDE)
    aside = SetAside(folder, read_manifest(made))
    tokens, features, nexts, final = aside.answer(prompt, 24)
    assert tokens == greedy and len(features) == len(nexts) == len(final) == len(greedy)
    assert mx.allclose(features, held.features[: len(greedy)]).item()
    # 30 tokens: only an answer that ended its turn serves; one that ran its 24 does not.
    assert (aside.answer(prompt, 30) is None) == (greedy[-1] not in aside.stops)
    tokens, features, _, _ = aside.answer(prompt, 10)
    assert tokens == greedy[: len(prompt) + 10] and len(features) == len(prompt) + 10
    assert aside.answer(encode_prompt(models, PROMPTS[1], True), 24) is None
    # The sampled answer alone set aside: not the target's greedy one, never taken.
    only_sampled = Corpus(
        corpus.source | {"samples": 1},
        1,
        lambda i: corpus[1],
        lambda i, spec, known: corpus.with_features(1, spec),
    )
    made_sampled, folder_sampled = tmp_path / "made-sampled", tmp_path / "folder-sampled"
    cache_features(models, only_sampled, FeatureSpec((0, 1)), made_sampled, progress=False)
    shutil.copytree(made_sampled, folder_sampled / ASIDE)
    assert open_shards(made_sampled).tokens.tolist() == sampled
    assert SetAside(folder_sampled, read_manifest(made_sampled)).answer(prompt, 24) is None


def test_other_features_keep_the_answers_already_cached(models, tmp_path, monkeypatch):
    """A cache of final states asked for layers' features (Medusa's data, then EAGLE-3):
    its sequences are read again through the target, no answer is made again, and the
    result is the cache a fresh run makes. A Ctrl-C while reading leaves the old cache
    whole and the rerun goes on where it stopped; a swap cut short is finished by the next
    reader of the folder."""
    from specmlx.training import data as data_module
    from specmlx.training import shards

    (tmp_path / "m.py").write_text("def f(x):\n    return x * 2\n" * 12)
    corpus = generate_corpus(models, PROMPTS, max_tokens=24, seed=0, batch_size=2)
    corpus = corpus + file_corpus([tmp_path], models.tokenizer, max_tokens=200, seed=0)
    folder, fresh = tmp_path / "data", tmp_path / "fresh"
    SHARD = 60  # tokens: several shards
    cache_features(models, corpus, FeatureSpec(), folder, shard_tokens=SHARD, progress=False)
    before = open_shards(folder, whole=True)
    made: list[int] = []
    spec = FeatureSpec((0, 1))
    read, real = [], data_module.target_features

    def interrupted(model, tokens, spec, chunk):
        read.append(tokens)
        if len(read) == 3:
            raise KeyboardInterrupt
        return real(model, tokens, spec, chunk)

    monkeypatch.setattr(data_module, "target_features", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache_features(
            models, counted(corpus, made), spec, folder, shard_tokens=SHARD, progress=False
        )
    kept = open_shards(folder, whole=True)  # the old cache, whole
    assert kept.manifest == before.manifest and np.array_equal(kept.tokens, before.tokens)
    assert mx.array_equal(kept.features, before.features)
    assert (folder / shards.AGAIN).is_dir()
    read.clear()
    monkeypatch.setattr(data_module, "target_features", lambda *a: read.append(a[1]) or real(*a))
    cache_features(models, counted(corpus, made), spec, folder, shard_tokens=SHARD, progress=False)
    assert made == []  # no answer (nor piece of file) made again: only read
    assert len(read) == len(corpus) - 2  # went on after the two read before the Ctrl-C
    assert not (folder / shards.AGAIN).exists()
    after = open_shards(folder, whole=True)
    cache_features(models, corpus, spec, fresh, shard_tokens=SHARD, progress=False)
    again = open_shards(fresh, whole=True)
    assert after.manifest == again.manifest
    assert np.array_equal(after.tokens, again.tokens) and np.array_equal(after.nexts, again.nexts)
    assert np.array_equal(after.starts, again.starts)
    assert after.index.counts == again.index.counts
    assert mx.allclose(after.features, again.features, atol=1e-2, rtol=1e-2)
    finals = open_shards(folder, layers=()).features  # the final states stay beside them
    assert mx.allclose(finals, before.features, atol=1e-2, rtol=1e-2)
    assert sorted(p.name for p in folder.glob("shard-*")) == sorted(
        s["file"] for s in after.index.shards
    )
    # Back to the final state alone, the swap cut short as its index is moved in: the next
    # reader of the folder finishes it.
    real_replace = shards.os.replace

    def cut(src, dst):
        if Path(dst) == folder / shards.INDEX and Path(src).parent.name == shards.AGAIN:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(shards.os, "replace", cut)  # os's own: every writer's
    with pytest.raises(KeyboardInterrupt):
        cache_features(models, counted(corpus, made), FeatureSpec((1,)), folder, progress=False)
    monkeypatch.setattr(shards.os, "replace", real_replace)
    assert (folder / shards.AGAIN).is_dir()
    one = open_shards(folder, whole=True)
    assert one.manifest["feature_layers"] == [1] and not (folder / shards.AGAIN).exists()
    assert made == []
    assert np.array_equal(one.tokens, before.tokens)
    assert mx.allclose(one.features, after.features[:, -one.features.shape[1] :], atol=1e-2)


def test_other_features_read_again_only_what_begins_the_new_data(models, tmp_path, monkeypatch):
    """Other features and other data at once: what the cache holds of the new data is read
    again, nothing else; data the cache holds nothing of is refused before any reading."""
    from specmlx.training import data as data_module

    def answers(prompts: list[str]) -> Corpus:
        return generate_corpus(models, prompts, max_tokens=24, seed=0, batch_size=2)

    folder, fresh = tmp_path / "data", tmp_path / "fresh"
    cache_features(models, answers(PROMPTS[:3]), FeatureSpec(), folder, progress=False)
    read, real = [], data_module.target_features
    monkeypatch.setattr(data_module, "target_features", lambda *a: read.append(a[1]) or real(*a))
    spec = FeatureSpec((0, 1))
    with pytest.raises(SpecmlxError, match="source"):
        cache_features(models, answers(PROMPTS[1:]), spec, folder, progress=False)
    assert read == []
    new = answers([*PROMPTS[:2], "Other prompt"])
    cache_features(models, new, spec, folder, shard_tokens=60, progress=False)
    assert len(read) == 2  # the answers both begin with; the third prompt's is answered
    # Features begun and cut short, then a run that wants the folder's own: they go.
    (folder / ".features-again").mkdir()
    cache_features(models, new, FeatureSpec(), folder, shard_tokens=60, progress=False)
    assert not (folder / ".features-again").exists() and len(read) == 2  # served by the layers
    cache_features(models, new, spec, fresh, shard_tokens=60, progress=False)
    after, again = open_shards(folder, whole=True), open_shards(fresh, whole=True)
    assert after.manifest == again.manifest and np.array_equal(after.tokens, again.tokens)
    assert mx.allclose(after.features, again.features, atol=1e-2, rtol=1e-2)


def test_magpie_prompts_come_from_the_user_prefix_and_are_kept(models, tmp_path, monkeypatch):
    """Each draw starts at the template's user prefix; prompts that did not end their turn
    (cut at max_tokens) or say nothing are dropped, repeats kept once; the set is written
    to the data folder and read back from there."""
    import sys

    import mlx_lm.generate  # noqa: F401 (the module, which mlx_lm's `generate` shadows)

    from specmlx.training import magpie

    prefix = magpie.user_prefix(models.tokenizer)
    text = models.tokenizer.decode(prefix)
    assert text.rstrip().endswith("user") and "assistant" not in text
    tok = models.tokenizer
    turns = [" Sort a list ", "Sort a list", "", "word " * 200]
    seen = []

    def batch_generate(model, tokenizer, prompts, max_tokens, return_token_ids, sampler):
        seen.extend(prompts)
        ids = [tok.encode(t, add_special_tokens=False)[:max_tokens] for t in turns]
        return type("Answers", (), {"token_ids": ids[: len(prompts)]})

    monkeypatch.setattr(sys.modules["mlx_lm.generate"], "batch_generate", batch_generate)
    prompts = magpie.cached_magpie_prompts(models, tmp_path, 4, seed=0, max_tokens=64)
    assert prompts == ["Sort a list"] and seen == [prefix] * 4
    saved = tmp_path / "magpie-4-seed0.jsonl"
    assert [json.loads(line)["prompt"] for line in saved.read_text().splitlines()] == prompts

    def drawn_again(*args, **kwargs):
        raise AssertionError("the kept prompts are read back, not drawn again")

    monkeypatch.setattr(magpie, "magpie_prompts", drawn_again)
    assert magpie.cached_magpie_prompts(models, tmp_path, 4, seed=0) == prompts


def test_another_model_writes_magpie_prompts_kept_under_its_name(models, tmp_path, monkeypatch):
    """`N@MODEL`: the writer is loaded and sampled from its own template's user prefix;
    its prompts are kept in a file named after it, beside the target's own, and read back
    without loading it again."""
    import sys

    import mlx_lm.generate  # noqa: F401 (the module, which mlx_lm's `generate` shadows)

    import specmlx.api.load
    from specmlx.training import magpie

    draws = magpie.MagpieDraws.parse("3@models/chat/writer-1")
    assert draws == magpie.MagpieDraws(3, "models/chat/writer-1")
    assert draws.file_name(7) == "magpie-3-seed7-writer-1.jsonl"
    assert magpie.MagpieDraws.parse("3").file_name(7) == "magpie-3-seed7.jsonl"
    assert draws.record() == {"count": 3, "writer": "models/chat/writer-1"}  # as given
    assert magpie.MagpieDraws(3, "/home/me/writer-1").record()["writer"] == "writer-1"
    loaded = []

    def load(reference, default_draft=True):
        loaded.append((reference, default_draft))
        return models

    def batch_generate(model, tokenizer, prompts, max_tokens, return_token_ids, sampler):
        assert prompts == [magpie.user_prefix(models.tokenizer)] * len(prompts)
        ids = [models.tokenizer.encode(f"Question {i}", add_special_tokens=False) for i in (1, 2)]
        return type("Answers", (), {"token_ids": ids[: len(prompts)]})

    monkeypatch.setattr(specmlx.api.load, "load", load)
    monkeypatch.setattr(sys.modules["mlx_lm.generate"], "batch_generate", batch_generate)
    target = object()  # the target itself writes nothing here
    kept = magpie.cached_magpie_prompts(target, tmp_path, 2, writer="chat/writer-1")
    assert kept == ["Question 1", "Question 2"] and loaded == [("chat/writer-1", False)]
    assert (tmp_path / "magpie-2-seed0-writer-1.jsonl").is_file()
    assert magpie.cached_magpie_prompts(target, tmp_path, 2, writer="chat/writer-1") == kept
    assert len(loaded) == 1  # read back, the writer not loaded again


def test_question_draws_begin_each_user_turn_with_an_opening(models, tmp_path, monkeypatch):
    """`--questions`: each draw's user turn starts with one of the openings, encoded with the
    template's user prefix; the kept prompt is the opening and what the writer went on to
    say (a draw that said nothing after it is dropped); the same seed draws the same
    openings; the set is kept under its own name and recorded as question draws."""
    import sys

    import mlx_lm.generate  # noqa: F401 (the module, which mlx_lm's `generate` shadows)

    from specmlx.training import magpie

    tok = models.tokenizer
    plain = magpie.user_prefix(tok)
    seen = []

    def batch_generate(model, tokenizer, prompts, max_tokens, return_token_ids, sampler):
        seen.append(prompts)
        said = [" the sky blue?", " ", " sleep", "x " * 200]
        ids = [tok.encode(t, add_special_tokens=False)[:max_tokens] for t in said]
        return type("Answers", (), {"token_ids": ids[: len(prompts)]})

    monkeypatch.setattr(sys.modules["mlx_lm.generate"], "batch_generate", batch_generate)
    kept = magpie.cached_magpie_prompts(models, tmp_path, 4, seed=3, questions=True, max_tokens=64)
    openings = [
        next(o for o in magpie.OPENINGS if magpie.user_prefix(tok, o) == row) for row in seen[0]
    ]
    assert all(row[: len(plain)] == plain and len(row) > len(plain) for row in seen[0])
    assert kept == [openings[0] + " the sky blue?", openings[2] + " sleep"]
    assert magpie.magpie_prompts(models, 4, seed=3, openings=magpie.OPENINGS) == kept
    assert seen[1] == seen[0]  # the same seed, the same openings
    assert magpie.magpie_prompts(models, 4, seed=4, openings=magpie.OPENINGS) and seen[2] != seen[0]
    draws = magpie.MagpieDraws.parse("4", questions=True)
    assert draws.file_name(3) == "magpie-questions-4-seed3.jsonl"
    assert (tmp_path / draws.file_name(3)).is_file()
    assert draws.record() == {"count": 4, "questions": True}
    with pytest.raises(UsageError, match="--questions takes N or N@MODEL, got 'x'"):
        magpie.MagpieDraws.parse("x", questions=True)


def test_a_question_keeps_the_space_a_tokenizer_drops_at_a_texts_start():
    """A SentencePiece-style tokenizer decodes a text's first token without its leading
    space: the writer's words are decoded behind the opening, not on their own."""
    from specmlx.training.magpie import _continuation

    class Pieces:  # one token a word, its space in front; decode drops the first one's
        def __init__(self):
            self.words: list[str] = []

        def encode(self, text, add_special_tokens=False):
            ids = []
            for word in text.replace(" ", "\0 ").split("\0"):
                if word:
                    self.words.append(word)
                    ids.append(len(self.words) - 1)
            return ids

        def decode(self, ids):
            return "".join(self.words[i] for i in ids).lstrip(" ")

    tok = Pieces()
    said = tok.encode(" the sky blue?")
    assert tok.decode(said) == "the sky blue?"  # on its own, the space is gone
    assert "What is" + _continuation(tok, "What is", said) == "What is the sky blue?"
    assert _continuation(tok, "", said) == "the sky blue?"  # free draws: as before


@pytest.mark.real
def test_the_real_instruct_target_writes_distinct_prompts():
    from tests.test_real_loop import need

    need("smollm2-135m")
    from specmlx.training.magpie import magpie_prompts

    real = specmlx.load("smollm2-135m", default_draft=False, progress=False)
    prompts = magpie_prompts(real, 8, max_tokens=64, seed=0, batch_size=8, progress=False)
    assert len(prompts) >= 4 and len(set(prompts)) == len(prompts)
    assert prompts == magpie_prompts(real, 8, max_tokens=64, seed=0, batch_size=8, progress=False)


def test_an_eagle_layer_can_start_as_the_targets_last(models):
    config = TrainConfig(kind="eagle", init_from_target=True, draft_vocab=None)
    head = _create(models, config, None)
    last = dict(tree_flatten(backbone(models.target).layers[-1].parameters()))
    copied = dict(tree_flatten(head.layer.parameters()))
    assert copied.keys() <= last.keys()
    assert all(mx.array_equal(copied[k], last[k].astype(mx.float32)) for k in copied)
    plain = dict(tree_flatten(_create(models, TrainConfig(kind="eagle"), None).layer.parameters()))
    assert not mx.any(plain["self_attn.o_proj.weight"]).item()  # the identity otherwise
    with pytest.raises(UsageError, match="copy no target layer"):
        TrainConfig(kind="medusa", init_from_target=True)


def test_heads_stored_in_bfloat16_load_back_in_their_own_dtype(models, tmp_path):
    from specmlx.heads import load_heads
    from specmlx.heads.store import save_heads

    heads = _create(models, TrainConfig(kind="eagle", draft_vocab=None), None)
    save_heads(heads, tmp_path / "full")
    save_heads(heads, tmp_path / "half", dtype=mx.bfloat16)
    full = (tmp_path / "full" / "model.safetensors").stat().st_size
    half = (tmp_path / "half" / "model.safetensors").stat().st_size
    assert half < 0.6 * full
    loaded = load_heads(tmp_path / "half", models.target, models.tokenizer)
    for name, value in tree_flatten(loaded.trainable_parameters()):
        original = dict(tree_flatten(heads.trainable_parameters()))[name]
        assert value.dtype == original.dtype == mx.float32
        assert mx.array_equal(value, original.astype(mx.bfloat16).astype(mx.float32))
    with pytest.raises(UsageError, match="save dtype"):
        TrainConfig(save_dtype="int8")


def test_task_prompts_ask_for_work_on_the_files_functions(tmp_path, monkeypatch):
    """Tasks on the functions, classes and methods of Python files: distinct, the same for
    the same seed (fewer of them the first of more), methods as if at top level; implement-tasks only on functions with a
    docstring; files with no code in them are a one-line error; kept in the data folder."""
    import ast

    from specmlx.training import tasks

    tmp_path, root = tmp_path / "src", tmp_path
    tmp_path.mkdir()
    (tmp_path / "shapes.py").write_text(
        "class Square:\n"
        "    def __init__(self, side):\n        self.side = side\n\n"
        "    def area(self):\n        '''The area.'''\n        side = self.side\n"
        "        return side * side\n"
    )
    for i in range(5):
        (tmp_path / f"m{i}.py").write_text(
            f"def f{i}(x, y):\n    '''Sum plus {i}.'''\n    s = x + y\n    return s + {i}\n"
        )
    (tmp_path / "notes.txt").write_text("def not_python():\n    pass\n\n\n")
    prompts = tasks.task_prompts([tmp_path], 20, seed=0)
    assert len(prompts) == len(set(prompts)) <= 20 and len(prompts) >= 6
    assert prompts == tasks.task_prompts([tmp_path], 20, seed=0)
    assert prompts != tasks.task_prompts([tmp_path], 20, seed=1)  # another order
    # Fewer prompts are the first of more: a cache of their answers grows in place.
    assert tasks.task_prompts([tmp_path], 3, seed=0) == prompts[:3]
    for prompt in prompts:
        code = prompt.split("```python\n")[1].split("\n```")[0]
        ast.parse(code)  # a method cut out of its class reads as top-level code
        assert "not_python" not in code
        if prompt.startswith("Implement"):
            assert '"""' in code or "'''" in code
            assert "return" not in code  # the body is left to write
    pieces = {name for name, _, _ in tasks.code_pieces(tmp_path / "shapes.py")}
    assert pieces == {"Square", "area"}  # __init__ is 2 lines: too short to ask about
    empty = root / "empty"
    empty.mkdir()
    (empty / "a.py").write_text("x = 1\n")
    with pytest.raises(UsageError, match="no Python function or class"):
        tasks.task_prompts([empty], 4)
    with pytest.raises(UsageError, match="at least one task prompt"):
        tasks.task_prompts([tmp_path], 0)
    kept = tasks.cached_task_prompts(root / "data", [tmp_path], 20, seed=0)
    assert kept == prompts and len(list((root / "data").glob("tasks-20-seed0-*.jsonl"))) == 1
    monkeypatch.setattr(tasks, "task_prompts", lambda *a, **k: pytest.fail("made again"))
    assert tasks.cached_task_prompts(root / "data", [tmp_path], 20, seed=0) == prompts


@pytest.mark.parametrize("spec", [FeatureSpec((0, 1)), FeatureSpec()])
def test_batched_answers_carry_the_features_a_pass_of_their_own_reads(models, spec):
    """Answered in batches, every sequence (prompt + answer, greedy and sampled, rows that
    end early and rows cut at max_tokens, a last block of 2) comes with the features, next
    tokens and final states a teacher-forced pass over it reads, and the same tokens as a
    request for tokens alone."""
    from types import SimpleNamespace

    from specmlx.training.answers import answer_batch
    from specmlx.training.data import encode_prompt, target_features

    prompts = [*PROMPTS, "Write a haiku about the sea", "x"]
    corpus = generate_corpus(models, prompts, max_tokens=10, seed=0, batch_size=4, samples=2)
    alone = generate_corpus(models, prompts, max_tokens=10, seed=0, batch_size=4, samples=2)
    for i in range(len(corpus)):
        tokens, features, nexts, finals = corpus.with_features(i, spec)
        assert tokens == alone[i]  # a request for tokens alone: the same answers
        want, want_nexts, want_finals = target_features(models.target, tokens, spec)
        assert features.shape == want.shape and features.dtype == mx.float16
        assert mx.allclose(features, want, atol=2e-2, rtol=1e-2)
        assert nexts.tolist() == want_nexts.tolist()
        if spec.layers:
            assert mx.allclose(finals, want_finals, atol=2e-2, rtol=1e-2)
        else:
            assert finals is None and want_finals is None
    # Rows that end their turn early: the stop token is kept and read too.
    ids = [encode_prompt(models, p, True) for p in prompts[:4]]
    free = answer_batch(models, ids, 8, SamplingConfig(), 0)
    stop = free[1].answer[2]  # row 1 says it third: a stop token ends row 1 there
    counting = _CountingRows(models.target)
    stopping = SimpleNamespace(target=counting, tokenizer=SimpleNamespace(eos_token_ids={stop}))
    rows = answer_batch(stopping, ids, 8, SamplingConfig(), 0, spec)
    assert rows[1].answer == free[1].answer[:3]
    # Row 1 leaves the batch once it has read its stop token; the others decode on.
    decoding = counting.rows[-9:]  # 8 tokens, and the last one read
    assert decoding[:4] == [4] * 4 and decoding[4:] == [3] * 5
    for row, prompt in zip(rows, ids, strict=True):
        assert row.answer[-1] == stop or len(row.answer) == 8
        assert stop not in row.answer[:-1]
        assert row.features.shape[0] == row.nexts.shape[0] == len(prompt) + len(row.answer)
        want, want_nexts, _ = target_features(models.target, prompt + row.answer, spec)
        assert mx.allclose(row.features, want, atol=2e-2, rtol=1e-2)
        assert row.nexts.tolist() == want_nexts.tolist()


class _CountingRows:
    """A target that counts the rows of every call made to it."""

    def __init__(self, model):
        self.model_itself, self.rows = model, []

    def __call__(self, tokens, cache=None):
        self.rows.append(tokens.shape[0])
        return self.model_itself(tokens, cache=cache)

    def __getattr__(self, key):
        return getattr(self.model_itself, key)


def test_prompts_are_prefilled_in_groups_of_like_length():
    """Shortest first; a longer prompt joins a group while the padding it puts on the
    group's rows costs less than a call; prompts with nothing to prefill join none."""
    from specmlx.training.answers import PREFILL_CALL_TOKENS, prefill_groups

    assert PREFILL_CALL_TOKENS == 16  # what the groups below are worked out for
    lengths = [40, 0, 3, 41, 200, 3, 42, 190, 5]
    assert prefill_groups(lengths) == [[2, 5, 8], [0, 3, 6], [7, 4]]
    assert prefill_groups([0, 0]) == [] and prefill_groups([7]) == [[0]]
