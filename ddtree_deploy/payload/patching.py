"""Apply a unified diff to a text exactly: every context and removed line must match.

The payload's changes to upstream SGLang files are kept as small patches; the
upstream file is first checked against the manifest's sha256, so a patch that
does not apply exactly means the payload itself is broken, never a fuzzy merge.
"""

from __future__ import annotations

import re

from ddtree_deploy.errors import DeployError

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(DeployError):
    pass


def apply_patch(original: str, patch: str, *, name: str = "file") -> str:
    src = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next unconsumed line of src (0-based)
    lines = patch.splitlines(keepends=True)
    i = hunks = 0
    while i < len(lines):
        m = HUNK.match(lines[i])
        i += 1
        if not m:
            continue
        hunks += 1
        old_left = int(m.group(2) or 1)
        new_left = int(m.group(4) or 1)
        start = int(m.group(1)) - (1 if old_left else 0)
        if start < pos:
            raise PatchError(f"{name}: hunk {hunks} overlaps the previous one")
        out.extend(src[pos:start])
        pos = start
        while (old_left or new_left) and i < len(lines):
            line = lines[i]
            i += 1
            tag, body = line[:1], line[1:]
            if tag in (" ", "-"):
                have = src[pos] if pos < len(src) else None
                if have is None or have.rstrip("\n") != body.rstrip("\n"):
                    raise PatchError(f"{name}: hunk {hunks} does not apply at line {pos + 1}: "
                                     f"expected {body.rstrip()!r}, found "
                                     f"{(have or '<end of file>').rstrip()!r}")
                if tag == " ":
                    out.append(have)
                    new_left -= 1
                pos += 1
                old_left -= 1
            elif tag == "+":
                out.append(body)
                new_left -= 1
            elif tag != "\\":
                raise PatchError(f"{name}: hunk {hunks}: unexpected line {line.rstrip()!r}")
        if old_left or new_left:
            raise PatchError(f"{name}: hunk {hunks} is truncated")
        if i < len(lines) and lines[i].startswith("\\") and out:  # "\ No newline at end of file"
            out[-1] = out[-1].rstrip("\n")
            i += 1
    if hunks == 0:
        raise PatchError(f"{name}: the patch has no hunks")
    out.extend(src[pos:])
    return "".join(out)
