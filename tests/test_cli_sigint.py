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


@pytest.mark.parametrize(("inherited", "while_importing"), [
    # as from a terminal (the suite itself may run with SIGINT ignored: a background job)
    (signal.default_int_handler, app._interrupted_at_start),
    # a background job of a shell without job control starts with SIGINT ignored: the CLI keeps
    # it so during the imports as it does for the rest of the run
    (signal.SIG_IGN, signal.SIG_IGN),
], ids=["terminal", "ignored-by-the-caller"])
def test_sigint_while_importing(monkeypatch: pytest.MonkeyPatch, inherited: Any,
                                while_importing: Any) -> None:
    seen = _seen_during_build(monkeypatch)
    old = signal.signal(signal.SIGINT, inherited)
    try:
        with pytest.raises(SystemExit):
            app.main(["--version"])
        assert seen == [while_importing]
        assert signal.getsignal(signal.SIGINT) is inherited  # put back as it came
    finally:
        signal.signal(signal.SIGINT, old)
