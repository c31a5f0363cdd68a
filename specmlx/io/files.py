"""Writing files so that a reader never sees half of one.

`write_atomic` writes through a temporary file in the same folder and renames it into place:
an error or a Ctrl-C midway leaves the old file (or none), never a truncated one. Reports,
benchmark results and other outputs the user asked for go through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Read once: os.umask can only be read by setting it, which would race between threads.
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write through a temporary file in the same folder and rename it into place."""
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; an ordinary file would not be
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
