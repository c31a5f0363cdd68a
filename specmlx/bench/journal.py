"""Where a long bench keeps what it measured, so that a run stopped midway (Ctrl-C, a
session's end) goes on from there.

A bench that writes a report keeps a journal beside it (`journal_path`), begun when its first
group finishes: a first line that names the run (its options, prompts, models and the
software and device measuring, `run_identity`), then one line per finished group, every
row's measurement of one prompt and repeat at one temperature, and what each suffix memory
had learnt to trust after it. The same command run again reads it, measures only the groups
it lacks (`specmlx.bench.run.run`) and reports over all of them; a journal of another run is
refused in one line, unless no group of it finished. A line cut off by a stop is dropped.
The CLI removes the journal once the report is written.

A resumed run refills each row's suffix memory with the answers measured before, and its
trust as it stood; what adaptive k learned of each drafter's costs and acceptance is not
carried over (it starts again from the calibrated costs and its priors), and the report
says how many groups were measured before.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from specmlx.bench.run import BenchConfig, Group, GroupKey, Measurement, RowSpec
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.stats import Stats
from specmlx.engine.step import Step
from specmlx.errors import UsageError
from specmlx.io.files import write_atomic

FORMAT = "specmlx-bench-journal"
VERSION = 1


def journal_path(outputs: tuple[Path | None, ...]) -> Path | None:
    """Beside the first report file asked for; None: no report, nothing to resume into."""
    first = next((path for path in outputs if path is not None), None)
    return None if first is None else first.with_name(first.name + ".journal")


def run_identity(
    config: BenchConfig,
    models: dict[str, Path | None],
    heads: list[str],
    environment: dict[str, Any],
    journal: Path,
) -> dict[str, Any]:
    """What makes two bench runs the same run: every option that changes a measurement,
    each prompt's text (by hash), the models (their paths from the journal's folder, so a
    checkout elsewhere goes on too; the heads as given), and the software and device that
    measure (versions, device, backend, BLAS). Warm-up and output files are not."""
    return _plain(
        {
            "suites": [
                {
                    "name": suite.name,
                    "ordered": suite.ordered,
                    "prompts": [[p.id, _digest(p.text)] for p in suite.prompts],
                }
                for suite in config.suites
            ],
            "rows": [asdict(row) for row in config.rows],
            "temperatures": config.temperatures,
            "top_p": config.top_p,
            "top_k": config.top_k,
            "max_tokens": config.max_tokens,
            "repeats": config.repeats,
            "seed": config.seed,
            "chat_template": config.chat_template,
            "options": {type(o).__name__: asdict(o) for o in config.options},
            "models": {role: _relative(path, journal.parent) for role, path in models.items()},
            "heads": heads,
            "measured_by": {
                key: environment.get(key)
                for key in ("specmlx", "mlx", "mlx_lm", "device", "backend", "blas")
            },
        }
    )


class Journal:
    """The groups a bench run finished, read back from its journal file, and the file that
    each newly finished group is appended to (begun with the first one)."""

    def __init__(self, path: Path, header: dict[str, Any], done: dict[GroupKey, Group]):
        self.path = path
        self.header = header
        self.done = done
        self._begun = bool(done)

    @classmethod
    def open(cls, path: Path, identity: dict[str, Any]) -> Journal:
        """The journal at `path` of the run `identity` names: its groups read back if it
        holds some (refused if it is another run's); a file with none is begun anew."""
        header = {"format": FORMAT, "version": VERSION, "run": identity}
        if not path.exists():
            return cls(path, header, {})
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the bench journal {path}: {exc}") from None
        lines = text.splitlines()
        try:
            first = json.loads(lines[0]) if lines else None
        except ValueError:
            first = None
        if not isinstance(first, dict) or first.get("format") != FORMAT:
            raise UsageError(f"{path} is not a bench journal; move it away to run the bench")
        if len(lines) < 2:  # no group finished: nothing to keep, whose run it was
            return cls(path, header, {})
        if first.get("version") != VERSION or first.get("run") != identity:
            raise UsageError(
                f"{path} is the journal of another bench run (other options, prompts, models "
                "or software): run that command again to finish it, or remove the file"
            )
        done: dict[GroupKey, Group] = {}
        kept = [lines[0]]
        for line in lines[1:]:
            try:
                key, group = _group_of(json.loads(line))
            except (ValueError, KeyError, TypeError):
                break  # cut off by a stop: this group runs again
            done[key] = group
            kept.append(line)
        if len(kept) < len(lines) or not text.endswith("\n"):
            write_atomic(path, "".join(line + "\n" for line in kept))
        return cls(path, header, done)

    def keep(self, key: GroupKey, group: Group) -> None:
        """Append a finished group, on disk before the bench goes on."""
        temperature, suite, prompt_id, repeat = key
        line = json.dumps(
            {
                "temperature": temperature,
                "suite": suite,
                "prompt_id": prompt_id,
                "repeat": repeat,
                "measurements": [to_record(m) for m in group.measurements],
                "trust": {str(i): trust for i, trust in group.trust.items()},
            }
        )
        try:
            if not self._begun:
                write_atomic(self.path, json.dumps(self.header) + "\n" + line + "\n")
                self._begun = True
                return
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise UsageError(f"cannot write the bench journal {self.path}: {exc}") from None

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _group_of(data: dict[str, Any]) -> tuple[GroupKey, Group]:
    key = (float(data["temperature"]), str(data["suite"]), str(data["prompt_id"]))
    measurements = tuple(from_record(m) for m in data["measurements"])
    trust = {int(i): t for i, t in data["trust"].items()}
    return (*key, int(data["repeat"])), Group(measurements, trust)


def to_record(measurement: Measurement) -> dict[str, Any]:
    return asdict(measurement)


def from_record(data: dict[str, Any]) -> Measurement:
    """A measurement as `to_record` wrote it (JSON's lists back to tuples)."""
    row = data["row"]
    sampling = row["sampling"]
    return Measurement(
        **{
            **_tuples(data, Measurement),
            "row": RowSpec(
                row["method"], row["k"], None if sampling is None else SamplingConfig(**sampling)
            ),
            "stats": Stats(**_tuples(data["stats"], Stats)),
            "decode_steps": tuple(Step(**_tuples(s, Step)) for s in data["decode_steps"]),
        }
    )


def _tuples(data: dict[str, Any], cls: type) -> dict[str, Any]:
    """The fields of `cls` in `data`, lists made tuples; unknown keys refused (KeyError)."""
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise KeyError(f"unknown fields {sorted(unknown)}")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


def _relative(path: Path | None, folder: Path) -> str | None:
    return None if path is None else os.path.relpath(Path(path).resolve(), folder.resolve())


def _digest(text: Any) -> str:
    return hashlib.sha256(json.dumps(text, ensure_ascii=False).encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """As it reads back from JSON: tuples as lists."""
    return json.loads(json.dumps(value))
