"""Prompts made from the user's code: tasks on its own functions and classes, for the target
to answer (self-distillation on the work heads will draft).

Magpie prompts are as varied as the target's tuning, but a small coder model writes few
usable ones (Qwen2.5-Coder-1.5B: 43 distinct of 96 draws, most of them not about code), and
each costs a generation. `task_prompts` costs none: it cuts functions and classes out of
Python files (`ast`) and asks for what people ask of code (explain it, test it, annotate it,
summarise it, list its parts as JSON, implement it from its signature and docstring, review
it, shorten it, port it), the same for the same files and seed.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from specmlx.errors import UsageError
from specmlx.training.data import kept_prompts, matching_files

FENCE = "```"
# Each task: a template over a piece of code ({code}), or over a function's signature and
# docstring ({stub}: the function to write).
TASKS = (
    "Explain what this Python code does, step by step:\n\n{code}",
    "Write pytest tests for this code, covering its edge cases:\n\n{code}",
    "Annotate this code with type hints and return it whole:\n\n{code}",
    "In two or three sentences, what is this code for?\n\n{code}",
    'Read this code and reply with JSON only: a list of {{"name", "params"}} objects, one per '
    "function or method it defines.\n\n{code}",
    "Implement this function:\n\n{stub}",
    "Review this code: name one risk of a bug or an unclear part, and show a fix.\n\n{code}",
    "Make this code shorter and clearer without changing what it does:\n\n{code}",
    "Port this Python code to JavaScript:\n\n{code}",
)
MIN_LINES, MAX_LINES = 4, 40  # pieces a prompt can hold and an answer can address
PER_FILE = 3  # at most this many pieces of one file: many files rather than a few


def task_prompts(
    paths: Iterable[str | Path], count: int, seed: int = 0, exclude: Iterable[str] = ()
) -> list[str]:
    """Up to `count` distinct prompts, each a task (`TASKS`) on a function or class of the
    Python files in `paths` (files, folders or globs, `exclude` patterns left out, as
    `file_corpus` reads them), files and pieces drawn in an order from `seed`."""
    if count < 1:
        raise UsageError(f"need at least one task prompt, got {count}")
    files = [f for f in matching_files(paths, exclude) if f.suffix == ".py"]
    rng = np.random.default_rng(seed)
    prompts: dict[str, None] = {}
    for f in rng.permutation(len(files)):
        if len(prompts) >= count:
            break
        pieces = code_pieces(files[f])
        for p in rng.permutation(len(pieces))[:PER_FILE]:
            name, code, stub = pieces[p]
            templates = [t for t in TASKS if stub is not None or "{stub}" not in t]
            template = templates[rng.integers(len(templates))]
            prompts.setdefault(template.format(code=_fenced(code), stub=_fenced(stub or "")))
            if len(prompts) >= count:
                break
    if not prompts:
        raise UsageError("no Python function or class in the files to make task prompts from")
    return list(prompts)


def cached_task_prompts(
    folder: Path,
    paths: Iterable[str | Path],
    count: int,
    seed: int = 0,
    exclude: Iterable[str] = (),
) -> list[str]:
    """`task_prompts`, kept in `folder` (written whole or not at all) and read back from
    there on the next run with the same files as given, count and seed (reading a large
    tree takes a while; a resumed run then answers the same prompts)."""
    paths, exclude = [str(p) for p in paths], list(exclude)
    key = json.dumps([paths, exclude, count, seed]).encode()
    path = Path(folder) / f"tasks-{count}-seed{seed}-{hashlib.sha256(key).hexdigest()[:8]}.jsonl"
    return kept_prompts(path, lambda: task_prompts(paths, count, seed, exclude))


def code_pieces(path: Path) -> list[tuple[str, str, str | None]]:
    """The functions and classes of a Python file between `MIN_LINES` and `MAX_LINES` long,
    methods included: (name, source, its signature and docstring where it is a function
    with one, else None). A file that is not UTF-8 Python has none."""
    try:
        source = path.read_text("utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    pieces = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        code = ast.get_source_segment(source, node)
        if code is None or not MIN_LINES <= code.count("\n") + 1 <= MAX_LINES:
            continue
        pieces.append((node.name, _dedent(code, node.col_offset), _stub(source, node)))
    return pieces


def _stub(source: str, node: ast.AST) -> str | None:
    """A function's `def` line(s) and docstring, its body left to write; None for a class or
    a function without a docstring."""
    if isinstance(node, ast.ClassDef) or not ast.get_docstring(node):  # type: ignore[arg-type]
        return None
    body = node.body[0]  # type: ignore[attr-defined]
    lines = source.splitlines()[node.lineno - 1 : body.end_lineno]  # type: ignore[attr-defined]
    return _dedent("\n".join(lines), node.col_offset)  # type: ignore[attr-defined]


def _dedent(code: str, indent: int) -> str:
    """A method's source as if it were at top level: `get_source_segment` leaves its first
    line unindented and the others as deep as in the class."""
    first, *rest = code.splitlines()
    rest = [line[min(indent, len(line) - len(line.lstrip(" "))) :] for line in rest]
    return "\n".join([first.lstrip(), *rest])


def _fenced(code: str) -> str:
    return f"{FENCE}python\n{code}\n{FENCE}"
