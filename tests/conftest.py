"""Shared fixtures: the lab (brought up once per session, taken down at the end)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from sshd_fixture import Sshd, sshd_available

from ddtree_deploy.config import Config, load_config
from ddtree_deploy.resources import embedded_hosts_file


def lab_possible() -> str | None:
    """Why the lab cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the lab needs root"
    for tool in ("systemd-nspawn", "debootstrap", "ip", "ssh-keygen", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run scripts/setup.sh)"
    return None


@pytest.fixture(scope="session")
def lab_session() -> Iterator[None]:
    reason = lab_possible()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"lab tests must run in CI: {reason}")
        pytest.skip(reason)
    from ddtree_deploy.lab import manager

    manager.up()
    try:
        yield
    finally:
        manager.down()


@pytest.fixture()
def lab(lab_session: None) -> Config:
    """The lab is up (brought back if a test took it down); returns the embedded hosts file."""
    from ddtree_deploy.lab import manager

    rows = manager.status()
    if not rows or not all(r.running and r.ssh for r in rows):
        manager.up()
    return load_config(embedded_hosts_file())


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH sshd on loopback for one test module, stopped by its PID after it."""
    reason = sshd_available()
    if reason:
        pytest.skip(reason)
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()
