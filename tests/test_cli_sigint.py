"""The CLI's SIGINT handling while its commands are imported (ddtree_deploy/cli/app.py main)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from ddtree_deploy.cli import app


def _seen_during_build(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    real = app.build_app

    def build(args: list[str]) -> Any:
        seen.append(signal.getsignal(signal.SIGINT))
        return real(args)

    monkeypatch.setattr(app, "build_app", build)
    return seen


def test_ctrl_c_while_importing_gets_the_short_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _seen_during_build(monkeypatch)
    # as from a terminal (the suite itself may run with SIGINT ignored: a background job)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit):
            app.main(["--version"])
        assert seen == [app._interrupted_at_start]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_sigint_the_caller_ignored_stays_ignored_while_importing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A background job of a shell without job control starts with SIGINT ignored: the CLI
    keeps it so during the imports as it does for the rest of the run."""
    seen = _seen_during_build(monkeypatch)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(SystemExit):
            app.main(["--version"])
        assert seen == [signal.SIG_IGN]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
