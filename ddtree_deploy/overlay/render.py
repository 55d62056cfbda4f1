"""`overlay --dry-run`: the plan as a table, one row per distribution.

For each distribution: the action and versions, how many of its files would be
replaced (sent over a path it already has), added (sent to a new path), removed
(old files the new version lacks) and kept, and the bytes its new files need.
The footer gives the bytes still to send after the workstation cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddtree_deploy.cli.text import plain
from ddtree_deploy.overlay.model import DistChange, OverlayPlan
from ddtree_deploy.overlay.plan import unique_send

_STYLE = {"replace": "yellow", "add": "green", "remove": "red", "same": "dim"}


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; exact bytes below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


@dataclass(frozen=True)
class ChangeCounts:
    """What one distribution's change does to files on the target."""

    replaced: int
    added: int
    removed: int
    kept: int
    send_bytes: int


def counts(change: DistChange) -> ChangeCounts:
    old = set(change.backup)
    replaced = sum(1 for f in change.send if f.path in old)
    return ChangeCounts(
        replaced=replaced,
        added=len(change.send) - replaced,
        removed=len(change.delete),
        kept=len(change.keep),
        send_bytes=sum(f.size for f in change.send),
    )


def _versions(change: DistChange) -> str:
    if change.action in ("same", "add"):
        return change.new_version or ""
    if change.action == "remove":
        return change.old_version or ""
    return f"{change.old_version} -> {change.new_version}"


def plan_table(plan: OverlayPlan, *, show_same: bool = True) -> Table:
    # Paths and names are text, never markup; columns fold at 80 columns instead of cutting.
    table = Table(title=Text(plain(f"overlay {plan.lane}: {plan.source.host}:{plan.source.venv}"
                                   f" -> {plan.target.host}:{plan.target.venv}")),
                  title_justify="left")
    table.add_column("distribution", overflow="fold")
    table.add_column("action", overflow="fold")
    table.add_column("version", overflow="fold")
    for name in ("replaced", "added", "removed", "kept", "to send"):
        table.add_column(name, justify="right", overflow="fold")
    for change in plan.changes:
        if change.action == "same" and not show_same:
            continue
        c = counts(change)
        table.add_row(
            Text(plain(change.name)),
            Text(change.action, style=_STYLE[change.action]),
            Text(plain(_versions(change))),
            str(c.replaced),
            str(c.added),
            str(c.removed),
            str(c.kept),
            human_bytes(c.send_bytes),
        )
    return table


def summary_lines(plan: OverlayPlan) -> list[str]:
    by_action: dict[str, int] = {}
    for change in plan.changes:
        by_action[change.action] = by_action.get(change.action, 0) + 1
    parts = [f"{by_action[a]} {a}" for a in ("replace", "add", "remove", "same") if a in by_action]
    unique = unique_send(plan)
    total = sum(unique.values())
    lines = [
        f"distributions: {', '.join(parts) or 'none'}",
        f"to send: {human_bytes(plan.bytes_to_send)} ({plan.bytes_to_send} bytes) of "
        f"{human_bytes(total)} in {len(unique)} distinct files; "
        f"{human_bytes(total - plan.bytes_to_send)} already in the workstation cache",
        f"plan id: {plan.id}",
    ]
    if all(c.action == "same" for c in plan.changes):
        lines.insert(0, "nothing to do: the target already holds this lane")
    return lines


def render_plan(plan: OverlayPlan, console: Console, *, show_same: bool = True) -> None:
    """Print the dry-run view of ``plan``."""
    console.print(plan_table(plan, show_same=show_same))
    for line in summary_lines(plan):
        console.print(plain(line), markup=False, highlight=False)
