"""Hostile and careless input to `ddtree-deploy payload` (issue 14): nothing is written or
deleted outside the venv's package and state folder, state read back from the host is checked
like any input, refusals exit 2 without a traceback. The cases are data:
tests/data/hostile_payload_cases.yaml (what each sets up, runs and expects).

Each command runs as the real CLI on localhost in a subprocess with an address-space limit and
a timeout, so a case that would hang (a FIFO) or eat memory (/dev/zero) cannot stall CI.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from payload_fakes import (
    UPSTREAM,
    VERIFY_FAIL,
    fake_venv,
    package,
    payload_folder,
    site_packages,
    tree,
)

from ddtree_deploy.payload import deploy as ops
from ddtree_deploy.payload.manifest import load_manifest
from ddtree_deploy.transport.local import LocalTransport

CASES = yaml.safe_load((Path(__file__).parent / "data/hostile_payload_cases.yaml").read_text())
MEMORY_LIMIT = 3 << 30
TIMEOUT_S = 60


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg/cache"),
               XDG_STATE_HOME=str(root / "xdg/state"), XDG_CONFIG_HOME=str(root / "xdg/config"),
               NO_COLOR="1", COLUMNS="200")
    try:
        return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                               str(root / "hosts.yaml"), "payload", *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                              env=env, preexec_fn=_limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"payload {' '.join(args)} did not finish in {TIMEOUT_S} s")


def _edit_manifest(folder: Path, edits: dict[str, Any]) -> None:
    path = folder / "payload.yaml"
    doc = yaml.safe_load(path.read_text())
    support = doc["sglang"]["0.5.11"]
    doc.update(edits.get("top", {}))
    support.update(edits.get("support", {}))
    support["patches"][0].update(edits.get("patch0", {}))
    support["files"][0].update(edits.get("file0", {}))
    if edits.get("verify_fails"):
        doc["verify"][0]["code"] = VERIFY_FAIL
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "hosts.yaml").write_text("version: 1\nhosts: {}\n")
        self.venv = fake_venv(root)
        self.payload = payload_folder(root)
        self.outside = root / "outside"
        self.outside.mkdir()
        (self.outside / "victim.txt").write_text("not the payload's\n")
        for rel, text in UPSTREAM.items():
            (self.outside / Path(rel).name).write_text(text)
        self.backup: Path | None = None
        self.before_deploy: dict[str, str] = {}

    def path(self, template: str) -> Path:
        return Path(template.format(venv=self.venv, sp=site_packages(self.venv),
                                    pkg=package(self.venv), outside=self.outside,
                                    payload=self.payload, backup=self.backup))

    @property
    def state(self) -> Path:
        return self.venv / ".ddtree-deploy/payload.json"

    def act(self, action: dict[str, Any]) -> None:
        ((kind, arg),) = action.items()
        if kind == "manifest":
            _edit_manifest(self.payload, arg)
        elif kind in ("move_link", "link"):
            link, to = self.path(arg[0]), self.path(arg[1])
            if kind == "move_link" and link.exists():
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(link, to)
            elif link.exists() or link.is_symlink():
                link.unlink()
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(to)
        elif kind == "write":
            target = self.path(arg[0])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(arg[1].encode("latin-1"))
        elif kind == "deploy":
            self.before_deploy = tree(package(self.venv))
            manifest, folder = load_manifest(self.payload)
            with LocalTransport() as t:
                assert ops.deploy(t, str(self.venv), manifest, folder).action == "deployed"
            self.backup = Path(json.loads(self.state.read_text())["backup"])
        elif kind == "state":
            doc = json.loads(self.state.read_text())
            doc.update({k: str(self.path(v)) if isinstance(v, str) else v
                        for k, v in arg.items()})
            self.state.write_text(json.dumps(doc))
        elif kind == "state_text":
            self.state.write_text(arg)
        elif kind == "backup_originals":
            assert self.backup is not None
            path = self.backup / "manifest.json"
            doc = json.loads(path.read_text())
            doc["originals"].update(arg)
            path.write_text(json.dumps(doc))
        elif kind == "fifo":
            target = self.path(arg)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)  # a payload's own file made a FIFO in its place
            os.mkfifo(target)
        elif kind == "python":
            python = self.venv / "bin/python"
            python.unlink()
            python.write_text(f"#!/bin/sh\n{arg}\n")
            python.chmod(0o755)
        else:
            raise AssertionError(f"unknown action {kind}")

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        venv = ["--venv", str(self.venv)]
        extra = {"deploy": venv + ["--payload", str(self.payload)], "rollback": venv,
                 "verify": venv + ["--payload", str(self.payload)]}[command]
        return cli(self.root, command, "localhost", *extra)


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["id"] for c in CASES["cases"]])
def test_hostile_payload_case(tmp_path: Path, case: dict[str, Any]) -> None:
    world = World(tmp_path)
    for action in case["setup"]:
        world.act(action)
    outside, payload = tree(world.outside), tree(world.payload)
    pkg_before = tree(world.venv)
    r = world.run(case["run"])
    said = r.stdout + r.stderr
    expect = case["expect"]
    assert r.returncode == expect["exit"], said
    assert expect["says"] in said, said
    assert "Traceback" not in said, said
    assert tree(world.outside) == outside, "a file outside the venv changed"
    assert tree(world.payload) == payload
    if expect["exit"] == 2 or expect.get("package") == "unchanged":
        assert tree(world.venv) == pkg_before, "a refusal changed the venv"
    if expect.get("package") == "as-before-deploy":
        assert tree(package(world.venv)) == world.before_deploy
        assert not world.state.exists()
    if expect.get("backups") == "empty":
        backups = world.venv / ".ddtree-deploy/backups"
        assert not backups.exists() or not any(backups.iterdir())
