"""One merge into ServerSettings: explicit layers (the host's defaults, a file, then flags).

A Layer is values by field path (``("ddtree", "budget")``) and how to say where one came
from: ``hosts.yaml:80: deployments.sglang-ddtree.ddtree.budget`` for a file, ``--ddtree-budget``
for a flag. A later layer overrides an earlier one field by field; a layer that sets the
algorithm to something other than ddtree drops the ``ddtree:`` values of the layers below it
(`--algorithm dflash` on a DDTree deployment serves DFLASH). The merged values are validated
ONCE as ServerSettings; every problem is reported at once, one line each, at the layer that
set the value: exit 2 (ConfigError for files, UsageError for flags), before any host is
contacted. ``on_host`` then runs the rules that need the host's facts (RefusedError, exit 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ddtree_deploy.errors import ConfigError, DeployError, RefusedError, UsageError
from ddtree_deploy.settings.messages import english
from ddtree_deploy.settings.model import FLAGS, HOST_FIT, HostFit, ServerSettings


class SettingsRefused(RefusedError):
    """Settings that do not fit the host (its facts): the verify width, tp vs the GPUs."""

    def __init__(self, message: str, *, hint: str | None = None, from_flags: bool = False
                 ) -> None:
        super().__init__(message, hint=hint)
        self.from_flags = from_flags

    def as_input_error(self) -> DeployError:
        """The same, said as bad input (exit 2): for a command whose input is at fault."""
        cls = UsageError if self.from_flags else ConfigError
        return cls(self.message, hint=self.hint)


Path_ = tuple[str, ...]
Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Layer:
    """Values of some fields of ServerSettings, from one source."""

    values: Mapping[Path_, Any]
    locate: Callable[[Loc], str]  # where a field of this layer is written
    from_flags: bool = False


def file_layer(values: Mapping[Path_, Any], file: str, prefix: Loc,
               line_of: Callable[[Loc], int]) -> Layer:
    """A layer read from a file: each field located as `file:line: prefix.field`."""
    def locate(loc: Loc) -> str:
        return f"{file}:{line_of((*prefix, *loc))}: {dotted((*prefix, *loc))}"

    return Layer(dict(values), locate)


def flag_layer(values: Mapping[Path_, Any], names: Mapping[Path_, str] | None = None) -> Layer:
    """A layer of command-line flags (None: not given); a field is named by its flag."""
    given = {path: value for path, value in values.items() if value is not None}
    known = {**FLAGS, **(names or {})}

    def locate(loc: Loc) -> str:
        path = tuple(str(p) for p in loc)
        for n in range(len(path), 0, -1):
            name = known.get(path[:n])
            if name:
                return name
        below = [known[p] for p in given if p[:len(path)] == path and p in known]
        if path and below:  # a rule about a block: the flags that gave its values
            return " ".join(below)
        return "--" + path[0].replace("_", "-") if path else "the flags"

    return Layer(given, locate, from_flags=True)


@dataclass(frozen=True)
class Merged:
    """Merged settings and, for each field path, the layer that set it."""

    settings: ServerSettings
    layers: tuple[Layer, ...]
    owner: dict[Path_, int] = field(default_factory=dict)
    partial: bool = False

    def on_host(self, fit: HostFit) -> ServerSettings:
        """The settings checked against the host's facts (the verify width, tp vs GPUs):
        validated again with the facts as the context."""
        return _validate(self.settings.model_dump(exclude_unset=True), self.layers, self.owner,
                         {"host": fit, "partial": self.partial, "complete": not self.partial})


def _nest(flat: Mapping[Path_, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def merge(*layers: Layer, partial: bool = False) -> Merged:
    """The layers merged in order and validated as ServerSettings. ``partial``: the layers
    need not name a model or a draft (a bench configuration checked before it is applied)."""
    flat: dict[Path_, Any] = {}
    owner: dict[Path_, int] = {}
    for i, layer in enumerate(layers):
        algorithm = layer.values.get(("algorithm",))
        if algorithm is not None and algorithm != "ddtree":
            for path in [p for p in flat if p[0] == "ddtree"]:
                del flat[path], owner[path]
        for path, value in layer.values.items():
            flat[path] = value
            owner[path] = i
    settings = _validate(_nest(flat), layers, owner, {"partial": partial,
                                                      "complete": not partial})
    return Merged(settings, tuple(layers), owner, partial)


def _owner_of(loc: Loc, owner: Mapping[Path_, int], last: int) -> int:
    path = tuple(str(p) for p in loc)
    for n in range(len(path), 0, -1):
        if path[:n] in owner:
            return owner[path[:n]]
    below = [i for p, i in owner.items() if p[:len(path)] == path and path]
    return max(below) if below else last


def _validate(data: dict[str, Any], layers: tuple[Layer, ...] | tuple[Any, ...],
              owner: Mapping[Path_, int], context: dict[str, Any]) -> ServerSettings:
    try:
        return ServerSettings.model_validate(data, context=context)
    except ValidationError as exc:
        raise _refusal(exc, tuple(layers), owner) from None


def _refusal(exc: ValidationError, layers: tuple[Layer, ...],
             owner: Mapping[Path_, int]) -> DeployError:
    lines: list[str] = []
    hints: list[str] = []
    host_fit = flags = False
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(p for p in err["loc"] if p != "[key]")
        layer = layers[_owner_of(loc, owner, len(layers) - 1)] if layers else None
        where = layer.locate(loc) if layer is not None else dotted(loc)
        line = f"{where}: {english(err, ServerSettings)}"
        if line not in lines:
            lines.append(line)
        flags = flags or bool(layer and layer.from_flags)
        if err["type"] == HOST_FIT:
            host_fit = True
            hint = (err.get("ctx") or {}).get("hint")
            if hint and hint not in hints:
                hints.append(hint)
    message = "\n".join(lines)
    hint_text = "; ".join(hints) or None
    if host_fit:
        return SettingsRefused(message, hint=hint_text, from_flags=flags)
    return UsageError(message) if flags else ConfigError(message)
