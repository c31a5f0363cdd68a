"""Shared fixtures: tiny model folders built once per session, offline."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Calibrations and converted GGUFs of the tests stay out of the user's cache.
os.environ["SPECMLX_CACHE_DIR"] = tempfile.mkdtemp(prefix="specmlx-test-cache-")

from tests.tiny import make_model_dir  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """Folders of tiny random models: one per architecture, plus unrelated drafts."""
    root = tmp_path_factory.mktemp("tiny")
    dirs = {}
    for arch in ("llama", "qwen2", "gemma3_text", "qwen2_moe"):
        dirs[arch] = make_model_dir(root / arch, arch, seed=1)
        dirs[f"{arch}-draft"] = make_model_dir(root / f"{arch}-draft", arch, seed=2)
    return dirs


@pytest.fixture(scope="session")
def loaded(tiny_dirs):
    """loaded(name): the tiny model of `tiny_dirs[name]` and its tokenizer, loaded once."""
    import mlx_lm

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = mlx_lm.load(str(tiny_dirs[name]))
        return cache[name]

    return get
