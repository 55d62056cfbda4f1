"""The endpoint (issue 30, item 6): bind, service user, and secrets that never show.

Unit: the unit renders `--host` from `bind:` (0.0.0.0 by default, and plan says what that
means), `User=` from `user:`, the API key as `--config FILE` run through the launcher and
HF_TOKEN as an EnvironmentFile=; no secret value reaches the spec, the unit or plan. A secret
file that is missing or not one line is refused without its content.

Integration: the secret files are written through the local transport with mode 0600, then
the unit's own command runs as a plain process (as on the H200 host) in a venv whose `sglang`
is a small stand-in shaped like SGLang's start-up: it reads --config, builds a ServerArgs
dataclass and logs `server_args=...` as sglang/srt/entrypoints/engine.py does. The key is in
neither /proc/PID/cmdline nor the log (the launcher shows it as '<hidden>'); HF_TOKEN reaches
the process's environment.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from test_converge_plan import facts

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.converge import hoststate
from ddtree_deploy.converge.hoststate import HostState
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.converge.steps import step_kind
from ddtree_deploy.converge.steps.unit_install import unit_text
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.remote import facts as remote_facts
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.service import endpoint
from ddtree_deploy.service.plainproc import start, stop
from ddtree_deploy.service.render import render_unit, unit_command
from ddtree_deploy.service.resolve import build_spec
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.settings.model import ServerSettings
from ddtree_deploy.transport.base import ExecTransport, RawOutcome
from ddtree_deploy.transport.local import LocalTransport

KEY = "sk-operator-test-3f1c9a"  # a made-up key: the assertions look for it everywhere
TOKEN = "hf_operatorTestToken42"
EXTRA = """    bind: 127.0.0.1
    user: sglang
    api_key_file: {key}
    hf_token_file: {token}
"""


def hosts_file(tmp_path: Path, endpoint_fields: bool) -> Path:
    text = embedded_hosts_file().read_text()
    anchor = "    mem_fraction_static: 0.85\n"
    assert anchor in text
    (tmp_path / "key").write_text(KEY + "\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    if endpoint_fields:
        text = text.replace(anchor, anchor + EXTRA.format(key=tmp_path / "key",
                                                          token=tmp_path / "token"))
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def spec_of(tmp_path: Path, endpoint_fields: bool) -> tuple[ServiceSpec, str]:
    config = load_config(hosts_file(tmp_path, endpoint_fields))
    spec = build_spec(config, config.host("ct200"), facts(True),
                      config.deployment("sglang-ddtree"))
    return spec, render_unit(spec, tool_version="0")


def test_default_binds_every_interface_and_plan_says_so(tmp_path: Path) -> None:
    spec, unit = spec_of(tmp_path, False)
    assert "--host 0.0.0.0" in unit and "User=" not in unit and "EnvironmentFile" not in unit
    assert " -m sglang.launch_server" in unit and "--config" not in unit
    config = load_config(hosts_file(tmp_path, False))
    steps = plan_host(config, config.host("ct200"), facts(True), HostState())
    (install,) = [s for s in steps if s.kind == "unit.install"]
    assert "listens on 0.0.0.0:30001 (every interface, no API key" in install.changes[0]


def test_bind_user_and_secrets_render_without_a_secret(tmp_path: Path) -> None:
    spec, unit = spec_of(tmp_path, True)
    stem = spec.name
    assert spec.bind_host == "127.0.0.1" and spec.user == "sglang"
    assert "--host 127.0.0.1" in unit and "\nUser=sglang\n" in unit
    assert f"\nEnvironmentFile={endpoint.env_file(stem)}\n" in unit
    assert f"--config {endpoint.config_file(stem)}" in unit
    assert f"ExecStart={spec.python} {endpoint.launcher(stem)}" in unit
    for text in (unit, repr(spec), str(unit_command(spec).as_json())):
        assert KEY not in text and TOKEN not in text
    config = load_config(hosts_file(tmp_path, True))
    steps = plan_host(config, config.host("ct200"), facts(True), HostState())
    assert not any(KEY in str(s.as_json()) or TOKEN in str(s.as_json()) for s in steps)
    (install,) = [s for s in steps if s.kind == "unit.install"]
    assert "listens on 127.0.0.1:30001" in install.changes[0]


def test_a_changed_secret_file_restarts_the_service_by_a_root_only_digest(
        tmp_path: Path) -> None:
    """Changing only a key or token file (issue 30's debt): plan compares the digest of the
    workstation's files with the one kept root-only next to the host's secret files, so
    apply installs the new files and restarts; the unit stays the same."""
    config = load_config(hosts_file(tmp_path, True))
    host, dep = config.host("ct200"), config.deployment("sglang-ddtree")
    spec = build_spec(config, host, facts(True), dep)
    unit = unit_text(spec)

    def digest() -> str | None:
        return endpoint.secrets_digest(endpoint.read_secrets(
            dep.api_key_file, dep.hf_token_file, dep.name), spec.name)

    def install_step(state: HostState) -> Any:
        steps = plan_host(config, host, facts(True), state)
        return next(s for s in steps if s.kind == "unit.install")

    installed = HostState(units={dep.unit_name: unit}, secrets={spec.name: str(digest())})
    assert install_step(installed).satisfied
    first = install_step(HostState(units={dep.unit_name: unit}))  # none on the host yet
    assert not first.satisfied and first.reason == "no secret files installed"
    for name, value in (("key", "sk-rotated-key-77"), ("token", "hf_rotatedToken99")):
        (tmp_path / name).write_text(value + "\n")
        step = install_step(installed)
        assert not step.satisfied and step.reason == "the secret files differ"
        assert any("secret files" in c for c in step.changes)
        assert step_kind(step.kind).marks_restart
        assert value not in str(step.as_json()) and KEY not in str(step.as_json())
        assert unit_text(build_spec(config, host, facts(True), dep)) == unit
        installed = HostState(units={dep.unit_name: unit}, secrets={spec.name: str(digest())})
        assert install_step(installed).satisfied
    secrets = endpoint.read_secrets(tmp_path / "key", tmp_path / "token", "d")
    assert not endpoint.secrets_match(secrets, "b", endpoint.secrets_digest(secrets, "a"))
    assert endpoint.secrets_digest(endpoint.Secrets(), "a") is None


def test_the_secrets_digest_is_salted_scrypt(tmp_path: Path) -> None:
    """The root-only digest costs scrypt's work per guess of a key (before: one SHA-256 over
    the public service name and the secrets, quick to brute-force from a leaked copy): a
    random salt per install, kept in the file; the workstation recomputes with it."""
    (tmp_path / "key").write_text(KEY + "\n")
    secrets = endpoint.read_secrets(tmp_path / "key", None, "d")
    stored = endpoint.secrets_digest(secrets, "svc")
    assert stored is not None
    kind, salt_hex, hashed = stored.split("$")
    assert kind == "scrypt" and len(bytes.fromhex(salt_hex)) == 16
    assert hashed == hashlib.scrypt(json.dumps(["svc", KEY, None]).encode(),
                                    salt=bytes.fromhex(salt_hex), n=1 << 14, r=8, p=1,
                                    dklen=32).hex()
    again = endpoint.secrets_digest(secrets, "svc")
    assert again != stored  # a fresh salt each install
    assert endpoint.secrets_match(secrets, "svc", stored)
    assert endpoint.secrets_match(secrets, "svc", again)
    (tmp_path / "key").write_text("sk-another-key-0001\n")
    other = endpoint.read_secrets(tmp_path / "key", None, "d")
    assert not endpoint.secrets_match(other, "svc", stored)
    sha = "sha256:" + hashlib.sha256(json.dumps(["svc", KEY, None]).encode()).hexdigest()
    for bad in (sha, None, "scrypt$$", "scrypt$zz$00", stored.replace("scrypt", "md5")):
        assert not endpoint.secrets_match(secrets, "svc", bad)
    assert endpoint.secrets_match(endpoint.Secrets(), "svc", None)
    assert not endpoint.secrets_match(endpoint.Secrets(), "svc", stored)


def test_the_unit_carries_nothing_derived_from_a_secret(tmp_path: Path) -> None:
    """The unit is world-readable: two keys give the same unit text (before the fix it
    carried a PBKDF2 digest salted by the public service name: brute-forceable offline)."""
    spec, unit = spec_of(tmp_path, True)
    (tmp_path / "key").write_text("sk-another-key-0001\n")
    config = load_config(tmp_path / "hosts.yaml")
    other = render_unit(build_spec(config, config.host("ct200"), facts(True),
                                   config.deployment("sglang-ddtree")), tool_version="0")
    assert other == unit and "X-DDTreeDeploy-Secrets" not in unit


def test_an_unreadable_secret_file_is_the_install_steps_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """plan still plans (the other steps, and this one pending with the file and the reason);
    apply's unit.install fails with them before it touches the host; `service render`
    refuses with exit 2 (converge/steps/unit_install.py, cli/service.py)."""
    from ddtree_deploy.cli import app
    from ddtree_deploy.converge.steps.unit_install import install_unit

    config = load_config(hosts_file(tmp_path, True))
    host, dep = config.host("ct200"), config.deployment("sglang-ddtree")
    spec = build_spec(config, host, facts(True), dep)
    (tmp_path / "key").unlink()
    steps = plan_host(config, host, facts(True), HostState(units={dep.unit_name: unit_text(spec)}))
    (step,) = [s for s in steps if s.kind == "unit.install"]
    assert not step.satisfied
    assert step.reason.startswith(f"deployments.sglang-ddtree.api_key_file: cannot read the "
                                  f"API key from {tmp_path / 'key'}")
    with pytest.raises(ConfigError, match="api_key_file: cannot read"):
        install_unit(None, spec, dep)  # type: ignore[arg-type]  # raises before any use
    monkeypatch.setattr("ddtree_deploy.cli.service._facts", lambda *a, **k: pytest.fail(
        "render reached the host"))
    with pytest.raises(SystemExit) as done:
        app.main(["--hosts", str(tmp_path / "hosts.yaml"), "service", "render", "ct200",
                  "sglang-ddtree", "--no-verify"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "api_key_file: cannot read the API key" in err, err
    assert "Traceback" not in err


class _Recording(ExecTransport):
    """A host that records every script it is sent (and answers each with success)."""

    host = "ct200"

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def _exec(self, script: str, *, stdin: Any, stdout: Any, deadline: float | None,
              live: Any = None) -> RawOutcome:
        self.scripts.append(script)
        return RawOutcome(0, b"", b"", 0.0)

    def _is_root(self) -> bool:
        return True


def test_an_unreadable_secret_file_fails_apply_before_the_restart_is_marked(
        tmp_path: Path) -> None:
    """apply's unit.install with the key file gone fails before anything reaches the host:
    before the fix the runner first marked the restart pending (a root-owned file), so once
    the same key was readable again service.start restarted a healthy service for nothing."""
    from ddtree_deploy.converge import runner
    from ddtree_deploy.converge.steps import Acting, LiveFacts

    config = load_config(hosts_file(tmp_path, True))
    host = config.host("ct200")
    (tmp_path / "key").unlink()
    steps = plan_host(config, host, facts(True), HostState())
    (step,) = [s for s in steps if s.kind == "unit.install"]
    t = _Recording()
    live = LiveFacts(config, host, t)
    live._facts = facts(True)  # the facts apply already holds: no gather on the host
    with pytest.raises(ConfigError, match="api_key_file: cannot read"):
        runner._act(Acting(config, host, t, live), step)
    assert t.scripts == []


def test_a_bad_secret_file_is_refused_without_its_content(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api_key_file: cannot read"):
        endpoint.read_secrets(tmp_path / "nope", None, "d")
    two = tmp_path / "two"
    two.write_text(f"{KEY}\nsecond line\n")
    with pytest.raises(ConfigError) as refused:
        endpoint.read_secrets(two, None, "d")
    assert KEY not in str(refused.value) and "one line" in str(refused.value)
    one = tmp_path / "one"
    one.write_text(f"  {KEY}  \n")
    secrets = endpoint.read_secrets(one, None, "d")
    assert secrets.api_key == KEY and repr(secrets) == "Secrets(api_key)"  # never the value


# A stand-in of SGLang's start-up, shaped as 0.5.11's: `--config FILE` merged into argv
# (server_args_config_parser.py: `key: value` lines become `--key value`), a ServerArgs
# dataclass with api_key, and `logger.info(f"{server_args=}")` (entrypoints/engine.py).
SERVER_ARGS = textwrap.dedent('''
    import dataclasses
    from typing import Optional

    @dataclasses.dataclass
    class ServerArgs:
        model_path: str
        host: str = "127.0.0.1"
        port: int = 30000
        api_key: Optional[str] = None
''')
LAUNCH = textwrap.dedent('''
    import json, logging, os, sys, time
    from sglang.srt.server_args import ServerArgs

    def merged(argv):
        if "--config" not in argv:
            return argv
        i = argv.index("--config")
        extra = []
        for line in open(argv[i + 1], encoding="utf-8"):
            key, _, value = line.partition(":")
            extra += ["--" + key.strip(), json.loads(value.strip())]
        return extra + argv[:i] + argv[i + 2:]

    args = merged(sys.argv[1:])
    values = dict(zip(args[::2], args[1::2]))
    server_args = ServerArgs(model_path=values["--model-path"], host=values["--host"],
                             port=int(values["--port"]), api_key=values.get("--api-key"))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("engine").info(f"{server_args=}")
    print("HF_TOKEN sha256", __import__("hashlib").sha256(
        os.environ.get("HF_TOKEN", "").encode()).hexdigest(), flush=True)
    print("ready", flush=True)
    while True:
        time.sleep(1)
''')


def standin_venv(root: Path) -> Path:
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "server_args.py").write_text(SERVER_ARGS)
    (site / "sglang" / "launch_server.py").write_text(LAUNCH)
    return venv


@pytest.mark.integration
def test_secrets_stay_out_of_argv_and_the_log(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint, "ROOT", str(tmp_path / "services"))
    venv = standin_venv(tmp_path)
    settings = ServerSettings.model_validate({"model_path": "/models/m"})
    spec = ServiceSpec(name="sglang-keyed", host="localhost", venv=str(venv), gpus=(0,),
                       port=30111, settings=settings, bind_host="127.0.0.1",
                       secrets=("api_key", "hf_token"))
    with LocalTransport() as t:
        endpoint.install_secrets(t, spec.name, endpoint.Secrets(KEY, TOKEN), None)
    for path in (endpoint.config_file(spec.name), endpoint.env_file(spec.name),
                 endpoint.digest_file(spec.name)):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    want = Path(endpoint.digest_file(spec.name)).read_text().strip()
    assert endpoint.secrets_match(endpoint.Secrets(KEY, TOKEN), spec.name, want)
    with LocalTransport() as t:  # plan's sudo read of the host state finds the digest
        assert hoststate.read(t, []).secrets == {spec.name: want}
    monkeypatch.setattr(remote_facts, "SERVICES_DIR", endpoint.ROOT)  # and so does the probe
    assert remote_facts.tool_state()["secrets_digests"] == {spec.name: want}
    Path(endpoint.folder("other"), endpoint.DIGEST_NAME).mkdir(parents=True)  # unreadable
    state = remote_facts.tool_state()  # as a probe that is not root: sudo reads it later
    assert state["secrets_unread"] == ["other"] and state["error"] is None
    cmd = unit_command(spec)
    log = tmp_path / "server.log"
    pid = start(cmd, str(log), base_env={"PATH": os.environ["PATH"]})
    try:
        for _ in range(600):
            if "ready" in log.read_text():
                break
            time.sleep(0.05)
        text = log.read_text()
        assert "ready" in text, text
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert "--config" in cmdline and not any(KEY in a for a in cmdline), cmdline
        assert KEY not in text and "api_key='<hidden>'" in text, text
        assert hashlib.sha256(TOKEN.encode()).hexdigest() in text  # HF_TOKEN reached it
        assert TOKEN not in text
    finally:
        stop(pid, timeout=10)
    with LocalTransport() as t:  # no secrets wanted any more: the folder goes
        endpoint.install_secrets(t, spec.name, endpoint.Secrets(), None)
    assert not Path(endpoint.folder(spec.name)).exists()


@pytest.mark.integration
def test_the_secrets_digest_read_from_the_host_is_never_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan reads each service's digest from its host: with sudo (hoststate) or in the facts
    probe's answer. apply -v/-vv shows every command and, at -vv, each line it prints; an
    error carries a failed command's output. The digest (nor its salt or hash, nor the first
    tool's SHA-256 form) is in none of it, yet plan reads it whole."""
    from rich.console import Console

    from ddtree_deploy.cli.applyview import ApplyView
    from ddtree_deploy.errors import RemoteCommandError, output_of
    from ddtree_deploy.transport import Command

    monkeypatch.setattr(endpoint, "ROOT", str(tmp_path / "services"))
    monkeypatch.setattr(remote_facts, "SERVICES_DIR", endpoint.ROOT)
    with LocalTransport() as t:
        endpoint.install_secrets(t, "sglang-keyed", endpoint.Secrets(KEY, TOKEN), None)
    want = Path(endpoint.digest_file("sglang-keyed")).read_text().strip()
    _, salt, hashed = want.split("$")
    legacy = hashlib.sha256(f"{KEY}{TOKEN}".encode()).hexdigest()  # the first tool's form
    Path(endpoint.folder("sglang-old")).mkdir()
    Path(endpoint.digest_file("sglang-old")).write_text(legacy + "\n")
    buf = io.StringIO()
    view = ApplyView(Console(file=buf, force_terminal=False, width=200), verbose=2,
                     terminal=False)
    seen: list[str] = []
    t = LocalTransport("ct200")
    t.listeners = view.listeners("ct200")
    t.observers = (view.observer("ct200"), lambda *said: seen.append(repr(said)))
    state = hoststate.read(t, [])  # plan's sudo read
    probe = t.run(Command.of(sys.executable, "-c", "import json, sys; sys.path[:0] = sys.argv[1:2];"
                             "from ddtree_deploy.remote import facts; facts.SERVICES_DIR = "
                             "sys.argv[2]; print(json.dumps(facts.tool_state()))",
                             str(Path(__file__).resolve().parents[1]), endpoint.ROOT))
    failed = t.run(Command.shell('cat "$1" >&2; exit 3', endpoint.digest_file("sglang-keyed")))
    with pytest.raises(RemoteCommandError) as error:
        failed.check()
    assert state.secrets == {"sglang-keyed": want, "sglang-old": "other"}
    assert json.loads(probe.stdout)["secrets_digests"] == state.secrets
    assert not endpoint.secrets_match(endpoint.Secrets(KEY, TOKEN), "sglang-old", "other")
    shown = buf.getvalue()
    assert "@secrets" in shown and '"secrets_digests"' in shown  # -vv showed both answers
    everything = shown + "".join(seen) + str(error.value) + output_of(error.value)
    for value in (want, salt, hashed, legacy, KEY, TOKEN):
        assert value not in everything
    assert "sglang-keyed ***" in shown and '"sglang-keyed": "***"' in shown


def test_the_probe_reads_where_the_unit_listens_and_its_key_file(tmp_path: Path) -> None:
    """The probe asks the bound address (loopback for 0.0.0.0) and sends the key it reads on
    the host from the unit's --config file: no key on the workstation."""
    from ddtree_deploy.converge.steps.service_probe import target_of

    spec, unit = spec_of(tmp_path, True)
    keyed = target_of(unit, spec.unit_name, "ct200")
    assert keyed is not None and keyed.addr == "127.0.0.1"
    assert keyed.key_file == endpoint.config_file(spec.name)
    spec, unit = spec_of(tmp_path, False)
    plain = target_of(unit.replace("--host 0.0.0.0", "--host 10.1.2.3"), spec.unit_name, "h")
    assert plain is not None and plain.addr == "10.1.2.3" and plain.key_file is None


def test_a_spec_probe_target_carries_the_bound_address_and_key_file(tmp_path: Path) -> None:
    """apply's, service up's and bench's probes (ProbeTarget.from_spec) as target_of's."""
    from ddtree_deploy.health import ProbeTarget

    spec, _ = spec_of(tmp_path, True)
    target = ProbeTarget.from_spec(spec)
    assert target.addr == "127.0.0.1" and target.key_file == endpoint.config_file(spec.name)
    spec, _ = spec_of(tmp_path, False)
    assert ProbeTarget.from_spec(spec).key_file is None


def test_doctor_asks_for_pyyaml_when_the_key_goes_through_config(tmp_path: Path) -> None:
    """SGLang reads --config with PyYAML (server_args_config_parser.py imports yaml)."""
    from test_rules import ct200, models, venv_healthy

    from ddtree_deploy.rules import diagnose

    config = load_config(hosts_file(tmp_path, True))
    dep = config.deployment("sglang-ddtree")
    venv = venv_healthy()
    found = diagnose(ct200(venv), venv=venv.path, deployment=dep, model_facts=models())
    (yaml,) = [f for f in found if f.id == "deploy.config-needs-yaml"]
    assert yaml.severity == "error" and "pyyaml" in yaml.remedy
    with_yaml = venv.model_copy(update={"distributions": {**venv.distributions,
                                                          "PyYAML": "6.0.2"}})
    ids = [f.id for f in diagnose(ct200(with_yaml), venv=venv.path, deployment=dep,
                                  model_facts=models())]
    assert "deploy.config-needs-yaml" not in ids and "deploy.open-endpoint" not in ids
