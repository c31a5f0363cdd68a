"""The `specmlx` command line: Typer commands only.

Each command parses its options, calls one function of the library and renders the result.
Heavy imports (mlx, mlx-lm, transformers) happen inside the commands, so `specmlx --help`
answers at once. Errors the user can act on (`SpecmlxError`) become one line on stderr and a
non-zero exit; Ctrl-C stops the work and exits 130. The options generate, chat and bench
share are declared once, in `specmlx.cli.options`; the methods come from `specmlx.api.methods`.

The top floor: it may import every floor below it, and nothing imports it.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from specmlx import __version__
from specmlx.cli import batch, bench, generate, heads, model_commands, serve
from specmlx.cli.common import handles_errors

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


# Every command, in the order `--help` lists them; heavy imports happen inside each.
for command in (
    model_commands.convert,
    model_commands.fetch,
    model_commands.models,
    generate.generate,
    generate.chat,
    batch.batch,
    bench.bench,
    model_commands.calibrate,
    model_commands.cost_curves,
    serve.serve,
):
    app.command()(handles_errors(command))
app.command("train-heads")(handles_errors(heads.train_heads))
app.command("draft-vocab")(handles_errors(heads.draft_vocab_report))
app.command("eval-heads")(handles_errors(heads.eval_heads))


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
