"""One health poll, run ON the host (stdlib only, Python >= 3.8): prints ONE JSON object.

Sent on stdin as `python3 - ARGS` (see probe.py), one SSH round trip per poll:

* systemd: `systemctl show UNIT -p ActiveState,SubState,NRestarts,...`; when the host has no
  running systemd (no /run/systemd/system) or no unit is given, "systemd" says so and the
  state comes from ``--pid`` (alive or not; a zombie counts as exited).
* log lines, bounded (``--max-lines``) and incremental (``--cursor``): the journal of the
  unit's CURRENT invocation on the first read (`_SYSTEMD_INVOCATION_ID=`), then everything the
  unit logged after the cursor (`-u UNIT --after-cursor`), so a restart's lines are not lost;
  without systemd, the bytes of ``--log-file`` after the offset in the cursor.
* HTTP from the host itself to 127.0.0.1:PORT with short timeouts: /health; when it answers
  200, /v1/models (``--models``) and, only when asked (``--generate N``), one short
  generation measured in tokens, seconds and tok/s (streamed where the server streams, so a
  slow server still reports what came before the time ran out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

SHOW_PROPS = ("ActiveState", "SubState", "NRestarts", "ExecMainStatus", "ExecMainPID",
              "InvocationID", "ActiveEnterTimestampMonotonic")  # fmt: skip
LOG_BYTES = 256 * 1024
CURSOR_MARK = "-- cursor: "
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True,
                              timeout=max(timeout, 0.2), check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, "", str(exc)
    return (proc.returncode, proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"))


def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system")


def unit_state(unit: str, timeout: float) -> dict[str, Any]:
    code, out, err = _run(["systemctl", "show", unit, "-p", ",".join(SHOW_PROPS)], timeout)
    if code != 0:
        return {"available": True, "error": err.strip() or f"systemctl exited {code}"}
    state: dict[str, Any] = {"available": True, "error": None}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in SHOW_PROPS:
            state[key] = value
    return state


def journal(unit: str, invocation: str, cursor: str | None, max_lines: int,
            timeout: float) -> dict[str, Any]:
    argv = ["journalctl", "-o", "cat", "--no-pager", "-q", "--show-cursor", "-n", str(max_lines)]
    if cursor:
        argv += ["-u", unit, "--after-cursor", cursor]
    elif invocation:
        argv += [f"_SYSTEMD_INVOCATION_ID={invocation}"]
    else:
        argv += ["-u", unit]
    code, out, err = _run(argv, timeout)
    lines = out.splitlines()
    new_cursor = cursor
    if lines and lines[-1].startswith(CURSOR_MARK):
        new_cursor = lines.pop()[len(CURSOR_MARK):].strip()
    result: dict[str, Any] = {"source": "journal", "lines": lines, "cursor": new_cursor}
    if code != 0:
        result["error"] = err.strip() or f"journalctl exited {code}"
    return result


def read_log_file(path: str, cursor: str | None, max_lines: int) -> dict[str, Any]:
    """New bytes of a log file after the offset ``cursor`` (bounded), as lines."""
    try:
        offset = int(cursor) if cursor else 0
    except ValueError:
        offset = 0
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < offset:  # truncated or replaced: start over
                offset = 0
            start = max(offset, size - LOG_BYTES)
            handle.seek(start)
            data = handle.read(size - start)
    except OSError as exc:
        return {"source": "file", "lines": [], "cursor": cursor, "error": str(exc)}
    end = data.rfind(b"\n") + 1  # a partial last line waits for the next poll
    lines = data[:end].decode("utf-8", "replace").splitlines()
    return {"source": "file", "lines": lines[-max_lines:], "cursor": str(start + end),
            "truncated": start > offset or len(lines) > max_lines}


def pid_state(pid: int) -> dict[str, Any]:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return {"pid": pid, "alive": False}
    state = stat[stat.rfind(")") + 2:].split(" ", 1)[0]
    return {"pid": pid, "alive": state not in ("Z", "X"), "state": state}


def _request(url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, Any, Any]:
    """(status, headers, response) — the response is open; the caller reads and closes it."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        resp = _OPENER.open(req, timeout=max(timeout, 0.05))
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code, exc.headers, None
    return resp.status, resp.headers, resp


def get_status(url: str, timeout: float) -> tuple[int | None, str | None, bytes]:
    try:
        status, _, resp = _request(url, None, timeout)
        body = b""
        if resp is not None:
            with resp:
                body = resp.read(1 << 20)
        return status, None, body
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return None, str(reason), b""


def model_id(base: str, timeout: float) -> str | None:
    status, _, body = get_status(base + "/v1/models", timeout)
    if status != 200:
        return None
    try:
        data = json.loads(body)["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _tokens(meta: Any, usage: Any) -> int | None:
    for holder, key in ((meta, "completion_tokens"), (usage, "completion_tokens")):
        if isinstance(holder, dict) and isinstance(holder.get(key), int):
            return int(holder[key])
    return None


def _read_stream(resp: Any, t0: float, limit: float, out: dict[str, Any]) -> None:
    """SSE lines `data: {...}` until [DONE] or the time limit; keeps the last text/meta."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    while True:
        left = limit - (time.monotonic() - t0)
        if left <= 0:
            out["timed_out"] = True
            return
        if sock is not None:
            sock.settimeout(max(left, 0.05))  # bound each wait by the time left
        line = resp.readline()
        if not line:
            return
        text = line.decode("utf-8", "replace").strip()
        if not text.startswith("data:"):
            continue
        payload = text[5:].strip()
        if payload == "[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            out["text"] = str(chunk.get("text", out.get("text", "")))
            out["tokens"] = _tokens(chunk.get("meta_info"), None) or out.get("tokens")


def generate(base: str, prompt: str, tokens: int, limit: float) -> dict[str, Any]:
    """One short generation: /generate (streamed if the server streams), else /v1/completions."""
    out: dict[str, Any] = {"asked": tokens, "tokens": None, "text": "", "timed_out": False}
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    t0 = time.monotonic()
    try:
        status, headers, resp = _request(base + "/generate", body, limit)
        if status == 404:
            out["endpoint"] = "/v1/completions"
            status, headers, resp = _request(base + "/v1/completions", {
                "prompt": prompt, "max_tokens": tokens, "temperature": 0}, limit)
        else:
            out["endpoint"] = "/generate"
        out["status"] = status
        if resp is not None:
            with resp:
                if "event-stream" in str(headers.get("Content-Type", "")):
                    _read_stream(resp, t0, limit, out)
                else:
                    data = json.loads(resp.read(1 << 20))
                    if isinstance(data, dict) and "choices" in data:
                        out["text"] = str(data["choices"][0].get("text", ""))
                        out["tokens"] = _tokens(None, data.get("usage"))
                    elif isinstance(data, dict):
                        out["text"] = str(data.get("text", ""))
                        out["tokens"] = _tokens(data.get("meta_info"), None)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        reason = getattr(exc, "reason", None) or exc
        out["error"] = f"{type(exc).__name__}: {reason}"
        out["timed_out"] = "timed out" in str(reason) or out["timed_out"]
    seconds = time.monotonic() - t0
    out["seconds"] = round(seconds, 4)
    count = out["tokens"] or 0
    out["tok_per_s"] = round(count / seconds, 3) if seconds > 0 else None
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ddtree-health-poll")
    p.add_argument("--unit")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--addr", default="127.0.0.1")
    p.add_argument("--pid", type=int)
    p.add_argument("--log-file")
    p.add_argument("--cursor")
    p.add_argument("--max-lines", type=int, default=400)
    p.add_argument("--models", action="store_true")
    p.add_argument("--generate", type=int, default=0)
    p.add_argument("--prompt", default="Count from one to ten:")
    p.add_argument("--http-timeout", type=float, default=1.0)
    p.add_argument("--budget", type=float, default=30.0)
    return p.parse_args(argv)


def poll(ns: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()

    def left(cap: float) -> float:
        return max(0.05, min(cap, ns.budget - (time.monotonic() - t0)))

    report: dict[str, Any] = {"systemd": {"available": False}, "process": None}
    use_systemd = bool(ns.unit) and systemd_running()
    if ns.unit and not use_systemd:
        report["systemd"] = {"available": False, "error": "systemd unavailable"}
    if use_systemd:
        state = unit_state(ns.unit, left(3.0))
        report["systemd"] = state
        report["log"] = journal(ns.unit, str(state.get("InvocationID") or ""), ns.cursor,
                                ns.max_lines, left(3.0))
    elif ns.log_file:
        report["log"] = read_log_file(ns.log_file, ns.cursor, ns.max_lines)
    else:
        report["log"] = {"source": None, "lines": [], "cursor": ns.cursor}
    if ns.pid and not use_systemd:
        report["process"] = pid_state(ns.pid)
    base = f"http://{ns.addr}:{ns.port}"
    status, error, _ = get_status(base + "/health", left(ns.http_timeout))
    http: dict[str, Any] = {"health": status, "health_error": error}
    if status == 200:
        if ns.models:
            http["model_id"] = model_id(base, left(ns.http_timeout))
        if ns.generate > 0:
            http["generation"] = generate(base, ns.prompt, ns.generate, left(ns.budget))
    report["http"] = http
    report["poll_s"] = round(time.monotonic() - t0, 4)
    return report


def main(argv: list[str]) -> int:
    ns = parse_args(argv)
    sys.stdout.write(json.dumps(poll(ns)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
