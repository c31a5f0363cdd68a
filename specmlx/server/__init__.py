"""An OpenAI-compatible HTTP server over one loaded target and drafter (`specmlx serve`).

`protocol` is the wire format, `engine` the one-at-a-time generation worker, `app` the
FastAPI app, `command` the Typer command. Nothing heavy is imported here.
"""
