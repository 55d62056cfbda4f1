#!/usr/bin/env bash
# The whole test suite: install, fetch the real wheels the tests need (tests/wheels.toml, once,
# into .test-wheels/, checked by sha256), lint, type-check, then every test, tier by tier (unit,
# integration, lab; tests/tiers.py says what puts a test in each). The lab is taken down at the
# end even when tests fail. Each stage prints its seconds, each tier its test count, and the
# tiers' union is checked to be the whole collection, so no test drops out of CI. Every skipped
# test is listed at the end with its reason.
# Extra arguments go to every pytest run (e.g. -x, -k EXPR).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall seconds, and the CPU seconds (user+sys, its processes included) it used: on a
# shared machine the wall time grows with the load, the CPU time much less.
stage() {  # NAME COMMAND...: run it, print its seconds, return its status
  local name=$1 rc=0 TIMEFORMAT; shift
  TIMEFORMAT="tier $name: %0R s (cpu %0U+%0S s)"
  time { "$@" || rc=$?; }
  return "$rc"
}
stage setup bash scripts/setup.sh
# The tests' HOME and XDG folders, inside the checkout (git-ignored): the same that
# tests/conftest.py gives any pytest run, set here too so that everything after setup (the lab's
# `down` at exit included) sees the caches and the lab state the tests write there.
test_home=$PWD/.test-home
export HOME=$test_home XDG_CACHE_HOME=$test_home/.cache XDG_CONFIG_HOME=$test_home/.config \
  XDG_STATE_HOME=$test_home/.local/state XDG_DATA_HOME=$test_home/.local/share
mkdir -p "$XDG_CACHE_HOME" "$XDG_CONFIG_HOME" "$XDG_STATE_HOME" "$XDG_DATA_HOME"
trap '.venv/bin/ddtree-deploy lab down >/dev/null 2>&1 || true' EXIT
failed=()
# A wheel that cannot be fetched fails the run, and (in CI) each test that needs it, by name.
stage wheels .venv/bin/python tests/wheelcache.py fetch || failed+=(wheels)
stage ruff .venv/bin/ruff check .
stage mypy .venv/bin/mypy

manifests=$(mktemp -d)
trap '.venv/bin/ddtree-deploy lab down >/dev/null 2>&1 || true; rm -rf "$manifests"' EXIT
pytest=(.venv/bin/pytest -q -p no:cacheprovider)
collect() { "${pytest[@]}" --collect-only --tier-manifest="$manifests/all" "$@" >/dev/null; }
stage collect collect "$@"

# The unit and integration tiers run on pytest-xdist workers, one test file at a time each
# (--dist loadfile: a module's fixtures are built once): the unit tier on a worker per core, the
# integration tier on two per core, at most 8 (its tests mostly wait on the processes they start;
# some hold a torch model or a venv's worth of files). The lab is one per machine: its tier runs
# in this process. `-n 0` among the extra arguments runs all in one process.
cores=$(nproc)
declare -A workers=([unit]="-n $cores --dist loadfile" [lab]="")
workers[integration]="-n $((2 * cores < 8 ? 2 * cores : 8)) --dist loadfile"
touch "$manifests/skips"
for tier in unit integration lab; do
  rc=0
  # shellcheck disable=SC2086  # the workers' options: words
  stage "$tier" "${pytest[@]}" -m "$tier" ${workers[$tier]} --tier-manifest="$manifests/$tier" \
    --skip-report="$manifests/skips" --durations=10 "$@" || rc=$?
  [ "$rc" -eq 5 ] && rc=0  # no test of this tier selected (by -k, or none exists)
  touch "$manifests/$tier"
  echo "tier $tier: $(wc -l <"$manifests/$tier") tests"
  [ "$rc" -eq 0 ] || failed+=("$tier")
done

# Every collected test ran in exactly one tier, and in the tier the collection gave it.
if ! cmp -s <(sort "$manifests/all") <(sort "$manifests/unit" "$manifests/integration" \
                                           "$manifests/lab"); then
  echo "tiers: their union is not the whole collection:" >&2
  diff <(sort "$manifests/all") <(sort "$manifests"/unit "$manifests"/integration \
                                       "$manifests"/lab) >&2 || true
  exit 1
fi
echo "tiers: $(wc -l <"$manifests/all") tests, each in one tier"
echo "skipped: $(wc -l <"$manifests/skips") tests"
sed 's/\t/: /' "$manifests/skips"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed tiers: ${failed[*]}" >&2
  exit 1
fi
