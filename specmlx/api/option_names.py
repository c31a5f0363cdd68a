"""Each method's options by the name users give them: `--tree-size` on the command line,
"tree_size" on a `specmlx batch` line. One table for both; the options dataclasses in
`specmlx.api.options` check the values' ranges."""

from __future__ import annotations

from typing import Any

from specmlx.api.methods import Method, owner_of, takers_of
from specmlx.api.options import (
    DraftOptions,
    EagleOptions,
    LookaheadOptions,
    MedusaOptions,
    MethodOptions,
    MtpOptions,
    NgramOptions,
    SuffixOptions,
)
from specmlx.errors import UsageError

# Each option: the options dataclasses it sets (one per method that has it), and which of
# their fields.
OPTION_NAMES: dict[str, tuple[tuple[type, str], ...]] = {
    "p_min": ((DraftOptions, "p_min"),),
    "ngram_min": ((NgramOptions, "min_n"),),
    "ngram_max": ((NgramOptions, "max_n"),),
    "window": ((LookaheadOptions, "window"),),
    "ngram_size": ((LookaheadOptions, "ngram"),),
    "guesses": ((LookaheadOptions, "guesses"),),
    "tree_size": (
        (MedusaOptions, "tree_size"),
        (EagleOptions, "tree_size"),
        (SuffixOptions, "tree_size"),
    ),
    "width": ((MedusaOptions, "width"), (EagleOptions, "width")),
    "depth": ((EagleOptions, "depth"),),
    "suffix_memory": ((SuffixOptions, "memory"),),
    "suffix_cache": ((SuffixOptions, "cache"),),
    "suffix_factor": ((SuffixOptions, "factor"),),
    "suffix_min_prob": ((SuffixOptions, "min_prob"),),
    "suffix_min_score": ((SuffixOptions, "min_score"),),
    "mtp_hidden": ((MtpOptions, "hidden"),),
}
# The type of each option's value where it is not a whole number.
FRACTIONS = frozenset({"p_min", "suffix_factor", "suffix_min_prob", "suffix_min_score"})
TEXTS = frozenset({"suffix_cache", "mtp_hidden"})


def owners(name: str) -> list[Method]:
    """The methods that take the option called `name`."""
    return [m for options, _ in OPTION_NAMES[name] for m in takers_of(options)]


def field_of(name: str, used: Method) -> str:
    """The field of `used`'s options that the option `name` sets."""
    return next(f for options, f in OPTION_NAMES[name] if options is used.options)


def implied_method(names: list[str]) -> Method | None:
    """The one method every named option belongs to (suffix alone, not its hybrids, where
    only suffix options are named); None where they name none or several."""
    common = set.intersection(*({m.name for m in owners(n)} for n in names))
    kinds = {m.options for m in owners(names[0]) if m.name in common}
    return owner_of(kinds.pop()) if len(kinds) == 1 else None


def with_options(
    used: Method, given: dict[str, Any], base: MethodOptions | None = None
) -> MethodOptions:
    """`used`'s options with `given` (by name) set over `base` where `base` is `used`'s,
    else over its defaults; an option of another method is a one-line error."""
    for name in given:
        if used not in owners(name):
            methods = " or ".join(m.name for m in owners(name))
            raise UsageError(f"{name} is an option of method {methods}, not of {used.name}")
    start = base if isinstance(base, used.options) else used.options()
    values = {f: getattr(start, f) for f in start.__dataclass_fields__}
    values.update({field_of(name, used): value for name, value in given.items()})
    return used.options(**values)
