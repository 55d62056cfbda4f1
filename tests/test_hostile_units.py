"""Hostile values in units and plain mode: what systemd runs is what plain mode runs.

Every case is data: a field of a service, the value a careless or hostile user gives it,
and either the refusal expected (exit 2, a fragment naming the field and the reason) or
None: the unit must then read, by systemd's own rules (tests/systemd_reading.py), as
exactly the argv, environment and folder the plain mode runs (`render.unit_command`).
The same values written into hosts.yaml are refused there, naming the file's field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import systemd_reading

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.errors import ConfigError, ExitCode
from ddtree_deploy.service.render import (
    UnitRenderError,
    WrapperSpec,
    render_unit,
    render_wrapper,
    unit_command,
    wrapper_command,
)
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.settings.model import ServerSettings

BASE = ServiceSpec(
    name="sglang-ddtree", host="localhost", venv="/opt/venv", gpus=(1,), port=30001,
    settings=ServerSettings.model_validate({
        "model_path": "/models/target", "draft_model_path": "/models/draft",
        "algorithm": "ddtree", "ddtree": {"budget": 15, "topk": 8}}),
    ld_library_path=("/opt/venv/lib",),
)
INJECT = "\nExecStart=/usr/bin/touch /tmp/pwned\n"

# (case id, field of ServiceSpec, value, refusal fragment or None: runs identically)
CASES: list[tuple[str, str, object, str | None]] = [
    ("venv-u2028-injects-execstart", "venv", "/opt/v\u2028ExecStart=/usr/bin/touch X", "U+2028"),
    ("venv-u2029", "venv", "/opt/v\u2029x", "U+2029"),
    ("venv-nel", "venv", "/opt/v\x85x", "U+0085"),
    ("model-nel", "model_path", "/models/a\x85b", "model path (model_path, --model-path)"),
    ("model-csi-c1", "model_path", "/models/\x9b31mred", "U+009B"),
    ("model-esc", "model_path", "/models/\x1b[31mred", "U+001B"),
    ("model-newline-injects", "model_path", "/models/m" + INJECT, "U+000A"),
    ("model-cr", "model_path", "/models/m\rExecStart=/bin/x", "U+000D"),
    ("model-vt", "model_path", "/models/m\x0bx", "U+000B"),
    ("model-ff", "model_path", "/models/m\x0cx", "U+000C"),
    ("model-fs-gs-rs", "model_path", "/models/m\x1c\x1d\x1ex", "U+001C"),
    ("model-nul", "model_path", "/models/m\x00x", "U+0000"),
    ("model-del", "model_path", "/models/m\x7fx", "U+007F"),
    ("model-bidi-override", "model_path", "/models/\u202egnp.exe", "U+202E"),
    ("model-lone-surrogate", "model_path", "/models/\udc80", "U+DC80"),
    ("draft-tab", "draft_model_path", "/models/d\tx", "draft model path (draft_model_path"),
    ("venv-dollar-name", "venv", "/opt/$HOME/venv", "contains $"),
    ("venv-dollar-brace", "venv", "/opt/${X}venv", "contains $"),
    ("venv-trailing-space", "venv", "/opt/venv ", "space"),
    ("venv-leading-space-inside", "venv", "/ opt/venv", None),
    ("venv-dotdot", "venv", "/opt/../venv", "'..'"),
    ("venv-quote", "venv", '/opt/ve"nv', "systemd refuses"),
    ("venv-backslash", "venv", "/opt/ve\\nv", "systemd refuses"),
    ("venv-relative", "venv", "opt/venv", "absolute"),
    ("venv-simplified", "venv", "/opt//v/./env/", None),
    ("venv-percent", "venv", "/opt/v%n", None),
    ("venv-space-inside", "venv", "/opt/my venv", None),
    ("venv-nbsp-end", "venv", "/opt/venv\xa0", None),
    ("model-dollar", "model_path", "/models/$HOME/${X}", None),
    ("model-percent", "model_path", "/models/%n%%", None),
    ("model-trailing-space", "model_path", "/models/m ", None),
    ("model-leading-space", "model_path", " /models/m", None),
    ("model-nbsp-ideographic-space", "model_path", "/models/\xa0m\u3000", None),
    ("model-quotes-backslash", "model_path", "/models/\"a'\\b", None),
    ("model-semicolon", "model_path", ";", None),
    ("model-hash", "model_path", "#/models/m", None),
    ("model-unicode", "model_path", "/models/Qwen3-\u00e9\u4e2d\U0001f600", None),
    ("extra-api-key", "extra_args", ("--api-key", "s3cret"), "--api-key would put a secret"),
    ("extra-api-key-eq", "extra_args", ("--api-key=s3cret",), "--api-key would put a secret"),
    ("extra-api-ke-abbrev", "extra_args", ("--api-ke", "s3cret"), "--api-ke (SGLang's argparse"),
    ("extra-api-abbrev-eq", "extra_args", ("--api=s3cret",), "reads it as --api-key"),
    ("extra-admin-abbrev", "extra_args", ("--admin-api", "s"), "reads it as --admin-api-key"),
    ("extra-admin-full", "extra_args", ("--admin-api-key=s",), "--admin-api-key would put"),
    ("extra-not-a-prefix", "extra_args", ("--api-keys-file", "/x"), None),
    ("extra-single-dash", "extra_args", ("-api-key",), None),
    ("extra-empty", "extra_args", ("",), "empty"),
    ("extra-newline", "extra_args", ("--x\n--api-key=s",), "extra_args[0]"),
    ("extra-odd-words", "extra_args", ('50% "q" $HOME ${X}', "back\\slash", "it's", ";"), None),
    ("env-value-nel", "environment", (("NCCL_X", "a\x85b"),), "U+0085"),
    ("env-value-u2028", "environment", (("NCCL_X", "a\u2028b"),), "U+2028"),
    ("env-value-odd", "environment", (("NCCL_X", 'a "b" 100% $x \\'),), None),
    ("env-secret-name", "environment", (("HF_TOKEN", "x"),), "looks like a secret"),
    ("env-tool-name", "environment", (("LD_LIBRARY_PATH", "/x"),), "set by the tool"),
    ("name-trailing-newline", "name", "sglang\n", "not valid"),
    ("ld-dir-nel", "ld_library_path", ("/opt/lib\x85",), "U+0085"),
    ("extra-huge", "extra_args", ("--x", "a" * 300_000), "longer than"),
]


def _spec(field: str, value: object) -> ServiceSpec:
    """BASE with one value changed; a server setting is changed WITHOUT validation, so that
    what render itself refuses stays under test (ServerSettings refuses these values first:
    tests/test_settings.py)."""
    if field in ServerSettings.model_fields:
        shaped = dict(value) if field == "environment" else (  # type: ignore[call-overload]
            list(value) if field == "extra_args" else value)  # type: ignore[call-overload]
        return dataclasses.replace(BASE, settings=BASE.settings.model_copy(
            update={field: shaped}))
    return dataclasses.replace(BASE, **{field: value})


@pytest.mark.parametrize(("case", "field", "value", "refusal"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_unit_runs_what_plain_mode_runs_or_is_refused(case: str, field: str, value: object,
                                                        refusal: str | None) -> None:
    spec = _spec(field, value)
    if refusal is not None:
        with pytest.raises(UnitRenderError) as info:
            unit_command(spec)
        assert info.value.exit_code == ExitCode.USAGE
        assert refusal in str(info.value), str(info.value)
        with pytest.raises(UnitRenderError):
            render_unit(spec, tool_version="0.0-test")
        return
    command = unit_command(spec)
    argv, env, cwd = systemd_reading.service(render_unit(spec, tool_version="0.0-test"))
    assert argv == command.argv
    assert env == dict(command.env)
    assert cwd == command.cwd
    assert command.argv[:3] == (spec.python, "-m", "sglang.launch_server")
    assert command.argv[3:] == tuple(spec.server_args())  # the values as given, nothing lost


def test_a_wrapper_runs_what_plain_mode_runs() -> None:
    spec = WrapperSpec(name="w", command=("/usr/bin/env", "a b", "$X", "%n", "\xa0"),
                       gpus=(0, 3), workdir="/tmp//x/", env={"MY_VAR": 'a "b" 100%'})
    command = wrapper_command(spec)
    assert systemd_reading.service(render_wrapper(spec, "0.0-test")) == (
        command.argv, dict(command.env), command.cwd)
    assert command.cwd == "/tmp/x"
    with pytest.raises(UnitRenderError, match="U\\+2028"):
        wrapper_command(dataclasses.replace(spec, command=("/bin/x\u2028y",)))


def test_the_oracle_reads_lines_as_systemd_does() -> None:
    """The reader itself: U+2028 and NEL do not end a line for systemd; CR and NUL do."""
    unit = "[Service]\nExecStart=/bin/a \"x\u2028y\"\x85\rEnvironment=A=1\0WorkingDirectory=/t\n"
    argv, env, cwd = systemd_reading.service(unit)
    assert argv == ("/bin/a", "x\u2028y\x85")
    assert env == {"A": "1"} and cwd == "/t"


HOSTS = """\
version: 1
hosts:
  gpu:
    address: 10.0.0.2
    venvs:
      serve: {{path: {venv}, role: serving}}
    models:
      default: /models/m
deployments:
  {name}:
    host: gpu
    venv: serve
    cuda_lane: cu130
    sglang: {{version: 0.5.11}}
    model_path: {model}
    extra_args: {extra}
    environment: {{NCCL_X: {env}}}
"""
GOOD = {"name": "svc", "venv": '"/opt/venv"', "model": '"/models/m"', "extra": "[]",
        "env": '"1"'}

# (case id, placeholder, YAML text of the value, fragment of the refusal)
CONFIG_CASES: list[tuple[str, str, str, str]] = [
    ("venv-u2028", "venv", '"/opt/v\\LExecStart=/usr/bin/touch X"', "hosts.gpu.venvs.serve.path"),
    ("venv-nel", "venv", '"/opt/v\\Nx"', "U+0085"),
    ("model-nel", "model", '"/models/a\\Nb"', "deployments.svc.model_path"),
    ("model-c1", "model", '"/models/\\x9b31m"', "U+009B"),
    ("model-bidi", "model", '"/models/\\u202Ex"', "U+202E"),
    ("model-u2029", "model", '"/models/\\Px"', "U+2029"),
    ("extra-api-ke", "extra", '["--api-ke", "s"]', "deployments.svc.extra_args[0]"),
    ("extra-api-key-eq", "extra", '["--api-key=s"]', "--api-key would put a secret"),
    ("extra-admin", "extra", '["--admin-api=s"]', "reads it as --admin-api-key"),
    ("extra-nel", "extra", '["--x\\N"]', "U+0085"),
    ("extra-empty", "extra", '[""]', "non-empty argument"),
    ("env-nel", "env", '"a\\Nb"', "deployments.svc.environment.NCCL_X"),
    ("env-u2028", "env", '"a\\Lb"', "U+2028"),
    ("name-trailing-newline", "name", '"svc\\n"', "expected a name"),
]


@pytest.mark.parametrize(("case", "slot", "text", "fragment"), CONFIG_CASES,
                         ids=[c[0] for c in CONFIG_CASES])
def test_hosts_yaml_refuses_what_a_unit_cannot_carry(tmp_path: Path, case: str, slot: str,
                                                     text: str, fragment: str) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS.format(**{**GOOD, slot: text}), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.exit_code == ExitCode.USAGE
    assert str(path) in str(info.value)
    assert fragment in str(info.value), str(info.value)


def test_the_good_hosts_yaml_of_the_table_loads(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS.format(**GOOD), encoding="utf-8")
    assert load_config(path).deployment("svc").extra_args == []


def test_a_refused_secret_is_not_repeated_in_the_message(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS.format(**{**GOOD, "extra": '["--api-key=hunter2"]'}), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "--api-key would put a secret" in str(info.value)
    assert "hunter2" not in str(info.value)


# Every name and path pattern of the tool, with a final newline appended to a valid value:
# `$` matches before it, `\Z` does not (module, pattern attribute, a valid value).
PATTERNS: list[tuple[str, str, str]] = [
    ("ddtree_deploy.config.schema", "HOST_NAME_RE", "ct200"),
    ("ddtree_deploy.config.schema", "ITEM_NAME_RE", "serve"),
    ("ddtree_deploy.config.schema", "UNIT_STEM_RE", "sglang-ddtree"),
    ("ddtree_deploy.settings.values", "ENV_NAME_RE", "NCCL_X"),
    ("ddtree_deploy.overlay.lanefile", "LANE_NAME_RE", "cu130"),
    ("ddtree_deploy.overlay.lanefile", "MODULE_RE", "torch.cuda"),
    ("ddtree_deploy.payload.manifest", "NAME", "ddtree"),
    ("ddtree_deploy.payload.manifest", "SHA256", "0" * 64),
    ("ddtree_deploy.service.install", "UNIT_NAME", "sglang.service"),
    ("ddtree_deploy.remote.payload_fs", "NAME", "x.whl"),
    ("ddtree_deploy.remote.payload_fs", "PACKAGE", "sglang"),
    ("ddtree_deploy.remote.payload_fs", "REL", "srt/x.py"),
    ("ddtree_deploy.bench.grid", "_NAME", "fast"),
]


@pytest.mark.parametrize(("module", "attr", "valid"), PATTERNS,
                         ids=[f"{m.rsplit('.', 1)[1]}.{a}" for m, a, _ in PATTERNS])
def test_no_name_pattern_accepts_a_final_newline(module: str, attr: str, valid: str) -> None:
    import importlib

    pattern = getattr(importlib.import_module(module), attr)
    assert pattern.match(valid)
    assert not pattern.match(valid + "\n")
