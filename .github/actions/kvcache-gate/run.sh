#!/usr/bin/env bash
# The kvcache-gate action (action.yml beside this file), runnable on its own: measures the counted suite on a pull
# request's merge base and on its head, each in a git worktree of the current repository, writes the pull request
# comment (kvcache comment) and the job summary, upserts the comment with the gh CLI (upsert-comment.sh), and
# exits 1 on a counted regression (kvcache compare's exit status, with --rules first --require-classes: BASE's
# rules judge, and a class BASE counted must be counted in HEAD), 2 when the runs cannot be compared.
#
# Environment (all optional except KVCACHE_PYTEST_ARGS outside a pull_request event's defaults):
#   KVCACHE_PYTEST_ARGS  suite arguments after `-m counted --kv-no-gate`, split on spaces
#   KVCACHE_SUITE        the suite as pytest is given it (default: --pyargs kvcache.benchmarks), split on spaces
#   KVCACHE_PYTHON       interpreter with kvcache-passes[bench] (default: python); a relative path is taken from
#                        the directory the script starts in
#   KVCACHE_PYTHONPATH   folder of each worktree put first on PYTHONPATH (default: .)
#   KVCACHE_BASE         commit to measure as BASE (default: merge base of the event's base and head)
#   KVCACHE_HEAD         commit to measure as HEAD (default: the event's head, else HEAD)
#   KVCACHE_PR           pull request number (default: the event's)
#   KVCACHE_COMMENT      "false": do not post the comment (default: true)
#   KVCACHE_COMMENT_AUTHOR  login whose comment with the marker is updated (default: github-actions[bot])
#   KVCACHE_PARALLEL     "false": measure base, then head (default: both at once)
#   KVCACHE_OUT          folder for base.json, head.json, their .log, comment.md, compare.md (default: under RUNNER_TEMP)
#   GITHUB_EVENT_PATH, GITHUB_REPOSITORY, GITHUB_STEP_SUMMARY, GITHUB_OUTPUT, GITHUB_SERVER_URL, GITHUB_RUN_ID: as
#   GitHub Actions sets them.
set -euo pipefail

fail() {
  echo "::error::kvcache-gate: ${1//$'\n'/ }"
  exit "${2:-2}"
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${KVCACHE_PYTHON:-python}
# A relative interpreter path, from where the script starts: the suite runs in the worktrees, kvcache in $out.
case "$python" in
  /*) ;;
  */*) folder=$(cd "$(dirname "$python")" 2>/dev/null && pwd) || fail "KVCACHE_PYTHON $python: no folder $(dirname "$python")"
       python="$folder/$(basename "$python")" ;;
esac

pythonpath=${KVCACHE_PYTHONPATH:-.}
read -r -a pytest_args <<< "${KVCACHE_PYTEST_ARGS:-}"
read -r -a suite <<< "${KVCACHE_SUITE:---pyargs kvcache.benchmarks}"
tmp=${RUNNER_TEMP:-${TMPDIR:-/tmp}}
out=${KVCACHE_OUT:-$tmp/kvcache-gate}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "$tmp/kvcache-gate-worktrees.XXXXXX")

cleanup() {
  for side in base head; do
    if [ -d "$work/$side" ]; then
      git worktree remove --force "$work/$side" >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$work"
  git worktree prune 2>/dev/null || true  # a worktree whose folder went anyway
}
trap cleanup EXIT

# One field of the event's payload (dotted path), empty when absent.
event() {
  if [ -z "${GITHUB_EVENT_PATH:-}" ] || [ ! -f "$GITHUB_EVENT_PATH" ]; then
    return 0
  fi
  "$python" - "$GITHUB_EVENT_PATH" "$1" <<'PY'
import json
import sys

value = json.load(open(sys.argv[1], encoding="utf-8"))
for part in sys.argv[2].split("."):
    value = value.get(part) if isinstance(value, dict) else None
print("" if value is None else value)
PY
}

git rev-parse --git-dir >/dev/null 2>&1 || fail "not in a git repository (run after actions/checkout)"
head=${KVCACHE_HEAD:-$(event pull_request.head.sha)}
head=${head:-$(git rev-parse HEAD)}
base=${KVCACHE_BASE:-}
base_is="merge base"
if [ -n "$base" ]; then
  base_is="base"
else
  target=$(event pull_request.base.sha)
  [ -n "$target" ] || fail "no BASE: not a pull_request event; give the base input (KVCACHE_BASE)"
  base=$(git merge-base "$target" "$head") ||
    fail "no merge base of $target and $head: check out with fetch-depth: 0"
fi
pr=${KVCACHE_PR:-$(event pull_request.number)}
repo=${GITHUB_REPOSITORY:-}

# The counted suite in the worktree of SIDE (base or head), its output in $out/SIDE.log.
measure() {
  local side=$1 dir="$work/$1"
  (
    cd "$dir"
    PYTHONPATH="$dir/$pythonpath${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest "${suite[@]}" \
      -p no:cacheprovider -m counted --kv-no-gate ${pytest_args[@]+"${pytest_args[@]}"} \
      --benchmark-json "$out/$side.json"
  ) > "$out/$side.log" 2>&1
}

# Both sides at once (counted bytes do not depend on what else runs), unless KVCACHE_PARALLEL=false.
for side in base head; do
  commit=$base
  [ "$side" = head ] && commit=$head
  rm -f "$out/$side.json"
  if ! made=$(git worktree add --detach "$work/$side" "$commit" 2>&1); then
    fail "cannot check out $commit for $side: $made"
  fi
done
status_base=0 status_head=0
if [ "${KVCACHE_PARALLEL:-true}" = "true" ]; then
  measure base & pid=$!
  measure head || status_head=$?
  wait "$pid" || status_base=$?
else
  measure base || status_base=$?
  measure head || status_head=$?
fi
for side in base head; do
  echo "::group::kvcache-gate: counted suite on $side"
  cat "$out/$side.log"
  echo "::endgroup::"
done
[ "$status_base" -eq 0 ] || fail "the counted suite failed on base ($base), exit $status_base: see its log above" 1
[ "$status_head" -eq 0 ] || fail "the counted suite failed on head ($head), exit $status_head: see its log above" 1
for side in base head; do  # a suite that exits 0 without its run (a wrong interpreter, a plugin) is no pass
  [ -s "$out/$side.json" ] || fail "the counted suite wrote no $side.json on $side: see its log above" 2
done

report=()
if [ -n "$repo" ] && [ -n "${GITHUB_RUN_ID:-}" ]; then
  report=(--report-url "${GITHUB_SERVER_URL:-https://github.com}/$repo/actions/runs/$GITHUB_RUN_ID")
fi
# kvcache itself from the folder of the runs: the installed one, never a checkout's kvcache/ by the working directory.
kvcache() {
  (cd "$out" && "$python" -m kvcache.cli "$@")
}
kvcache comment base.json head.json --out comment.md --base-label "$base_is ${base:0:10}" \
  --head-label "head ${head:0:10}" ${report[@]+"${report[@]}"} || fail "kvcache comment could not compare the runs (exit $?)"
gate=0
# BASE's rules: HEAD cannot loosen its own gate; every class BASE counted: HEAD cannot drop one from it.
kvcache compare base.json head.json --markdown --rules first --require-classes > "$out/compare.md" || gate=$?

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  {
    cat "$out/comment.md"
    printf '\n<details><summary>kvcache compare BASE HEAD</summary>\n\n'
    cat "$out/compare.md"
    printf '\n</details>\n'
  } >> "$GITHUB_STEP_SUMMARY"
fi
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  {
    echo "base-json=$out/base.json"
    echo "head-json=$out/head.json"
    echo "comment=$out/comment.md"
    if [ "$gate" -eq 1 ]; then echo "regression=true"; else echo "regression=false"; fi
  } >> "$GITHUB_OUTPUT"
fi

if [ "${KVCACHE_COMMENT:-true}" = "true" ]; then
  if [ -n "$pr" ] && [ -n "$repo" ]; then
    bash "$here/upsert-comment.sh" "$repo" "$pr" "$out/comment.md" "${KVCACHE_COMMENT_AUTHOR:-github-actions[bot]}" ||
      echo "::warning::kvcache-gate: could not post the comment (a pull request from a fork has a read-only token); it is in the job summary"
  else
    echo "kvcache-gate: no pull request number or repository: comment not posted"
  fi
fi

case "$gate" in
  0) echo "kvcache-gate: no counted regression against $base" ;;
  1) fail "counted regression against the $base_is $base: see the comment or the job summary" 1 ;;
  *) fail "kvcache compare could not compare the runs (exit $gate)" 2 ;;
esac
