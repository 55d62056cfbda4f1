#!/usr/bin/env bash
# Run the test command as a new machine would, so that no warm cache hides a missing step: a fresh
# clone of this checkout's commit (or REF), `CI=true bash .ci/run` there in a clean environment
# (env -i: the standard PATH, so Debian's python3) whose HOME, XDG_{CACHE,CONFIG,STATE,DATA}_HOME,
# MPLCONFIGDIR and uv's tool folder are empty folders of its own: no pip or uv cache, no test
# wheels, no matplotlib font cache, no lab caches (rootfs, wheels, layers, keys); the lab's own
# `lab down --purge` runs before and after. Used before every stop. Only the machine's network
# settings (CA bundle, proxy variables) pass into that environment.
#
#   bash scripts/fresh-run.sh [--keep] [REF]     (FRESH_DIR=/some/empty/folder to choose where)
#
# Prints the test command's output, then each stage's seconds, the load average before and after
# (a shared machine inflates them), what the run left in the empty folders and the log's path.
# The clone and its folders are removed at the end unless --keep; the log (FOLDER/run.log) stays.
set -euo pipefail
keep=0
if [ "${1:-}" = "--keep" ]; then keep=1; shift; fi
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse --verify "${1:-HEAD}^{commit}")
dir=${FRESH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ddt-fresh.XXXXXX")}
mkdir -p "$dir"
if [ -n "$(ls -A "$dir")" ]; then
  echo "fresh-run: $dir is not empty" >&2
  exit 2
fi
dir=$(cd "$dir" && pwd)
log=$dir/run.log
home=$dir/home
mkdir -p "$home" "$dir/xdg/cache" "$dir/xdg/config" "$dir/xdg/state" "$dir/xdg/data" "$dir/mpl"
git clone -q --no-local --no-checkout "$repo" "$dir/repo"
git -C "$dir/repo" checkout -q --detach "$commit"

# The machine's network settings pass through (a CA bundle, a proxy): they are no cache.
mapfile -t network < <(env | grep -E '^(SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|PIP_CERT|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY)=' || true)
fresh_env=(env -i "${network[@]}" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
           HOME="$home" USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb CI=true
           XDG_CACHE_HOME="$dir/xdg/cache" XDG_CONFIG_HOME="$dir/xdg/config"
           XDG_STATE_HOME="$dir/xdg/state" XDG_DATA_HOME="$dir/xdg/data"
           MPLCONFIGDIR="$dir/mpl" DDTREE_DEPLOY_UV_HOME="$dir/uv-tool")
lab_purge() {  # CHECKOUT: the lab's own purge with the fresh folders (leftovers found by a
  # scan of the machine too), through CHECKOUT's venv if it has one
  if [ -x "$1/.venv/bin/ddtree-deploy" ]; then
    (cd "$1" && "${fresh_env[@]}" .venv/bin/ddtree-deploy lab down --purge) || true
    # the tests' own lab lives under CHECKOUT/.test-home (tests/conftest.py): taken down too
    # (its mounts undone before the folder goes), its caches kept
    local th=$1/.test-home
    if [ -d "$th" ]; then
      (cd "$1" && "${fresh_env[@]}" HOME="$th" XDG_CACHE_HOME="$th/.cache" \
        XDG_CONFIG_HOME="$th/.config" XDG_STATE_HOME="$th/.local/state" \
        XDG_DATA_HOME="$th/.local/share" .venv/bin/ddtree-deploy lab down) || true
    fi
  fi
}
finish() {
  lab_purge "$dir/repo" >>"$log" 2>&1
  if [ "$keep" -eq 0 ]; then
    find "$dir" -mindepth 1 -maxdepth 1 ! -name run.log -exec rm -rf {} +
  fi
}
trap finish EXIT

{
  echo "fresh-run: commit $commit in $dir/repo, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  lab_purge "$repo"
  t0=$SECONDS rc=0
  (cd "$dir/repo" && "${fresh_env[@]}" bash .ci/run) || rc=$?
  echo "fresh-run: exit $rc after $((SECONDS - t0)) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "fresh-run: stages (wall, cpu user+sys):" "$(grep -oE '^tier [a-z]+: [0-9]+ s \(cpu [0-9]+\+[0-9]+ s\)' "$log" | sed 's/^tier //;s/ s (cpu /s (/;s/ s)$/s)/' | paste -sd, -)"
  for what in "$home" "$dir/xdg/cache" "$dir/xdg/config" "$dir/xdg/state" "$dir/xdg/data" \
              "$dir/mpl" "$dir/uv-tool" "$dir/repo/.test-wheels" "$dir/repo/.test-home"; do
    [ -e "$what" ] && echo "fresh-run: left in ${what#"$dir"/}: $(du -sh "$what" | cut -f1)" \
      "($(find "$what" -mindepth 1 -maxdepth 2 | sed "s|^$what/||" | head -8 | paste -sd' ' -))"
  done
  echo "fresh-run: log $log"
  exit "$rc"
} 2>&1 | tee "$log"
