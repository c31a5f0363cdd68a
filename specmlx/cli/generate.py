"""generate and chat: one prompt, or a conversation, streamed through one generation session."""

from __future__ import annotations

from typing import Annotated

import typer

from specmlx.cli.common import load_models
from specmlx.cli.options import (
    KOpt,
    MethodOpt,
    SeedOpt,
    SharedOptions,
    TempOpt,
    with_options,
)


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

    from specmlx.api.config import method_of, method_settings
    from specmlx.api.generate import stream_generate
    from specmlx.cli.display import stats_line

    config = opts.generation_config(method, k, temp, seed, chat_template=not no_chat_template)
    models = load_models(opts.models, config)
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
    from specmlx.api.config import method_of
    from specmlx.cli.display import live, render, stats_line

    config = opts.generation_config(method, k, temp, seed, chat_template=True)
    models = load_models(opts.models, config)
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
