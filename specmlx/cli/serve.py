"""The `specmlx serve` command: load the models once, then serve them over HTTP.

Only typer and the shared option groups are imported here; FastAPI, uvicorn and MLX are
imported when the command runs, so `specmlx --help` stays fast.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from specmlx.cli.common import load_models
from specmlx.cli.options import KOpt, MethodOpt, SeedOpt, SharedOptions, with_options
from specmlx.errors import SpecmlxError, UsageError


@with_options(SharedOptions, max_tokens=512)
def serve(
    method: MethodOpt = None,
    k: KOpt = "auto",
    temp: Annotated[
        float,
        typer.Option("--temp", help="Temperature of requests that give none; 0 is greedy."),
    ] = 0.0,
    seed: SeedOpt = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; 0.0.0.0 listens on every interface.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="SPECMLX_API_KEY",
            help="Require `Authorization: Bearer KEY` on /v1 requests (401 otherwise).",
        ),
    ] = None,
    max_queue: Annotated[
        int, typer.Option(help="Requests that may wait for the one being generated; then 429.")
    ] = 16,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No log line per request.")] = False,
    *,
    opts: SharedOptions,
) -> None:
    """Serve the target (and its drafter) over an OpenAI-compatible HTTP API.

    POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health; streaming
    with stream: true. Top-p, top-k and --max-tokens are the defaults of requests that give
    none. One generation at a time; Ctrl-C stops the server.
    """
    if max_queue < 0:
        raise UsageError(f"max-queue must be >= 0, got {max_queue}")
    if not 0 < port < 65536:
        raise UsageError(f"port must be in 1..65535, got {port}")
    config = opts.generation_config(method, k, temp, seed, chat_template=True)

    import uvicorn
    from rich.console import Console

    from specmlx.api.config import method_settings
    from specmlx.server.app import create_app, request_logger
    from specmlx.server.engine import Engine

    err = Console(stderr=True, highlight=False)
    uvicorn_config = uvicorn.Config(
        "unused",  # the app is given to the server below, once the models are loaded
        host=host,
        port=port,
        log_level="warning",  # our own line per request instead of the access log
        access_log=False,
        timeout_graceful_shutdown=3,  # open streams get this long, then are cut
    )
    # Bound before the (slow) model load: a port in use is reported at once.
    try:
        sock = uvicorn_config.bind_socket()
    except SystemExit:  # uvicorn's answer to a failed bind, after logging why
        raise SpecmlxError(f"could not listen on {host}:{port} (in use, or not allowed)") from None
    models = load_models(opts.models, config)
    engine = Engine(models, config, max_queue, log=None if quiet else request_logger(err))
    path = models.target_path
    model_id = opts.models.target or (path.name if path else "specmlx")
    aliases = (str(path), path.name) if path else ()
    uvicorn_config.app = create_app(engine, model_id, aliases=aliases, api_key=api_key)
    if not quiet:
        settings = " ".join(f"{k}={v}" for k, v in method_settings(models, config).items())
        err.print(
            f"serving {model_id} ({engine.method}{', ' + settings if settings else ''}) "
            f"on http://{host}:{port}/v1"
            + (" (API key required)" if api_key else "")
            + "; Ctrl-C stops",
            soft_wrap=True,
        )
    try:
        uvicorn.Server(uvicorn_config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn shut down gracefully, then re-raised the signal
    finally:
        sock.close()
    if not quiet:
        err.print("stopped")
    sys.stderr.flush()
