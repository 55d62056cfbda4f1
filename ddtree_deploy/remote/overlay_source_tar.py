"""On an overlay's source: stream ONE tar of the wanted files to stdout.

    python -c "$(this file)" SITE_PACKAGES   < [[sha256, path], ...]

Members: "pid" (so the workstation can stop it), then one member per file named by its sha256,
then "end" with {"missing": [[path, why], ...]}: a stream without "end" is incomplete. The list
comes on stdin (a lane has tens of thousands of files: too many for the command line). Sent as
it is (not bundled): Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile

CHUNK = 1 << 20


def main(argv: list[str]) -> int:
    sp = argv[0]
    wanted = json.load(sys.stdin)
    out = sys.stdout.buffer
    tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT,  # noqa: SIM115
                       bufsize=CHUNK)
    tar.copybufsize = CHUNK  # type: ignore[attr-defined]

    def small(name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    small("pid", str(os.getpid()).encode())
    missing = []
    for sha, rel in wanted:
        path = os.path.normpath(os.path.join(sp, rel))
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            missing.append([rel, str(exc)])
            continue
        with fh:
            info = tarfile.TarInfo(sha)
            info.size = os.fstat(fh.fileno()).st_size
            info.mode = 0o644
            tar.addfile(info, fh)
    small("end", json.dumps({"missing": missing}).encode())
    tar.close()
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
