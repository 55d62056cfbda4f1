"""The stdlib-only Python scripts the transfer runs on source and target hosts.

Each runs as ``PYTHON -c SCRIPT ARGS`` with its list of files as JSON on standard
input (a lane has tens of thousands of files: too many for the command line).
They must run on the oldest Python a venv may have (3.8), so no match, no walrus
in comprehensions, no new typing.
"""

from __future__ import annotations

# Source: stream one tar of the wanted files to stdout. Members: "pid" (so the
# workstation can stop us), then one member per file named by its sha256, then
# "end" with {"missing": [...]} - a stream without "end" is incomplete.
# stdin: [[sha256, path], ...]; argv[1]: site-packages.
SOURCE_TAR = r"""
import io, json, os, sys, tarfile
sp = sys.argv[1]
wanted = json.load(sys.stdin)
out = sys.stdout.buffer
tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1 << 20)
tar.copybufsize = 1 << 20
def small(name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
small("pid", str(os.getpid()).encode())
missing = []
for sha, rel in wanted:
    path = os.path.normpath(os.path.join(sp, rel))
    try:
        fh = open(path, "rb")
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
"""

# Both staging scripts first prove that the staging folder lies inside its venv once
# symlinks are resolved (<venv>/.ddtree-deploy/overlay/staging/<plan id>, no link out).
_STAGING_GUARD = r"""
import os, sys
def _inside(staging):
    parts = os.path.normpath(staging).split(os.sep)
    if len(parts) < 6 or parts[-4:-1] != [".ddtree-deploy", "overlay", "staging"]:
        return False
    venv = os.sep.join(parts[:-4]) or os.sep
    return os.path.realpath(staging) == os.path.join(os.path.realpath(venv), *parts[-4:])
if not _inside(sys.argv[1]):
    sys.stderr.write("refusing: %s is not a staging folder inside its venv\n" % sys.argv[1])
    sys.exit(2)
"""

# Target, step 1: which staged blobs are already there with the right content.
# Damaged ones and half-received leftovers are deleted. stdin: [[sha256, size], ...];
# argv[1]: the staging folder. Prints {"present": [...], "zstd": bool, "free": bytes}.
STAGING_CHECK = _STAGING_GUARD + r"""
import hashlib, json, os, shutil, sys
staging = sys.argv[1]
blobs = os.path.join(staging, "blobs")
incoming = os.path.join(staging, "incoming")
want = json.load(sys.stdin)
shutil.rmtree(incoming, ignore_errors=True)
records = {}
try:
    with open(os.path.join(staging, "verified.jsonl")) as rec:
        for line in rec:
            try:
                r = json.loads(line)
                records[r[0]] = tuple(r[1:5])
            except (ValueError, IndexError, TypeError):
                continue
except OSError:
    pass
present = []
for sha, size in want:
    path = os.path.join(blobs, sha)
    try:
        st = os.stat(path)
        if st.st_size != size:
            raise ValueError("size")
        if records.get(sha) == (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns):
            present.append(sha)  # verified when it arrived, untouched since
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                digest.update(chunk)
        if digest.hexdigest() != sha:
            raise ValueError("hash")
        present.append(sha)
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        try:
            os.unlink(path)
        except OSError:
            pass
os.makedirs(blobs, exist_ok=True)
free = shutil.disk_usage(staging).free
print(json.dumps({"present": present, "zstd": shutil.which("zstd") is not None, "free": free}))
"""

# Target, step 2: read a tar of blobs (named by sha256) from stdin; write each to
# incoming/, hash it while writing, and rename it into blobs/ only when it matches.
# Each blob so verified is recorded in verified.jsonl with its size, inode, mtime and
# ctime: the staging check and the apply trust a blob whose stat still matches its
# record (no write, chmod, rename or replacement since: any of them changes the
# ctime, which no caller can set back) and hash every other one again. So the
# bytes are read once, as they arrive.
# The tar is the workstation's (from its cache) or the source's own (forwarded while
# it arrives: its "pid" member is skipped).
# argv[1]: the staging folder. Prints {"ok": [...], "bad": [...], "complete": bool}.
STAGING_RECEIVE = _STAGING_GUARD + r"""
import hashlib, json, os, queue, sys, tarfile, threading
staging = sys.argv[1]
blobs = os.path.join(staging, "blobs")
incoming = os.path.join(staging, "incoming")
os.makedirs(blobs, exist_ok=True)
os.makedirs(incoming, exist_ok=True)
ok, bad, complete, error = [], [], False, None
finished = queue.Queue(8)  # written and hashed blobs: fsync + rename, overlapped with reading
def finish():
    global error
    while True:
        item = finished.get()
        if item is None:
            return
        fh, part, sha, good = item
        try:
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
            if good:
                os.replace(part, os.path.join(blobs, sha))
                st = os.stat(os.path.join(blobs, sha))
                with open(os.path.join(staging, "verified.jsonl"), "a") as rec:
                    rec.write(json.dumps([sha, st.st_size, st.st_ino, st.st_mtime_ns,
                                          st.st_ctime_ns]) + "\n")
                ok.append(sha)
            else:
                os.unlink(part)
                bad.append(sha)
        except OSError as exc:
            error = error or "%s: %s" % (type(exc).__name__, exc)
finisher = threading.Thread(target=finish)
finisher.start()
try:
    tar = tarfile.open(fileobj=sys.stdin.buffer, mode="r|", bufsize=1 << 20)
    for member in tar:
        if member.name == "end":
            complete = True
            break
        if member.name == "pid":  # a source's stream, forwarded as it came: not a blob
            continue
        sha = member.name
        if len(sha) != 64 or sha.strip("0123456789abcdef") or not member.isfile():
            bad.append(sha)
            continue
        src = tar.extractfile(member)
        part = os.path.join(incoming, sha + ".part")
        digest = hashlib.sha256()
        fh = open(part, "wb")
        size = 0
        try:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                digest.update(chunk)
                fh.write(chunk)
                size += len(chunk)
        except BaseException:
            fh.close()
            raise
        finished.put((fh, part, sha, digest.hexdigest() == sha and size == member.size))
except (tarfile.TarError, OSError, EOFError) as exc:
    error = "%s: %s" % (type(exc).__name__, exc)
finished.put(None)
finisher.join()
print(json.dumps({"ok": ok, "bad": bad, "complete": complete, "error": error}))
"""

# The shell around a script: the first byte of stdout says whether the rest is
# zstd ("Z") or plain ("P"). $1: python, $2: script, $3: its argument, $4: zstd flags.
SOURCE_SHELL = (
    'if [ -n "$4" ] && command -v zstd >/dev/null 2>&1; then printf Z; '
    '"$1" -c "$2" "$3" | zstd -q -c -T0 $4; '
    'else printf P; exec "$1" -c "$2" "$3"; fi'
)

# $1: python, $2: script, $3: staging, $4: "z" when stdin is zstd.
RECEIVE_SHELL = (
    'if [ "$4" = z ]; then zstd -q -d -c --long=27 | "$1" -c "$2" "$3"; '
    'else exec "$1" -c "$2" "$3"; fi'
)
