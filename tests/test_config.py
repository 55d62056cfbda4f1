"""hosts.yaml: schema, line-numbered problems, discovery, path expansion, implicit localhost."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.config.hosts import Config, find_hosts_file, load_config
from ddtree_deploy.config.schema import expand_vars
from ddtree_deploy.errors import ConfigError, ExitCode
from ddtree_deploy.resources import embedded_hosts_file

DATA = Path(__file__).parent / "data"
BAD = DATA / "hosts_bad"
GOOD = DATA / "hosts_good"
ROOT = Path(__file__).resolve().parent.parent

# file -> every line of the ConfigError, after "<file>:"
EXPECTED: dict[str, list[str]] = {
    "wrong_types.yaml": [
        "6: hosts.ct200.port: expected an integer, got '22'",
        "7: hosts.ct200.connect_timeout: expected a number, got 'abc'",
        "8: hosts.ct200.gpus: expected a mapping, got a list",
        "10: deployments.svc.model_path: required: host ct200 has no models.default to fall "
        "back on",
        "12: deployments.svc.venv: expected a venv of host ct200 (none declared), got 'v'",
        "15: deployments.svc.payload: expected true or false, got 'yes'",
        "16: deployments.svc.tp_size: expected an integer, got 1.5",
    ],
    "unknown_field.yaml": [
        "6: hosts.ct200.portt: unknown field (did you mean 'port'?)",
        "11: hosts.ct200.venvs.v.colour: unknown field; expected one of: path, role, create, "
        "allow_writes",
    ],
    "unknown_top_key.yaml": [
        "3: deployment: unknown field; expected one of: version, hosts, deployments",
    ],
    "duplicate_host.yaml": ["7: hosts.ct200: duplicate key 'ct200' (first given on line 3)"],
    "duplicate_nested_key.yaml": [
        "9: hosts.ct200.venvs.v.path: duplicate key 'path' (first given on line 7)",
    ],
    "unknown_host.yaml": [
        "10: deployments.svc.host: expected a host defined under hosts: (ct200), got 'ct300'",
    ],
    "unknown_venv.yaml": [
        "11: deployments.svc.venv: expected a venv of host ct200 (venv), got 'venv_sglang211'",
    ],
    "empty.yaml": [
        "1: the file is empty; expected a mapping with version: 1, hosts: and deployments:",
    ],
    "list.yaml": [
        "1: expected a mapping with version: 1, hosts: and deployments: at the top level, "
        "got a list",
    ],
    "scalar.yaml": [
        "1: expected a mapping with version: 1, hosts: and deployments: at the top level, "
        "got 'just some text'",
    ],
    "port_range.yaml": ["7: hosts.ct200.port: must be 1-65535, got 70000"],
    "bad_cuda_lane.yaml": [
        "12: deployments.svc.cuda_lane: expected 'cu128' or 'cu130', got 'cu126'",
    ],
    "ddtree_with_dflash.yaml": [
        "16: deployments.svc.ddtree: only allowed with algorithm: ddtree, got algorithm: dflash",
    ],
    "ddtree_missing_block.yaml": [
        "9: deployments.svc.draft_model_path: required with algorithm ddtree (the draft model)",
        "14: deployments.svc.algorithm: ddtree needs a ddtree: block with budget and topk",
    ],
    "relative_venv.yaml": [
        "7: hosts.ct200.venvs.rel.path: expected an absolute path on the host, got 'root/venv'",
        "10: hosts.ct200.venvs.home.path: expected an absolute path on the host "
        "('~' is not expanded for paths on a host), got '~/venv'",
    ],
    "jump_cycle.yaml": [
        "5: hosts.a.jump: expected no jump cycle, got a -> b -> c -> a",
        "14: hosts.d.jump: expected no jump cycle, got d -> d",
        "17: hosts.e.jump: expected a host defined in this file (a, b, c, d, e), got 'nowhere'",
    ],
    "duplicate_port.yaml": [
        "20: deployments.second.port: expected a port not used by another deployment on host "
        "ct200, got 30001 (used by first, line 9)",
    ],
    "duplicate_gpu_service.yaml": [
        "19: deployments.second.service: expected a service not used by another deployment on "
        "host ct200, got first (used by first, line 11)",
        "24: deployments.second.gpu: expected a gpu not used by another deployment on host "
        "ct200, got 2 (used by first, line 11)",
    ],
    "clone_problems.yaml": [
        "6: hosts.ct200.venvs.a.create.clone: expected no clone cycle, got a -> b -> a",
        "8: hosts.ct200.venvs.c.create.clone: expected a venv of host ct200 (a, b, c, d, e, f), "
        "got 'missing'",
        "9: hosts.ct200.venvs.d.create: expected exactly one of clone or python",
        '10: hosts.ct200.venvs.e.create.python: expected a Python version such as "3.11" in '
        "quotes (YAML reads this as a number), got 3.11",
        "11: hosts.ct200.venvs.f.path: expected a path of its own, got /root/a (also venv 'a')",
    ],
    "address_alias.yaml": [
        "5: hosts.both.ssh_alias: expected address or ssh_alias, not both",
        "6: hosts.neither: expected an address or an ssh_alias (a Host of ~/.ssh/config)",
        "9: hosts.badaddr.address: expected a hostname or an IP address, got 'not a host!'",
        "10: hosts.Upper: expected a name of lowercase letters, digits, '.', '_' and '-', "
        "starting with a letter or digit, got 'Upper'",
    ],
    "sglang_values.yaml": [
        "13: deployments.svc.sglang.version: expected a version in quotes (YAML reads this as "
        "a number), got 0.5",
        "16: deployments.svc.sglang.extra_packages[1]: expected a PEP 508 requirement such as "
        "'soundfile==0.13.1', got 'flashinfer-python>=>0.6'",
        "17: deployments.svc.attention_backend: expected 'triton', 'torch_native', "
        "'flex_attention', 'nsa', 'cutlass_mla', 'fa3', 'fa4', 'flashinfer', 'flashmla', "
        "'trtllm_mla', 'trtllm_mha', 'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx', "
        "'ascend' or 'intel_xpu', got 'flashattn'",
        "18: deployments.svc.grammar_backend: expected 'xgrammar', 'outlines', 'llguidance' or "
        "'none', got 'outlines2'",
        "19: deployments.svc.mem_fraction_static: must be between 0 and 1 (exclusive), got 1.2",
        "20: deployments.svc.extra_args[1]: expected an argument in quotes (YAML reads this "
        "as a number), got 1",
        "21: deployments.BadName: expected a name of lowercase letters, digits, '.', '_' and "
        "'-', starting with a letter or digit, got 'BadName'",
    ],
    "model_and_gpu.yaml": [
        "9: deployments.svc.draft_model_path: required with algorithm dflash (the draft model)",
        "9: deployments.svc.model_path: required: host ct129 has no models.default to fall back on",
        "14: deployments.svc.gpu: expected a GPU of host ct129 (0-1, tp_size 2), got 1",
        "17: deployments.svc.service: expected the unit name without '.service', got 'svc.service'",
    ],
    "unset_env.yaml": [
        "5: hosts.ct200.identity_file: environment variable DDTREE_TEST_SURELY_UNSET is not "
        "set (write ${DDTREE_TEST_SURELY_UNSET:-default} to give a default), "
        "got '${DDTREE_TEST_SURELY_UNSET}/id_ed25519'",
        "6: hosts.ct200.known_hosts: bad variable reference '${broken': use ${NAME} or "
        "${NAME:-default}, got '$${broken'",
    ],
    "version_wrong.yaml": [
        "1: version: expected 1, got 2",
        "2: hosts: expected a mapping of names to entries, got a list",
    ],
    "localhost_no_venv.yaml": [
        "7: deployments.local.venv: expected a venv of host localhost (none declared), "
        "got 'ml-env'",
    ],
}


def _error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


def test_every_bad_file_has_expectations() -> None:
    on_disk = {p.name for p in BAD.glob("*.yaml")} - {"syntax_error.yaml"}
    assert on_disk == set(EXPECTED)
    assert len(on_disk) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_file_reports_every_problem_by_line(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDTREE_TEST_SURELY_UNSET", raising=False)
    path = BAD / name
    err = _error(path)
    assert str(err).splitlines() == [f"{path}:{line}" for line in EXPECTED[name]]
    assert err.exit_code == ExitCode.USAGE
    assert "pydantic" not in str(err) and "http" not in str(err)


def test_yaml_syntax_error_gives_line_and_column() -> None:
    path = BAD / "syntax_error.yaml"
    message = str(_error(path))
    assert message.startswith(f"{path}:5:4: YAML syntax error: ")
    assert "\n" not in message


def test_file_is_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "version: 1\nhosts:\n  ct200:\n    address: 10.0.0.2\n    port: 70000\n"
    (tmp_path / "hosts.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert str(_error(Path("hosts.yaml"))) == (
        "hosts.yaml:5: hosts.ct200.port: must be 1-65535, got 70000"
    )


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"version: 1\nhosts:\n  caf\xe9:\n    address: 10.0.0.1\n")
    assert str(_error(path)) == f"{path}:3: not a UTF-8 text file (byte 0xe9 at offset 23)"


def test_missing_and_directory(tmp_path: Path) -> None:
    assert str(_error(tmp_path / "nope.yaml")) == f"{tmp_path / 'nope.yaml'}: no such file"
    assert str(_error(tmp_path)) == f"{tmp_path}: is a directory, expected a YAML file"


def test_unknown_yaml_tag_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text("version: 1\nhosts:\n  a:\n    address: !!python/name:os.system x\n")
    message = str(_error(path))
    assert message.startswith(f"{path}:4: hosts.a.address: YAML tags are not accepted, got "
                              "tag:yaml.org,2002:python/name:os.system")


# ---- good files


def test_embedded_lab_file_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    cfg = load_config(ROOT / "hosts.yaml")
    assert set(cfg.hosts) == {"ct129", "ct200"}
    ct200 = cfg.host("ct200")
    assert ct200.address == "10.77.200.2" and ct200.port == 22 and ct200.user == "root"
    assert ct200.identity_file == Path("/srv/state/ddtree-deploy/lab/id_ed25519")
    assert (
        ct200.raw("identity_file")
        == "${XDG_STATE_HOME:-~/.local/state}/ddtree-deploy/lab/id_ed25519"
    )
    assert ct200.gpus is not None and ct200.gpus.count == 8
    assert ct200.venvs["venv_sglang211"].create is not None
    assert ct200.venvs["venv_sglang211"].create.clone == "venv"
    dep = cfg.deployment("sglang-ddtree")
    assert dep.unit_name == "sglang-ddtree.service"
    assert (dep.host, dep.venv, dep.cuda_lane, dep.gpu, dep.port) == (
        "ct200", "venv_sglang211", "cu130", 1, 30001,
    )  # fmt: skip
    assert dep.sglang.version == "0.5.11"
    assert dep.sglang.extra_packages == ["soundfile==0.13.1", "flashinfer-python==0.6.8.post1"]
    assert dep.model_path == ct200.models["default"]  # not given: the host's models.default
    assert dep.raw("model_path") == ct200.raw("models.default") == str(dep.model_path)
    assert dep.ddtree is not None and (dep.ddtree.budget, dep.ddtree.topk) == (15, 8)
    assert [d.name for d in cfg.deployments_on("ct200")] == ["sglang-ddtree"]
    assert cfg.deployments_on(cfg.host("ct129")) == []
    assert embedded_hosts_file().resolve() == (ROOT / "hosts.yaml").resolve()


def test_xdg_default_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    cfg = load_config(ROOT / "hosts.yaml")
    expected = Path.home() / ".local/state/ddtree-deploy/lab/known_hosts"
    assert cfg.host("ct129").known_hosts == expected


def test_story_example_loads_without_network() -> None:
    cfg = load_config(ROOT / "examples" / "hosts.story.yaml")
    assert cfg.host("ct129").address == "10.1.2.129"
    assert cfg.host("ct200").address == "10.1.2.200"
    dep = cfg.deployment("sglang-ddtree")
    assert dep.extra_args == ["--page-size", "1"] and dep.attention_backend == "triton"


@pytest.mark.parametrize("name", sorted(p.name for p in GOOD.glob("*.yaml")))
def test_good_files_load(name: str) -> None:
    assert isinstance(load_config(GOOD / name), Config)


def test_alias_jump_and_sudo_details() -> None:
    path = GOOD / "alias_and_jump.yaml"
    cfg = load_config(path)
    gpu_a, gpu_b, bastion = cfg.host("gpu-a"), cfg.host("gpu-b"), cfg.host("bastion")
    assert gpu_a.ssh_alias == "gpu-a" and gpu_a.address is None and gpu_a.target == "gpu-a"
    assert gpu_a.jump == "bastion" and gpu_a.connect_timeout == 2.5
    assert gpu_a.use_sudo is False  # sudo: false wins over auto
    assert bastion.use_sudo is True  # auto + user ops
    assert gpu_b.port == 2222 and gpu_b.address == "fd00::20" and gpu_b.use_sudo is True
    # a relative workstation path is relative to the hosts file
    assert gpu_b.identity_file == path.parent / "keys" / "id_gpu_b"
    assert gpu_b.venvs["serve"].create is not None
    assert gpu_b.venvs["serve"].create.python == "3.11"
    serve_a = cfg.deployment("serve-a")
    assert serve_a.unit_name == "sglang-serve.service" and serve_a.gpu_indices == range(0, 2)
    assert cfg.deployment("serve-b").cuda_graph is False
    assert serve_a.algorithm == "none" and serve_a.payload is True and serve_a.tp_size == 2


def test_explicit_local_host_and_merge_keys() -> None:
    cfg = load_config(GOOD / "local_and_anchors.yaml")
    assert cfg.host("localhost").is_local and "dev" in cfg.host("localhost").venvs
    one, two = cfg.deployment("dflash-local"), cfg.deployment("dflash-local-2")
    assert (one.port, two.port) == (31000, 31001)
    assert two.algorithm == "dflash" and two.venv == "dev"
    assert two.model_path == PurePosixPath("/models/small")


def test_localhost_is_implicit() -> None:
    cfg = load_config(GOOD / "minimal.yaml")
    local = cfg.host("localhost")
    assert local.is_local and local.name == "localhost" and local.use_sudo is False
    assert "localhost" not in cfg.hosts
    assert cfg.deployments == {}


def test_unknown_host_and_deployment_lookups() -> None:
    cfg = load_config(GOOD / "minimal.yaml")
    with pytest.raises(ConfigError, match="unknown host 'ct300'; .* defines: one, localhost"):
        cfg.host("ct300")
    with pytest.raises(ConfigError, match="unknown deployment 'x'; .* defines: none"):
        cfg.deployment("x")


# ---- ${VAR} expansion


def test_expand_vars_forms() -> None:
    env = {"A": "/a", "EMPTY": ""}
    assert expand_vars("${A}/x", env) == "/a/x"
    assert expand_vars("${B:-/dflt}/x", env) == "/dflt/x"
    assert expand_vars("${EMPTY:-/dflt}", env) == "/dflt"
    assert expand_vars("${EMPTY}", env) == ""
    assert expand_vars("$A and $$ stay", env) == "$A and $$ stay"
    with pytest.raises(ValueError, match="environment variable B is not set"):
        expand_vars("${B}", env)
    with pytest.raises(ValueError, match="bad variable reference"):
        expand_vars("${1X}", env)


def test_remote_paths_expand_vars_but_not_tilde(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDT_MODELS", "/srv/models")
    path = tmp_path / "h.yaml"
    path.write_text(
        "version: 1\nhosts:\n  h:\n    address: h.example\n"
        "    known_hosts: ~/kh\n    models:\n      default: ${DDT_MODELS}/m\n"
    )
    host = load_config(path).host("h")
    assert host.models["default"] == PurePosixPath("/srv/models/m")
    assert host.raw("models.default") == "${DDT_MODELS}/m"
    assert host.known_hosts == Path.home() / "kh"
    assert host.raw("known_hosts") == "~/kh"


# ---- discovery


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd without hosts.yaml, an empty XDG config home, no $DDTREE_DEPLOY_HOSTS."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DDTREE_DEPLOY_HOSTS", raising=False)
    return tmp_path


def _hosts_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("version: 1\n")
    return path


def test_discovery_order(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_hosts_file(None) == embedded_hosts_file()
    xdg = _hosts_file(nowhere / "xdg" / "ddtree-deploy" / "hosts.yaml")
    assert find_hosts_file(None) == xdg
    _hosts_file(nowhere / "work" / "hosts.yaml")
    assert find_hosts_file(None) == Path("hosts.yaml")
    from_env = _hosts_file(nowhere / "env.yaml")
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(from_env))
    assert find_hosts_file(None) == from_env
    cli = _hosts_file(nowhere / "cli.yaml")
    assert find_hosts_file(cli) == cli


def test_named_file_must_exist(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"does not exist \(from --hosts "):
        find_hosts_file(nowhere / "missing.yaml")
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(nowhere / "gone.yaml"))
    with pytest.raises(ConfigError, match=r"does not exist \(from \$DDTREE_DEPLOY_HOSTS="):
        find_hosts_file(None)
    with pytest.raises(ConfigError, match="is not a file"):
        find_hosts_file(nowhere)


def test_discovered_embedded_file_loads(nowhere: Path) -> None:
    cfg = load_config(find_hosts_file(None))
    assert set(cfg.hosts) == {"ct129", "ct200"}


def test_odd_yaml_shapes(tmp_path: Path) -> None:
    multi = tmp_path / "multi.yaml"
    multi.write_text("version: 1\n---\nversion: 1\n")
    assert str(_error(multi)) == (
        f"{multi}:2:1: YAML syntax error: expected a single document in the stream, "
        "but found another document"
    )
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(
        "version: 1\nhosts:\n  a:\n    address: 10.0.0.1\n    port: true\n    name: zz\n"
        "  ? [1, 2]\n  : 3\n  7: {address: x}\n"
    )
    assert str(_error(shapes)).splitlines() == [
        f"{shapes}:5: hosts.a.port: expected an integer, got true",
        f"{shapes}:6: hosts.a.name: unknown field: the name is the key above it",
        f"{shapes}:7: hosts: a mapping key must be a plain value, not a list or mapping",
        f"{shapes}:9: hosts.7: expected a name of lowercase letters, digits, '.', '_' and '-', "
        "starting with a letter or digit, got 7",
    ]
