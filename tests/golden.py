"""Golden files: what the tool prints and renders, captured so that a refactoring keeps it.

Captured first from commit 4a67c69 (before issue 26's one model of a server's settings) and
compared by tests/test_golden.py, which regenerates every file and compares it byte for byte:

- ``help/``: the `--help` of every command and subcommand (the plugins' groups included),
  100 columns, no colour;
- ``plan/``: `plan --json` on the fact scenarios of tests/test_converge_plan.py and
  tests/facts/layouts/ct200.json (the CLI in this process, the facts from a seeded cache;
  ``made_at`` and the tool's version replaced by placeholders);
- ``units/``: the systemd unit of every deployment of the tested hosts files (the embedded lab
  file, examples/hosts.story.yaml, tests/data/hosts_good/), of `service up`'s flags on the
  story's deployment and without one, and the server flags of the bench grid's configurations.

A change that alters any of them on purpose updates them with ONE command, and the diff is
reviewed with the change:

    .venv/bin/python tests/golden.py --update

(which also regenerates docs/commands.md and docs/hosts-yaml.md, scripts/gen_docs.py).

This module starts no process (the unit tier): the CLI runs in this process (typer's
CliRunner), with XDG_STATE_HOME pointed at a temporary folder.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from story_facts import CU130, story_facts

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the tool and tests' data from this checkout
    sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "tests" / "data" / "golden"
LAYOUT = ROOT / "tests" / "facts" / "layouts" / "ct200.json"
VERSION = "<version>"
HOSTS_FILES = {
    "embedded": ROOT / "hosts.yaml",  # resources.embedded_hosts_file()
    "story": ROOT / "examples" / "hosts.story.yaml",
    **{f"good-{p.stem}": p
       for p in sorted((ROOT / "tests" / "data" / "hosts_good").glob("*.yaml"))},
}
_ENV = {"COLUMNS": "100", "LINES": "50", "NO_COLOR": "1", "TERMINAL_WIDTH": "100",
        "FORCE_COLOR": None, "PY_COLORS": None, "GITHUB_ACTIONS": None, "TERM": "dumb",
        "DDTREE_DEPLOY_HOSTS": None}


# ---- help -----------------------------------------------------------------------------------


def _command_paths() -> list[tuple[str, ...]]:
    import typer

    from ddtree_deploy.cli import app as cli_app

    root = typer.main.get_command(cli_app.build_app())
    paths: list[tuple[str, ...]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        paths.append(path)
        for name in sorted(getattr(cmd, "commands", None) or {}):  # a group's subcommands
            walk(cmd.commands[name], (*path, name))

    walk(root, ())
    return paths


def _invoke(args: list[str], env: dict[str, Any] | None = None) -> tuple[int, str]:
    from typer.testing import CliRunner

    from ddtree_deploy.cli import app as cli_app
    from ddtree_deploy.errors import DeployError

    runner = CliRunner()
    result = runner.invoke(cli_app.build_app(args), args, prog_name="ddtree-deploy",
                           env={**_ENV, **(env or {})})
    if isinstance(result.exception, DeployError):
        return int(result.exception.exit_code), f"error: {result.exception}\n"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def help_texts() -> Iterator[tuple[str, str]]:
    for path in _command_paths():
        code, text = _invoke([*path, "--help"])
        name = "-".join(path) or "ddtree-deploy"
        text = "".join(line.rstrip() + "\n" for line in text.splitlines())
        yield f"help/{name}.txt", f"$ ddtree-deploy {' '.join([*path, '--help'])}\n" \
                                  f"exit {code}\n{text}"


# ---- facts scenarios ------------------------------------------------------------------------

def layout_facts() -> dict[str, Any]:
    """tests/facts/layouts/ct200.json: CT200's GPUs (GPU0 held), its venv and model folders."""
    data: dict[str, Any] = json.loads(LAYOUT.read_text(encoding="utf-8"))
    return data


def generic_facts(host: str, venvs: list[str], gpus: int = 8) -> dict[str, Any]:
    """A host with `gpus` free GPUs and the given venvs present (one nvidia lib folder each)."""
    return {"host": host,
            "nvidia": {"present": True, "gpus": [{"index": i, "processes": []}
                                                 for i in range(gpus)]},
            "venvs": [{"path": v, "nvidia": {"cu13": True,
                                             "lib_dirs": [f"{v}/lib/python3.11/site-packages/"
                                                          "nvidia/cu13/lib"]}} for v in venvs]}


# ---- rendering, through the tool's API (the one place a refactoring of it edits) -------------


def render(hosts_file: Path, host: str, facts: dict[str, Any], deployment: str | None,
           flags: dict[str, Any] | None = None, *, force: bool = False) -> str:
    """The unit `service up HOST [DEPLOYMENT] --FLAG...` would install (flags by their
    `service up` names, dashes as underscores); a refusal as its exit code and message."""
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.errors import DeployError
    from ddtree_deploy.facts.model import Facts
    from ddtree_deploy.service.render import render_unit
    from ddtree_deploy.service.resolve import build_spec, settings_for
    from ddtree_deploy.settings.layers import flag_layer

    config = load_config(hosts_file)
    given = dict(flags or {})
    name, venv = given.pop("service_name", None), given.pop("venv", None)
    paths = {"budget": ("ddtree", "budget"), "topk": ("ddtree", "topk")}
    layer = flag_layer({paths.get(k, (k,)): v for k, v in given.items()})
    spec_host = config.host(host)
    dep = config.deployment(deployment) if deployment else None
    try:
        settings = settings_for(config, spec_host, dep, layer)
        spec = build_spec(config, spec_host, Facts.model_validate(facts), dep, settings,
                          name=name, venv=venv, force=force)
    except DeployError as exc:
        return f"refused: exit {int(exc.exit_code)}\n{exc}\n"
    return render_unit(spec, tool_version=VERSION)


def bench_flags(configs: str) -> dict[str, list[str]]:
    """The server flags of each bench configuration on the story's deployment (layout facts)."""
    from ddtree_deploy.bench import grid as bench_grid
    from ddtree_deploy.bench.prepare import block_size
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.facts.model import Facts
    from ddtree_deploy.service.resolve import build_spec, settings_for

    config = load_config(HOSTS_FILES["embedded"])
    facts = Facts.model_validate(layout_facts())
    dep = config.deployment("sglang-ddtree")
    host = config.host("ct200")
    g = bench_grid.from_flags(configs, "1", "greedy", "code", ("code",), requests=1)
    base = build_spec(config, host, facts, dep)
    draft = base.draft_model_path
    entry = facts.model(draft) if draft else None
    block = block_size(entry.config if entry else None)
    return {c.key: build_spec(config, host, facts, dep, settings_for(config, host, dep, c.layer),
                              block=block).server_args() for c in g.configs}


# ---- the cases ------------------------------------------------------------------------------

FLAG_CASES: dict[str, tuple[str | None, dict[str, Any]]] = {
    "story": ("sglang-ddtree", {}),
    "story-dflash": ("sglang-ddtree", {"algorithm": "dflash"}),
    "story-none": ("sglang-ddtree", {"algorithm": "none"}),
    "story-budget-topk": ("sglang-ddtree", {"budget": 31, "topk": 4}),
    "story-backends": ("sglang-ddtree", {"attention_backend": "fa3",
                                         "grammar_backend": "xgrammar",
                                         "sampling_backend": "pytorch",
                                         "mem_fraction_static": 0.8}),
    "story-dflash-backends": ("sglang-ddtree", {"algorithm": "dflash",
                                                "attention_backend": "fa3",
                                                "sampling_backend": "pytorch"}),
    # refused since issue 26 (each rendered a unit SGLang or the payload would refuse)
    "refused-budget-2000": ("sglang-ddtree", {"budget": 2000}),
    "refused-attention-nonsense": ("sglang-ddtree", {"attention_backend": "nonsense"}),
    "refused-mem-fraction-0": ("sglang-ddtree", {"mem_fraction_static": 0.0}),
    "refused-budget-with-dflash": ("sglang-ddtree", {"algorithm": "dflash", "budget": 31}),
    "story-gpu-port-name": ("sglang-ddtree", {"gpu": 3, "port": 30007,
                                              "service_name": "sglang-other"}),
    "story-paths": ("sglang-ddtree", {"model_path": "/dev/shm/other",
                                      "draft_model_path": "/dev/shm/other-draft",
                                      "venv": "/root/venv_sglang211"}),
    "nodeployment-none": (None, {"venv": "/root/venv_sglang211"}),
    "nodeployment-dflash": (None, {"venv": "/root/venv_sglang211", "algorithm": "dflash",
                                   "port": 30100}),
    "nodeployment-ddtree": (None, {"venv": "/root/venv_sglang211", "algorithm": "ddtree",
                                   "budget": 22, "topk": 6, "service_name": "dd"}),
}



def _plan_scenarios() -> dict[str, tuple[dict[str, Any], bool, dict[str, str], list[str]]]:
    """name -> (facts, whether the unit is installed as rendered, other managed units, pending)."""
    no_soundfile = {k: v for k, v in CU130.items() if k != "soundfile"}
    return {
        "from-nothing": (story_facts(False), False, {}, []),
        "converged": (story_facts(True), True, {}, []),
        "package-missing": (story_facts(True, no_soundfile), True, {}, []),
        "pending-restart": (story_facts(True), True, {}, ["sglang-ddtree.service"]),
        "stopped": (story_facts(True, active=False), True, {}, []),
        "payload-missing-and-removed": (
            story_facts(True, ddtree=False), True,
            {"old.service": "[Unit]\nX-DDTreeDeploy-Managed=yes\n"
                            "X-DDTreeDeploy-Deployment=gone-deployment\n"}, []),
        "layout-venv-only": (layout_facts(), False, {}, []),
    }


def _normalise_plan(text: str) -> str:
    from ddtree_deploy import __version__

    doc = json.loads(text)  # the --json document (docs/json.md): the plan is its results
    plan = doc["results"]
    plan["made_at"] = "<time>"
    plan["facts_at"] = {host: "<time>" for host in plan.get("facts_at", {})}  # cache seeded
    text = json.dumps(doc, indent=1, sort_keys=True).replace(__version__, VERSION)
    return text.replace(str(ROOT), "<checkout>") + "\n"  # the same in every checkout


def plan_outputs() -> Iterator[tuple[str, str]]:
    from ddtree_deploy import __version__
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.facts.model import SCHEMA_VERSION, Facts
    from ddtree_deploy.service.render import render_unit
    from ddtree_deploy.service.resolve import build_spec

    hosts_file = HOSTS_FILES["embedded"]
    config = load_config(hosts_file)
    host = config.host("ct200")
    for name, (facts, installed, others, pending) in _plan_scenarios().items():
        data = copy.deepcopy(facts)
        tool: dict[str, Any] = {"managed_units": dict(others), "pending_restarts": pending}
        if installed:
            spec = build_spec(config, host, Facts.model_validate(data),
                              config.deployment("sglang-ddtree"))
            tool["managed_units"]["sglang-ddtree.service"] = render_unit(
                spec, tool_version=__version__)
        data["tool"] = tool
        data["taken_at"] = time.time()
        data["schema_version"] = SCHEMA_VERSION  # the layout's file predates schema 2
        with tempfile.TemporaryDirectory() as state:
            cache_root = Path(state) / "ddtree-deploy" / "facts"
            cache = FactsCache(cache_root)
            cache.save(host, Facts.model_validate(data))
            cached = cache.load(host)  # as facts.gather.collect reads it: never a host contacted
            if cached is None or not all(cached.model(str(p)) for p in host.models.values()):
                raise AssertionError(f"plan scenario {name}: the seeded facts would not be used")
            code, text = _invoke(["--hosts", str(hosts_file), "plan", "ct200", "--json"],
                                 env={"XDG_STATE_HOME": state})
        body = _normalise_plan(text) if text.startswith("{") else text
        yield f"plan/{name}.json.txt", f"exit {code}\n{body}"


def unit_outputs() -> Iterator[tuple[str, str]]:
    from ddtree_deploy.config.hosts import load_config

    for label, path in HOSTS_FILES.items():
        config = load_config(path)
        for dep in sorted(config.deployments.values(), key=lambda d: d.name):
            host = config.host(dep.host)
            if label in ("embedded", "story") and dep.host == "ct200":
                facts = layout_facts()
            else:
                facts = generic_facts(host.name, sorted(str(v.path) for v in host.venvs.values()))
            yield f"units/{label}/{dep.name}.service", render(path, host.name, facts, dep.name)
    for case, (dep_name, flags) in FLAG_CASES.items():
        yield f"units/flags/{case}.service", render(HOSTS_FILES["embedded"], "ct200",
                                                    layout_facts(), dep_name, flags)
    flags = bench_flags("none,dflash,ddtree:15/8,ddtree:31/4,shadow:7/4")
    yield "units/bench/flags.json", json.dumps(flags, indent=1) + "\n"


def generate() -> dict[str, str]:
    """Every golden file: relative path -> text."""
    out: dict[str, str] = {}
    for gen in (help_texts, plan_outputs, unit_outputs):
        for rel, text in gen():
            assert rel not in out, rel
            out[rel] = text
    return out


def write(files: dict[str, str]) -> None:
    import shutil

    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    for rel, text in files.items():
        path = GOLDEN / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    files = generate()
    if argv == ["--update"]:
        write(files)
        print(f"wrote {len(files)} golden files under {GOLDEN.relative_to(ROOT)}")
        # the reference pages under docs/ come from the same CLI and schema: updated together
        import runpy

        runpy.run_path(str(ROOT / "scripts" / "gen_docs.py"), run_name="gen_docs")["main"]([])
        print("wrote the reference pages under docs/ (scripts/gen_docs.py)")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
