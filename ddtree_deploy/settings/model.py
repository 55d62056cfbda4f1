"""ServerSettings: how one SGLang server is started, as ONE strict model validated once.

A deployment of hosts.yaml, `service up`'s flags and a bench configuration all become this
model through settings.layers.merge (file, then flags). Each field has its range; the rules
between fields are validators here:

- ``ddtree:`` only with algorithm ddtree, and algorithm ddtree needs it (budget and topk);
- a draft model with every speculative algorithm (skipped for a partial layer: a bench
  configuration alone);
- attention backends per algorithm: full-tree DDTREE verifies with triton only (the payload and
  the plugin refuse any other backend at start), in the field and in extra_args alike; DFLASH
  takes any (SGLang 0.5.11's server_args checks none for it);
- what SGLang or the payload refuses at start, said first: DDTREE with a page size other than
  1, DFLASH and DDTREE with --enable-dp-attention or a --pp-size other than 1.

Rules that need the host's facts run when a HostFit is given as the validation context
(``context={"host": fit}``): the verify width against the drafter's block size
(``budget + 1 >= block`` in full-tree mode) and tensor parallelism against the GPUs present.
Their errors have the type ``host_fit`` (settings.layers raises them as RefusedError, exit 1);
every other error is bad input (exit 2), found before any host is contacted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from ddtree_deploy.settings.values import (
    Algorithm,
    AttentionBackend,
    EnvName,
    EnvValue,
    Fraction,
    GpuCount,
    GpuIndex,
    GrammarBackend,
    Port,
    PosInt,
    RemotePath,
    SamplingBackend,
    ServerArg,
    StrictModel,
    TreeSize,
)

RULE = "settings_rule"  # the error type of a rule between fields (its message says it all)
HOST_FIT = "host_fit"  # the error type of a rule that needs the host's facts
DFLASH_BLOCK = 16  # without the drafter's config.json: the z-lab *-DFlash-b16 drafters' block
ATTENTION_FLAGS = ("--attention-backend", "--prefill-attention-backend",
                   "--decode-attention-backend")
# What a field is called on `service up`'s command line (the merge names flags by these).
FLAGS: dict[tuple[str, ...], str] = {
    ("algorithm",): "--algorithm", ("model_path",): "--model-path",
    ("draft_model_path",): "--draft-model-path", ("ddtree", "budget"): "--ddtree-budget",
    ("ddtree", "topk"): "--ddtree-topk",
    ("attention_backend",): "--attention-backend", ("grammar_backend",): "--grammar-backend",
    ("sampling_backend",): "--sampling-backend",
    ("mem_fraction_static",): "--mem-fraction-static", ("gpu",): "--gpu", ("port",): "--port",
}  # fmt: skip


class DdtreeSettings(StrictModel):
    """DDTree's own settings; budget and topk are required (a rule of ServerSettings, so a
    layer may give one of them and another layer the other)."""

    budget: TreeSize | None = None  # tree nodes verified per round (verify width budget + 1)
    topk: TreeSize | None = None  # candidates kept per depth
    shadow_linear: bool = False  # build and score the tree, verify the linear chain


@dataclass(frozen=True)
class HostFit:
    """What the host-fact rules read from the facts (the caller derives it from them)."""

    host: str
    draft_block: int | None = None  # the drafter's block size (config.json, else 16)
    block_from: str = "the drafter's config.json"
    gpu_count: int | None = None  # GPUs present (None: not known)
    deployment: str | None = None  # named in the remedies


def verify_width_problem(budget: int, block: int) -> str | None:
    """Why a full-tree DDTREE budget cannot serve a drafter of ``block`` tokens, or None.

    The verify width is budget + 1 tokens per request per round (root + budget nodes); SGLang
    sizes the round's KV slots, the req-to-token rows and the CUDA graphs from it."""
    width = budget + 1
    if width >= block:
        return None
    return (f"DDTREE budget {budget} gives a verify width of {width} tokens per request per "
            f"round (root + budget nodes), below the drafter's block size {block}: SGLang "
            f"reserves {width} KV slots per running request per round and sizes the "
            f"req-to-token rows and the CUDA graphs ({width} x batch size tokens) for them, "
            f"while the drafter writes {block} per request unchecked; under memory pressure "
            "\"DFLASH draft OOM\" kills the scheduler, and near the context limit a request's "
            "row can be overwritten")


def verify_width_remedy(deployment: str, block: int) -> str:
    return (f"set deployments.{deployment}.ddtree.budget in hosts.yaml to at least {block - 1} "
            "(--speculative-ddtree-budget), then run `ddtree-deploy apply`: each node of budget "
            "costs one more KV slot per running request per round and widens every captured "
            "CUDA graph by the batch size in tokens; or set ddtree.shadow_linear: true "
            f"(verify width = the block size {block})")


def named_attention_backends(attention_backend: str | None,
                             extra_args: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The attention backends a server is given: the field and any flag in extra_args."""
    named: dict[str, str] = {}
    if attention_backend:
        named["--attention-backend"] = attention_backend
    args = list(extra_args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in ATTENTION_FLAGS:
            if not eq and i + 1 < len(args):
                value = args[i + 1]
            if value:
                named[flag] = value
    return named


Problem = tuple[tuple[str | int, ...], str, Any]  # (field path, message, the value)

# SGLang flags (with their argparse aliases) the tool sets itself from a field or from the
# host's facts: in extra_args, argparse's last-wins would quietly replace what the rules
# checked (the bind the API-key rule saw, the port the health probe polls, the GPUs chosen for
# tp_size, the models whose configs were checked, the algorithm, the API key's --config file).
TOOL_FLAGS: dict[str, str] = {
    "--host": "bind", "--port": "port", "--model-path": "model_path", "--model": "model_path",
    "--tp-size": "tp_size", "--tensor-parallel-size": "tp_size",
    "--speculative-algorithm": "algorithm",
    "--speculative-draft-model-path": "draft_model_path",
    "--speculative-draft-model": "draft_model_path",
    "--config": "api_key_file",
}


# Flags a rule reads from extra_args by their full names (and TOOL_FLAGS'). SGLang's parser is
# argparse with abbreviations allowed: `--po 1` or `--page-s=16` reach --port and --page-size
# past a check of full names, so a prefix of one of these is refused (a prefix shared with
# another SGLang flag is one argparse refuses too, as ambiguous).
CHECKED_FLAGS = ("--enable-dp-attention", "--pp-size", "--pipeline-parallel-size",
                 "--page-size", *ATTENTION_FLAGS)


def abbreviated_flag(arg: str) -> str | None:
    """The checked or tool-set flag `arg` (`--opt`, `--opt=V`) abbreviates, if any: the
    first in order when it abbreviates several."""
    option = arg.split("=", 1)[0]
    if not option.startswith("--") or len(option) <= 2 or option in TOOL_FLAGS \
            or option in CHECKED_FLAGS:
        return None
    return next((flag for flag in (*TOOL_FLAGS, *CHECKED_FLAGS) if flag.startswith(option)),
                None)


def flag_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value `args` give `flag` (`--flag V` or `--flag=V`), the last one; None if absent."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == flag:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return found


def _error(loc: tuple[str | int, ...], message: str, value: Any, kind: str = RULE,
           hint: str | None = None) -> InitErrorDetails:
    ctx: dict[str, Any] = {"error": message}
    if hint is not None:
        ctx["hint"] = hint
    return InitErrorDetails(type=PydanticCustomError(kind, "{error}", ctx), loc=loc,
                            input=value)


class ServerSettings(StrictModel):
    """How SGLang is started: everything its command line and environment are made of,
    except what the host decides (the GPUs and port chosen, the venv's library folders)."""

    algorithm: Algorithm = "none"
    model_path: RemotePath | None = None  # None: the host's models.default (merged in first)
    draft_model_path: RemotePath | None = None
    ddtree: DdtreeSettings | None = None
    attention_backend: AttentionBackend | None = None
    grammar_backend: GrammarBackend | None = None
    sampling_backend: SamplingBackend | None = None
    mem_fraction_static: Fraction | None = None
    context_length: PosInt | None = None
    tp_size: GpuCount = 1
    gpu: GpuIndex | None = None  # the first GPU (None: chosen from the facts)
    port: Port | None = None  # None: chosen from the facts
    cuda_graph: bool = True
    extra_args: list[ServerArg] = Field(default_factory=list)
    # Environment= lines of the unit (NCCL, CUDA variables a site's hardware needs)
    environment: dict[EnvName, EnvValue] = Field(default_factory=dict)

    @property
    def gpu_indices(self) -> range | None:
        """The GPUs this service uses (gpu .. gpu+tp_size-1), None while gpu is not chosen."""
        return None if self.gpu is None else range(self.gpu, self.gpu + self.tp_size)

    @property
    def full_tree(self) -> bool:
        """DDTREE verifying the whole tree (not shadow-linear)."""
        return self.algorithm == "ddtree" and not (self.ddtree and self.ddtree.shadow_linear)

    @property
    def model(self) -> str:
        """The target model's path (the merge makes sure there is one)."""
        assert self.model_path is not None, "settings merged without a model path"
        return str(self.model_path)

    @property
    def draft(self) -> str | None:
        """The draft model's path when a speculative algorithm uses one."""
        if self.algorithm == "none" or self.draft_model_path is None:
            return None
        return str(self.draft_model_path)

    def server_fields(self) -> dict[tuple[str, ...], Any]:
        """Every field of the server's settings set here, by path (a layer's values)."""
        out: dict[tuple[str, ...], Any] = {}
        for name in ServerSettings.model_fields:
            if name not in self.model_fields_set:
                continue
            value = getattr(self, name)
            if name == "ddtree" and value is not None:
                for key in value.model_fields_set:
                    out[("ddtree", key)] = getattr(value, key)
            else:
                out[(name,)] = value
        return out

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> ServerSettings:
        """Context: ``defer`` (hosts.yaml's loader runs rule_problems() after its own type
        checks), ``partial`` (no draft needed), ``complete`` (a model needed), ``host``."""
        context = info.context or {}
        if context.get("defer"):
            return self
        errors = [_error(loc, message, value) for loc, message, value in
                  self._input_problems(partial=bool(context.get("partial")),
                                       complete=bool(context.get("complete")))]
        fit = context.get("host")
        if not errors and isinstance(fit, HostFit):
            errors = self._host_rules(fit)
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    def rule_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """The rules between fields, as (field path, message): for a loader that validated
        the types first with ``context={"defer": True}``."""
        return [(loc, message) for loc, message, _ in
                self._input_problems(partial=False, complete=False)]

    def _input_problems(self, *, partial: bool, complete: bool) -> list[Problem]:
        errors: list[Problem] = []
        if complete and self.model_path is None:
            errors.append((("model_path",), "required: no model_path in the deployment, no "
                           "--model-path and no models.default on the host", None))
        if self.ddtree is not None and self.algorithm != "ddtree":
            errors.append((("ddtree",), "only allowed with algorithm: ddtree, got algorithm: "
                           f"{self.algorithm}", self.ddtree.model_dump()))
        if self.algorithm == "ddtree" and self.ddtree is None:
            errors.append((("algorithm",), "ddtree needs a ddtree: block with budget and topk",
                           self.algorithm))
        if self.algorithm == "ddtree" and self.ddtree is not None:
            for key in ("budget", "topk"):
                if getattr(self.ddtree, key) is None:
                    errors.append((("ddtree", key), "required with algorithm ddtree", None))
        if not partial and self.algorithm != "none" and self.draft_model_path is None:
            errors.append((("draft_model_path",), f"required with algorithm {self.algorithm} "
                           "(the draft model)", None))
        if self.algorithm != "none":  # SGLang 0.5.11's server_args refuses both for DFLASH
            label = self.algorithm.upper()
            if "--enable-dp-attention" in self.extra_args:
                errors.append((("extra_args",), f"{label} does not support "
                               "--enable-dp-attention (SGLang refuses it at start)",
                               "--enable-dp-attention"))
            for flag in ("--pp-size", "--pipeline-parallel-size"):
                pipeline = flag_value(self.extra_args, flag)
                if pipeline is not None and pipeline != "1":
                    errors.append((("extra_args",), f"{label} supports only --pp-size 1 "
                                   f"(SGLang refuses another at start), got {flag} {pipeline}",
                                   pipeline))
        for arg in self.extra_args:
            option = arg.split("=", 1)[0]
            if option in TOOL_FLAGS:
                errors.append((("extra_args",), f"{option} is set by ddtree-deploy itself "
                               f"(from {TOOL_FLAGS[option]}); give {TOOL_FLAGS[option]} instead "
                               "of the flag", option))
            elif (full := abbreviated_flag(arg)) is not None:
                reason = (f"which ddtree-deploy sets itself (from {TOOL_FLAGS[full]}): give "
                          f"{TOOL_FLAGS[full]} instead of the flag" if full in TOOL_FLAGS else
                          "which the settings' rules check: write its full name")
                errors.append((("extra_args",), f"{option} abbreviates {full} (SGLang's "
                               f"argparse takes any unambiguous prefix), {reason}", option))
        page = flag_value(self.extra_args, "--page-size")
        if self.algorithm == "ddtree" and page is not None and page != "1":
            errors.append((("extra_args",), "DDTREE needs --page-size 1 (accepted tree nodes "
                           f"are not contiguous in the verify block), got --page-size {page}",
                           page))
        if self.full_tree:
            for flag, value in named_attention_backends(self.attention_backend,
                                                        self.extra_args).items():
                if value == "triton":
                    continue
                loc: tuple[str, ...] = ("attention_backend",) if flag == "--attention-backend" \
                    else ("extra_args",)
                errors.append((loc, "full-tree DDTREE verification needs the triton attention "
                               f"backend, got {flag} {value}: name triton (or none), or set "
                               "ddtree.shadow_linear: true to verify the linear chain only",
                               value))
        return errors

    def _host_rules(self, fit: HostFit) -> list[InitErrorDetails]:
        errors: list[InitErrorDetails] = []
        if self.full_tree and self.ddtree is not None and self.ddtree.budget is not None \
                and fit.draft_block is not None:
            problem = verify_width_problem(self.ddtree.budget, fit.draft_block)
            if problem is not None:
                errors.append(_error(("ddtree", "budget"), problem, self.ddtree.budget, HOST_FIT,
                                     verify_width_remedy(fit.deployment or "NAME",
                                                         fit.draft_block)))
        if fit.gpu_count is not None and self.tp_size > fit.gpu_count:
            errors.append(_error(
                ("tp_size",), f"tp {self.tp_size} needs {self.tp_size} GPUs; {fit.host} has "
                f"only {fit.gpu_count} GPU(s)", self.tp_size, HOST_FIT,
                "deploy to a host with more GPUs, or lower tp_size"))
        return errors
