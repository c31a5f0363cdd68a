"""What every command shares: one-line errors, Ctrl-C, and loading the models a config needs
with a spinner (`load_models`, for generate, chat, calibrate and serve alike)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import typer

from specmlx.api.methods import METHODS
from specmlx.errors import SpecmlxError

if TYPE_CHECKING:
    from specmlx.api.config import GenerationConfig
    from specmlx.api.models import Models
    from specmlx.cli.options import ModelRefs

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


def load_models(refs: ModelRefs, config: GenerationConfig) -> Models:
    """Check the models given against the method, then load them (spinner on stderr)."""
    from rich.console import Console

    from specmlx.api.load import load_for

    refs.check([METHODS[config.method]] if config.method is not None else [])
    err = Console(stderr=True)
    return load_for(config, refs.target, refs.draft, refs.heads, stage=err.status)
