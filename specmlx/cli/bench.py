"""The bench command: the target alone, each method and k, and mlx-lm, interleaved per prompt
(`specmlx.bench`); `--overhead` measures specmlx's own cost per step instead."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specmlx.api.methods import METHODS, methods_help
from specmlx.cli.options import SharedOptions, parse_ks, with_options
from specmlx.errors import UsageError

if TYPE_CHECKING:
    from specmlx.bench.run import BenchConfig


@with_options(SharedOptions, max_tokens=64)
def bench(
    suite: Annotated[
        list[str] | None,
        typer.Option(
            metavar="SUITE",
            help="Prompt suite: code, extract, chat, creative or all (those four), or "
            "scripting (run in order, reported by halves); repeatable.",
        ),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(help="Your prompts: JSONL with a 'prompt' field, or one prompt per line."),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many prompts per suite.")] = None,
    method: Annotated[
        list[str] | None,
        typer.Option(
            metavar="METHOD",
            help="Method to compare with the target alone (none, always the first row); "
            f"repeatable; default: draft. {methods_help()}.",
        ),
    ] = None,
    k: Annotated[
        list[str] | None,
        typer.Option("-k", "--k", metavar="K", help="Draft lengths: -k 2 -k 4 or 2,4,auto."),
    ] = None,
    mlx_lm: Annotated[
        bool, typer.Option(help="Add mlx-lm's speculative decoding at each k, as reference.")
    ] = True,
    mlx_lm_k: Annotated[
        list[int] | None,
        typer.Option(
            "--mlx-lm-k", metavar="K", help="mlx-lm's draft lengths (default: each fixed -k)."
        ),
    ] = None,
    temp: Annotated[
        list[float] | None,
        typer.Option("--temp", metavar="T", help="Temperature (repeatable); 0 is greedy."),
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
    """Benchmark the target alone, each method and k, and mlx-lm, interleaved per prompt.

    A run stopped midway goes on where it stopped when the same command runs again: the
    groups it measured are kept in a journal beside the first report file (--json, --csv,
    --markdown or --plot), removed once the report is written."""
    from rich.console import Console

    if overhead:
        from specmlx.bench.overhead import (
            measure_overhead,
            measure_rewind,
            measure_suffix_history,
            render,
            render_history,
            render_rewind,
        )

        Console().print(render(measure_overhead()))
        Console().print(render_history(measure_suffix_history()))
        Console().print(render_rewind(measure_rewind()))
        return

    from specmlx.bench import report as bench_report
    from specmlx.io.files import write_atomic

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
    from specmlx.bench.environment import environment
    from specmlx.bench.journal import Journal, journal_path, run_identity
    from specmlx.bench.run import run
    from specmlx.bench.summary import build_report
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
    journal = None
    where = journal_path((json_path, csv_path, markdown_path, plot))
    if where is not None:
        loaded = {"target": models.target_path, "draft": models.draft_path}
        heads = list(opts.models.heads or [])
        journal = Journal.open(where, run_identity(config, loaded, heads, env, where))
        if journal.done:
            err.print(
                f"resuming from {where}: {len(journal.done)} of {config.groups} groups "
                "measured before"
            )
    done = journal.done if journal is not None else {}
    replayed = {id(m) for group in done.values() for m in group.measurements}
    total = (config.groups + config.warmups(len(done))) * len(config.rows)
    measurements = []
    with progress_bar(True, "benchmarking", total, len(replayed)) as bar:
        try:
            for m in run(models, config, done, journal.keep if journal is not None else None):
                measurements.append(m)
                if id(m) not in replayed:
                    bar.advance(f"{m.suite} {m.prompt_id} {m.row}")
        except KeyboardInterrupt:
            if journal is not None:
                err.print(f"what was measured is kept in {where}: the same command goes on")
            raise
    report = build_report(config, measurements, env, profile, resumed=len(done))
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
            write_atomic(path, writer(report))
            err.print(f"wrote {path}")
    if journal is not None:
        journal.remove()  # the report holds it all now


def plan(
    opts: SharedOptions,
    *,
    suites: list[str] | None = None,
    prompts: Path | None = None,
    limit: int | None = None,
    methods: list[str] | None = None,
    ks: list[str] | None = None,
    mlx_lm: bool = True,
    mlx_lm_ks: list[int] | None = None,
    temperatures: list[float] | None = None,
    repeats: int = 1,
    warmup: int = 1,
    seed: int = 0,
    chat_template: bool = True,
    plot: Path | None = None,
    outputs: tuple[Path | None, ...] = (),
) -> BenchConfig:
    """The bench command's options as a `BenchConfig`: everything that can be wrong with
    them fails here, a one-line `UsageError`, before any model loads. None is an option not
    given: every shipped suite (unless `prompts`), the methods that use a draft model, k = 4,
    T = 0. `outputs` are the files to write, `plot` among them; None is one not asked for."""
    # Here, not above: the report imports this module, the options' parser is the CLI's.
    from specmlx.bench import report as bench_report
    from specmlx.bench.run import BenchConfig, make_rows
    from specmlx.bench.suites import load_prompts_file, load_suite, suite_names

    chosen = [load_prompts_file(prompts, limit)] if prompts is not None else []
    if suites or prompts is None:
        chosen += [load_suite(name, limit) for name in suite_names(suites or ["all"])]
    methods = methods or ["draft"]
    rows = make_rows(methods, parse_ks(ks or ["4"]), mlx_lm, mlx_lm_ks)
    if plot is not None:
        bench_report.require_matplotlib()
    for path in outputs:
        if path is not None:
            bench_report.check_writable(path)
    names = [chosen_suite.name for chosen_suite in chosen]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"two suites are named {name!r}: give the prompts file another name")
    seen: set[tuple[str, str]] = set()
    for chosen_suite in chosen:
        for prompt in chosen_suite.prompts:
            if (chosen_suite.name, prompt.id) in seen:
                raise UsageError(
                    f"prompt {prompt.id!r} appears twice in suite {chosen_suite.name!r}: "
                    "give each prompt its own id (and a prompts file a name of its own)"
                )
            seen.add((chosen_suite.name, prompt.id))
    used = [METHODS[m] for m in dict.fromkeys(methods)]
    config = BenchConfig(
        suites=tuple(chosen),
        rows=rows,
        temperatures=tuple(dict.fromkeys(temperatures or [0.0])),
        top_p=opts.top_p,
        top_k=opts.top_k,
        max_tokens=opts.max_tokens,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        chat_template=chat_template,
        options=opts.method_flags.options_among(used),
    )
    for temperature in config.temperatures:
        config.sampling(temperature)  # validates the sampler settings
    opts.models.check(used)
    return config
