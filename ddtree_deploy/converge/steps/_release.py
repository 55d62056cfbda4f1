"""The sglang release a deployment declares, checked before any step acts: the DDTree payload
serves it (the matrix: the patch set's versions and the plugin's), and no pin of hosts.yaml
conflicts with the release's own (its wheel's Requires-Dist). Both refuse the plan (exit 2)
naming hosts.yaml's field and the supported list or every conflicting pin.
"""

from __future__ import annotations

from ddtree_deploy.converge.steps import Planning
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.rules.release_pins import conflicts, missing


def refuse_unsupported(ctx: Planning) -> str:
    """The form the declared release takes ('patch' or 'plugin'); refused outside the matrix."""
    from ddtree_deploy.rules.matrix import shipped_matrix

    d = ctx.deployment
    matrix = shipped_matrix()
    form = matrix.form(d.sglang.version)
    if form is None:
        raise ConfigError(f"{ctx.config.path}: deployments.{d.name}.sglang.version: "
                          f"{matrix.refusal(d.sglang.version)}",
                          hint="set sglang.version to a supported release (or algorithm to "
                               "something other than ddtree, or payload: false)")
    return form


def refuse_conflicts(ctx: Planning) -> None:
    d = ctx.deployment
    python = (ctx.basis.python_version if ctx.basis is not None else None) or "3.11"
    found = conflicts(d.sglang.version, [str(x) for x in d.sglang.extra_packages], python)
    if found:
        lines = "\n".join(f"  {c.pin}: sglang {d.sglang.version} requires {c.release}"
                          for c in found)
        raise ConfigError(f"{ctx.config.path}: deployments.{d.name}.sglang.extra_packages: "
                          f"{len(found)} pin(s) conflict with sglang {d.sglang.version}'s own "
                          f"(from {found[0].source}):\n{lines}",
                          hint="change or drop these pins in hosts.yaml")


def lacking(ctx: Planning) -> str | None:
    """What apply leaves out: the requirements the release adds to the installed one's that
    the venv lacks (sglang is installed with --no-deps; the lane and the extras bring its
    dependencies)."""
    d = ctx.deployment
    have = ctx.basis.distributions if ctx.basis is not None else {}
    python = (ctx.basis.python_version if ctx.basis is not None else None) or "3.11"
    installed = have.get("sglang")
    names = missing(d.sglang.version, installed, have,
                    [str(x) for x in d.sglang.extra_packages], python)
    if not names:
        return None
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (f"sglang {d.sglang.version} adds {len(names)} requirement(s) to {installed}'s that "
            f"the venv lacks ({shown}); apply installs sglang without its dependencies "
            "(--no-deps): list the ones the service needs in sglang.extra_packages")
