"""The server's command line AND environment, from its settings and the SGLang version.

SGLang 0.5.11 with the DDTree payload takes DDTree's settings as flags
(``--speculative-ddtree-budget``, ``-topk``, ``-shadow-linear``). From 0.5.17 SGLang has no
DDTree flags (its argparse would refuse them): the plugin registers the algorithm
``DDTREE`` and reads its budget, top-k and shadow-linear mode from environment variables
(names agreed with the plugin: PLUGIN_ENV). The 0.5.11 payload settles page size 1, overlap
off and (full tree, no backend named) triton itself; the plugin refuses a server without them,
so from 0.5.17 a DDTREE server is given them (PLUGIN_REQUIRED) unless extra_args names its
own. Everything else is the same flags in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from ddtree_deploy.settings.model import ServerSettings, named_attention_backends

PLUGIN_FROM = Version("0.5.17")  # the first SGLang the DDTree plugin serves (no payload flags)
DEFAULT_SGLANG = "0.5.11"  # when the version is not known: the payload's release
# What the plugin needs on the command line (it refuses a server without), unless extra_args
# names the flag itself; the backend only in full-tree mode and when none is named.
PLUGIN_REQUIRED: tuple[tuple[str, str | None], ...] = (
    ("--page-size", "1"), ("--disable-overlap-schedule", None))
PLUGIN_ENV = {
    "budget": "SGLANG_DDTREE_BUDGET",
    "topk": "SGLANG_DDTREE_TOPK",
    "shadow_linear": "SGLANG_DDTREE_SHADOW_LINEAR",
}


@dataclass(frozen=True)
class ServerCommand:
    """`python -m sglang.launch_server` arguments, and the variables the server is given:
    the deployment's `environment:` and the tool's own for the plugin, each sorted by name."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # the deployment's environment:
    plugin_env: tuple[tuple[str, str], ...] = ()  # SGLANG_DDTREE_* (SGLang >= 0.5.17)


def uses_plugin(sglang: str | None) -> bool:
    """Whether DDTree's settings travel as environment variables on this SGLang."""
    try:
        return Version(sglang or DEFAULT_SGLANG) >= PLUGIN_FROM
    except InvalidVersion:
        return False


def server_command(s: ServerSettings, sglang: str | None, *, port: int, bind_host: str,
                   draft_tokens: int | None) -> ServerCommand:
    """The one place a server's argv and environment are made (stable order)."""
    plugin = uses_plugin(sglang)
    env: dict[str, str] = {}
    args = ["--model-path", s.model, "--host", bind_host, "--port", str(port)]
    if s.tp_size != 1:
        args += ["--tp-size", str(s.tp_size)]
    if s.algorithm != "none":
        args += ["--speculative-algorithm", s.algorithm.upper()]
        if s.draft:
            args += ["--speculative-draft-model-path", s.draft]
        if draft_tokens is not None:
            args += ["--speculative-num-draft-tokens", str(draft_tokens)]
    if s.algorithm == "ddtree" and s.ddtree is not None:
        tree = s.ddtree
        if plugin:
            for key, value in (("budget", tree.budget), ("topk", tree.topk)):
                if value is not None:
                    env[PLUGIN_ENV[key]] = str(value)
            if tree.shadow_linear:
                env[PLUGIN_ENV["shadow_linear"]] = "1"
        else:
            if tree.budget is not None:
                args += ["--speculative-ddtree-budget", str(tree.budget)]
            if tree.topk is not None:
                args += ["--speculative-ddtree-topk", str(tree.topk)]
            if tree.shadow_linear:
                args += ["--speculative-ddtree-shadow-linear"]
    attention = s.attention_backend
    if plugin and s.full_tree and not named_attention_backends(attention, s.extra_args):
        attention = "triton"  # the plugin verifies the full tree with triton only
    if attention:
        args += ["--attention-backend", attention]
    if s.grammar_backend:
        args += ["--grammar-backend", s.grammar_backend]
    if s.sampling_backend:
        args += ["--sampling-backend", s.sampling_backend]
    if s.mem_fraction_static is not None:
        args += ["--mem-fraction-static", f"{s.mem_fraction_static:g}"]
    if s.context_length is not None:
        args += ["--context-length", str(s.context_length)]
    if not s.cuda_graph:
        args += ["--disable-cuda-graph"]
    if plugin and s.algorithm == "ddtree":
        named = {a.split("=", 1)[0] for a in s.extra_args}
        for flag, given in PLUGIN_REQUIRED:
            if flag not in named:
                args += [flag] if given is None else [flag, given]
    return ServerCommand(tuple(args + list(s.extra_args)), tuple(sorted(s.environment.items())),
                         tuple(sorted(env.items())))
