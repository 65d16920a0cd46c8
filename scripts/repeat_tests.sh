#!/usr/bin/env bash
# Run a test command many times and report each run's result and duration (for flaky-test hunting).
#
#   scripts/repeat_tests.sh RUNS HOGS [pytest args...]
#       RUNS   how many runs
#       HOGS   CPU hogs (busy loops) kept running meanwhile, stopped at the end by PID
#       pytest args default to "tests/integration"; each run gets -p no:cacheprovider and -q
#   scripts/repeat_tests.sh --fresh-clones RUNS
#       RUNS fresh clones of HEAD, each running `make test` from scratch (new virtualenv and all)
#
# Output: one line per run ("run 3: passed in 142s" / "run 3: FAILED (rc 1) in 97s, log: ...") and a summary.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
logdir=$(mktemp -d "${TMPDIR:-/tmp}/rebaser-repeat.XXXXXX")
hogs=()
cleanup() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done; }
trap cleanup EXIT

fresh=0
if [ "${1:-}" = "--fresh-clones" ]; then fresh=1; shift; fi
runs=${1:?RUNS}; shift
nhogs=0
if [ $fresh = 0 ]; then nhogs=${1:?HOGS}; shift; fi
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(tests/integration)

for _ in $(seq 1 "$nhogs"); do ( while :; do :; done ) & hogs+=($!); done

passed=0
for i in $(seq 1 "$runs"); do
  log="$logdir/run-$i.log"
  start=$(date +%s)
  if [ $fresh = 1 ]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/rebaser-clone.XXXXXX")
    git clone -q "$root" "$dir" && (cd "$dir" && CI=true bash .ci/run) >"$log" 2>&1
    rc=$?
    rm -rf "$dir"
  else
    .venv/bin/pytest -q -p no:cacheprovider "${args[@]}" >"$log" 2>&1
    rc=$?
  fi
  took=$(( $(date +%s) - start ))
  summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* =+$" "$log" | tail -1)
  if [ $rc = 0 ]; then passed=$((passed + 1)); echo "run $i: passed in ${took}s ($summary)"
  else echo "run $i: FAILED (rc $rc) in ${took}s ($summary), log: $log"; fi
done
echo "$passed of $runs runs passed (logs in $logdir)"
[ "$passed" = "$runs" ]
