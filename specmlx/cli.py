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
from specmlx.errors import SpecmlxError

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


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
