"""Find and load hosts.yaml: every problem in the file, reported at once, by line.

``load_config(path)`` reads the file once (ddtree_deploy.config.yamlload keeps the line
of every node), validates each host and deployment against the models of
ddtree_deploy.config.schema, then checks what refers to what (jump hosts, venv
clones, a deployment's host and venv, clashing ports, GPUs and service names).
All problems end up in one ConfigError, one line each::

    hosts.yaml:14: hosts.ct200.port: must be 1-65535, got 70000
"""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ddtree_deploy.config.schema import (
    HOST_NAME_RE,
    DdtreeSpec,
    Deployment,
    ExpectedGpus,
    HostSpec,
    SglangSpec,
    VenvCreate,
    VenvSpec,
    expand_vars,
    local_host,
)
from ddtree_deploy.config.yamlload import (
    LoadedYaml,
    PathKey,
    Problem,
    load_yaml_file,
    parse_yaml,
    path_part,
    render_problems,
)
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.settings.messages import describe, english
from ddtree_deploy.xdg import config_dir

__all__ = [
    "Config", "DdtreeSpec", "Deployment", "ExpectedGpus", "HostSpec", "SglangSpec", "VenvCreate",
    "VenvSpec", "expand_vars", "find_hosts_file", "load_config",
]  # fmt: skip

ENV_VAR = "DDTREE_DEPLOY_HOSTS"
TOP_KEYS = ("version", "hosts", "deployments")
LOCALHOST = "localhost"


class Config:
    """A validated hosts file: hosts and deployments by name."""

    def __init__(
        self, path: Path, hosts: dict[str, HostSpec], deployments: dict[str, Deployment],
        line_of: Callable[[PathKey], int] | None = None,
    ) -> None:
        self.path = path
        self.hosts = hosts
        self.deployments = deployments
        self.source = FROM_FLAG  # where the file came from (locate_hosts_file); set by the CLI
        self._line_of = line_of

    def line_of(self, path: PathKey) -> int:
        """The line of a field of the file (1 when not known)."""
        return self._line_of(path) if self._line_of is not None else 1

    def host(self, name: str) -> HostSpec:
        """The host called ``name``; ``localhost`` is always there (the workstation itself)."""
        if name in self.hosts:
            return self.hosts[name]
        if name == LOCALHOST:
            return local_host()
        known = [*self.hosts, *([] if LOCALHOST in self.hosts else [LOCALHOST])]
        raise ConfigError(f"unknown host {name!r}{_did_you_mean(name, known)}; {self.path} "
                          f"defines: {', '.join(known)}")

    def deployment(self, name: str) -> Deployment:
        if name in self.deployments:
            return self.deployments[name]
        known = list(self.deployments)
        raise ConfigError(f"unknown deployment {name!r}{_did_you_mean(name, known)}; "
                          f"{self.path} defines: {', '.join(known) or 'none'}")

    def deployments_on(self, host: str | HostSpec) -> list[Deployment]:
        name = host.name if isinstance(host, HostSpec) else host
        return [d for d in self.deployments.values() if d.host == name]


def _did_you_mean(name: str, known: list[str]) -> str:
    """`: did you mean 'x'?` for the closest known names (difflib's ratio), else nothing."""
    import difflib

    close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


# Where a hosts file came from (locate_hosts_file): named on purpose, found, or the default.
FROM_FLAG, FROM_ENV, FROM_CWD, FROM_XDG, EMBEDDED = (
    "--hosts", f"${ENV_VAR}", "./hosts.yaml", "the XDG config folder", "embedded")
LAB = "--lab"  # the embedded file, asked for by name: the lab
NAMED = (FROM_FLAG, FROM_ENV, LAB)


def locate_hosts_file(cli_path: Path | None = None) -> tuple[Path, str]:
    """The hosts file and where it came from: --hosts FILE, else $DDTREE_DEPLOY_HOSTS, else
    ./hosts.yaml (a user's file, a checkout's too), else the XDG config folder's hosts.yaml,
    else the embedded default (EMBEDDED: the lab's addresses)."""
    if cli_path is not None:
        return _must_exist(Path(cli_path).expanduser(), f"--hosts {cli_path}"), FROM_FLAG
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return _must_exist(Path(from_env).expanduser(), f"${ENV_VAR}={from_env}"), FROM_ENV
    for candidate, source, where in ((Path("hosts.yaml"), FROM_CWD, "./hosts.yaml"),
                                     (config_dir() / "hosts.yaml", FROM_XDG, "the XDG config")):
        # a folder, FIFO or dangling link there is a user's mistake, not a reason to fall
        # through to the embedded lab file and its addresses
        if os.path.lexists(candidate):
            return _must_exist(candidate, where), source
    return embedded_hosts_file(), EMBEDDED


def find_hosts_file(cli_path: Path | None = None) -> Path:
    """The hosts file locate_hosts_file finds."""
    return locate_hosts_file(cli_path)[0]


def _must_exist(path: Path, given: str) -> Path:
    shown, given = _printable(str(path)), _printable(given)  # a line break forges a message
    if not path.exists():
        raise ConfigError(f"hosts file {shown} does not exist (from {given})")
    if not path.is_file():
        raise ConfigError(f"hosts file {shown} is not a file (from {given})")
    return path


def _printable(text: str) -> str:
    return text if text.isprintable() else repr(text)


def load_config(path: Path | str, *, text: str | None = None) -> Config:
    """Load and fully validate a hosts file; any problem raises one ConfigError listing all.

    With `text`, that text is validated as the file at `path` would be (relative paths
    from its folder, problems naming it): an edit checked before anything is written."""
    return _Loader(Path(path), text).run()


def _clone_path(host: str, venv: str) -> PathKey:
    return ("hosts", host, "venvs", venv, "create", "clone")


def _loc_order(loc: tuple[Any, ...]) -> list[tuple[int, int, str]]:
    return [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in loc]


def _drop(data: Any, loc: tuple[Any, ...]) -> bool:
    """Remove the value at ``loc`` from nested dicts and lists; False if it is not there."""
    for part in loc[:-1]:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return False
    try:
        del data[loc[-1]]
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _not_a_file(path: Path | None) -> str | None:
    """What ``path`` is when it exists and is not a regular file (a FIFO would block every
    SSH connection that reads it), else None."""
    if path is None:
        return None
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"


class _Loader:
    def __init__(self, path: Path, text: str | None = None) -> None:
        self.path = path
        self.file = str(path)
        self.doc: LoadedYaml = load_yaml_file(path) if text is None else \
            parse_yaml(text, self.file)
        self.problems: list[Problem] = list(self.doc.problems)
        self.declared: dict[str, set[str]] = {"hosts": set(), "deployments": set()}
        # Values dropped after a failed validation: checks about them would only echo the error.
        self.pruned: list[PathKey] = list(self.doc.unreadable)

    def add(self, path: PathKey, message: str) -> None:
        if any(path[: len(u)] == u for u in self.doc.unreadable):
            return  # the value was refused as it was read (a tag, a NUL): said once, there
        self.problems.append(Problem(self.doc.line_of(path), path, message))

    def run(self) -> Config:
        data = self.doc.data
        if data is None and not self.problems:
            raise ConfigError(
                f"{self.file}:1: the file is empty; expected a mapping with "
                "version: 1, hosts: and deployments:"
            )
        if data is not None and not isinstance(data, dict):
            raise ConfigError(
                f"{self.file}:{self.doc.line_of(())}: expected a mapping with version: 1, "
                f"hosts: and deployments: at the top level, got {describe(data)}"
            )
        data = data or {}
        self._top(data)
        hosts = self._section(data, "hosts", HostSpec, HOST_NAME_RE)
        deployments = self._section(data, "deployments", Deployment, HOST_NAME_RE)
        first_check = len(self.problems)
        for host in hosts.values():
            self._check_host(host, hosts)
        self._check_cycles(
            {n: h.jump for n, h in hosts.items()}, lambda n: ("hosts", n, "jump"), "jump"
        )
        for host in hosts.values():
            clones = {n: v.create.clone if v.create else None for n, v in host.venvs.items()}
            self._check_cycles(clones, partial(_clone_path, host.name), "clone")
        resolved = {n: self._check_deployment(d, hosts) for n, d in deployments.items()}
        self._check_clashes(resolved.values())
        self.problems[first_check:] = [
            p for p in self.problems[first_check:] if not self._about_pruned(p.path)
        ]
        if self.problems:
            unique = sorted(set(self.problems), key=lambda p: (p.line, str(p.path), p.message))
            raise ConfigError(render_problems(unique, self.file))
        return Config(self.path, hosts, resolved, self.doc.line_of)

    def _top(self, data: dict[Any, Any]) -> None:
        for key in data:
            if key not in TOP_KEYS:
                self.add((str(key),), f"unknown field; expected one of: {', '.join(TOP_KEYS)}")
        if "version" not in data:
            self.add((), "version: required field is missing (expected version: 1)")
        elif data["version"] != 1 or isinstance(data["version"], bool):
            self.add(("version",), f"expected 1, got {describe(data['version'])}")

    def _section(
        self, data: dict[Any, Any], section: str, model: type[Any], name_re: Any
    ) -> dict[str, Any]:
        raw = data.get(section)
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.add((section,), f"expected a mapping of names to entries, got {describe(raw)}")
            return {}
        out: dict[str, Any] = {}
        for name, entry in raw.items():
            where: PathKey = (section, path_part(name))
            if not isinstance(name, str) or not name_re.match(name):
                self.add(
                    where,
                    "expected a name of lowercase letters, digits, '.', '_' and "
                    f"'-', starting with a letter or digit, got {describe(name)}",
                )
                continue
            self.declared[section].add(name)
            if not isinstance(entry, dict):
                self.add(where, f"expected a mapping, got {describe(entry)}")
                continue
            if "name" in entry:
                self.add((*where, "name"), "unknown field: the name is the key above it")
                entry = {k: v for k, v in entry.items() if k != "name"}
            valid = self._validate(model, {**entry, "name": name}, where)
            if valid is not None:
                out[name] = valid
        return out

    def _validate(self, model: type[Any], entry: dict[Any, Any], where: PathKey) -> Any:
        """Validate one entry; on errors report them, drop the bad values and try once more,
        so that the rest of the entry can still be cross-checked (None if that fails too)."""
        context = {"base_dir": self.path.parent, "defer": True}  # rules: _check_deployment
        try:
            return model.model_validate(entry, context=context)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
        locs: list[tuple[Any, ...]] = []
        for err in errors:
            loc = tuple(p for p in err["loc"] if p != "[key]")
            self.add((*where, *loc), english(err, model))
            locs.append(loc)
        pruned = copy.deepcopy(entry)
        # Deepest and highest list index first, so earlier removals do not shift later ones.
        for loc in sorted(locs, key=_loc_order, reverse=True):
            if not loc or not _drop(pruned, loc):
                return None
            self.pruned.append((*where, *loc))
        try:
            return model.model_validate(pruned, context=context)
        except ValidationError:
            return None

    def _about_pruned(self, path: PathKey) -> bool:
        def under(a: PathKey, b: PathKey) -> bool:
            return a[: len(b)] == b

        return any(under(path, q) or under(q, path) for q in self.pruned)

    def _names(self, section: str) -> str:
        return ", ".join(sorted(self.declared[section])) or "none"

    def _check_host(self, host: HostSpec, hosts: dict[str, HostSpec]) -> None:
        where: PathKey = ("hosts", host.name)
        if host.is_local:
            for field in ("address", "ssh_alias", "jump"):
                if getattr(host, field) is not None:
                    self.add((*where, field), "not allowed with transport: local")
        elif host.address and host.ssh_alias:
            self.add((*where, "ssh_alias"), "expected address or ssh_alias, not both")
        elif not host.address and not host.ssh_alias:
            self.add(where, "expected an address or an ssh_alias (a Host of ~/.ssh/config)")
        if host.jump is not None and host.jump not in self.declared["hosts"]:
            self.add(
                (*where, "jump"),
                f"expected a host defined in this file ({self._names('hosts')}), got '{host.jump}'",
            )
        for field in ("identity_file", "known_hosts"):
            kind = _not_a_file(getattr(host, field))
            if kind is not None:
                self.add((*where, field), f"expected a regular file, got {kind} "
                         f"({getattr(host, field)}): reading it would hang or fail")
        seen_paths: dict[str, str] = {}
        for name, venv in host.venvs.items():
            vwhere: PathKey = (*where, "venvs", name)
            other = seen_paths.setdefault(str(venv.path), name)
            if other != name:
                self.add(
                    (*vwhere, "path"),
                    f"expected a path of its own, got {venv.path} (also venv '{other}')",
                )
            create = venv.create
            if create is None:
                continue
            if (create.clone is None) == (create.python is None):
                self.add((*vwhere, "create"), "expected exactly one of clone or python")
            elif create.clone is not None and create.clone not in host.venvs:
                self.add(
                    (*vwhere, "create", "clone"),
                    f"expected a venv of host {host.name} "
                    f"({', '.join(host.venvs)}), got '{create.clone}'",
                )

    def _check_cycles(
        self, edges: dict[str, str | None], where: Callable[[str], PathKey], what: str
    ) -> None:
        """Report each cycle of jump hosts (or venv clones) once, at its first member."""
        done: set[str] = set()
        for start in edges:
            chain: list[str] = []
            node: str | None = start
            while node is not None and node in edges and node not in done and node not in chain:
                chain.append(node)
                node = edges[node]
            if node is not None and node in chain:
                loop = " -> ".join([*chain[chain.index(node) :], node])
                self.add(where(node), f"expected no {what} cycle, got {loop}")
            done.update(chain)

    def _check_deployment(self, dep: Deployment, hosts: dict[str, HostSpec]) -> Deployment:
        where: PathKey = ("deployments", dep.name)
        for loc, message in dep.rule_problems():  # ServerSettings' rules between fields
            self.add((*where, *(path_part(p) if isinstance(p, str) else p for p in loc)),
                     message)
        if dep.host not in self.declared["hosts"] and dep.host != LOCALHOST:
            self.add(
                (*where, "host"),
                f"expected a host defined under hosts: ({self._names('hosts')}), got '{dep.host}'",
            )
            return dep
        if dep.host in self.declared["hosts"] and dep.host not in hosts:
            return dep  # the host itself is wrong (reported): its venvs cannot be checked
        host = hosts.get(dep.host) or local_host()
        if dep.venv not in host.venvs:
            self.add(
                (*where, "venv"),
                f"expected a venv of host {host.name} "
                f"({', '.join(host.venvs) or 'none declared'}), got '{dep.venv}'",
            )
        if host.gpus is not None and dep.gpu_indices is not None:
            last = dep.gpu_indices[-1]
            if last >= host.gpus.count:
                self.add(
                    (*where, "gpu"),
                    f"expected a GPU of host {host.name} "
                    f"(0-{host.gpus.count - 1}, tp_size {dep.tp_size}), got {dep.gpu}",
                )
        if dep.model_path is not None:
            return dep
        if host.default_model is None:
            self.add(
                (*where, "model_path"),
                f"required: host {host.name} has no models.default to fall back on",
            )
            return dep
        resolved = dep.model_copy(update={"model_path": host.default_model})
        resolved._raw = {**dep._raw, "model_path": host.raw("models.default") or ""}
        return resolved

    def _check_clashes(self, deployments: Iterable[Deployment]) -> None:
        """Two deployments on one host may not share a service name, a port or a GPU."""
        seen: dict[tuple[str, str, Any], Deployment] = {}
        for dep in deployments:
            keys: list[tuple[str, Any]] = [("service", dep.service_name)]
            if dep.port is not None:
                keys.append(("port", dep.port))
            keys += [("gpu", i) for i in dep.gpu_indices or ()]
            reported: set[str] = set()
            for field, value in keys:
                first = seen.setdefault((dep.host, field, value), dep)
                if first is dep or field in reported:
                    continue
                reported.add(field)
                line = self.doc.line_of(("deployments", first.name))
                self.add(
                    ("deployments", dep.name, field),
                    f"expected a {field} not used by another deployment on host {dep.host}, "
                    f"got {value} (used by {first.name}, line {line})",
                )
