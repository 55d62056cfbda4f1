"""What every command shares: the hosts file, loaded once per invocation."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from ddtree_deploy.config import Config, find_hosts_file, load_config


def config_of(ctx: typer.Context) -> Config:
    """The validated hosts file named by --hosts (or found by discovery), cached on ctx."""
    root = ctx.find_root()
    obj = root.obj if isinstance(root.obj, dict) else {}
    if "config" not in obj:
        cli_path = obj.get("hosts")
        obj["config"] = load_config(find_hosts_file(Path(cli_path) if cli_path else None))
        root.obj = obj
    config: Config = obj["config"]
    return config


def hosts_or_all(config: Config, names: list[str] | None) -> list[str]:
    """The named hosts (each checked to exist), or every host in the file."""
    if names:
        for name in names:
            config.host(name)
        return names
    return list(config.hosts)


def print_json(console: Console, data: object) -> None:
    """JSON for machines: plain text when stdout is a pipe or a file (fast, nothing to strip),
    highlighted by rich on a terminal. `data` is a JSON-able value or a JSON text."""
    value = json.loads(data) if isinstance(data, str) else data
    if console.is_terminal:
        console.print_json(data=value)
    else:
        console.file.write(json.dumps(value, indent=2) + "\n")
        console.file.flush()
