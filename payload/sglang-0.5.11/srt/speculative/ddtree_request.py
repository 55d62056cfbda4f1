"""DDTREE's admission on SGLang 0.5.11: the HTTP handlers' call into the shared rules.

``http_server.generate_request`` (/generate) and ``OpenAIServingBase.handle_request``
(/v1/completions, /v1/chat/completions, ...) call :func:`admit` with the ``GenerateReqInput``
before any token is produced and before a stream starts: a request DDTREE would serve
differently from plain decoding is answered with HTTP 400 naming the parameter and DDTREE
(``ddtree_admission.Refused`` is a ``ValueError``, which both handlers turn into a 400). The rules
themselves are ``ddtree_admission`` (payload/ddtree/admission.py), shared with the plugin for
later SGLang releases.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

from sglang.srt.speculative.ddtree_admission import check_request


def request_fields(obj: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """A dataclass request's fields and the defaults of those that have one."""
    fields: Dict[str, Any] = {}
    defaults: Dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        fields[f.name] = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            defaults[f.name] = f.default_factory()  # type: ignore[misc]
    return fields, defaults


def admit(server_args: Any, obj: Any) -> None:
    """Raise ``Refused`` (a ValueError) when a DDTREE server would serve ``obj`` differently."""
    if getattr(server_args, "speculative_algorithm", None) != "DDTREE":
        return
    if type(obj).__name__ != "GenerateReqInput" or not dataclasses.is_dataclass(obj):
        return  # embeddings, scores: no decoding
    fields, defaults = request_fields(obj)
    check_request(fields, defaults)
