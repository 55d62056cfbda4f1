"""Every remedy the tool prints is a command line its own CLI accepts (issue 30, item 1).

Each remedy template (doctor's rules, the probe's crash signatures, their builders) is filled
and every `ddtree-deploy ...` command it names is parsed by the real Typer/click parser of the
CLI, as a shell would hand it over: no `--help`, nothing run. A placeholder the tool cannot know
(HOST, NAME, N, P: upper case) stays a placeholder; the numeric ones are given a number here,
as the user would. `--json` carries the commands as their own field; doctor prints each remedy
whole on one line under its table (never folded inside a table cell).
"""

from __future__ import annotations

import io
import shlex

import pytest
import typer.main
from rich.console import Console
from test_rules import HOSTS, ct129, ct200, models, venv_healthy, venv_sglang, venv_training
from typer._click.exceptions import ClickException
from typer.core import TyperGroup

from ddtree_deploy.cli.app import build_app
from ddtree_deploy.cli.render_inventory import findings_table, remedies
from ddtree_deploy.facts.model import Gpu, GpuProcess, Listener, NvidiaInfo, Services, Venv
from ddtree_deploy.health.signatures import SIGNATURES, fill_remedy, match_line
from ddtree_deploy.rules import diagnose
from ddtree_deploy.rules import findings as builders
from ddtree_deploy.rules.findings import Finding, commands_of

NUMBERS = {"N": "1", "P": "30002"}  # what a user types for the numeric placeholders
CONTEXT = {"host": "ct200", "name": "sglang-ddtree", "venv": "/root/venv_sglang",
           "deployment": "sglang-ddtree", "port": 30001, "lane": "cu130"}


def parse(command: str) -> list[str]:
    """Parse one command line with the CLI's own parser (every group down to the command);
    raises click's error as the CLI would print it. Returns the command path."""
    argv = [NUMBERS.get(word, word) for word in shlex.split(command)]
    assert argv[0] == "ddtree-deploy", command
    args = argv[1:]
    cmd = typer.main.get_command(build_app(args))
    ctx = cmd.make_context("ddtree-deploy", list(args))
    path = []
    while isinstance(cmd, TyperGroup):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            break
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        path.append(name)
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd = sub
    assert not ctx.args and not ctx._protected_args, (command, ctx.args)
    return path


def test_the_parser_refuses_what_the_old_remedies_printed() -> None:
    """The helper is the real parser: the four remedies of the issue fail it."""
    for bad in ("ddtree-deploy overlay ct200 --abi cu130 --venv /root/v",
                "ddtree-deploy apply ct200 --deployment sglang-ddtree",
                "ddtree-deploy venv clone ct200 venv_sglang211 --from SOURCE",
                "ddtree-deploy service up --gpu 1"):
        with pytest.raises(ClickException):
            parse(bad)
    assert parse("ddtree-deploy overlay --abi cu130 --to ct200 --venv /root/v") == ["overlay"]
    assert parse("ddtree-deploy service up ct200 sglang-ddtree --gpu N") == ["service", "up"]


def _signature_remedies() -> list[tuple[str, str]]:
    return [(s.id, fill_remedy(s.remedy, CONTEXT)) for s in SIGNATURES]


@pytest.mark.parametrize(("sig", "remedy"), _signature_remedies(),
                         ids=[s.id for s in SIGNATURES])
def test_every_signature_remedy_parses(sig: str, remedy: str) -> None:
    for command in commands_of(remedy):
        parse(command)


def test_signature_remedies_name_commands_and_carry_them_in_json() -> None:
    named = [sig for sig, remedy in _signature_remedies() if commands_of(remedy)]
    assert len(named) >= len(SIGNATURES) - 3  # prose only where no command fixes it
    match = match_line("ImportError: libcudart.so.13: cannot open shared object file", CONTEXT)
    assert match is not None
    data = match.to_json()
    assert data["commands"] == [
        "ddtree-deploy overlay --abi cu130 --to ct200 --venv /root/venv_sglang"]
    unknown = match_line("RuntimeError: No CUDA GPUs are available", {"host": "h"})
    assert unknown is not None
    assert unknown.to_json()["commands"][0] == "ddtree-deploy service up h DEPLOYMENT --gpu N"


def _scenarios() -> list[list[Finding]]:
    """Facts that make every rule with a command in its remedy fire at least once."""
    from ddtree_deploy.config.hosts import load_config

    config = load_config(HOSTS)
    dep = config.deployment("sglang-ddtree")
    busy = dep.model_copy(update={"gpu": 0, "port": 30000})
    dead = ct200(venv_healthy(), nvidia=NvidiaInfo(present=True, driver_version="580.95.05",
                 cuda_version="13.0", gpus=[Gpu(index=0, dead=True, error="gone"),
                                            Gpu(index=1, processes=[GpuProcess(pid=1)])]))
    return [
        diagnose(ct200(venv_training(), venv_sglang()), venv="/root/venv_sglang", deployment=dep,
                 model_facts=models(draft_config=None, target_config=None)),
        diagnose(ct200(venv_sglang()), venv="/root/venv_sglang", deployment=None,
                 model_facts=None),
        diagnose(ct200(venv_training()), venv="/root/venv_sglang211", deployment=dep,
                 model_facts=None),
        diagnose(ct200(venv_healthy(ddtree=False), services=Services(listeners=[
            Listener(port=30000, address="0.0.0.0", pid=4242, process="python3")])),
            venv="/root/venv_sglang211", deployment=busy, model_facts=models()),
        diagnose(ct200(venv_training().model_copy(update={"error": "denied"})),
                 venv="/root/venv", deployment=None, model_facts=None),
        diagnose(ct200(nvidia=NvidiaInfo(present=False, error="no driver")), venv=None,
                 deployment=None, model_facts=None),
        diagnose(ct129(), venv=None, deployment=None, model_facts=None),
        diagnose(dead, venv=None, deployment=None, model_facts=None),
        diagnose(ct200(Venv(path="/root/x", exists=False)), venv="/root/x", deployment=None,
                 model_facts=None),
    ]


def test_every_doctor_remedy_parses() -> None:
    found = [f for scenario in _scenarios() for f in scenario]
    commands = [(f.id, c) for f in found for c in f.to_json()["commands"]]
    fired = {fid for fid, _ in commands}
    assert {"deploy.lane-mismatch", "venv.soundfile-missing", "venv.missing", "gpu.dead",
            "deploy.gpu-busy", "deploy.port-taken", "venv.unreadable", "nvidia.absent",
            "venv.xgrammar-structural-tag", "payload.ddtree-missing",
            "model.target-config-missing"} <= fired, fired
    for fid, command in commands:
        try:
            parse(command)
        except ClickException as exc:
            raise AssertionError(f"{fid}: {command}: {exc.format_message()}") from None


def test_doctor_names_what_it_knows() -> None:
    """The deployment's name and a free GPU, not NAME and N, when doctor knows them."""
    from ddtree_deploy.config.hosts import load_config

    dep = load_config(HOSTS).deployment("sglang-ddtree").model_copy(update={"gpu": 0})
    found = diagnose(ct200(venv_healthy()), venv="/root/venv_sglang211", deployment=dep,
                     model_facts=models())
    busy = next(f for f in found if f.id == "deploy.gpu-busy")
    assert busy.to_json()["commands"] == ["ddtree-deploy service up ct200 sglang-ddtree --gpu 1"]
    dead = next(f for f in diagnose(ct129(), venv=None, deployment=None, model_facts=None))
    assert dead.to_json()["commands"] == ["ddtree-deploy service up ct129 NAME --gpu 0"]


def test_builders_quote_what_a_shell_would_split() -> None:
    line = builders.payload_deploy("ct200", "/root/my venv")
    assert commands_of(line) == ["ddtree-deploy payload deploy ct200 --venv '/root/my venv'"]
    assert shlex.split(commands_of(line)[0])[-1] == "/root/my venv"
    parse(commands_of(line)[0])


def test_doctor_prints_each_remedy_whole_on_one_line() -> None:
    long_venv = "/srv/very/long/folder/names/of/a/shared/gpu/host/venvs/sglang-ddtree-cu130"
    findings = [Finding(id="venv.lane-mix", severity="error", message="mixed lanes",
                        remedy=builders.overlay("ct200", "cu130", long_venv))]
    buf = io.StringIO()
    con = Console(file=buf, width=80, color_system=None, legacy_windows=False)
    con.print(findings_table("ct200", None, findings))
    for line in remedies(findings):
        con.print(line, soft_wrap=True)
    text = buf.getvalue()
    (command,) = commands_of(findings[0].remedy)
    assert any(command in line for line in text.splitlines()), text


def test_probe_hints_parse_and_name_the_deployment_of_the_unit() -> None:
    from ddtree_deploy.converge.steps.service_probe import target_of
    from ddtree_deploy.health.check import SAMPLED_STALL_REMEDY

    (stall,) = commands_of(fill_remedy(SAMPLED_STALL_REMEDY, CONTEXT))
    assert stall == "ddtree-deploy probe ct200 sglang-ddtree --warmup 600"
    parse(stall)
    unit = "[Unit]\nX-DDTreeDeploy-Deployment=qwen-ddtree\nX-DDTreeDeploy-Port=30001\n"
    target = target_of(unit, "ddtree-x.service", "ct200")
    assert target is not None and target.context("ct200")["deployment"] == "qwen-ddtree"
