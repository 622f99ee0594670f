#!/usr/bin/env bash
# issues.sh OWNER/REPO SENTINEL.json [LABEL]: one GitHub issue per change that `kvcache sentinel --json` lists under
# `issues` (a change: the commit that moved one or more counted figures), with the gh CLI (GH_TOKEN). The issue of a
# change is found by the hidden marker its body starts with (`<!-- kvcache-sentinel: KEY -->`) among the issues
# labelled LABEL (default kvcache-sentinel), open or closed: it is updated (title, body, and closed once every figure
# of the change has recovered, reopened if the change is open again); a change without one gets a new issue, unless
# it has already recovered. One write per change.
set -euo pipefail

[ "$#" -eq 2 ] || [ "$#" -eq 3 ] || { echo "usage: issues.sh OWNER/REPO SENTINEL.json [LABEL]" >&2; exit 2; }
repo=$1 doc=$2 label=${3:-kvcache-sentinel}
[ -f "$doc" ] || { echo "issues.sh: no sentinel JSON $doc" >&2; exit 2; }
if ! [[ $label =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
  echo "issues.sh: label '$label' is not a plain label name (letters, digits, . _ -)" >&2
  exit 2
fi
count=$(jq '.issues | length' "$doc")
body=$(mktemp)
trap 'rm -f "$body"' EXIT

for ((i = 0; i < count; i++)); do
  key=$(jq -r ".issues[$i].key" "$doc")
  state=$(jq -r ".issues[$i].state" "$doc")
  title=$(jq -r ".issues[$i].title" "$doc")
  jq -r ".issues[$i].body" "$doc" > "$body"
  # kvcache sentinel writes keys of letters, digits and . _ @ - only: safe inside the filter's string
  if ! [[ $key =~ ^[A-Za-z0-9._@-]+$ ]]; then
    echo "issues.sh: change key '$key' is not one kvcache sentinel writes" >&2
    exit 2
  fi
  marker="<!-- kvcache-sentinel: $key -->"
  numbers=$(gh api --paginate "repos/$repo/issues?state=all&labels=$label&per_page=100" \
    --jq ".[] | select(.pull_request == null and ((.body // \"\") | startswith(\"$marker\"))) | .number")
  number=${numbers%%$'\n'*}
  if [ -n "$number" ]; then
    gh api --method PATCH "repos/$repo/issues/$number" -f "title=$title" -F "body=@$body" -f "state=$state" > /dev/null
    echo "kvcache sentinel: issue #$number ($key) updated, $state"
  elif [ "$state" = open ]; then
    gh api --method POST "repos/$repo/issues" -f "title=$title" -F "body=@$body" -f "labels[]=$label" > /dev/null
    echo "kvcache sentinel: issue opened for $key"
  else
    echo "kvcache sentinel: $key recovered before an issue was opened for it"
  fi
done
