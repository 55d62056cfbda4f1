"""A bench sweep's grid: the configurations, concurrency levels, sampling modes and workloads.

Given as a small YAML file (`--grid FILE`) or as flags (`--configs none,dflash,ddtree:15/8`),
validated in full before anything runs: each problem names the file, line and field (or the
flag), and the command exits 2. Each configuration is a layer of the server's settings
(settings.layers) put over the deployment's: its algorithm and DDTree values are checked by
ServerSettings itself, the verify width against the drafter's block when the host is known.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ddtree_deploy.errors import ConfigError, DeployError, UsageError
from ddtree_deploy.settings.layers import Layer, Loc, merge

Algorithm = Literal["none", "dflash", "ddtree"]
Sampling = Literal["greedy", "sampled"]
PromptMode = Literal["ids", "text", "auto"]
SAMPLED_PARAMS = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}  # as the probe's sampled one
DEFAULT_WORKLOADS = ("code", "math", "json", "chat", "agentic")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")
_SHORT = re.compile(r"(none|nospec|dflash|ddtree|shadow)(?::(\d+)/(\d+))?\Z")
_GRID_KEYS = {"configs", "concurrency", "sampling", "workloads", "requests", "max_new_tokens",
              "repeats", "time_limit_s", "warmup_requests", "prompts"}
_CONFIG_KEYS = {"name", "algorithm", "budget", "topk", "shadow_linear"}


@dataclass(frozen=True)
class BenchConfig:
    """One server configuration of the sweep (the service is restarted with it)."""

    algorithm: Algorithm
    budget: int | None = None
    topk: int | None = None
    shadow_linear: bool = False
    name: str = ""
    # where each value was written (the grid file's lines, or --configs)
    locate: Any = field(default=None, compare=False, repr=False)

    @property
    def layer(self) -> Layer:
        """This configuration as a layer of the server's settings (over the deployment's)."""
        values: dict[tuple[str, ...], Any] = {("algorithm",): self.algorithm}
        for key, value in (("budget", self.budget), ("topk", self.topk)):
            if value is not None:
                values[("ddtree", key)] = value
        if self.algorithm == "ddtree" or self.shadow_linear:  # never the deployment's mode
            values[("ddtree", "shadow_linear")] = self.shadow_linear
        locate = self.locate or (lambda loc: f"configuration {self.label}")
        return Layer(values, locate, from_flags=self.locate is None or
                     getattr(self.locate, "from_flags", False))

    @property
    def key(self) -> str:
        """A stable identifier (resume and results use it)."""
        if self.algorithm == "ddtree":
            mode = "-shadow" if self.shadow_linear else ""
            return f"ddtree-{self.budget}-{self.topk}{mode}"
        return "nospec" if self.algorithm == "none" else "dflash"

    @property
    def label(self) -> str:
        return self.name or self.key

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.label, "algorithm": self.algorithm,
                "budget": self.budget, "topk": self.topk, "shadow_linear": self.shadow_linear}


@dataclass(frozen=True)
class Grid:
    configs: tuple[BenchConfig, ...]
    concurrency: tuple[int, ...] = (1, 4, 16)
    sampling: tuple[Sampling, ...] = ("greedy", "sampled")
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    requests: int = 16  # per cell (agentic: sessions)
    max_new_tokens: int = 128
    repeats: int = 1
    time_limit_s: float = 120.0  # per cell: no new request after it
    warmup_requests: int = 2
    prompts: PromptMode = "auto"
    source: str = "flags"
    lines: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def cells_per_config(self) -> int:
        return len(self.workloads) * len(self.concurrency) * len(self.sampling) * self.repeats


class _FlagPlace:
    """Where a configuration of --configs was written: the flag and the item."""

    from_flags = True

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, loc: Loc) -> str:
        field_ = str(loc[-1]) if loc else ""
        return f"{self.where}: {field_}" if field_ else self.where


class _FilePlace:
    """Where a configuration of a grid file was written: file:line: configs[i].key."""

    from_flags = False

    def __init__(self, source: str, index: int, lines: dict[str, int], line: int | None) -> None:
        self.source, self.index, self.lines, self.line = source, index, lines, line

    def __call__(self, loc: Loc) -> str:
        key = str(loc[-1]) if loc else ""
        if key == "ddtree":  # the grid writes DDTree's values flat: the first one given
            key = next((k for k in ("budget", "topk", "shadow_linear")
                        if f"configs[{self.index}].{k}" in self.lines), "")
        key = {"draft_model_path": "", "model_path": ""}.get(key, key)
        label = f"configs[{self.index}]" + (f".{key}" if key else "")
        at = self.lines.get(label) or self.line
        return f"{self.source}:{at}: {label}" if at else f"{self.source}: {label}"


def _config(raw: Any, where: str) -> BenchConfig:
    """`none`, `dflash`, `ddtree:15/8`, `shadow:15/8` (shadow-linear DDTree)."""
    m = _SHORT.match(str(raw).strip().lower())
    if m is None:
        raise UsageError(f"{where}: {raw!r} is not a configuration",
                         hint="use none, dflash, ddtree:BUDGET/TOPK or shadow:BUDGET/TOPK")
    kind, budget, topk = m.groups()
    if kind in ("ddtree", "shadow"):
        if budget is None:
            raise UsageError(f"{where}: {raw!r} needs BUDGET/TOPK, e.g. ddtree:15/8")
        return _checked(BenchConfig("ddtree", int(budget), int(topk), kind == "shadow",
                                    locate=_FlagPlace(f"{where} {raw}")), where)
    if budget is not None:
        raise UsageError(f"{where}: {kind} takes no budget")
    return BenchConfig("none" if kind in ("none", "nospec") else "dflash")


def _checked(c: BenchConfig, where: str) -> BenchConfig:
    """The configuration's server settings validated by ServerSettings (no model needed yet:
    the deployment's come under it when the sweep is prepared); its name checked here."""
    merge(c.layer, partial=True)
    if c.name and not _NAME.match(c.name):
        raise UsageError(f"{where}: name {c.name!r} must be letters, digits, _ . + -")
    return c


def _ints(values: Any, what: str, lo: int, hi: int) -> tuple[int, ...]:
    items = values if isinstance(values, list) else [values]
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise UsageError(f"{what}: each value must be an integer {lo}-{hi}, got {v!r}")
        out.append(v)
    if not out or len(set(out)) != len(out):
        raise UsageError(f"{what}: give distinct values, got {items!r}")
    return tuple(out)


def _int(value: Any, what: str, lo: int, hi: int) -> int:
    return _ints([value], what, lo, hi)[0]


def _words(values: Any, what: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    items = values if isinstance(values, list) else [values]
    bad = [v for v in items if v not in allowed]
    if bad or not items or len(set(items)) != len(items):
        raise UsageError(f"{what}: expected distinct values of {', '.join(allowed)}, got {items!r}")
    return tuple(str(v) for v in items)


def build(configs: list[BenchConfig], *, workloads: tuple[str, ...], **values: Any) -> Grid:
    """A grid from already-parsed values (flags)."""
    if not configs:
        raise UsageError("the grid has no configuration")
    keys = [c.key for c in configs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise UsageError(f"configurations listed twice: {', '.join(twice)}")
    grid = Grid(configs=tuple(configs), workloads=workloads, **values)
    from ddtree_deploy.bench.results import MAX_LEVELS, MAX_NAMES

    if len(grid.concurrency) > MAX_LEVELS or len(grid.configs) > MAX_NAMES:
        raise UsageError(f"the grid has {len(grid.concurrency)} concurrency levels and "
                         f"{len(grid.configs)} configurations; a report lays out at most "
                         f"{MAX_LEVELS} and {MAX_NAMES}")
    if grid.requests < max(grid.concurrency):
        raise UsageError(f"requests: {grid.requests} per cell cannot reach concurrency "
                         f"{max(grid.concurrency)}", hint="give at least as many requests as the "
                         "highest concurrency")
    return grid


def from_flags(configs: str, concurrency: str, sampling: str, workloads: str,
               known_workloads: tuple[str, ...], **values: Any) -> Grid:
    parsed = [_config(c, "--configs") for c in configs.split(",") if c.strip()]
    conc = _ints([_flag_int(x, "--concurrency") for x in concurrency.split(",")],
                 "--concurrency", 1, 1024)
    samp = _words([s.strip() for s in sampling.split(",")], "--sampling", ("greedy", "sampled"))
    work = _words([w.strip() for w in workloads.split(",")], "--workloads", known_workloads)
    return build(parsed, workloads=work, concurrency=conc, sampling=samp, **values)


def _flag_int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not an integer") from None


def load(path: Path, known_workloads: tuple[str, ...]) -> Grid:
    """Read and validate a grid file; problems as `file:line: field: ...` (exit 2).

    Read by hosts.yaml's bounded loader (config/yamlload.py): a regular file of at most
    4 MiB (a FIFO or /dev/zero refused unread), aliases and nesting bounded, duplicate
    keys and unusual tags refused, every node's line kept."""
    from ddtree_deploy.config.yamlload import load_yaml_file, render_problems

    loaded = load_yaml_file(path, "a bench grid (YAML)")
    if loaded.problems:
        raise ConfigError(render_problems(loaded.problems, str(path)))
    return _from_doc(loaded.data, str(path), known_workloads, loaded.line_of)


def _from_doc(doc: Any, source: str, known: tuple[str, ...],
              line_of: Callable[[tuple[str | int, ...]], int]) -> Grid:
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}:1: the grid must be a mapping with 'configs'")
    lines: dict[str, int] = {}

    def _line(node: Any, key: str) -> int:
        return line_of((key,))

    def _item_line(node: Any, index: int) -> int:
        return line_of(("configs", index))

    def _key_line(index: int, key: str) -> int:
        return line_of(("configs", index, key))

    def where(key: str, line: int | None) -> str:
        return f"{source}:{line}: {key}" if line else f"{source}: {key}"

    unknown = sorted(set(map(str, doc)) - _GRID_KEYS)
    if unknown:
        raise ConfigError(f"{where(unknown[0], _line(doc, unknown[0]))}: unknown key "
                          f"(expected {', '.join(sorted(_GRID_KEYS))})")
    raw_configs = doc.get("configs")
    if not isinstance(raw_configs, list) or not raw_configs:
        raise ConfigError(f"{where('configs', _line(doc, 'configs'))}: a non-empty list of "
                          "configurations is needed")
    configs = []
    for i, item in enumerate(raw_configs):
        at = _item_line(raw_configs, i)
        label = f"configs[{i}]"
        try:
            if isinstance(item, str):
                configs.append(_config(item, where(label, at)))
                continue
            if not isinstance(item, dict):
                raise UsageError(f"{where(label, at)}: a mapping or a short form like ddtree:15/8")
            bad = sorted(set(map(str, item)) - _CONFIG_KEYS)
            if bad:
                raise UsageError(f"{where(f'{label}.{bad[0]}', _key_line(i, bad[0]))}: unknown key "
                                 f"(expected {', '.join(sorted(_CONFIG_KEYS))})")
            algo = item.get("algorithm")
            if algo not in ("none", "dflash", "ddtree"):
                raise UsageError(f"{where(f'{label}.algorithm', _key_line(i, 'algorithm') or at)}"
                                 f": expected none, dflash or ddtree, got {algo!r}")
            shadow = item.get("shadow_linear", False)
            if not isinstance(shadow, bool):
                raise UsageError(f"{where(f'{label}.shadow_linear', _key_line(i, 'shadow_linear'))}"
                                 f": expected true or false, got {shadow!r}")
            for key in ("budget", "topk", "shadow_linear", "algorithm"):
                if key in item:
                    lines[f"{label}.{key}"] = _key_line(i, key) or at or 0
            configs.append(_checked(
                BenchConfig(algo, item.get("budget"), item.get("topk"), shadow,
                            str(item.get("name") or ""),
                            locate=_FilePlace(source, i, lines, at)),
                where(label, lines.get(f"{label}.budget") or at)))
        except DeployError as exc:
            raise ConfigError(exc.message, hint=exc.hint) from None
    values: dict[str, Any] = {}
    try:
        if "concurrency" in doc:
            values["concurrency"] = _ints(doc["concurrency"],
                                          where("concurrency", _line(doc, "concurrency")), 1, 1024)
        if "sampling" in doc:
            values["sampling"] = _words(doc["sampling"], where("sampling", _line(doc, "sampling")),
                                        ("greedy", "sampled"))
        workloads: tuple[str, ...] = DEFAULT_WORKLOADS
        if "workloads" in doc:
            workloads = _words(doc["workloads"], where("workloads", _line(doc, "workloads")),
                               known)
        for key, lo, hi in (("requests", 1, 10000), ("max_new_tokens", 1, 32768),
                            ("repeats", 1, 100), ("warmup_requests", 0, 100)):
            if key in doc:
                values[key] = _int(doc[key], where(key, _line(doc, key)), lo, hi)
        if "time_limit_s" in doc:
            limit = doc["time_limit_s"]
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or \
                    not 1 <= limit <= 86400:
                raise UsageError(f"{where('time_limit_s', _line(doc, 'time_limit_s'))}: seconds "
                                 f"1-86400, got {limit!r}")
            values["time_limit_s"] = float(limit)
        if "prompts" in doc:
            values["prompts"] = _words(doc["prompts"], where("prompts", _line(doc, "prompts")),
                                       ("ids", "text", "auto"))[0]
        grid = build(configs, workloads=workloads, source=source, lines=lines, **values)
    except UsageError as exc:
        raise ConfigError(exc.message if exc.message.startswith(source) else
                          f"{source}: {exc.message}", hint=exc.hint) from None
    return grid
