"""What one SGLang service is: everything its unit and its probe need, resolved.

Built only by service.resolve.build_spec: the server's settings (settings.ServerSettings,
one merge of the deployment and flags) placed on a host by its facts (the GPUs and port
chosen, the venv's real nvidia library folders, the drafter's block, the SGLang version).
Immutable data: rendering and installing read it, never change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddtree_deploy.settings.command import ServerCommand, server_command
from ddtree_deploy.settings.model import ServerSettings
from ddtree_deploy.settings.values import TOOL_ENVIRONMENT, Algorithm

__all__ = ["DEPLOYMENT_KEY", "MANAGED_KEY", "PORT_KEY", "TOOL_ENVIRONMENT", "UNIT_DIR",
           "Algorithm", "ServiceSpec", "UnitCommand"]

MANAGED_KEY = "X-DDTreeDeploy-Managed"  # in [Unit]: marks units this tool created
UNIT_DIR = "/etc/systemd/system"
DEPLOYMENT_KEY = "X-DDTreeDeploy-Deployment"  # in [Unit]: the deployment a unit serves
PORT_KEY = "X-DDTreeDeploy-Port"  # in [Unit]: the port its /health answers on
# What systemd gives a system service besides the unit's own variables (systemd.exec(5),
# "Environment Variables in Spawned Processes"): its default PATH, the system locale's LANG
# (locale.conf) and the user's HOME, USER, LOGNAME and SHELL. A plain process gets the same,
# for the user it runs as (HOME: the caller's where set, so a test's own HOME holds), and
# nothing else of the caller's environment.
UNIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOCALE_FILES = ("/etc/locale.conf", "/etc/default/locale")


def unit_base_environment() -> dict[str, str]:
    """The environment systemd would start a unit's process in, before the unit's own."""
    import os
    import pwd

    entry = pwd.getpwuid(os.geteuid())
    base = {"PATH": UNIT_PATH, "HOME": os.environ.get("HOME") or entry.pw_dir,
            "USER": entry.pw_name, "LOGNAME": entry.pw_name, "SHELL": entry.pw_shell or "/bin/sh"}
    for path in LOCALE_FILES:
        try:
            with open(path, encoding="utf-8") as fh:
                lang = [line.strip()[5:].strip('"') for line in fh if line.startswith("LANG=")]
        except (OSError, UnicodeDecodeError):
            continue
        if lang and lang[-1]:
            base["LANG"] = lang[-1]
            break
    return base


@dataclass(frozen=True)
class UnitCommand:
    """What a unit runs: argv, its own environment and working folder.

    The one model both ways of running a service read: `render.py` writes it into the unit
    (quoted for systemd) and `plainproc.py` runs it as it is, so the two cannot differ.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    env_file: str | None = None  # EnvironmentFile= (secrets: read when the process starts)
    user: str | None = None  # User= (None: whoever starts it)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The process's environment: `base` (default: what systemd gives a unit's process,
        `unit_base_environment`; never the caller's whole environment) with the unit's on
        top, then its EnvironmentFile's (read here, as systemd reads it at each start)."""
        merged = dict(unit_base_environment() if base is None else base)
        merged.update(self.env)
        if self.env_file is not None:
            from ddtree_deploy.service.endpoint import read_env_file

            merged.update(read_env_file(self.env_file))
        return merged

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"argv": list(self.argv), "environment": dict(self.env),
                                  "working_directory": self.cwd}
        if self.env_file is not None:
            out["environment_file"] = self.env_file  # its path: never its content
        if self.user is not None:
            out["user"] = self.user
        return out


@dataclass(frozen=True)
class ServiceSpec:
    name: str  # unit stem: "sglang-ddtree" -> sglang-ddtree.service
    host: str
    venv: str  # absolute path of the venv on the host
    gpus: tuple[int, ...]  # physical GPU indices -> CUDA_VISIBLE_DEVICES
    port: int
    settings: ServerSettings  # merged and validated (with the host's facts)
    deployment: str | None = None  # the hosts.yaml deployment it came from, if any
    bind_host: str = "0.0.0.0"
    sglang_version: str | None = None  # the venv's SGLang (None: the payload's 0.5.11)
    num_draft_tokens: int | None = None  # the drafter's block size (16 for the -b16 drafters)
    ld_library_path: tuple[str, ...] = field(default_factory=tuple)  # venv's nvidia lib dirs
    user: str | None = None  # the unit's User= (None: root)
    secrets: tuple[str, ...] = ()  # which secret files it reads: "api_key", "hf_token"

    @property
    def unit_name(self) -> str:
        return f"{self.name}.service"

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit_name}"

    @property
    def python(self) -> str:
        return f"{self.venv.rstrip('/')}/bin/python"

    @property
    def algorithm(self) -> Algorithm:
        return self.settings.algorithm

    @property
    def tp_size(self) -> int:
        return self.settings.tp_size

    @property
    def model_path(self) -> str:
        return self.settings.model

    @property
    def draft_model_path(self) -> str | None:
        return self.settings.draft

    @property
    def extra_args(self) -> tuple[str, ...]:
        return tuple(self.settings.extra_args)

    def command(self) -> ServerCommand:
        """The server's arguments and environment (settings.command: per SGLang version)."""
        return server_command(self.settings, self.sglang_version, port=self.port,
                              bind_host=self.bind_host,
                              draft_tokens=self.num_draft_tokens if self.algorithm != "none"
                              else None)

    def server_args(self) -> list[str]:
        """`python -m sglang.launch_server` arguments, in a stable order."""
        return list(self.command().args)

    @property
    def environment(self) -> tuple[tuple[str, str], ...]:
        """The deployment's `environment:`, by name (the tool's own variables are not in it)."""
        return self.command().env
