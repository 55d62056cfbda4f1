"""The plugin's entry point: SGLang calls :func:`load` in every process it starts.

``load`` registers ``DDTREE`` with ``SpeculativeAlgorithm.register`` (official API, 0.5.12+),
its worker created lazily (only a process that builds a speculative worker imports torch-heavy
modules), and the request admission hook (``admission_hook``). It never raises: a plugin that
breaks start-up would break servers that do not use DDTREE. Instead:

* a release outside ``releases.SUPPORTED``: DDTREE is registered as a name whose server-args
  check refuses with the supported list (an unknown name would be SGLang's vaguer error);
* the request admission hook cannot be installed (``admission_hook.unready``): DDTREE is
  registered only to refuse at start, as requests it would serve differently would pass (and
  ``--tokenizer-worker-num`` above 1 is refused: those HTTP workers load no plugin; the
  streamed requests' part, ``http_admission``, refuses start-up itself where it fails);
* a SGLang that has its own DDTREE (upstream PR #29907): that one serves
  ``--speculative-algorithm DDTREE``; the plugin registers as ``DDTREE_PLUGIN`` and says so.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata
from typing import Any

from ddtree_sglang import __version__, compat, releases
from ddtree_sglang.settings import from_env

logger = logging.getLogger("ddtree_sglang")

NAME, FALLBACK_NAME = "DDTREE", "DDTREE_PLUGIN"


def sglang_version() -> str:
    return metadata.version("sglang")


def choose_name(algorithm_cls: type) -> tuple[str, str]:
    """(the name the plugin registers, who serves ``DDTREE``: "plugin" or "upstream")."""
    if NAME in getattr(algorithm_cls, "__members__", {}):
        return FALLBACK_NAME, "upstream"
    return NAME, "plugin"


def _refuser(why: str) -> Any:
    def validate(server_args: Any) -> None:
        raise ValueError(why)

    return validate


def register(version: str, algorithm_cls: type, registry: Any,
             refuse: str | None = None) -> str:
    """Register DDTREE on ``algorithm_cls`` (``SpeculativeAlgorithm``); returns the name used.

    ``registry`` is ``sglang.srt.speculative.spec_registry`` (``CustomSpecAlgo``, ``get_spec``);
    ``refuse``: a reason to register DDTREE only to refuse it at start."""
    name, serves = choose_name(algorithm_cls)
    if registry.get_spec(name) is not None:
        return name  # loaded twice in this process
    if serves == "upstream":
        logger.warning(
            "SGLang %s has its own DDTREE: --speculative-algorithm DDTREE is served by SGLang's "
            "implementation; ddtree-sglang-plugin %s is registered as %s.",
            version, __version__, FALLBACK_NAME)
    why = releases.refusal(version) or refuse
    if why is not None:
        logger.error("%s", why)
        algorithm_cls.register(name, supports_overlap=False,
                               validate_server_args=_refuser(why))(_refused_factory(why))
        return name
    from ddtree_sglang.spec import make_spec_class

    spec_class = make_spec_class(version, algorithm_cls, registry.CustomSpecAlgo)

    def validate(server_args: Any) -> None:
        from_env(os.environ)  # a bad setting fails before any model loads
        workers = getattr(server_args, "tokenizer_worker_num", 1) or 1
        if int(workers) > 1:  # its HTTP workers import the app afresh: no plugin loaded there
            raise ValueError(
                f"{name} needs --tokenizer-worker-num 1 (got {workers}): SGLang's extra HTTP "
                "worker processes load no plugin, so DDTREE's request admission would not run "
                "there")
        from ddtree_sglang.admission_hook import unapplied

        missing = unapplied(name)  # SGLang applied the hooks before parsing the server args
        if missing is not None:
            raise ValueError(missing)

    algorithm_cls.register(name, supports_overlap=False, validate_server_args=validate,
                           spec_class=spec_class)(worker_factory)
    logger.info("ddtree-sglang-plugin %s: %s registered on SGLang %s (serving %s).",
                __version__, name, version,
                "DDTREE" if serves == "plugin" else f"{FALLBACK_NAME}; DDTREE is SGLang's own")
    return name


def _refused_factory(why: str) -> Any:
    def factory(server_args: Any) -> type:
        raise ValueError(why)

    return factory


def worker_factory(server_args: Any) -> type:
    """The worker class (imported when a scheduler builds its speculative worker)."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    compat.check_worker_ctor(sglang_version(), DFlashWorkerV2)
    from ddtree_sglang.worker import DDTreeWorker

    return DDTreeWorker


def load() -> None:
    """Entry point (group ``sglang.srt.plugins``, name ``ddtree``)."""
    try:
        version = sglang_version()
        from sglang.srt.speculative import spec_registry
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except Exception as exc:  # never break start-up
        logger.error("ddtree-sglang-plugin: not loaded (%s: %s).", type(exc).__name__, exc)
        return
    if not hasattr(SpeculativeAlgorithm, "register"):
        logger.error("ddtree-sglang-plugin: SGLang %s has no SpeculativeAlgorithm.register; %s",
                     version, releases.refusal(version) or "")
        return
    from ddtree_sglang.admission_hook import install, unready

    hook_problem = unready() if releases.refusal(version) is None else None
    try:
        name = register(version, SpeculativeAlgorithm, spec_registry, refuse=hook_problem)
    except Exception as exc:
        logger.error("ddtree-sglang-plugin: DDTREE not registered (%s: %s).",
                     type(exc).__name__, exc)
        return
    if releases.refusal(version) is None and hook_problem is None:
        install(name)
