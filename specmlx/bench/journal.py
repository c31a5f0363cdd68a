"""Where a long bench keeps what it measured, so that a run stopped midway (Ctrl-C, a
session's end) goes on from there.

A bench that writes a report keeps a journal beside it (`journal_path`): a first line that
names the run (its options, prompts and models, `run_identity`), then one line per finished
group, every row's measurement of one prompt and repeat at one temperature. The same command
run again reads it, measures only the groups it lacks (`specmlx.bench.run.run`) and reports
over all of them; a journal of another run is refused in one line. A line cut off by a stop
is dropped. The CLI removes the journal once the report is written.

What a resumed run does not carry over from the groups measured before: what adaptive k
learned of each drafter (it starts again from the calibrated costs and its priors), and
suffix decoding's trust; each row's suffix memory is refilled with the answers measured
before.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from specmlx.bench.run import BenchConfig, GroupKey, Measurement, RowSpec
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
    config: BenchConfig, models: dict[str, Path | None], heads: list[str]
) -> dict[str, Any]:
    """What makes two bench runs the same run: every option that changes a measurement,
    each prompt's text (by hash), the models' paths (from the working folder where they lie
    in it, so a checkout elsewhere goes on too) and the heads' kinds. Warm-up and output
    files are not."""
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
            "models": {role: _where(path) for role, path in models.items()},
            "heads": heads,
        }
    )


def _where(path: Path | None) -> str | None:
    if path is None:
        return None
    path = Path(path).resolve()
    cwd = Path.cwd().resolve()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


class Journal:
    """The groups a bench run finished, read back from its journal file, and the file that
    each newly finished group is appended to."""

    def __init__(self, path: Path, done: dict[GroupKey, list[Measurement]]):
        self.path = path
        self.done = done

    @classmethod
    def open(cls, path: Path, identity: dict[str, Any]) -> Journal:
        """The journal at `path` of the run `identity` names: read back if there is one
        (refused if it is another run's), else begun."""
        header = {"format": FORMAT, "version": VERSION, "run": identity}
        if not path.exists():
            write_atomic(path, json.dumps(header) + "\n")
            return cls(path, {})
        try:
            lines = path.read_text("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the bench journal {path}: {exc}") from None
        try:
            first = json.loads(lines[0]) if lines else None
        except ValueError:
            first = None
        if not isinstance(first, dict) or first.get("format") != FORMAT:
            raise UsageError(f"{path} is not a bench journal; move it away to run the bench")
        if first.get("version") != VERSION or first.get("run") != identity:
            raise UsageError(
                f"{path} is the journal of another bench run (other options, prompts or "
                "models): run that command again to finish it, or remove the file"
            )
        done: dict[GroupKey, list[Measurement]] = {}
        kept = [lines[0]]
        for line in lines[1:]:
            try:
                group = json.loads(line)
                key = (
                    float(group["temperature"]),
                    str(group["suite"]),
                    str(group["prompt_id"]),
                    int(group["repeat"]),
                )
                done[key] = [from_record(m) for m in group["measurements"]]
            except (ValueError, KeyError, TypeError):
                break  # cut off by a stop: this group runs again
            kept.append(line)
        if len(kept) < len(lines):
            write_atomic(path, "".join(line + "\n" for line in kept))
        return cls(path, done)

    def keep(self, key: GroupKey, measurements: list[Measurement]) -> None:
        """Append a finished group, on disk before the next one starts."""
        temperature, suite, prompt_id, repeat = key
        line = {
            "temperature": temperature,
            "suite": suite,
            "prompt_id": prompt_id,
            "repeat": repeat,
            "measurements": [to_record(m) for m in measurements],
        }
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


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


def _digest(text: Any) -> str:
    return hashlib.sha256(json.dumps(text, ensure_ascii=False).encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """As it reads back from JSON: tuples as lists."""
    return json.loads(json.dumps(value))
