"""The shape of a saved plan (`plan --out FILE`), checked before `apply --plan FILE` reads it.

A saved plan is a file the user hands back: edited, damaged or forged, it is refused here,
with the field that is wrong, and never reaches apply as an `errors` entry that is no mapping
(a traceback in apply's worker), a step whose title is a number or a time that is infinite
(`time.localtime` raises on the confirmation screen). Only the shape is checked: what the
plan is pinned to (the tool version, the specs, each host's facts) is apply's to check.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr
from pydantic import ValidationError as _ValidationError

from ddtree_deploy.isotime import epoch
from ddtree_deploy.settings.messages import english


def _time(value: float | str) -> float | str:
    try:
        seconds = epoch(value)
    except (ValueError, OverflowError):
        raise ValueError("expected an ISO-8601 time") from None
    if not math.isfinite(seconds) or not 0 <= seconds < 1e11:  # before the year 5138
        raise ValueError("expected a time after 1970, as plan writes it")
    return value


Time = Annotated[StrictStr | float, AfterValidator(_time)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SavedError(_Strict):
    model_config = ConfigDict(extra="allow", strict=True)

    error: StrictStr
    exit_code: StrictInt = 1


class SavedStep(_Strict):
    kind: StrictStr
    host: StrictStr
    deployment: StrictStr
    title: StrictStr
    reason: StrictStr
    changes: list[StrictStr] = []
    satisfied: StrictBool = False
    params: dict[StrictStr, Any] | None = None


class SavedPlan(_Strict):
    model_config = ConfigDict(extra="ignore", strict=True)  # "changes": a count, for readers

    hosts: list[StrictStr]
    fingerprints: dict[StrictStr, StrictStr]
    steps: list[SavedStep]
    made_at: Time = 0.0
    errors: dict[StrictStr, SavedError] | None = None
    specs: dict[StrictStr, dict[StrictStr, StrictStr]] | None = None
    tool_version: StrictStr | None = None
    facts_at: dict[StrictStr, Time] | None = None


def check_saved_plan(data: Any) -> None:
    """ValueError naming the first field of `data` that is not a saved plan's."""
    try:
        SavedPlan.model_validate(data)
    except _ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise ValueError(f"{where}: {english(first, SavedPlan)}") from None
