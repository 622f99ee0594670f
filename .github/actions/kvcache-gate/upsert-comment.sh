#!/usr/bin/env bash
# upsert-comment.sh REPOSITORY PR BODY_FILE [AUTHOR]: update the pull request's comment that carries kvcache
# comment's hidden marker and was written by AUTHOR (default github-actions[bot], the login of the workflow's
# GITHUB_TOKEN; the login of the token's owner when the action is given another token), or post one when there is
# none, with the gh CLI (GH_TOKEN). Exactly one write: a PATCH of the first such comment, else a POST. A comment
# with the marker written by anybody else (quoted, or copied by a user) is never edited.
set -euo pipefail

[ "$#" -eq 3 ] || [ "$#" -eq 4 ] || { echo "usage: upsert-comment.sh OWNER/REPO PR BODY_FILE [AUTHOR]" >&2; exit 2; }
repo=$1 pr=$2 body=$3 author=${4:-github-actions[bot]}
[ -f "$body" ] || { echo "upsert-comment.sh: no body file $body" >&2; exit 2; }
# A GitHub login (letters, digits, hyphens; an app's ends in [bot]): it goes into the jq filter as a string.
if ! [[ $author =~ ^[A-Za-z0-9][A-Za-z0-9-]*(\[bot\])?$ ]]; then
  echo "upsert-comment.sh: comment author '$author' is not a GitHub login (e.g. github-actions[bot], my-bot[bot])" >&2
  exit 2
fi
marker='<!-- kvcache-passes-comment -->'

ids=$(gh api --paginate "repos/$repo/issues/$pr/comments" \
  --jq ".[] | select(.user.login == \"$author\" and ((.body // \"\") | contains(\"$marker\"))) | .id")
id=${ids%%$'\n'*}
if [ -n "$id" ]; then
  gh api --method PATCH "repos/$repo/issues/comments/$id" -F "body=@$body" > /dev/null
  echo "kvcache-gate: updated comment $id by $author on #$pr"
else
  gh api --method POST "repos/$repo/issues/$pr/comments" -F "body=@$body" > /dev/null
  echo "kvcache-gate: posted a comment on #$pr"
fi
