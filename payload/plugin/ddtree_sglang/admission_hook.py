"""DDTREE's request admission in the plugin form: the shared ``ddtree.admission`` rules, run
by a BEFORE hook on ``TokenizerManager.generate_request`` (SGLang's ``HookRegistry``, applied by
``load_plugins`` in the server's main process, where requests arrive).

A request DDTREE would serve differently from plain decoding raises ``ddtree.admission.Refused``
(a ``ValueError``: SGLang answers it with HTTP 400) before it reaches the scheduler; requests to a
server of another algorithm pass untouched. SGLang's streaming routes call the tokenizer manager
only once the stream has started (HTTP 200), so an AFTER hook on ``TokenizerManager.__init__``
installs ``http_admission`` in the process that serves HTTP, which refuses streamed requests
before that; a DDTREE server where it cannot be installed does not start.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

logger = logging.getLogger("ddtree_sglang")

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
INIT_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.__init__"


def request_fields(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request dataclass's fields and their defaults."""
    fields, defaults = {}, {}
    for field in dataclasses.fields(obj):
        fields[field.name] = getattr(obj, field.name)
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return fields, defaults


def serves(manager: Any, name: str) -> bool:
    algorithm = getattr(getattr(manager, "server_args", None), "speculative_algorithm", None)
    return str(algorithm or "").upper() == name


def make_hook(name: str) -> Any:
    from ddtree.admission import check_request

    def before(manager: Any, obj: Any, *args: Any, **kwargs: Any) -> None:
        if not serves(manager, name) or not dataclasses.is_dataclass(obj):
            return None
        if type(obj).__name__ != "GenerateReqInput":
            return None
        fields, defaults = request_fields(obj)
        check_request(fields, defaults)
        return None

    return before


def make_init_hook(name: str) -> Any:
    """AFTER hook on ``TokenizerManager.__init__``: on a DDTREE server, the streamed requests'
    admission (``http_admission.install``); raises, so the server does not start, where it
    cannot be installed."""

    def after(result: Any, manager: Any, *args: Any, **kwargs: Any) -> None:
        if not serves(manager, name):
            return None
        from ddtree_sglang import http_admission

        try:
            http_admission.install(name)
        except http_admission.NotInstalled as exc:
            raise RuntimeError(
                f"{name} refused: its admission of streamed requests cannot be installed in "
                f"SGLang's HTTP server ({exc}); without it a streamed request {name} would serve "
                "differently from plain decoding would get HTTP 200 and an error event instead "
                "of a 400. Reinstall ddtree-sglang-plugin or use a supported SGLang release."
            ) from exc
        return None

    return after


def unready() -> str | None:
    """Why the hook cannot be installed in this process, or None. Without the hook a request
    DDTREE would serve differently would be served, not refused: DDTREE is then refused at
    start instead (fail closed)."""
    try:
        import ddtree.admission  # noqa: F401
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: F401
    except ImportError as exc:
        return (f"DDTREE's request admission cannot be installed ({exc}): without it a request "
                "DDTREE would serve differently from plain decoding would not be refused; "
                "reinstall ddtree-sglang-plugin")
    return None


def unapplied(name: str) -> str | None:
    """Why the admission hooks are not in place in this process, or None. SGLang applies the
    hooks (``load_plugins``) before it parses the server args, where DDTREE's check calls this;
    a target it could not patch is only logged by SGLang, and DDTREE would then serve requests
    it must refuse. None as well where SGLang's hook registry is not loaded in this process
    (nothing applies hooks here; ``unready`` covers a registry that cannot be imported)."""
    registry = sys.modules.get("sglang.srt.plugins.hook_registry")
    patched = getattr(getattr(registry, "HookRegistry", None), "_patched", None)
    if not isinstance(patched, set):
        return None
    missing = [t for t in (TARGET, INIT_TARGET) if t not in patched]
    if not missing:
        return None
    return (f"{name} refused: SGLang did not apply its request admission hooks to "
            f"{', '.join(missing)} (see the log's 'Failed to apply hooks'); requests {name} "
            "would serve differently from plain decoding would not be refused")


def install(name: str) -> bool:
    """Register the hooks (before SGLang applies hooks); False where they cannot be."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        hooks = {TARGET: (make_hook(name), HookType.BEFORE),
                 INIT_TARGET: (make_init_hook(name), HookType.AFTER)}
    except ImportError as exc:
        logger.error("DDTREE admission hook not installed (%s); requests are not checked.", exc)
        return False
    for target, (hook, kind) in hooks.items():
        listed = getattr(HookRegistry, "_hooks", {}).get(target, [])
        if any(getattr(entry[1], "ddtree_admission", None) == name for entry in listed):
            continue  # the plugin loaded twice in this process: one hook is enough
        hook.ddtree_admission = name
        HookRegistry.register(target, hook, kind)
    return True
