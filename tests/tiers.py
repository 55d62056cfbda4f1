"""Test tiers: every collected test is in exactly one, marked with it (``-m unit`` selects one).

- unit: pure, in this process: no process started (no sshd, venv, pip, compiler, shell
  command, server or CLI in a subprocess), no lab. The whole tier runs in under a minute.
- integration: real processes: sshd on loopback, venvs, real wheels, compiled stand-ins, servers
  and the CLI run as subprocesses, commands through LocalTransport; and the end-to-end runs of the
  DDTree core on small models (pure, but minutes of torch).
- lab: the systemd-nspawn lab, and the lab's own machinery (its locks, mounts, namespaces).

A test's tier comes from what it uses: fixtures (by the file that defines them, so two fixtures
of one name in two modules are told apart), markers, and, for modules whose tests reach real
processes through helpers of their own rather than fixtures, the module. The heaviest evidence
wins. A test may also carry a tier marker itself: one heavier than its evidence is taken, one
lighter (``unit`` on a test that starts sshd) or two tier markers are refused at collection.
While a unit test runs, starting a process (subprocess, exec, spawn, fork) fails it, naming
the program: what it uses must put it in another tier. scripts/test.sh runs each tier by name
and checks that their union is the whole collection (``--tier-manifest FILE`` writes the ids a
session selected, with their tiers).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "integration", "lab")

# Evidence for a tier. Fixtures as "FILE::NAME" (FILE: where the fixture is defined); tests as
# "FILE::FUNCTION" (every parametrized case of it). Measured: the unit guard fails a unit test
# that starts a process, so an entry missing here shows as a failure naming the program.
LAB_FIXTURES = frozenset({"conftest.py::lab_session"})
LAB_MARKERS = frozenset({"lab"})
LAB_MODULES = frozenset({
    "test_lab_guard.py",  # the lab's lock and mount guard: real mounts (root)
    "test_lab_links.py",  # the lab's link shaping: tc and ip on real namespaces
})

INTEGRATION_FIXTURES = frozenset({
    "conftest.py::sshd",
    "conftest.py::openssh_control",
    "test_overlay_plan.py::venvs",  # real wheels into real venvs, stand-ins compiled
    "test_payload_integration.py::upstream",  # SGLang's real files from its wheel
    "test_payload_integration.py::patched",  # patch(1) applies the payload
    "test_rehearsal_carry.py::world",  # a git checkout and wheels built
    # the payload's Triton kernels: pure, but in Triton's CPU interpreter seconds a kernel
    "triton_interpret.py::kernel_device",
})
INTEGRATION_MARKERS = frozenset({"sshd", "slow"})
# Modules whose tests, nearly all, start processes: servers, the CLI, venvs, pip, uv, gcc, sshd.
INTEGRATION_MODULES = frozenset({
    "test_bench_cli.py", "test_bench_recommend.py", "test_bench_sweep.py",
    "test_ddtree_bench_smoke.py", "test_health_probe.py", "test_health_sampled.py",
    "test_cli_ctrl_c.py", "test_readonly_tool_dirs.py",
    "test_hostile_cli.py", "test_hostile_config.py", "test_hostile_environment.py",
    "test_hostile_yaml.py", "test_installer.py",
    "test_overlay_apply.py", "test_overlay_relay.py", "test_overlay_transfer.py",
    "test_packaging.py", "test_payload_cli.py", "test_payload_deploy.py", "test_payload_hostile.py",
    "test_payload_integration.py", "test_payload_plugin.py", "test_payload_upgrade.py",
    "test_plugin_releases.py",
    "test_payload_writes.py", "test_payload_plugin_writes.py",
    "test_probe_nvml.py",
    "test_probe_run.py", "test_quoting.py", "test_remote_bundle.py", "test_remote_runner.py",
    "test_standin_nvidia_smi.py", "test_standin_server.py", "test_standin_wheels.py",
    "test_transport_local.py",
    # pure, but the rehearsal's hand-set models run end to end in torch (half a minute)
    "test_rehearsal_models.py",
    # an HTTP server (a thread) that stalls for real, seconds at a time
    "test_health_stall.py",
    # SGLang's real sampler and request fields, read from its wheel
    "test_ddtree_sampling_sglang.py", "test_request_contract.py", "test_sliding_window_refusal.py",
    # the request-parameter phase against fake servers (HTTP servers in threads)
    "test_rehearsal_request_params.py",
})
# Single tests that start processes in modules of mostly unit tests (and the DDTree core's
# end-to-end decoding runs: pure, but the heaviest torch work of the suite).
INTEGRATION_TESTS = frozenset({
    "test_overlay_link_probe.py::test_the_probe_runs_on_the_host_and_a_cut_stream_is_an_error",
    "test_overlay_link_probe.py::test_the_sources_probe_runs_there_and_a_failing_python_is_an_error",
    "test_triton_interpret.py::test_a_kernel_calling_jit_functions_leaves_triton_language_as_it_was",
    "test_ddtree_core.py::test_lossless_with_a_different_drafter",
    "test_ddtree_core.py::test_lossless_and_accepting_with_the_target_as_drafter",
    "test_payload_runtime.py::test_sampled_walk_commits_the_targets_distribution",
    "test_payload_runtime.py::test_the_statistical_test_rejects_greedy_follow_and_a_biased_sampler",
    "test_bench_report.py::test_recommend_without_dflash_says_so",
    "test_bench_report.py::test_report_cli_writes_markdown_html_latex_and_labels_synthetic",
    "test_bench_report.py::test_report_of_a_missing_or_broken_file_exits_2",
    "test_overlay_plan.py::test_broken_venvs_are_refused_clearly",
    "test_overlay_plan.py::test_plan_apply_replan_is_a_noop",
    "test_overlay_plan.py::test_verify_reports_tampered_and_missing_files",
    "test_plainproc.py::test_start_detaches_into_its_own_group_and_stop_ends_the_group",
    "test_plainproc.py::test_start_reports_a_missing_executable",
    "test_plainproc.py::test_a_link_planted_where_the_log_goes_is_not_followed",
    "test_plainproc.py::test_stop_kills_a_main_process_that_ignores_sigterm",
    "test_plainproc.py::test_a_plain_process_gets_the_units_environment_not_the_callers",
    "test_probe_elf.py::test_needed_and_rpath_of_a_built_object",
    "test_probe_elf.py::test_reads_only_pages_it_needs",
    "test_probe_memo.py::test_the_probe_gives_the_same_facts_from_its_memo_and_sees_each_change",
    "test_probe_memo.py::test_the_probe_is_kept_compiled_by_its_hash_and_old_versions_go",
    "test_rehearsal_carry.py::test_repacked_wheel_installs_with_pip_target",
    "test_rehearsal_carry.py::test_requirement_check_script_reads_real_metadata",
    "test_rehearsal_carry.py::test_keep_and_strip_options_of_a_profile",
    "test_rehearsal_carry.py::test_tree_bytes_is_tracked_plus_untracked_not_ignored",
    "test_openssh_ciphers.py::test_the_local_client_accepts_what_is_offered",
    "test_rehearsal_run.py::test_faults_change_what_they_claim_and_nothing_without_them",
    "test_rehearsal_run.py::test_faults_reach_the_plugin_forms_modules",
    "test_service_tp_env.py::test_systemd_accepts_a_tp4_unit_with_environment",
    "test_signatures.py::test_real_dlopen_of_sgl_kernel_like_module_in_cu128_venv",
    "test_signatures.py::test_real_dlopen_without_driver_library",
    "test_signatures.py::test_real_undefined_c10_symbol",
    "test_units.py::test_verify_accepts_a_good_unit_silently",
    "test_units.py::test_verify_fails_on_a_bad_directive",
    "test_units.py::test_verify_fails_when_the_execstart_binary_is_missing",
})


# In CI a test may skip only for what the machine cannot have: a GPU (CUDA), or a kernel feature
# a container may lack. Any other skip (a tool, wheel or service the test command provides) fails
# the test there, saying so; elsewhere skips stay skips.
CI_MAY_SKIP = re.compile(r"GPU|CUDA|sock_diag", re.IGNORECASE)


def ci_skip_refused(reason: str, ci: bool) -> str | None:
    """The failure a skip for `reason` becomes in CI, or None where the skip stands."""
    if not ci or CI_MAY_SKIP.search(reason):
        return None
    return (f"skipped in CI: {reason} (in CI only what the machine cannot have, a GPU, may "
            "skip: scripts/setup.sh and the test command provide the rest; tests/tiers.py)")


def _fixture_keys(item: pytest.Item) -> set[str]:
    info = getattr(item, "_fixtureinfo", None)
    keys: set[str] = set()
    if info is None:
        return keys
    for name in item.fixturenames:  # type: ignore[attr-defined]
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        try:
            source = inspect.getsourcefile(defs[-1].func) or ""
        except TypeError:  # a builtin fixture
            continue
        keys.add(f"{Path(source).name}::{name}")
    return keys


def evidence(item: pytest.Item) -> str:
    """The tier that what ``item`` uses puts it in."""
    fixtures = _fixture_keys(item)
    markers = {m.name for m in item.iter_markers()}
    module = item.path.name
    if fixtures & LAB_FIXTURES or markers & LAB_MARKERS or module in LAB_MODULES:
        return "lab"
    function = getattr(item, "originalname", item.name)
    if (fixtures & INTEGRATION_FIXTURES or markers & INTEGRATION_MARKERS
            or module in INTEGRATION_MODULES or f"{module}::{function}" in INTEGRATION_TESTS):
        return "integration"
    return "unit"


def tier_of(item: pytest.Item) -> str:
    declared = sorted({m.name for m in item.iter_markers() if m.name in TIERS}, key=TIERS.index)
    found = evidence(item)
    if len(declared) > 1:
        raise pytest.UsageError(f"{item.nodeid}: in two tiers ({' and '.join(declared)}): "
                                "mark it with one")
    if declared and TIERS.index(declared[0]) < TIERS.index(found):
        raise pytest.UsageError(
            f"{item.nodeid}: marked {declared[0]}, but what it uses puts it in {found} "
            "(tests/tiers.py says why): drop the marker or what it uses")
    tier = declared[0] if declared else found
    if tier not in TIERS:  # evidence always names a tier; kept as the contract's last word
        raise pytest.UsageError(f"{item.nodeid}: in no tier")
    return tier


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        item.stash[TIER] = tier
        item.add_marker(getattr(pytest.mark, tier))


TIER = pytest.StashKey[str]()


def write_manifest(path: str, items: list[pytest.Item]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(f"{item.stash[TIER]} {item.nodeid}\n" for item in items))


class UnitGuard:
    """Records the processes a unit test starts (an audit hook on subprocess.Popen, os.exec*,
    os.posix_spawn, os.system, os.fork and os.forkpty: one per process, switched on per unit
    test)."""

    def __init__(self) -> None:
        self.current: list[str] | None = None
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.current is None:
            return
        if event in ("os.fork", "os.forkpty"):
            self.current.append("a fork")
        elif event == "os.system":  # (command,)
            self.current.append(self._what(args[0]) or "a shell command")
        elif event in ("subprocess.Popen", "os.exec", "os.posix_spawn"):
            # Popen: (executable, args, ...); exec and spawn: (path, argv, ...)
            self.current.append(self._what(args[1]) or "a process")

    @staticmethod
    def _what(argv: Any) -> str | None:
        if isinstance(argv, (str, bytes, os.PathLike)):
            words = os.fsdecode(argv).split()
        else:
            try:
                words = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a)
                         for a in argv]
            except TypeError:
                return None
        if not words:
            return None
        program = os.path.basename(words[0])
        for flag, module in zip(words[1:], words[2:], strict=False):
            if flag == "-m":
                return f"{program} -m {module}"
        return program
