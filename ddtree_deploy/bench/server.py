"""Bring the benched service up with one configuration's flags, and put back what was there.

Two ways, one interface:

- `SystemdControl` (hosts with systemd): the tool's own service machinery: the unit rendered
  from the deployment with the configuration's flags, verified and installed atomically,
  daemon-reload, restart, then the health probe. `restore` puts back the unit file that was
  installed before, byte for byte (or removes the unit if there was none) and leaves it
  running or stopped, enabled or disabled, as it was; the result is read back and compared.
- `PlainControl` (hosts without systemd, e.g. the H200 GPU host; the local transport only):
  what the rendered unit runs, as a plain process (`service/plainproc.py`: the argv,
  environment and folder the unit is written from, `render.unit_command`), its output in a
  log file, probed with `--pid/--log-file`;
  `restore` stops the process it started. It never stops a process it did not start: a
  port already taken is refused before anything runs.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ddtree_deploy import __version__
from ddtree_deploy.errors import DeployError, RefusedError
from ddtree_deploy.health.check import ProbeTarget, Verdict, probe_service
from ddtree_deploy.service.render import render_unit, unit_command
from ddtree_deploy.service.spec import UNIT_DIR, ServiceSpec
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport


class ServerControl(Protocol):
    mode: str

    def prepare(self) -> None: ...

    def start(self, spec: ServiceSpec, key: str, deadline_s: float, warmup_s: float
              ) -> tuple[Verdict, dict[str, Any]]: ...

    def restore(self) -> str: ...


def _probe(t: ExecTransport, target: ProbeTarget, deadline_s: float, warmup_s: float) -> Verdict:
    return probe_service(t, target, deadline_s=deadline_s, warmup_s=warmup_s)


def unit_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _target(spec: ServiceSpec, **extra: Any) -> ProbeTarget:
    base = ProbeTarget.from_spec(spec)
    values = {k: getattr(base, k) for k in ("port", "unit", "host", "name", "venv", "deployment",
                                             "input_ids", "addr", "key_file")}
    values.update(extra)
    return ProbeTarget(**values)


@dataclass
class SystemdControl:
    t: ExecTransport
    unit: str
    mode: str = "systemd"
    original: bytes | None = None  # the unit file as it was, byte for byte (None: no unit)
    was_active: bool = False
    was_enabled: bool = True
    prepared: bool = False

    @property
    def path(self) -> str:
        return f"{UNIT_DIR}/{self.unit}"

    def _read(self) -> bytes | None:
        """The unit file's bytes as they are on the host (None when there is none)."""
        buf = io.BytesIO()
        r = self.t.run_stream_out(Command.shell('[ -f "$1" ] || exit 3; exec cat -- "$1"',
                                                self.path, sudo=True), buf, timeout=30)
        if r.exit_code == 3:
            return None
        r.check()
        return buf.getvalue()

    def prepare(self) -> None:
        from ddtree_deploy.service import install

        text = install.current_text(self.t, self.unit)
        if text is not None and not install.is_managed(text):
            raise RefusedError(f"{self.unit} on {self.t.host} was not created by ddtree-deploy; "
                               "bench leaves it alone")
        self.original = self._read() if text is not None else None
        state = self.t.run(Command.of("systemctl", "is-active", self.unit), timeout=30)
        self.was_active = state.stdout.strip() in ("active", "activating", "reloading")
        enabled = self.t.run(Command.of("systemctl", "is-enabled", self.unit), timeout=30)
        self.was_enabled = enabled.stdout.strip() not in ("disabled", "not-found")
        self.prepared = True

    def start(self, spec: ServiceSpec, key: str, deadline_s: float, warmup_s: float
              ) -> tuple[Verdict, dict[str, Any]]:
        from ddtree_deploy.service import install

        text = render_unit(spec, tool_version=__version__)
        install.install(self.t, self.unit, text)
        install.restart(self.t, self.unit)
        verdict = _probe(self.t, _target(spec), deadline_s, warmup_s)
        return verdict, {"unit_sha256": unit_digest(text)}

    def restore(self) -> str:
        """Put back the bytes that were there (not re-verified: systemd loaded them before),
        read them back, and the unit's running and enabled state as it was."""
        from ddtree_deploy.service import install

        if not self.prepared:
            return "nothing to restore"
        if self.original is None:
            install.down(self.t, self.unit, remove=True)
            left = install.current_text(self.t, self.unit)
            if left is not None:
                raise DeployError(f"{self.unit} on {self.t.host}: could not remove the bench's "
                                  "unit")
            return f"{self.unit} removed (there was none before)"
        if self._read() != self.original:
            self.t.put_stream(io.BytesIO(self.original), self.path, mode=0o644, sudo=True)
            install._systemctl(self.t, "daemon-reload")
        if self._read() != self.original:
            raise DeployError(f"{self.unit} on {self.t.host}: the unit put back differs from the "
                              "one installed before the bench")
        if self.was_active:
            install.restart(self.t, self.unit)
            done = f"{self.unit} put back byte for byte and restarted"
        else:
            install._systemctl(self.t, "stop", self.unit, check=False)
            done = f"{self.unit} put back byte for byte (stopped, as it was)"
        if not self.was_enabled:
            install._systemctl(self.t, "disable", self.unit)
            done += ", disabled as it was"
        return done


@dataclass
class PlainControl:
    t: ExecTransport
    log_dir: Path
    mode: str = "plain"
    pid: int | None = None
    started: list[int] = field(default_factory=list)

    def prepare(self) -> None:
        if not _is_local(self.t):
            raise RefusedError(f"{self.t.host}: plain-process mode runs servers on this machine "
                               "only (the local transport)",
                               hint="run bench on the host itself: ddtree-deploy bench localhost")
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, spec: ServiceSpec, key: str, deadline_s: float, warmup_s: float
              ) -> tuple[Verdict, dict[str, Any]]:
        from ddtree_deploy.service import plainproc

        self._stop()
        text = render_unit(spec, tool_version=__version__)
        cmd = unit_command(spec)  # what the unit runs, from the model the unit was written from
        log = self.log_dir / f"{key}.log"
        self.pid = plainproc.start(cmd, str(log))
        self.started.append(self.pid)
        verdict = _probe(self.t, _target(spec, unit=None, pid=self.pid, log_file=str(log)),
                         deadline_s, warmup_s)
        return verdict, {"unit_sha256": unit_digest(text), "pid": self.pid, "log": str(log),
                         "argv": list(cmd.argv)}

    def _stop(self) -> None:
        from ddtree_deploy.service import plainproc

        if self.pid is not None:
            plainproc.stop(self.pid, timeout=30.0)
            self.pid = None

    def restore(self) -> str:
        if not self.started:
            return "no server was started"
        self._stop()
        return f"stopped the bench's server process(es) {', '.join(map(str, self.started))}"


def _is_local(t: ExecTransport) -> bool:
    from ddtree_deploy.transport.local import LocalTransport

    return isinstance(t, LocalTransport)
