"""The options generate, chat and bench share, declared once, and how they become a config.

Typer has no option groups, so a group is a frozen dataclass whose fields are `Annotated`
typer options (`ModelRefs`, `MethodFlags`, `SharedOptions`; a field holding another group is
flattened into it). `with_options(Group, **defaults)` appends a group's options to a
command's parameters, so `--help` lists them with the command's own, and hands the command
one typed `opts` object instead. Defaults may differ per command (`--max-tokens`).

The per-method options (`--ngram-min`, `--window`, `--p-min`, ...) default to None, meaning
"not given": only the options of the method in use become its options object
(`specmlx.api.methods`), an option of another method is an error, and options given without
`--method` name the method they belong to. Their help shows the defaults of the method's own
options dataclass, the one place those are stated.

Nothing here imports mlx: `specmlx --help` stays fast.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from specmlx.api.methods import (
    METHODS,
    Method,
    MethodOptions,
    method,
    methods_help,
    owner_of,
)
from specmlx.api.option_names import OPTION_NAMES, field_of, owners
from specmlx.errors import UsageError

if TYPE_CHECKING:
    from specmlx.api.config import GenerationConfig

F = TypeVar("F", bound=Callable[..., object])

# Options of generate and chat alone (bench takes lists of methods, k and temperatures).
MethodOpt = Annotated[
    str | None,
    typer.Option(
        help=f"{methods_help()}. Default: the draft model when one is loaded, else the "
        "heads, else the target's own MTP layer where its checkpoint has one, else plain decoding."
    ),
]
KOpt = Annotated[
    str,
    typer.Option(
        "-k", "--k", help="Draft length per step, or auto: chosen each step from measured costs."
    ),
]
TempOpt = Annotated[float, typer.Option("--temp", help="Temperature; 0 is greedy.")]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed for sampling.")]


def parse_k(k: str) -> int | None:
    """`auto` is None; anything else must be a whole number."""
    if k == "auto":
        return None
    try:
        return int(k)
    except ValueError:
        raise UsageError(f"k must be a whole number or auto, got {k!r}") from None


def parse_ks(values: list[str]) -> list[int | None]:
    """`-k 2 -k 4` or `--k 2,4,auto` (or both); auto is None."""
    return [parse_k(part) for value in values for part in value.split(",")]


def _flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _method_flag(name: str, what: str) -> Any:
    """A per-method option: None unless given; the help names its methods and defaults."""
    shown = []
    for options, attribute in OPTION_NAMES[name]:
        default = "auto" if getattr(options(), attribute) is None else getattr(options(), attribute)
        several = len(OPTION_NAMES[name]) > 1
        shown.append(f"{owner_of(options).name} {default}" if several else str(default))
    methods = "/".join(owner_of(options).name for options, _ in OPTION_NAMES[name])
    # Written into the help: click would show a None default's stand-in in parentheses.
    return typer.Option(help=f"{methods}: {what}  [default: {', '.join(shown)}]")


@dataclass(frozen=True)
class ModelRefs:
    """Which models to load: --target and --draft."""

    target: Annotated[
        str | None,
        typer.Option(
            help="Target model: folder, .gguf, alias or Hugging Face id. "
            "Default: the registry's pair."
        ),
    ] = None
    draft: Annotated[
        str | None, typer.Option(help="Draft model (same tokenizer as the target).")
    ] = None
    heads: Annotated[
        list[str] | None,
        typer.Option(
            metavar="HEADS",
            help="Medusa or EAGLE heads for the target: a folder (`specmlx train-heads`, or a "
            "published layout) or a Hugging Face id; repeatable (one of each kind).",
        ),
    ] = None

    def check(self, methods: list[Method]) -> None:
        """A draft model (heads) is given when one of `methods` needs it, and not given when
        none does. (With no --target, the registry's pair brings its draft.)"""
        needing = [m for m in methods if m.needs_draft_model]
        if needing and self.draft is None and self.target is not None:
            raise UsageError(f"--method {needing[0].name} needs a draft model (--draft)")
        if methods and not needing and self.draft is not None:
            raise UsageError(f"--draft is not used by --method {methods[0].name}")
        with_heads = [m for m in methods if m.needs_heads]
        if with_heads and self.heads is None:
            raise UsageError(f"--method {with_heads[0].name} needs trained heads (--heads DIR)")
        if methods and not with_heads and self.heads is not None:
            raise UsageError(f"--heads is not used by --method {methods[0].name}")


@dataclass(frozen=True)
class MethodFlags:
    """The options of each method, None where not given (see `OPTION_NAMES`)."""

    p_min: Annotated[
        float | None,
        _method_flag(
            "p_min",
            "end a draft after a token the draft model gives less probability than this, "
            "in [0, 1]; auto: -k auto decides from the costs, a fixed k drafts all k.",
        ),
    ] = None
    ngram_min: Annotated[
        int | None, _method_flag("ngram_min", "shortest context suffix to look up.")
    ] = None
    ngram_max: Annotated[
        int | None, _method_flag("ngram_max", "longest context suffix to look up.")
    ] = None
    window: Annotated[int | None, _method_flag("window", "Jacobi window W.")] = None
    ngram_size: Annotated[int | None, _method_flag("ngram_size", "n-gram size N.")] = None
    guesses: Annotated[int | None, _method_flag("guesses", "candidates G verified per step.")] = (
        None
    )
    tree_size: Annotated[
        int | None,
        _method_flag("tree_size", "most tokens per verify call, root included (auto: from costs)."),
    ] = None
    width: Annotated[int | None, _method_flag("width", "candidates kept per head or level.")] = None
    depth: Annotated[int | None, _method_flag("depth", "most levels an EAGLE tree grows.")] = None
    suffix_memory: Annotated[
        int | None,
        _method_flag("suffix_memory", "tokens of earlier answers kept (the oldest go first)."),
    ] = None
    suffix_cache: Annotated[
        str | None,
        _method_flag(
            "suffix_cache",
            "a file that keeps the earlier answers across runs (read at start, written after "
            "each answer; refused if made for another tokenizer).",
        ),
    ] = None
    suffix_factor: Annotated[
        float | None, _method_flag("suffix_factor", "most drafted tokens per matched token.")
    ] = None
    suffix_min_prob: Annotated[
        float | None,
        _method_flag("suffix_min_prob", "drop a branch fewer than this share of matches took."),
    ] = None
    suffix_min_score: Annotated[
        float | None,
        _method_flag(
            "suffix_min_score",
            "with --draft or --heads: draft from the suffix when it expects this many tokens "
            "kept, else from them.",
        ),
    ] = None
    mtp_hidden: Annotated[
        str | None,
        _method_flag(
            "mtp_hidden",
            "the target's hidden state the MTP layer reads: post-norm (after the final norm, "
            "as the model's authors feed it) or pre-norm.",
        ),
    ] = None

    def given(self) -> list[str]:
        """The options given on the command line, by field name."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def method(self, name: str | None) -> Method | None:
        """The method named by --method, else the one the given options belong to, else
        None (the API's default: the draft model when one is loaded)."""
        if name is not None:
            return method(name)  # a known name, or a one-line error
        given = self.given()
        if not given:
            return None
        # The methods every given option belongs to.
        common = set.intersection(*({m.name for m in owners(flag)} for flag in given))
        kinds = {METHODS[name].options for name in common}
        if len(common) > 1 and len(kinds) == 1:
            return owner_of(kinds.pop())  # suffix's options: suffix alone unless told
        if len(common) != 1:
            flags = " and ".join(_flag_name(flag) for flag in given)
            what = "different methods" if not common else " or ".join(sorted(common))
            raise UsageError(f"{flags}: options of {what}; choose one with --method")
        return METHODS[common.pop()]

    def options(self, used: Method | None) -> MethodOptions | None:
        """The options object of `used` from the options given; an option of another method
        is an error."""
        for flag in self.given():
            takers = owners(flag)
            if used is None or used not in takers:
                names = " or ".join(m.name for m in takers)
                where = "" if used is None else f", not of --method {used.name}"
                raise UsageError(f"{_flag_name(flag)} is an option of --method {names}{where}")
        if used is None:
            return None
        # Every option given is one of `used`'s now; the rest keep the method's defaults.
        return used.options(**{field_of(flag, used): getattr(self, flag) for flag in self.given()})

    def options_among(self, methods: list[Method]) -> tuple[MethodOptions, ...]:
        """For a bench of several methods: the options of each method that was given any
        (the others run with their defaults); an option of a method not benched is an
        error."""
        taken = {flag: owners(flag) for flag in self.given()}
        for flag, own in taken.items():
            if not any(m in methods for m in own):
                names = " or ".join(m.name for m in own)
                raise UsageError(
                    f"{_flag_name(flag)} is an option of --method {names}, "
                    "which this bench does not run"
                )
        return tuple(
            m.options(**{field_of(f, m): getattr(self, f) for f, own in taken.items() if m in own})
            for m in methods
            if any(m in own for own in taken.values())
        )


@dataclass(frozen=True)
class SharedOptions:
    """What generate, chat and bench all take; `--max-tokens` defaults differ per command."""

    models: ModelRefs = field(default_factory=ModelRefs)
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass, in (0, 1].")] = 1.0
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens; 0 keeps all.")] = 0
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 256
    method_flags: MethodFlags = field(default_factory=MethodFlags)

    def generation_config(
        self,
        method_name: str | None,
        k: str,
        temperature: float,
        seed: int | None,
        chat_template: bool,
    ) -> GenerationConfig:
        """The GenerationConfig of these options and generate's or chat's own (validated
        there and in the options dataclasses: every bad value is a one-line error)."""
        from specmlx.api.config import GenerationConfig
        from specmlx.engine.sampling import SamplingConfig

        used = self.method_flags.method(method_name)
        if used is not None and used.name == "suffix":
            # `--method suffix --draft M` (or `--heads DIR`): the draft falls back to them.
            if self.models.draft is not None:
                used = METHODS["suffix+draft"]
            elif self.models.heads:
                used = METHODS["suffix+heads"]
        return GenerationConfig(
            method=None if used is None else used.name,
            options=self.method_flags.options(used),
            k=parse_k(k),
            max_tokens=self.max_tokens,
            sampling=SamplingConfig(temperature, self.top_p, self.top_k),
            seed=seed,
            chat_template=chat_template,
        )


def _parameters(group: type, defaults: dict[str, Any]) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group, include_extras=True)
    parameters = []
    for f in fields(group):
        hint = hints[f.name]
        if is_dataclass(hint):
            parameters += _parameters(hint, defaults)
        else:
            default = defaults.get(f.name, f.default)
            parameters.append(
                inspect.Parameter(
                    f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint
                )
            )
    return parameters


def _build(group: type, values: dict[str, Any]) -> Any:
    """The group's object from the parsed options, which are taken out of `values`."""
    hints = typing.get_type_hints(group)
    return group(
        **{
            f.name: _build(hints[f.name], values)
            if is_dataclass(hints[f.name])
            else values.pop(f.name)
            for f in fields(group)
        }
    )


def with_options(group: type, **defaults: Any) -> Callable[[F], F]:
    """Append `group`'s options to a command's parameters; the command receives them as one
    keyword argument, `opts`. `defaults` override the group's defaults for this command."""
    shared = _parameters(group, defaults)
    unknown = defaults.keys() - {p.name for p in shared}
    if unknown:
        raise TypeError(f"{group.__name__} has no option {', '.join(sorted(unknown))}")

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        own = [p for name, p in signature.parameters.items() if name != "opts"]

        @functools.wraps(command)
        def wrapper(*args: object, **kwargs: object) -> object:
            return command(*args, opts=_build(group, kwargs), **kwargs)

        parameters = [*own, *shared]
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper  # type: ignore[return-value]

    return decorate
