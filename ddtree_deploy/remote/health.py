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
  200, /v1/models and /server_info (``--models``: whether the server takes input_ids only,
  ``--skip-tokenizer-init``, and its sampling backend) and, only when asked
  (``--generate N``), one short generation, greedy or sampled (``--sampling`` JSON),
  measured in tokens, seconds to the first token, seconds and tok/s (streamed where the
  server streams, so a slow server still reports what came before the time ran out). The
  wait for the first token has its own limit (``--first-limit``: warm-up, JIT compiles on a
  first start) apart from the rest (``--gen-limit``).
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
_AUTH: dict = {}  # the Authorization header of a server with an API key (read_key)


def read_key(path: str) -> str | None:
    """The API key of the service's --config file (`api-key: "..."`, a JSON string), read
    here on the host: the key never travels to the workstation or into any argv."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("api-key", "api_key"):
                value = value.strip()
                return str(json.loads(value)) if value.startswith('"') else value
    return None


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
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json", **_AUTH})
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


def _take_chunk(chunk: dict[str, Any], out: dict[str, Any]) -> None:
    """One answer (or streamed chunk) of /generate: text or output_ids, the token count."""
    err = chunk.get("error")
    if err is not None:  # SGLang streams a ValueError as {"error": {"message": ...}}
        out["error"] = str(err.get("message") if isinstance(err, dict) else err)
        return
    if "text" in chunk:
        out["text"] = str(chunk.get("text") or "")
    ids = chunk.get("output_ids")
    if isinstance(ids, list):
        have = out.get("ids") or []
        # cumulative by default in SGLang 0.5.11; incremental with --incremental-streaming-output
        out["ids"] = ids if ids[:len(have)] == have else have + ids
    count = _tokens(chunk.get("meta_info"), None)
    if count is None and isinstance(ids, list):
        count = len(out["ids"])
    if count is not None:
        out["tokens"] = count


STALL_GAP_S = 2.0  # a gap between two tokens longer than this may be a warm-up stall


def _read_stream(resp: Any, t0: float, first_limit: float, limit: float,
                 out: dict[str, Any]) -> None:
    """SSE lines `data: {...}` until [DONE] or the time limits: ``first_limit`` for the first
    token (warm-up: a first start's JIT compiles land here), then ``limit`` for the rest.

    One stall after the first token may also draw on the warm-up budget (``first_limit`` from
    the start): a first sampled request on a real H200 got its first token at once from
    prefill, then stalled ~100 s while the sampling kernels of the verify step compiled. A gap
    over ``STALL_GAP_S`` is that stall: it is reported as ``stall_s`` and added to ``limit``.
    A stream that is slow throughout has no such gap and is judged by ``limit`` alone."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    last: float | None = None
    while True:
        now = time.monotonic() - t0
        first = out.get("first_s")
        if first is None:
            left = first_limit - now
        else:
            left = float(first) + limit + float(out.get("stall_s") or 0.0) - now
            if not out.get("stall_s"):  # the one stall may still be under way
                left = max(left, first_limit - now)
        if left <= 0:
            out["timed_out"] = True
            out["first_timed_out"] = first is None
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
            _take_chunk(chunk, out)
            at = time.monotonic() - t0
            if out.get("first_s") is None and (out.get("tokens") or out.get("error")):
                out["first_s"] = round(at, 4)
                out["first_tokens"] = out.get("tokens") or 0
            elif out.get("first_s") is not None:
                gap = at - (last if last is not None else float(out["first_s"]))
                if gap > STALL_GAP_S and not out.get("stall_s"):
                    out["stall_s"] = round(gap, 4)
                budget_end = float(out["first_s"]) + limit + float(out.get("stall_s") or 0.0)
                if at > budget_end:
                    out["timed_out"] = True
                    out["first_timed_out"] = False
                    return
            last = at


# What a text prompt gets from a server started with --skip-tokenizer-init (SGLang 0.5.11
# tokenizer_manager: "... skip_tokenizer_init=True cannot accept text prompts ...").
_NEEDS_IDS = ("skip_tokenizer_init", "input_ids")


def _bodies(prompt: Any, tokens: int, params: dict[str, Any]) -> tuple[dict[str, Any],
                                                                       dict[str, Any]]:
    """The /generate body and the /v1/completions fallback body of one generation."""
    key = "input_ids" if isinstance(prompt, list) else "text"
    native = {key: prompt, "stream": True,
              "sampling_params": {"max_new_tokens": tokens, **params}}
    openai = {"prompt": prompt, "max_tokens": tokens, **params}
    return native, openai


def _attempt(base: str, prompt: Any, tokens: int, params: dict[str, Any], first_limit: float,
             limit: float, out: dict[str, Any]) -> None:
    native, openai = _bodies(prompt, tokens, params)
    t0 = time.monotonic()
    try:
        status, headers, resp = _request(base + "/generate", native, first_limit + limit)
        if status == 404:
            out["endpoint"] = "/v1/completions"
            status, headers, resp = _request(base + "/v1/completions", openai,
                                             first_limit + limit)
        else:
            out["endpoint"] = "/generate"
        out["status"] = status
        if resp is not None:
            with resp:
                if "event-stream" in str(headers.get("Content-Type", "")):
                    _read_stream(resp, t0, first_limit, limit, out)
                else:
                    data = json.loads(resp.read(1 << 20))
                    out["first_s"] = round(time.monotonic() - t0, 4)
                    if isinstance(data, list) and data and isinstance(data[0], dict):
                        data = data[0]
                    if isinstance(data, dict) and "choices" in data:
                        out["text"] = str(data["choices"][0].get("text", ""))
                        out["tokens"] = _tokens(None, data.get("usage"))
                    elif isinstance(data, dict):
                        _take_chunk(data, out)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        reason = getattr(exc, "reason", None) or exc
        out["error"] = f"{type(exc).__name__}: {reason}"
        out["timed_out"] = "timed out" in str(reason) or out["timed_out"]
        if out["timed_out"] and out.get("first_s") is None:
            out["first_timed_out"] = True


def generate(base: str, prompt: str, prompt_ids: list[int], tokens: int,
             params: dict[str, Any], first_limit: float, limit: float,
             mode: str) -> dict[str, Any]:
    """One short generation, greedy or sampled: /generate (streamed if the server streams),
    else /v1/completions. ``mode`` "text" sends the prompt, "ids" input_ids (a server with
    --skip-tokenizer-init takes no text); "auto" sends text and, when the server answers that
    it takes input_ids only, asks again with input_ids."""
    out: dict[str, Any] = {"asked": tokens, "tokens": None, "text": "", "timed_out": False,
                           "mode": "ids" if mode == "ids" else "text",
                           "params": params}  # fmt: skip
    t0 = time.monotonic()
    _attempt(base, prompt_ids if mode == "ids" else prompt, tokens, params, first_limit,
             limit, out)
    needs_ids = any(word in str(out.get("error") or "") for word in _NEEDS_IDS)
    if mode == "auto" and needs_ids and not out["tokens"]:
        spent = time.monotonic() - t0
        out.update({"mode": "ids", "error": None, "status": None, "first_s": None,
                    "timed_out": False, "text_refused_s": round(spent, 4)})
        _attempt(base, prompt_ids, tokens, params, max(0.05, first_limit - spent), limit, out)
    seconds = time.monotonic() - t0
    out["seconds"] = round(seconds, 4)
    # Cut with nothing after the first token: a stall (the probe may ask again on warm-up time).
    out["stalled"] = bool(out.get("timed_out")) and out.get("first_s") is not None and (
        out.get("tokens") or 0) <= (out.get("first_tokens") or 0)
    count = out["tokens"] or 0
    out["tok_per_s"] = round(count / seconds, 3) if seconds > 0 else None
    first, first_tokens = out.get("first_s"), out.get("first_tokens") or 0
    steady = seconds - (first or 0.0) - float(out.get("stall_s") or 0.0)  # warm-up stalls out
    if first is not None and steady > 0.01 and count > first_tokens:
        out["steady_tok_per_s"] = round((count - first_tokens) / steady, 3)
    if out.get("ids") is not None:
        out["ids"] = out["ids"][:32]
    return out


def server_info(base: str, timeout: float) -> dict[str, Any] | None:
    """What the probe needs from /server_info: input mode, sampling and attention backends."""
    status, _, body = get_status(base + "/server_info", timeout)
    if status != 200:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    keys = ("skip_tokenizer_init", "sampling_backend", "attention_backend",
            "speculative_algorithm", "version")
    return {k: data.get(k) for k in keys}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ddtree-health-poll")
    p.add_argument("--unit")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--addr", default="127.0.0.1")
    p.add_argument("--pid", type=int)
    p.add_argument("--log-file")
    p.add_argument("--cursor")
    p.add_argument("--max-lines", type=int, default=400)
    p.add_argument("--models", action="store_true", help="also /v1/models and /server_info")
    p.add_argument("--generate", type=int, default=0, help="tokens of one generation")
    p.add_argument("--sampling", default="{}", help="JSON sampling params (temperature, ...)")
    p.add_argument("--mode", choices=("auto", "text", "ids"), default="auto")
    p.add_argument("--prompt", default="Count from one to ten:")
    p.add_argument("--prompt-ids", default="1,2,3,4,5,6")
    p.add_argument("--first-limit", type=float, default=20.0,
                   help="seconds to wait for the generation's first token")
    p.add_argument("--gen-limit", type=float, default=20.0,
                   help="seconds for the rest of the generation after its first token")
    p.add_argument("--http-timeout", type=float, default=1.0)
    p.add_argument("--key-file", help="the service's --config file: its API key is sent")
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
        mode = ns.mode
        if ns.models:
            http["model_id"] = model_id(base, left(ns.http_timeout))
            info = server_info(base, left(ns.http_timeout))
            http["server_info"] = info
            if info is not None and mode == "auto" and info.get("skip_tokenizer_init"):
                mode = "ids"
        if ns.generate > 0:
            try:
                params = json.loads(ns.sampling)
                ids = [int(x) for x in ns.prompt_ids.split(",") if x.strip()]
            except ValueError as exc:
                raise SystemExit(f"bad --sampling or --prompt-ids: {exc}") from exc
            first = min(ns.first_limit, ns.budget - (time.monotonic() - t0))
            http["generation"] = generate(base, ns.prompt, ids, ns.generate, params,
                                          max(0.05, first), max(0.05, ns.gen_limit), mode)
    report["http"] = http
    report["poll_s"] = round(time.monotonic() - t0, 4)
    return report


def main(argv: list[str]) -> int:
    ns = parse_args(argv)
    if ns.key_file:
        try:
            key = read_key(ns.key_file)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSON errors included
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            sys.stderr.write(
                f"health.py: cannot read the API key from the service's --config file "
                f"{ns.key_file!r} as uid {os.geteuid()}: {why}. It must be a readable UTF-8 "
                "file with a line `api-key: \"KEY\"` (`apply` writes it, mode 0600, owned by "
                "the service's user: probe with that user's rights or sudo).\n")
            return 2
        if key:
            _AUTH["Authorization"] = "Bearer " + key
    sys.stdout.write(json.dumps(poll(ns)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
