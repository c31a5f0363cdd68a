"""resolve_model: paths, GGUF files (converted once), aliases and Hub ids, with the Hub faked."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import errors as hub_errors

from specmlx.errors import SpecmlxError
from specmlx.io import resolve
from specmlx.io.registry import load_registry
from specmlx.io.resolve import resolve_model


@pytest.fixture(autouse=True)
def folders(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECMLX_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def converts(monkeypatch) -> list[tuple[Path, Path]]:
    """A stand-in `specmlx.io.convert` that records its calls and writes a config.json."""
    calls: list[tuple[Path, Path]] = []

    def convert_gguf(src, out, *, dtype="float32", force=False, progress=True, **_):
        calls.append((Path(src), Path(out)))
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.json").write_text(json.dumps({"from": str(src)}))
        return Path(out)

    module = types.ModuleType("specmlx.io.convert")
    module.convert_gguf = convert_gguf
    monkeypatch.setitem(sys.modules, "specmlx.io.convert", module)
    return calls


def model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


class FakeHub:
    """snapshot_download stand-in: `cached` repos resolve locally; online behaviour is chosen."""

    def __init__(self, root: Path, online: BaseException | None = None, cached=()):
        self.root, self.online, self.cached = root, online, set(cached)
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, repo_id, *, allow_patterns=None, local_files_only=False, **_):
        self.calls.append((repo_id, local_files_only))
        assert "model*.safetensors" in allow_patterns and "*.json" in allow_patterns
        folder = self.root / "hub" / repo_id.replace("/", "--")
        if local_files_only:
            if repo_id not in self.cached:
                raise hub_errors.LocalEntryNotFoundError("Cannot find an appropriate cached...")
            return str(folder)
        if self.online is not None:
            raise self.online
        model_dir(folder)
        return str(folder)


def test_local_model_folder_is_returned_as_is(folders):
    folder = model_dir(folders / "my-model")
    assert resolve_model(str(folder)) == folder.resolve()
    assert resolve_model("my-model") == folder.resolve()  # relative to the working directory


def test_folder_without_config_and_missing_paths_are_clear(folders):
    (folders / "empty").mkdir()
    with pytest.raises(SpecmlxError, match="no config.json"):
        resolve_model("empty")
    for ref in ("./nope", "/no/such/dir", "missing.gguf", "a/b/c"):
        with pytest.raises(SpecmlxError, match="no such file or folder"):
            resolve_model(ref)
    (folders / "notes.txt").write_text("hi")
    with pytest.raises(SpecmlxError, match="neither"):
        resolve_model("notes.txt")


def test_gguf_is_converted_once_then_reused(folders, converts, monkeypatch):
    hashed = []
    real_sha256 = resolve.sha256_file
    monkeypatch.setattr(resolve, "sha256_file", lambda p, **k: hashed.append(p) or real_sha256(p))
    gguf = folders / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\1" * 1000)

    first = resolve_model(str(gguf), progress=False)
    assert (first / "config.json").is_file()
    assert first.parent == folders / "cache" / "gguf" and len(first.name) == 16
    assert resolve_model(str(gguf), progress=False) == first
    assert len(converts) == 1 and len(hashed) == 1  # same size and mtime: no re-hash

    other = folders / "n.gguf"
    other.write_bytes(b"GGUF" + b"\2" * 1000)
    assert resolve_model(str(other), progress=False) != first
    assert len(converts) == 2


def test_alias_prefers_the_local_copy(folders, monkeypatch):
    hub = FakeHub(folders)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    local = model_dir(folders / "models" / "local" / "smollm2-135m")
    assert resolve_model("smollm2-135m") == local
    assert hub.calls == []


def test_alias_without_local_copy_goes_to_its_hub_repo(folders, monkeypatch):
    hub = FakeHub(folders)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    path = resolve_model("qwen2.5-coder-0.5b", progress=False)
    repo = load_registry().get("qwen2.5-coder-0.5b").hf_repo
    assert (path / "config.json").is_file()
    assert hub.calls == [(repo, True), (repo, False)]


def test_cached_hub_repo_resolves_without_going_online(folders, monkeypatch):
    model_dir(folders / "hub" / "org--name")
    hub = FakeHub(folders, online=AssertionError("went online"), cached={"org/name"})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    assert resolve_model("org/name") == folders / "hub" / "org--name"
    assert hub.calls == [("org/name", True)]


@pytest.mark.parametrize(
    "down",
    [
        hub_errors.LocalEntryNotFoundError("An error happened while trying to locate the files"),
        hub_errors.OfflineModeIsEnabled("offline"),
        httpx2.ConnectError("[Errno 111] Connection refused"),
        ConnectionError("reset"),
    ],
)
def test_hub_down_is_one_line_with_offline_instructions(folders, monkeypatch, down):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(folders, online=down))
    with pytest.raises(SpecmlxError) as info:
        resolve_model("org/name")
    message = str(info.value)
    assert "\n" not in message
    assert "cannot reach the Hugging Face Hub" in message and "org/name" in message
    assert "make models" in message and "specmlx fetch" in message and ".gguf" in message


def test_hub_down_for_an_alias_names_its_fetch_command(folders, monkeypatch):
    down = hub_errors.LocalEntryNotFoundError("no connection")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(folders, online=down))
    with pytest.raises(SpecmlxError, match="specmlx fetch gemma3-270m"):
        resolve_model("gemma3-270m")
    with pytest.raises(SpecmlxError, match="specmlx fetch gemma3-270m"):  # its Hub id too
        resolve_model(load_registry().get("gemma3-270m").hf_repo)


def test_missing_hub_repo_and_non_model_repo(folders, monkeypatch):
    response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/api/x"))
    missing = hub_errors.RepositoryNotFoundError("404 Client Error", response=response)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(folders, online=missing))
    with pytest.raises(SpecmlxError, match="not found on the Hugging Face Hub"):
        resolve_model("org/name")

    (folders / "hub" / "org--bare").mkdir(parents=True)
    hub = FakeHub(folders, cached={"org/bare"})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    with pytest.raises(SpecmlxError, match="no config.json"):
        resolve_model("org/bare")


def test_unknown_reference_lists_the_aliases(folders):
    with pytest.raises(SpecmlxError) as info:
        resolve_model("qwen-giant")
    message = str(info.value)
    assert "\n" not in message and "qwen-giant" in message
    assert "smollm2-135m" in message and "qwen2.5-coder-1.5b" in message
