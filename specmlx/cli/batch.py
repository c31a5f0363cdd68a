"""batch: one request a line in, one result a line out, the models loaded once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specmlx.cli.common import load_models
from specmlx.cli.options import KOpt, MethodOpt, SeedOpt, SharedOptions, TempOpt, with_options
from specmlx.errors import UsageError


@with_options(SharedOptions, max_tokens=256)
def batch(
    input_file: Annotated[
        Path,
        typer.Argument(
            metavar="IN.jsonl",
            help='One request a line: {"prompt": ...} or {"messages": [...]}, an optional '
            '"id", and any of max_tokens, temperature, top_p, top_k, seed, method, k, '
            "chat_template.",
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--output",
            help="Results, one a line (id, text, finish_reason, method, stats), written as "
            "each finishes; lines it already holds are skipped when run again.",
        ),
    ],
    method: MethodOpt = None,
    k: KOpt = "auto",
    temp: TempOpt = 0.0,
    seed: SeedOpt = None,
    no_chat_template: Annotated[
        bool, typer.Option("--no-chat-template", help="Send prompts as raw text.")
    ] = False,
    *,
    opts: SharedOptions,
) -> None:
    """Generate for every line of IN.jsonl into OUTPUT, for local scripting.

    A malformed line gets an error record (its id or line number, and what is wrong) and
    the batch goes on. With --method suffix every answer is remembered for the next lines."""
    import json
    import sys

    from specmlx.api.batch import read_finished, run_batch
    from specmlx.io.files import write_atomic
    from specmlx.progress import progress_bar

    try:
        in_lines = input_file.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {input_file}: {exc}") from None
    if output.resolve() == input_file.resolve():
        raise UsageError("the output file must not be the input file")
    if not output.parent.is_dir():
        raise UsageError(f"cannot write {output}: the folder {output.parent} does not exist")
    earlier = output.read_text("utf-8").splitlines() if output.exists() else []
    done, keep = read_finished(earlier)
    if keep != earlier:  # errors are retried; a cut-off last line goes
        write_atomic(output, "".join(line + "\n" for line in keep))
    config = opts.generation_config(method, k, temp, seed, chat_template=not no_chat_template)
    models = load_models(opts.models, config)
    total = sum(1 for line in in_lines if line.strip())
    tokens = seconds = accepted = drafted = errors = 0.0
    with (
        output.open("a", encoding="utf-8") as out,
        progress_bar(True, "batch", total, completed=len(done)) as bar,
    ):
        for line in run_batch(models, in_lines, config, done):
            out.write(json.dumps(line.record, ensure_ascii=False) + "\n")
            out.flush()
            stats = line.stats
            if stats is None:
                errors += 1
                typer.echo(f"line {line.number}: {line.record['error']}", err=True)
            else:
                tokens += stats.tokens
                seconds += stats.decode_seconds + stats.time_to_first_token
                accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
            rate = f"{tokens / seconds:.1f} tok/s" if seconds else ""
            acceptance = f"acceptance {accepted / drafted:.0%}" if drafted else ""
            bar.advance("  ".join(filter(None, (rate, acceptance))))
    summary = f"{total - errors:.0f} of {total} lines in {output}"
    if errors:
        summary += f"; {errors:.0f} with errors (rerun to retry them)"
    typer.echo(summary, err=True)
    sys.stderr.flush()
