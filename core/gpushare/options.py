"""Options declared once: each component's table of `Option`s gives its flags, environment
variables and (the operator's) live keys, its configuration class the defaults; one path
reads them for both deployables, flag over environment over default (`given`, `parse`,
`defaults_of`); the value parsers both components share.

Pure: building an argparse parser and parsing text, no I/O.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from enum import Enum
from typing import Any, TypeVar

from gpushare.model.devices import MAX_UNIT_MIB

_N = TypeVar("_N", int, float)
_E = TypeVar("_E", bound=Enum)

_LOG_LEVELS = ("debug", "info", "warning", "error")

MAX_SECONDS = 86400
"""The longest duration an option takes, a day: anything longer is a slip (`inf`, a value
meant in milliseconds)."""


@dataclass(frozen=True, kw_only=True)
class Option:
    """One setting. `parse` turns its text into the value or raises ValueError saying what the
    text must be (the caller prefixes where the text came from)."""

    field: str
    """The configuration field it sets (also the argparse dest)."""
    env: str
    flag: str
    parse: Callable[[str], Any]
    help: str
    live: str | None = None
    """Its key in a live configuration resource's spec; None when it only applies at start-up."""
    schema: Mapping[str, Any] | None = None
    """The OpenAPI schema of its live key's value (the CRD's, so that the apiserver refuses
    a bad value at apply time); required with `live`."""

    def __post_init__(self) -> None:
        if (self.live is None) != (self.schema is None):
            raise ValueError(f"option {self.field}: a live key needs a schema, and only it")


def add_flags(
    parser: argparse.ArgumentParser, options: Iterable[Option], defaults: Mapping[str, str]
) -> None:
    """One flag per option (dest: its field, None when not given), its help naming the
    environment variable and the default (`defaults`, by field)."""
    for option in options:
        default = defaults.get(option.field)
        shown = f"; default {default}" if default else ""
        parser.add_argument(
            option.flag, dest=option.field, help=f"{option.help} (${option.env}{shown})"
        )


def given(
    options: Iterable[Option], flags: Mapping[str, str | None], environ: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """What was set for each option, a flag over its environment variable: {field: (where
    the text came from, the text)}. An option set by neither is left out: its default stands."""
    found: dict[str, tuple[str, str]] = {}
    for option in options:
        flag = flags.get(option.field)
        if flag is not None:
            found[option.field] = (option.flag, flag)
        elif option.env in environ:
            found[option.field] = (option.env, environ[option.env])
    return found


def defaults_of(config: type) -> dict[str, str]:
    """Each field's default in a configuration dataclass, as its environment variable would
    spell it (for `--help`, the CRD's descriptions); fields without one, or whose default is
    "unset" (None, empty), are left out."""
    return {
        item.name: spelled(item.default)
        for item in fields(config)
        if item.default is not MISSING and item.default is not None and item.default != ""
    }


def spelled(value: object) -> str:
    """A value as its environment variable spells it."""
    if isinstance(value, frozenset):
        return ",".join(sorted(map(str, value)))
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Enum):
        return str(value.value)
    return str(value)


def parse(
    options: Iterable[Option], texts: Mapping[str, tuple[str, str]]
) -> tuple[dict[str, Any], list[str]]:
    """The options in `texts` ({field: (where the text came from, text)}) parsed: the values by
    field, and one `where='text': what it must be` line per refused text."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for option in options:
        if option.field not in texts:
            continue
        where, raw = texts[option.field]
        try:
            values[option.field] = option.parse(raw)
        except ValueError as error:
            problems.append(f"{where}={raw!r}: {error}")
    return values, problems


def scheduler_names(raw: str) -> frozenset[str]:
    """A comma list of spec.schedulerName values, at least one."""
    found = frozenset(part.strip() for part in raw.split(",") if part.strip())
    if not found:
        raise ValueError("must name at least one scheduler")
    return found


def bounded(
    raw: str,
    kind: Callable[[str], _N],
    *,
    low: _N,
    high: _N | None = None,
    above: bool = False,
    must: str,
) -> _N:
    """`raw` read as `kind`, from `low` (or `above` it) up to `high`; ValueError(`must`) for
    anything else, a text that is no number (or NaN) included."""
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(must) from None
    fits = (low < value if above else low <= value) and (high is None or value <= high)
    if not fits:
        raise ValueError(must)
    return value


def seconds(raw: str) -> float:
    """A duration above 0, at most `MAX_SECONDS`."""
    return bounded(
        raw,
        float,
        low=0.0,
        above=True,
        high=float(MAX_SECONDS),
        must=f"must be a number of seconds above 0 and at most {MAX_SECONDS}",
    )


def seconds_from(least: float, *, meaning: str = "") -> Callable[[str], float]:
    """A parser of durations from `least` to `MAX_SECONDS`; `meaning`: what `least` itself
    means, said in the refusal (`0 (never)`)."""
    said = f" ({meaning})" if meaning else ""
    must = f"must be a number of seconds from {least:g}{said} to {MAX_SECONDS}"

    def parse(raw: str) -> float:
        return bounded(raw, float, low=least, high=float(MAX_SECONDS), must=must)

    return parse


def memory_unit(raw: str) -> int:
    """MiB per gpu-memory device: the operator's memory unit, the device plugins' factor."""
    return bounded(
        raw,
        int,
        low=1,
        high=MAX_UNIT_MIB,
        must=f"must be a whole number of MiB from 1 to {MAX_UNIT_MIB}",
    )


def nonblank(raw: str) -> str:
    """Text with something in it, stripped."""
    if not raw.strip():
        raise ValueError("must not be empty")
    return raw.strip()


def one_of(choices: type[_E]) -> Callable[[str], _E]:
    """A parser of one of an enumeration's values, naming them all when the text is none."""

    def parse(raw: str) -> _E:
        try:
            return choices(raw)
        except ValueError:
            names = [str(choice.value) for choice in choices]
            raise ValueError(f"must be {', '.join(names[:-1])} or {names[-1]}") from None

    return parse


def boolean(raw: str) -> bool:
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ValueError("must be true or false")


def port(raw: str) -> int:
    """A TCP port; 0 disables."""
    return bounded(raw, int, low=0, high=65535, must="must be a port number (0 disables)")


def log_level(raw: str) -> str:
    if raw.lower() not in _LOG_LEVELS:
        raise ValueError(f"must be {', '.join(_LOG_LEVELS[:-1])} or {_LOG_LEVELS[-1]}")
    return raw.lower()
