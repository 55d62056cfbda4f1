"""`hosts check`: one SSH round trip per host saying what answers there.

A quick reachability check (hostname, kernel, GPUs as nvidia-smi lists them,
which declared venvs exist), not the full facts probe: one shell script, values
passed as positional arguments, output parsed by a pure function.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddtree_deploy.config.hosts import Config, HostSpec
from ddtree_deploy.errors import RemoteCommandError
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

SCRIPT = r"""
echo "@hostname"; hostname
echo "@kernel"; uname -r
echo "@gpus"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.used,memory.total,temperature.gpu,pstate \
    --format=csv,noheader,nounits 2>&1
else
  echo "no nvidia-smi"
fi
echo "@venvs"
for v in "$@"; do
  if [ -x "$v/bin/python" ]; then echo "present $v"; else echo "absent $v"; fi
done
"""


@dataclass(frozen=True)
class GpuLine:
    index: str
    name: str
    used_mib: str
    total_mib: str
    error: str = ""  # a dead GPU: what its cells read ("Unknown Error"); its MiB mean nothing

    @property
    def memory(self) -> str:
        return f"DEAD ({self.error})" if self.error else f"{self.used_mib}/{self.total_mib}"


_NOT_AN_ERROR = ("[N/A]", "[Not Supported]")


def _cell_error(value: str) -> str | None:
    """What a CSV cell of a broken GPU reads ("[Unknown Error]", "[GPU is lost]", "ERR!")."""
    if value == "ERR!" or (value.startswith("[") and value.endswith("]")
                           and value not in _NOT_AN_ERROR):
        return value.strip("[]")
    return None


@dataclass
class HostCheck:
    host: str
    hostname: str = ""
    kernel: str = ""
    gpus: list[GpuLine] = field(default_factory=list)
    gpu_error: str = ""
    venvs: dict[str, bool] = field(default_factory=dict)


def parse(host: str, text: str) -> HostCheck:
    """Pure: the script's output -> HostCheck."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@"):
            current = line[1:].strip()
            sections[current] = []
        elif current is not None and line.strip():
            sections[current].append(line.strip())
    check = HostCheck(host)
    check.hostname = (sections.get("hostname") or [""])[0]
    check.kernel = (sections.get("kernel") or [""])[0]
    for line in sections.get("gpus", []):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 6 and parts[0].isdecimal():
            errors = sorted({e for p in parts[2:] if (e := _cell_error(p))})
            check.gpus.append(GpuLine(parts[0], parts[1], parts[2], parts[3], ", ".join(errors)))
        else:
            check.gpu_error = (check.gpu_error + " " + line).strip()
    for line in sections.get("venvs", []):
        state, _, path = line.partition(" ")
        check.venvs[path] = state == "present"
    return check


def check_host(config: Config, spec: HostSpec) -> HostCheck:
    venvs = [str(v.path) for v in spec.venvs.values()]
    with open_transport(config, spec) as transport:
        result = transport.run(Command.shell(SCRIPT, *venvs), timeout=spec.command_timeout)
    if not result.ok:
        raise RemoteCommandError(f"{spec.name}: the check script failed ({result.exit_code}): "
                                 f"{result.stderr.strip()[-300:]}",
                                 output=result.error_output())
    return parse(spec.name, result.stdout)
