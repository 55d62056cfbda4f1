"""ServerSettings (issue 26): one strict model of how SGLang is started, one merge of its layers,
its rules (with and without the host's facts), and the command it makes per SGLang version.

Pure: the CLI runs in this process (typer's CliRunner) with the host's connection and facts
replaced by functions that fail the test, so "refused before any host is contacted" is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.config.layers import settings_layers
from ddtree_deploy.errors import ConfigError, ExitCode, RefusedError, UsageError
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.service.render import render_unit
from ddtree_deploy.service.resolve import build_spec, settings_for
from ddtree_deploy.settings.command import PLUGIN_ENV, server_command, uses_plugin
from ddtree_deploy.settings.layers import file_layer, flag_layer, merge
from ddtree_deploy.settings.model import HostFit, ServerSettings

LAYOUT = Path(__file__).parent / "facts" / "layouts" / "ct200.json"


def story() -> tuple[Any, Any, Any]:
    config = load_config(embedded_hosts_file())
    return config, config.host("ct200"), config.deployment("sglang-ddtree")


def ct200() -> Facts:
    return Facts.model_validate_json(LAYOUT.read_text(encoding="utf-8"))


def flags(**values: Any) -> Any:
    paths = {"budget": ("ddtree", "budget"), "topk": ("ddtree", "topk")}
    return flag_layer({paths.get(k, (k,)): v for k, v in values.items()})


# -- the model: ranges and the rules between fields --------------------------------------------


@pytest.mark.parametrize(("data", "loc", "needle"), [
    ({"algorithm": "ddtree", "ddtree": {"budget": 2000, "topk": 8}}, ("ddtree", "budget"),
     "must be 1-1024"),
    ({"attention_backend": "nonsense"}, ("attention_backend",), "'triton'"),
    ({"mem_fraction_static": 0.0}, ("mem_fraction_static",), "between 0 and 1"),
    ({"tp_size": 0}, ("tp_size",), "must be 1-64"),
    ({"tp_size": 10**11}, ("tp_size",), "must be 1-64"),
    ({"port": 70000}, ("port",), "must be 1-65535"),
    ({"model_path": "models/x"}, ("model_path",), "absolute path"),
    ({"environment": {"CUDA_VISIBLE_DEVICES": "0"}}, ("environment", "CUDA_VISIBLE_DEVICES"),
     "set by ddtree-deploy itself"),
    ({"environment": {"SGLANG_DDTREE_BUDGET": "9"}}, ("environment", "SGLANG_DDTREE_BUDGET"),
     "set by ddtree-deploy itself"),
    ({"algorithm": "dflash", "draft_model_path": "/d", "ddtree": {"budget": 15, "topk": 8}},
     ("ddtree",), "only allowed with algorithm: ddtree"),
    ({"algorithm": "ddtree", "draft_model_path": "/d"}, ("algorithm",),
     "needs a ddtree: block"),
    ({"algorithm": "ddtree", "draft_model_path": "/d", "ddtree": {"budget": 15}},
     ("ddtree", "topk"), "required with algorithm ddtree"),
    ({"algorithm": "dflash"}, ("draft_model_path",), "required with algorithm dflash"),
    ({"algorithm": "ddtree", "draft_model_path": "/d", "ddtree": {"budget": 15, "topk": 8},
      "extra_args": ["--page-size", "16"]}, ("extra_args",), "DDTREE needs --page-size 1"),
    ({"algorithm": "dflash", "draft_model_path": "/d", "extra_args": ["--enable-dp-attention"]},
     ("extra_args",), "DFLASH does not support --enable-dp-attention"),
    # a flag the tool sets from a field would replace it behind the rules' back (last wins)
    ({"extra_args": ["--host", "0.0.0.0"]}, ("extra_args",), "--host is set by ddtree-deploy"),
    ({"extra_args": ["--port=30001"]}, ("extra_args",), "from port"),
    ({"tp_size": 1, "extra_args": ["--tensor-parallel-size", "8"]}, ("extra_args",),
     "from tp_size"),
    ({"extra_args": ["--model", "/other"]}, ("extra_args",), "from model_path"),
    ({"extra_args": ["--speculative-algorithm", "DDTREE"]}, ("extra_args",), "from algorithm"),
    ({"extra_args": ["--config", "/tmp/c.yaml"]}, ("extra_args",), "from api_key_file"),
    ({"algorithm": "dflash", "draft_model_path": "/d", "extra_args": ["--pp-size=2"]},
     ("extra_args",), "DFLASH supports only --pp-size 1"),
    ({"algorithm": "dflash", "draft_model_path": "/d",
      "extra_args": ["--pipeline-parallel-size", "2"]}, ("extra_args",),
     "got --pipeline-parallel-size 2"),
    # abbreviations reach the same option through SGLang's argparse (allow_abbrev)
    ({"extra_args": ["--po", "30002"]}, ("extra_args",),
     "--po abbreviates --port (SGLang's argparse takes any unambiguous prefix), which "
     "ddtree-deploy sets itself (from port): give port instead"),
    ({"extra_args": ["--ho=127.0.0.1"]}, ("extra_args",), "--ho abbreviates --host"),
    ({"extra_args": ["--tensor-par", "8"]}, ("extra_args",), "from tp_size"),
    ({"extra_args": ["--speculative-draft-model-pa=/x"]}, ("extra_args",),
     "from draft_model_path"),
    ({"extra_args": ["--conf", "/tmp/c.yaml"]}, ("extra_args",), "from api_key_file"),
    ({"algorithm": "ddtree", "draft_model_path": "/d", "ddtree": {"budget": 15, "topk": 8},
      "extra_args": ["--page-s=16"]}, ("extra_args",),
     "--page-s abbreviates --page-size (SGLang's argparse takes any unambiguous prefix), "
     "which the settings' rules check: write its full name"),
    ({"extra_args": ["--decode-attention", "fa3"]}, ("extra_args",),
     "abbreviates --decode-attention-backend"),
    ({"extra_args": ["--enable-dp"]}, ("extra_args",), "abbreviates --enable-dp-attention"),
    ({"algorithm": "ddtree", "draft_model_path": "/d", "ddtree": {"budget": 15, "topk": 8},
      "attention_backend": "fa3"}, ("attention_backend",), "needs the triton attention backend"),
    ({"algorithm": "ddtree", "draft_model_path": "/d", "ddtree": {"budget": 15, "topk": 8},
      "extra_args": ["--decode-attention-backend", "flashinfer"]}, ("extra_args",),
     "got --decode-attention-backend flashinfer"),
])
def test_each_range_and_rule_is_said_at_its_field(data: dict[str, Any], loc: tuple[str, ...],
                                                  needle: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        ServerSettings.model_validate(data)
    errors = info.value.errors()
    assert [tuple(p for p in e["loc"] if p != "[key]") for e in errors] == [loc]
    assert needle in str(errors[0]["msg"])


def test_shadow_linear_ddtree_and_dflash_take_any_backend() -> None:
    for data in ({"algorithm": "ddtree", "draft_model_path": "/d", "attention_backend": "fa3",
                  "ddtree": {"budget": 3, "topk": 2, "shadow_linear": True}},
                 {"algorithm": "dflash", "draft_model_path": "/d", "attention_backend": "fa3"}):
        assert ServerSettings.model_validate(data).attention_backend == "fa3"


# -- the merge: file, then flags, with the same messages ----------------------------------------


def test_flags_override_the_file_field_by_field() -> None:
    config, host, dep = story()
    s = settings_for(config, host, dep, flags(budget=31, gpu=3)).settings
    assert s.ddtree is not None and (s.ddtree.budget, s.ddtree.topk) == (31, 8)
    assert (s.gpu, s.port, s.attention_backend) == (3, 30001, "triton")
    # another algorithm leaves the deployment's ddtree: block behind
    s = settings_for(config, host, dep, flags(algorithm="dflash")).settings
    assert s.algorithm == "dflash" and s.ddtree is None
    assert str(s.draft_model_path) == "/dev/shm/Qwen3.6-27B-DFlash-b16"


@pytest.mark.parametrize(("given", "message"), [
    ({"budget": 2000}, "--ddtree-budget: must be 1-1024, got 2000"),
    ({"attention_backend": "nonsense"}, "--attention-backend: expected 'triton', "),
    ({"mem_fraction_static": 0.0}, "--mem-fraction-static: must be between 0 and 1 "
                                   "(exclusive), got 0.0"),
    ({"algorithm": "eagle"}, "--algorithm: expected 'none', 'dflash' or 'ddtree', got 'eagle'"),
    ({"algorithm": "dflash", "topk": 4}, "--ddtree-topk: only allowed with algorithm: ddtree"),
    ({"attention_backend": "fa3"}, "--attention-backend: full-tree DDTREE verification needs "
                                   "the triton attention backend"),
])
def test_a_bad_flag_is_named_by_its_flag(given: dict[str, Any], message: str) -> None:
    config, host, dep = story()
    with pytest.raises(UsageError) as info:
        settings_for(config, host, dep, flags(**given))
    assert str(info.value).startswith(message)
    assert info.value.exit_code == ExitCode.USAGE


def test_a_file_value_is_said_at_its_line_and_a_flag_can_make_it_wrong() -> None:
    config, host, dep = story()
    line = config.line_of(("deployments", "sglang-ddtree", "attention_backend"))
    # a file layer with a bad value: file:line: field
    bad = file_layer({("attention_backend",): "fa3"}, "hosts.yaml", ("deployments", "x"),
                     lambda loc: 7)
    with pytest.raises(ConfigError, match=r"^hosts.yaml:7: deployments.x.attention_backend: "
                                          "full-tree DDTREE"):
        merge(*settings_layers(config, host, dep), bad)
    # the file's triton is fine; shadow-linear off is the file's: a backend flag is the problem
    with pytest.raises(UsageError, match="^--attention-backend"):
        settings_for(config, host, dep, flags(attention_backend="flashinfer"))
    assert line > 1


def test_without_a_model_anywhere_the_merge_says_so() -> None:
    config, host, _ = story()
    bare = host.model_copy(update={"models": {}})
    with pytest.raises(UsageError, match="^--model-path: required"):
        settings_for(config, bare, None, flags(algorithm="none"))


# -- rules that need the host's facts ------------------------------------------------------------


def test_the_verify_width_and_the_gpus_are_checked_with_the_facts() -> None:
    config, host, dep = story()
    merged = settings_for(config, host, dep)
    merged.on_host(HostFit(host="ct200", draft_block=16, gpu_count=8))
    with pytest.raises(RefusedError) as info:
        merged.on_host(HostFit(host="ct200", draft_block=32, gpu_count=8,
                               deployment="sglang-ddtree"))
    assert "deployments.sglang-ddtree.ddtree.budget: DDTREE budget 15" in str(info.value)
    assert info.value.hint and "at least 31" in info.value.hint
    tp = settings_for(config, host, dep, flag_layer({("tp_size",): 4}, {}))
    with pytest.raises(RefusedError, match="tp 4 needs 4 GPUs; ct200 has only 2 GPU"):
        tp.on_host(HostFit(host="ct200", draft_block=16, gpu_count=2))


# -- the command per SGLang version ----------------------------------------------------------------


def test_sglang_0_5_17_gets_ddtree_through_the_environment() -> None:
    config, host, dep = story()
    s = settings_for(config, host, dep).settings
    old = server_command(s, "0.5.11", port=30001, bind_host="0.0.0.0", draft_tokens=16)
    new = server_command(s, "0.5.17", port=30001, bind_host="0.0.0.0", draft_tokens=16)
    assert "--speculative-ddtree-budget" in old.args and old.plugin_env == ()
    assert not any("ddtree" in a for a in new.args)
    assert new.args[new.args.index("--speculative-algorithm") + 1] == "DDTREE"
    assert dict(new.plugin_env) == {PLUGIN_ENV["budget"]: "15", PLUGIN_ENV["topk"]: "8"}
    # the plugin refuses a server without page size 1 and overlap off (the payload sets both)
    assert [a for a in old.args if "ddtree" not in a and a not in ("15", "8")] + [
        "--page-size", "1", "--disable-overlap-schedule"] == list(new.args)
    bare = s.model_copy(update={"attention_backend": None})  # full tree, no backend named
    args = server_command(bare, "0.5.17", port=1, bind_host="h", draft_tokens=16).args
    assert args[args.index("--attention-backend") + 1] == "triton"
    assert "--attention-backend" not in server_command(bare, "0.5.11", port=1, bind_host="h",
                                                       draft_tokens=16).args
    own = s.model_copy(update={"extra_args": ["--page-size=1", "--disable-overlap-schedule"]})
    args = server_command(own, "0.5.17", port=1, bind_host="h", draft_tokens=16).args
    assert args.count("--disable-overlap-schedule") == 1 and "--page-size" not in args
    assert (uses_plugin("0.5.11"), uses_plugin("0.5.17"), uses_plugin("0.5.23"),
            uses_plugin(None)) == (False, True, True, False)


def test_a_0_5_17_deployment_renders_the_plugin_s_variables(tmp_path: Path) -> None:
    text = embedded_hosts_file().read_text(encoding="utf-8")
    assert "version: 0.5.11" in text
    path = tmp_path / "hosts.yaml"
    path.write_text(text.replace("version: 0.5.11", "version: 0.5.17"), encoding="utf-8")
    config = load_config(path)
    host, dep = config.host("ct200"), config.deployment("sglang-ddtree")
    unit = render_unit(build_spec(config, host, ct200(), dep), tool_version="t")
    assert "Environment=SGLANG_DDTREE_BUDGET=15" in unit.splitlines()
    assert "Environment=SGLANG_DDTREE_TOPK=8" in unit.splitlines()
    assert "--speculative-ddtree" not in unit and "--speculative-algorithm DDTREE" in unit


def test_an_abbreviated_flag_in_hosts_yaml_names_the_file_line_and_field(
        tmp_path: Path) -> None:
    text = embedded_hosts_file().read_text(encoding="utf-8")
    path = tmp_path / "hosts.yaml"
    path.write_text(text.replace("    port: 30001\n",
                                 "    port: 30001\n    extra_args: [--po, '30002']\n"),
                    encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = text.splitlines().index("    port: 30001") + 2
    assert f"{path}:{line}: deployments.sglang-ddtree.extra_args" in str(info.value)
    assert "--po abbreviates --port" in str(info.value)


def test_full_names_and_other_flags_pass_the_abbreviation_check() -> None:
    s = ServerSettings.model_validate({"extra_args": [
        "--page-size", "1", "--disable-overlap-schedule", "--p2p-nodes", "--posthoc", "-p",
        "--enable-dp-attention=", "--chunked-prefill-size=4096", "--", "--attention-backend"]})
    assert "--posthoc" in s.extra_args


# -- service up: refused before any host is contacted ---------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["--ddtree-budget", "2000"], "--ddtree-budget: must be 1-1024, got 2000"),
    (["--ddtree-topk", "0"], "--ddtree-topk: must be 1-1024, got 0"),
    (["--port", "70000"], "--port: must be 1-65535, got 70000"),
    (["--gpu", "-1"], "--gpu: must be 0-63, got -1"),
    (["--attention-backend", "nonsense"], "--attention-backend: expected 'triton'"),
    (["--mem-fraction-static", "0"], "--mem-fraction-static: must be between 0 and 1"),
    (["--algorithm", "dflash", "--ddtree-topk", "4"], "--ddtree-topk: only allowed"),
    (["--venv", "relative/venv"], "--venv: expected an absolute path on the host"),
    (["--name", "x.service"], "--name: expected the unit name without '.service'"),
])
def test_service_up_refuses_bad_flags_before_any_host(monkeypatch: pytest.MonkeyPatch,
                                                      args: list[str], message: str) -> None:
    from ddtree_deploy.cli import app as cli_app
    from ddtree_deploy.facts import gather
    from ddtree_deploy.transport import connect

    def no_host(*_: Any, **__: Any) -> Any:
        raise AssertionError("a host was contacted")

    monkeypatch.setattr(gather, "collect", no_host)
    monkeypatch.setattr(connect, "open_transport", no_host)
    argv = ["--hosts", str(embedded_hosts_file()), "service", "up", "ct200", "sglang-ddtree",
            *args]
    result = CliRunner().invoke(cli_app.build_app(argv), argv)
    assert isinstance(result.exception, UsageError), result.output
    assert str(result.exception).startswith(message)
    assert result.exception.exit_code == ExitCode.USAGE


def test_the_gpu_smoke_starts_sglang_0_5_17_with_the_tool_s_flags(tmp_path: Path) -> None:
    """rehearsal/plugin_smoke.py's server (run on the H200, GPU call 1) takes the same flags and
    DDTree variables that server_command makes for its settings: what the GPU proves is what the
    tool renders (flag order aside: argparse does not care)."""
    from rehearsal import plugin_smoke

    models = tmp_path / "m"
    argv = plugin_smoke.server_argv("ddtree", models, 31001, 8, 4096)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    settings = ServerSettings.model_validate({
        "model_path": str(models / "target"), "draft_model_path": str(models / "draft"),
        "algorithm": "ddtree", "ddtree": {"budget": 15, "topk": 8},
        "attention_backend": "triton", "sampling_backend": "pytorch", "grammar_backend": "none",
        "mem_fraction_static": 0.5, "context_length": 4096,
        "extra_args": ["--skip-tokenizer-init", "--dtype", "bfloat16", "--max-total-tokens",
                       "65536", "--max-running-requests", "32", "--cuda-graph-max-bs", "32",
                       "--random-seed", "1234"]})
    ours = server_command(settings, "0.5.17", port=31001, bind_host="127.0.0.1", draft_tokens=8)

    def flags(args: list[str] | tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for i, a in enumerate(args):
            if a.startswith("--"):
                out[a] = tuple(x for x in args[i + 1:i + 2] if not x.startswith("--"))
        return out

    assert flags(argv[3:]) == flags(ours.args)
    smoke_env = {"SGLANG_DDTREE_BUDGET": "15", "SGLANG_DDTREE_TOPK": "8"}  # plugin_smoke.main
    assert dict(ours.plugin_env) == smoke_env
