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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_deploy.bench.metrics import METRICS
from ddtree_deploy.errors import ConfigError, DeployError
from ddtree_deploy.xdg import state_dir

SCHEMA = "ddtree-deploy-bench/1"
CELL_KEYS = ("config", "workload", "concurrency", "sampling", "repeat")
CONFIG_COLUMNS = ("name", "algorithm", "budget", "topk", "shadow_linear")
CSV_COLUMNS = (*CELL_KEYS, *CONFIG_COLUMNS, *METRICS)

CellKey = tuple[str, str, int, str, int]
#: the host facts that make two measurements comparable (not the time they were read)
STACK_KEYS = ("hostname", "gpus", "driver_version", "cuda_version", "python", "torch", "lane",
              "sglang", "payload")


def stack_of(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: facts.get(k) for k in STACK_KEYS}


def results_dir(host: str, service: str) -> Path:
    return state_dir() / "bench" / host / service


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no bench results at {path}",
                              hint="run `ddtree-deploy bench HOST [DEPLOYMENT]` first") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a bench results file ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ConfigError(f"{path}: not a bench results file (schema {SCHEMA} expected)")
        for i, cell in enumerate(data.get("cells") or []):
            missing = [k for k in (*CELL_KEYS, "metrics") if k not in cell]
            if missing or cell["config"] not in data.get("configs", {}):
                raise ConfigError(f"{path}: cells[{i}] lacks {', '.join(missing) or 'its config'}")
        return cls(path, data)

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
        row = dict(zip(CELL_KEYS, key, strict=True))
        self.cells.append({**row, "metrics": metrics, "errors": errors,
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
        try:
            _atomic_write(self.path, json.dumps(self.data, indent=1, sort_keys=False) + "\n")
            _atomic_write(self.path.with_suffix(".csv"), self.csv_text())
        except OSError as exc:
            raise DeployError(f"cannot write bench results {self.path}: {exc}") from None
