"""Payload upgrade in place (issue 12, deliverable 6): a venv holding another payload version or
content, or payload files changed since, is upgraded from its backup's upstream originals, and
rollback still gives back the venv as it was before any payload. The planner shows it as a
payload.upgrade step (old -> new) followed by the unit and a restart. Local transport, a fake
sglang in a tmp venv, small payloads (tests/payload_fakes.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from payload_fakes import UPSTREAM, VERIFY_FAIL, fake_venv, package, payload_folder, sha, tree
from test_converge_plan import V, facts, installed_unit, pending

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.converge.hoststate import HostState
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.converge.steps import fingerprint
from ddtree_deploy.errors import DeployError, RefusedError
from ddtree_deploy.facts.model import PayloadInfo
from ddtree_deploy.payload import deploy as ops
from ddtree_deploy.payload.manifest import load_manifest, shipped_identity
from ddtree_deploy.remote.facts_sglang import payload_state
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.transport.local import LocalTransport

SPEC = "srt/speculative/spec_info.py"
ARGS = "srt/server_args.py"
WORKER = "srt/speculative/ddtree_worker.py"
EXTRA = "srt/speculative/ddtree_extra.py"


def state_of(venv: Path) -> dict:
    return json.loads((venv / ".ddtree-deploy/payload.json").read_text())


def backups(venv: Path) -> list[Path]:
    folder = venv / ".ddtree-deploy/backups"
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.fixture()
def venv(tmp_path: Path) -> Path:
    return fake_venv(tmp_path)


def test_older_version_upgraded_in_place_and_rollback_gives_upstream(
        tmp_path: Path, venv: Path) -> None:
    upstream = tree(package(venv))
    old, old_dir = load_manifest(payload_folder(tmp_path, version="0.1.0", worker="W = 1\n"))
    new, new_dir = load_manifest(payload_folder(tmp_path, version="0.2.0", worker="W = 2\n",
                                                extra_file=False, args_patch=False))
    with LocalTransport() as t:
        assert ops.deploy(t, str(venv), old, old_dir).action == "deployed"
        first_backup = backups(venv)
        assert (package(venv) / EXTRA).is_file() and state_of(venv)["version"] == "0.1.0"
        out = ops.deploy(t, str(venv), new, new_dir)
        assert out.action == "upgraded" and out.payload == "0.2.0"
        assert out.previous is not None and out.previous.startswith("ddtree 0.1.0")
        assert [c.status for c in out.checks] == ["passed"]
        pkg = package(venv)
        assert "DDTREE" in (pkg / SPEC).read_text()  # patched from the backup's original
        assert (pkg / WORKER).read_text() == "W = 2\n"
        assert not (pkg / EXTRA).exists()  # the old payload's file the new one does not ship
        assert sha((pkg / ARGS).read_bytes()) == sha(UPSTREAM[ARGS])  # back to upstream
        st = state_of(venv)
        assert st["version"] == "0.2.0" and st["digest"] == new.digest(new_dir, "0.5.11")
        assert set(st["files"]) == {SPEC, WORKER}
        assert backups(venv) == first_backup  # one backup: the true upstream originals
        assert ops.deploy(t, str(venv), new, new_dir).action == "unchanged"
        assert ops.rollback(t, str(venv)).action == "rolled back"
    assert tree(package(venv)) == upstream
    assert backups(venv) == [] and not (venv / ".ddtree-deploy/payload.json").exists()


def test_same_version_other_content_is_upgraded(tmp_path: Path, venv: Path) -> None:
    a, a_dir = load_manifest(payload_folder(tmp_path, worker="W = 'a'\n"))
    b, b_dir = load_manifest(payload_folder(tmp_path, worker="W = 'b'\n"))
    assert a.version == b.version and a.digest(a_dir, "0.5.11") != b.digest(b_dir, "0.5.11")
    with LocalTransport() as t:
        ops.deploy(t, str(venv), a, a_dir)
        out = ops.deploy(t, str(venv), b, b_dir)
    assert out.action == "upgraded" and (package(venv) / WORKER).read_text() == "W = 'b'\n"


def test_changed_payload_files_are_repaired_from_the_originals(tmp_path: Path,
                                                               venv: Path) -> None:
    m, folder = load_manifest(payload_folder(tmp_path))
    with LocalTransport() as t:
        ops.deploy(t, str(venv), m, folder)
        want = tree(package(venv))
        (package(venv) / SPEC).write_text(UPSTREAM[SPEC])  # as a killed install or pip leaves it
        (package(venv) / WORKER).write_text("edited by hand\n")
        out = ops.deploy(t, str(venv), m, folder)
    assert out.action == "repaired"
    assert tree(package(venv)) == want


def test_upgrade_from_an_earlier_tools_state_and_backup(tmp_path: Path, venv: Path) -> None:
    """An earlier ddtree-deploy wrote no digest or package in the state and a flat backup
    manifest {rel: sha256 | None}: that host is upgraded, and rolls back to upstream."""
    upstream = tree(package(venv))
    m, folder = load_manifest(payload_folder(tmp_path, version="0.1.0"))
    new, new_dir = load_manifest(payload_folder(tmp_path, version="0.2.0", worker="W = 9\n"))
    with LocalTransport() as t:
        ops.deploy(t, str(venv), m, folder)
        st = state_of(venv)
        for key in ("digest", "package"):
            del st[key]
        (venv / ".ddtree-deploy/payload.json").write_text(json.dumps(st))
        manifest_json = Path(st["backup"]) / "manifest.json"
        originals = json.loads(manifest_json.read_text())["originals"]
        manifest_json.write_text(json.dumps({r: e and e["sha256"] for r, e in originals.items()}))
        assert ops.deploy(t, str(venv), new, new_dir).action == "upgraded"
        assert (package(venv) / WORKER).read_text() == "W = 9\n"
        ops.rollback(t, str(venv))
    assert tree(package(venv)) == upstream


def test_failed_verify_of_an_upgrade_rolls_back_to_upstream(tmp_path: Path,
                                                            venv: Path) -> None:
    upstream = tree(package(venv))
    old, old_dir = load_manifest(payload_folder(tmp_path, version="0.1.0"))
    bad, bad_dir = load_manifest(payload_folder(tmp_path, version="0.2.0", verify=VERIFY_FAIL))
    with LocalTransport() as t:
        ops.deploy(t, str(venv), old, old_dir)
        with pytest.raises(DeployError, match="rolled back to the upstream files"):
            ops.deploy(t, str(venv), bad, bad_dir)
    assert tree(package(venv)) == upstream and backups(venv) == []


def test_a_backup_of_other_originals_than_the_new_payload_patches_is_refused(
        tmp_path: Path, venv: Path) -> None:
    old, old_dir = load_manifest(payload_folder(tmp_path, version="0.1.0"))
    folder = payload_folder(tmp_path, version="0.2.0")
    text = (folder / "payload.yaml").read_text().replace(sha(UPSTREAM[SPEC]), "a" * 64)
    (folder / "payload.yaml").write_text(text)
    new, new_dir = load_manifest(folder)
    with LocalTransport() as t:
        ops.deploy(t, str(venv), old, old_dir)
        before = tree(venv)
        with pytest.raises(RefusedError, match="in the backup of the payload there"):
            ops.deploy(t, str(venv), new, new_dir)
    assert tree(venv) == before


def test_the_probe_reports_the_payload_and_whether_it_is_intact(tmp_path: Path,
                                                                venv: Path) -> None:
    assert payload_state(str(venv)) is None
    m, folder = load_manifest(payload_folder(tmp_path))
    with LocalTransport() as t:
        ops.deploy(t, str(venv), m, folder)
    got = payload_state(str(venv))
    assert got == {"payload": "ddtree", "version": m.version, "digest": m.digest(folder, "0.5.11"),
                   "intact": True, "error": None, "form": "patch", "sglang": "0.5.11"}
    (package(venv) / WORKER).write_text("changed\n")
    assert payload_state(str(venv))["intact"] is False  # type: ignore[index]
    (venv / ".ddtree-deploy/payload.json").write_text("[]")
    assert payload_state(str(venv))["error"]  # type: ignore[index]


# --- the planner ------------------------------------------------------------------------------

def _plan(info: PayloadInfo | None) -> list:
    config = load_config(embedded_hosts_file())
    f = facts(True)
    venv = f.venv(V)
    assert venv is not None and venv.sglang is not None
    venv.sglang.payload = info
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)})
    return plan_host(config, config.host("ct200"), f, state)


def test_plan_shows_an_older_payload_as_an_upgrade_then_a_restart() -> None:
    shipped = shipped_identity("0.5.11")
    assert shipped is not None
    name, version, digest = shipped
    steps = _plan(PayloadInfo(payload=name, version="0.0.1", digest="0" * 16, intact=True))
    assert pending(steps) == [("payload.upgrade", "DDTree payload"),
                              ("unit.install", "sglang-ddtree.service"),
                              ("service.start", "sglang-ddtree.service")]
    up = next(s for s in steps if s.kind == "payload.upgrade")
    assert f"payload {name} 0.0.1 is installed; this tool ships {name} {version}" == up.reason
    assert up.changes == [f"upgrade the payload in place: {name} 0.0.1 -> {name} {version}"]
    same_version = _plan(PayloadInfo(payload=name, version=version, digest="0" * 16,
                                     intact=True))
    up = next(s for s in same_version if s.kind == "payload.upgrade")
    assert f"(content {'0' * 16})" in up.reason and f"(content {digest})" in up.reason
    assert pending(_plan(PayloadInfo(payload=name, version=version, digest=digest,
                                     intact=True))) == []
    changed = _plan(PayloadInfo(payload=name, version=version, digest=digest, intact=False))
    assert [k for k, _ in pending(changed)][0] == "payload.upgrade"
    unreadable = _plan(PayloadInfo(error="payload.json: not JSON"))
    step = next(s for s in unreadable if s.title == "DDTree payload")
    assert step.pending and "cannot be read: payload.json: not JSON" in step.reason


def test_fingerprint_follows_the_payload() -> None:
    a, b = facts(True), facts(True)
    venv = b.venv(V)
    assert venv is not None and venv.sglang is not None
    venv.sglang.payload = PayloadInfo(payload="ddtree", version="0.0.1", intact=True)
    assert fingerprint(a, [V], {}) != fingerprint(b, [V], {})
