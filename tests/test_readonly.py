"""Commands that read write nothing in venvs or declared paths (issue 30, item 2).

A local host of a hosts file declares three venvs: a real one (a fake sglang), a missing one
(role source) and a bare folder without a python (role training, as a tool that made folders
left it). `overlay history`, `inventory`, `doctor` and `payload status` run on it; afterwards
every declared path is byte for byte as before (a missing one still missing) and only the
tool's own state and cache folders (XDG, under the test's folder) changed. A folder without
a python is no venv: the facts say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from payload_fakes import fake_venv

pytestmark = pytest.mark.integration


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "cache"), XDG_STATE_HOME=str(root / "state"),
               HOME=str(root / "home"), NO_COLOR="1", COLUMNS="200", DDTREE_DEPLOY_HOSTS="")
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                           str(root / "hosts.yaml"), *args], capture_output=True,
                          text=True, timeout=300, check=False, env=env, cwd=root)


def tree(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "home").mkdir()
    venvs = tmp_path / "venvs"
    venvs.mkdir()
    serving = fake_venv(venvs, "serving")
    bare = venvs / "training"
    bare.mkdir()
    (bare / "notes.txt").write_text("a folder, no python\n")
    missing = venvs / "source"
    (tmp_path / "hosts.yaml").write_text(
        "version: 1\nhosts:\n  ws:\n    transport: local\n    venvs:\n"
        f"      s: {{path: {serving}, role: serving}}\n"
        f"      src: {{path: {missing}, role: source}}\n"
        f"      tr: {{path: {bare}, role: training}}\n")
    return {"root": tmp_path, "venvs": venvs, "serving": serving, "bare": bare,
            "missing": missing}


def test_reads_write_nothing_in_declared_venvs(site: dict[str, Path]) -> None:
    root, venvs = site["root"], site["venvs"]
    before = tree(venvs)
    history = cli(root, "overlay", "history", "ws", "--json")
    assert history.returncode == 0, history.stdout + history.stderr
    assert json.loads(history.stdout)["results"] == {
        str(site["serving"]): [], str(site["missing"]): [], str(site["bare"]): []}
    text = cli(root, "overlay", "history", "ws")
    assert f"{site['missing']}: 0 entries (venv not found" in text.stdout, text.stdout
    for args in (("inventory", "ws", "--refresh"), ("doctor", "ws", "--refresh"),
                 ("payload", "status", "ws")):
        ran = cli(root, *args)
        assert "Traceback" not in ran.stderr, (args, ran.stderr)
    assert tree(venvs) == before
    assert not site["missing"].exists()
    assert not (site["bare"] / ".ddtree-deploy").exists()


def test_history_reads_what_an_overlay_wrote(site: dict[str, Path]) -> None:
    state = site["serving"] / ".ddtree-deploy" / "overlay"
    state.mkdir(parents=True)
    entry = {"op": "apply", "result": "applied", "lane": "cu130", "plan_id": "abc"}
    (state / "history.jsonl").write_text(json.dumps(entry) + "\n{cut sho")
    before = tree(site["venvs"])
    ran = cli(site["root"], "overlay", "history", "ws", "--venv", str(site["serving"]), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["results"] == {str(site["serving"]): [entry]}
    assert tree(site["venvs"]) == before


def test_a_folder_without_python_is_no_venv(site: dict[str, Path]) -> None:
    ran = cli(site["root"], "inventory", "ws", "--json", "--refresh")
    assert ran.returncode == 0, ran.stderr
    (facts,) = json.loads(ran.stdout)["results"]
    by_path = {v["path"]: v for v in facts["venvs"]}
    assert by_path[str(site["serving"])]["exists"] is True
    bare = by_path[str(site["bare"])]
    assert bare["exists"] is False and "without bin/python" in bare["error"]
