"""Bench results on disk: one JSON file per host and service, with a CSV beside it.

`$XDG_STATE_HOME/ddtree-deploy/bench/<host>/<service>/results.json` holds the host's facts
(GPU, driver, CUDA lane, versions), every configuration with the exact server flags it ran with,
and one row per measured cell (configuration x workload x concurrency x sampling x repeat).
Saving rewrites both files atomically after every cell, so a killed sweep loses at most the
cell it was running and a re-run skips what is already measured (resume).

Each configuration also records the software and hardware it ran on (its `stack`: GPU, driver,
CUDA, python, torch, lane, sglang, payload). A resume on a host whose stack changed since the
file's cells were measured (e.g. a payload upgrade) would put two stacks into one comparison:
`stack_change` says what changed, the CLI refuses unless asked, and the facts the file held before
go to `facts_history`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddtree_deploy.bench.metrics import METRICS
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.xdg import state_dir

SCHEMA = "ddtree-deploy-bench/1"
CELL_KEYS = ("config", "workload", "concurrency", "sampling", "repeat")
CONFIG_COLUMNS = ("name", "algorithm", "budget", "topk", "shadow_linear")
CSV_COLUMNS = (*CELL_KEYS, *CONFIG_COLUMNS, *METRICS)

CellKey = tuple[str, str, int, str, int]
#: the host facts that make two measurements comparable (not the time they were read)
STACK_KEYS = ("hostname", "gpus", "driver_version", "cuda_version", "python", "torch", "lane",
              "sglang", "payload")


MAX_RESULTS_BYTES = 64 << 20  # ~100,000 cells; a results file is written by bench itself
MAX_NAMES = 256  # configurations a report can lay out
MAX_WORKLOADS = 32  # a chart panel each (a real grid has 5)
MAX_LEVELS = 16  # concurrency levels (a bar group each per workload; a real grid has 3-4)


class _Checked(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


Scalar = str | int | float | bool | None
# A measured quantity: finite, 0 or more, and below anything a GPU serves (so a ratio of two
# of them, or their geometric mean, stays finite).
Amount = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)] | None


class _Metrics(_Checked):
    output_tok_s: Amount = None
    request_tok_s_p50: Amount = None
    ttft_p50_s: Amount = None
    ttft_p99_s: Amount = None
    tpot_p50_s: Amount = None
    icl_p50_s: Amount = None
    icl_p99_s: Amount = None
    accept_length: Amount = None
    verify_ct: Amount = None
    requests: Amount = None
    failed: Annotated[int, Field(ge=0, le=10**9)] | None = None
    tokens: Amount = None
    wall_s: Amount = None


class _Cell(_Checked):
    config: str
    workload: Annotated[str, Field(min_length=1, max_length=200)]
    concurrency: Annotated[int, Field(ge=1, le=1024)]
    sampling: Literal["greedy", "sampled"]
    repeat: Annotated[int, Field(ge=0, le=10**6)]
    metrics: _Metrics
    errors: list[str] = []


class _ConfigColumns(_Checked):
    key: str | None = None
    name: Annotated[str, Field(max_length=200)] | None = None
    algorithm: Literal["none", "dflash", "ddtree"] | None = None
    budget: Annotated[int, Field(ge=1, le=1024)] | None = None
    topk: Annotated[int, Field(ge=1, le=1024)] | None = None
    shadow_linear: bool = False


class _ConfigInfo(_Checked):
    config: _ConfigColumns = _ConfigColumns()
    flags: list[str] = []
    error: str | None = None
    stack: dict[str, Any] | None = None


class _Gpu(_Checked):
    name: Scalar = None
    memory_total_mib: Scalar = None


class _HostFacts(_Checked):
    gpus: list[_Gpu] | None = None
    hostname: Scalar = None
    driver_version: Scalar = None
    cuda_version: Scalar = None
    lane: Scalar = None
    torch: Scalar = None
    sglang: Scalar = None
    payload: Scalar = None
    python: Scalar = None


class _File(_Checked):
    host: str
    service: str
    label: str | None = None
    synthetic: bool = False
    host_facts: _HostFacts = _HostFacts()
    facts_history: list[_HostFacts] = []
    grid: dict[str, Scalar | list[Any]] | None = None
    configs: Annotated[dict[str, _ConfigInfo], Field(max_length=MAX_NAMES)]
    cells: list[_Cell]


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problems(path: Path, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors()[:10]:
        value = error.get("input")
        shown = repr(value) if isinstance(value, str | int | float | bool) or value is None \
            else type(value).__name__
        lines.append(f"{path}: {_where(error['loc'])}: {error['msg']}, got {shown[:80]}")
    more = len(exc.errors()) - 10
    if more > 0:
        lines.append(f"{path}: ... and {more} more")
    return "\n".join(lines)


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a number a results file may hold")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # json.loads would keep the last one silently
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse(raw: bytes, path: Path) -> dict[str, Any]:
    """A results file's JSON, validated in full (ConfigError, exit 2, naming file and field)."""
    from ddtree_deploy.config.yamlload import decode_utf8

    text = decode_utf8(raw, str(path))
    try:
        data = json.loads(text, parse_constant=_not_a_number, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: not a bench results file "
                          f"(JSON: {exc.msg})") from None
    except ValueError as exc:  # NaN, Infinity, a duplicate key, an integer of 5000 digits
        raise ConfigError(f"{path}: not a bench results file: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a bench results file: nested too deep") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"{path}: not a bench results file (schema {SCHEMA} expected)")
    try:
        _File.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_problems(path, exc), hint="the results file was edited or damaged; "
                          "bench writes it itself") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a bench results file: nested too deep") from None
    for i, cell in enumerate(data["cells"]):
        if cell["config"] not in data["configs"]:
            raise ConfigError(f"{path}: cells[{i}].config: {cell['config']!r} is not one of "
                              "the file's configs")
    for what, limit in (("workload", MAX_WORKLOADS), ("concurrency", MAX_LEVELS)):
        seen = {c[what] for c in data["cells"]}
        if len(seen) > limit:
            raise ConfigError(f"{path}: cells: {len(seen)} distinct {what} values, more than a "
                              f"report can lay out ({limit})")
    return data


def stack_of(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: facts.get(k) for k in STACK_KEYS}


def results_dir(host: str, service: str) -> Path:
    return state_dir() / "bench" / host / service


def _atomic_write(path: Path, text: str) -> None:
    from ddtree_deploy.atomicfile import replace_file

    replace_file(path, text.encode("utf-8"))


@dataclass
class Results:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, *, host: str, service: str) -> Results:
        """The results file at `path` (created empty in memory if it does not exist)."""
        if path.exists():
            res = cls.load(path)
            if res.data.get("host") != host or res.data.get("service") != service:
                raise ConfigError(
                    f"{path} holds results of {res.data.get('service')} on "
                    f"{res.data.get('host')}, not {service} on {host}",
                    hint="pass another --results file")
            return res
        return cls(path, {"schema": SCHEMA, "host": host, "service": service,
                          "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "synthetic": False,
                          "host_facts": {}, "configs": {}, "cells": []})

    @classmethod
    def load(cls, path: Path) -> Results:
        """Read through the bounded reader hosts.yaml uses (a regular file, at most
        MAX_RESULTS_BYTES: a FIFO or /dev/zero is refused unread), then validated in full."""
        from ddtree_deploy.config.yamlload import read_config_bytes

        if not os.path.lexists(path):
            raise ConfigError(f"no bench results at {path}",
                              hint="run `ddtree-deploy bench HOST [DEPLOYMENT]` first")
        raw = read_config_bytes(path, "a bench results file (JSON)", limit=MAX_RESULTS_BYTES)
        return cls(path, parse(raw, path))

    @property
    def cells(self) -> list[dict[str, Any]]:
        cells: list[dict[str, Any]] = self.data["cells"]
        return cells

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        configs: dict[str, dict[str, Any]] = self.data["configs"]
        return configs

    def done(self) -> set[CellKey]:
        return {(c["config"], c["workload"], int(c["concurrency"]), c["sampling"],
                 int(c["repeat"])) for c in self.cells}

    def set_config(self, key: str, info: dict[str, Any]) -> None:
        stack = stack_of(self.data.get("host_facts") or {})
        self.configs[key] = {**self.configs.get(key, {}), "stack": stack, **info}

    def stack_change(self, facts: dict[str, Any]) -> list[str]:
        """The stack keys in which ``facts`` differ from those the measured cells ran on
        (empty when nothing is measured yet)."""
        if not self.cells:
            return []
        old = stack_of(self.data.get("host_facts") or {})
        new = stack_of(facts)
        return [k for k in STACK_KEYS if old[k] != new[k]]

    def record_facts(self, facts: dict[str, Any]) -> None:
        """The host's facts for what is measured next; facts of another stack are kept."""
        old = self.data.get("host_facts") or {}
        if old and self.stack_change(facts):
            history = self.data.setdefault("facts_history", [])
            if not history or stack_of(history[-1]) != stack_of(old):
                history.append(old)
        self.data["host_facts"] = facts

    def stacks(self) -> dict[str, dict[str, Any]]:
        """Configuration -> the stack it ran on, where the file records it."""
        return {k: info["stack"] for k, info in self.configs.items() if info.get("stack")}

    def add_cell(self, key: CellKey, metrics: dict[str, Any], errors: list[str]) -> None:
        """Record a cell; a metric the reader would refuse (NaN, infinite, negative or not a
        number: what a broken host's answer can make) is kept out, and said in its errors, so
        the file bench writes is always one bench report reads."""
        row = dict(zip(CELL_KEYS, key, strict=True))
        kept, said = dict(metrics), list(errors)
        for name, value in metrics.items():
            if name in _Metrics.model_fields and value is not None:
                try:
                    _Metrics.model_validate({name: value})
                except ValidationError:
                    kept[name] = None
                    said.append(f"{name}: {value!r} is not a measurement (dropped)")
        self.cells.append({**row, "metrics": kept, "errors": said,
                           "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per cell: its keys, its configuration's columns, its metrics."""
        out = []
        for cell in self.cells:
            conf = self.configs[cell["config"]].get("config", {})
            row = {k: cell[k] for k in CELL_KEYS}
            row.update({k: conf.get(k) for k in CONFIG_COLUMNS})
            row.update({k: cell["metrics"].get(k) for k in METRICS})
            out.append(row)
        return out

    def csv_text(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
        writer.writeheader()
        for row in self.rows():
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
        return buf.getvalue()

    def save(self) -> None:
        """Both files replaced atomically (a failure names the file, exit 1, no temporary)."""
        _atomic_write(self.path, json.dumps(self.data, indent=1, sort_keys=False) + "\n")
        _atomic_write(self.path.with_suffix(".csv"), self.csv_text())
