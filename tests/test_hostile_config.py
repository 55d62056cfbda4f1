"""Hostile values in hosts.yaml fields that reach remote commands never run.

Every string of the hosts file that ends up in a command (today: venv and model
paths, through `hosts check`) is given shell metacharacters; the command runs
through the real transports (local, and SSH into the lab) and a marker file
that any injection would create must never appear, while the values come back
intact (proving they reached the remote side as data).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from ddtree_deploy.config.hosts import Config, load_config
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.hostcheck import check_host
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport


def hostile_values(marker: Path) -> list[str]:
    m = str(marker)
    return [
        f"/opt/x; touch {m}",
        f"/opt/$(touch {m})",
        f"/opt/`touch {m}`",
        f"/opt/x' ; touch {m} ; '",
        f'/opt/x" ; touch {m} ; "',
        f"/opt/x && touch {m} #",
        f"/opt/x | touch {m}",
        f"/opt/x > {m}",
    ]


def write_hosts(path: Path, host_block: str, values: list[str]) -> Config:
    venvs = "\n".join(
        f"      v{i}:\n        path: {json.dumps(v)}\n        role: scratch"
        for i, v in enumerate(values)
    )
    models = "\n".join(f"      m{i}: {json.dumps(v)}" for i, v in enumerate(values))
    path.write_text(f"version: 1\nhosts:\n{host_block}    venvs:\n{venvs}\n    models:\n{models}\n")
    return load_config(path)


def test_hostile_paths_survive_config_loading_unchanged(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    values = hostile_values(marker)
    config = write_hosts(tmp_path / "hosts.yaml", "  box:\n    transport: local\n", values)
    spec = config.host("box")
    assert [str(v.path) for v in spec.venvs.values()] == values
    assert [str(p) for p in spec.models.values()] == values


def test_a_path_with_a_line_break_is_refused_when_loaded(tmp_path: Path) -> None:
    """A newline would end a unit's line (and a report's): host paths refuse it outright."""
    marker = tmp_path / "pwned"
    with pytest.raises(ConfigError, match="U\\+000A"):
        write_hosts(tmp_path / "hosts.yaml", "  box:\n    transport: local\n",
                    [f"/opt/x\ntouch {marker}"])
    assert not marker.exists()


def test_hostile_values_do_not_run_locally(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    values = hostile_values(marker)
    config = write_hosts(tmp_path / "hosts.yaml", "  box:\n    transport: local\n", values)
    result = check_host(config, config.host("box"))
    assert not marker.exists()
    # each value arrived as one argument: reported back whole (a newline splits the report line)
    assert set(result.venvs) >= {v for v in values if "\n" not in v}
    assert not any(result.venvs.values())


@pytest.mark.lab
def test_hostile_values_do_not_run_over_ssh(lab: Config, tmp_path: Path) -> None:
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    values = hostile_values(marker)
    ct129 = lab.host("ct129")
    block = (
        f"  ct129:\n    address: {ct129.address}\n    identity_file: {ct129.identity_file}\n"
        f"    known_hosts: {ct129.known_hosts}\n"
    )
    config = write_hosts(tmp_path / "hosts.yaml", block, values)
    result = check_host(config, config.host("ct129"))
    assert set(result.venvs) >= {v for v in values if "\n" not in v}
    with open_transport(lab, "ct129") as t:
        assert t.run(Command.of("test", "-e", str(marker))).exit_code == 1
        # the values also travel intact as plain argv, newline included
        echoed = t.run(Command.of("printf", "%s\\0", *values)).stdout
    assert echoed.split("\0")[:-1] == values
