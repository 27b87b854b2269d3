#!/usr/bin/env bash
# The cert store of the gate workflow (.github/workflows/gate.yml, docs/action.md): a branch of
# the repository (default batch-invariance-certs) holding one folder per cert, named by the
# cert file's sha256, with the cert, its sigstore bundle and its in-toto attestation.
#
#   cert-store.sh fetch DIR           the branch checked out in DIR (an empty DIR when the
#                                     branch does not exist yet)
#   cert-store.sh push DIR FRESH      every cert under FRESH (with the files beside it) added
#                                     to the store in DIR, committed and pushed
#
# The store is not trusted for what it holds: check-deploy --store counts a cert only where it
# verifies and is signed per the gate's identity policy, and names every file it ignores. So
# push copies what the run measured as it is, and a file anyone else pushed cannot cover a cell.
#
# Environment: GITHUB_SERVER_URL, GITHUB_REPOSITORY (the store's repository), STORE_BRANCH,
# STORE_TOKEN (read for fetch, contents: write for push; empty: no auth header), and
# STORE_URL to read and write another remote instead (the act tests' local bare repository).
set -euo pipefail

branch=${STORE_BRANCH:-batch-invariance-certs}
url=${STORE_URL:-${GITHUB_SERVER_URL:-https://github.com}/${GITHUB_REPOSITORY:?}.git}

# The token reaches git through its environment, never its argv (no process listing shows it).
if [ -n "${STORE_TOKEN:-}" ]; then
  basic=$(printf 'x-access-token:%s' "$STORE_TOKEN" | base64 | tr -d '\n')
  echo "::add-mask::$basic"
  export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=http.extraheader
  export GIT_CONFIG_VALUE_0="AUTHORIZATION: basic $basic"
fi

fetch() {
  local dir=$1
  if git ls-remote --exit-code --heads "$url" "$branch" >/dev/null 2>&1; then
    git clone --quiet --depth 1 --single-branch --branch "$branch" "$url" "$dir"
    echo "cert store: $(find "$dir" -name '*.json' ! -name '*.sigstore.json' -not -path '*/.git/*' | wc -l) cert(s) on $branch"
  else
    mkdir -p "$dir"
    echo "cert store: no branch $branch yet: the store is empty"
  fi
}

push() {
  local dir=$1 fresh=$2 cert digest added=0
  if [ ! -d "$dir/.git" ]; then
    git init --quiet "$dir"
    git -C "$dir" checkout --quiet --orphan "$branch"
    git -C "$dir" remote add origin "$url"
  fi
  while IFS= read -r -d '' cert; do
    # Certs only (MODEL__ctxC__NN.json): an artifact may also hold the run's plan and logs.
    case "$cert" in *.sigstore.json | *.superseded-*) continue ;; esac
    case "${cert##*/}" in *__ctx*__N*.json) ;; *) continue ;; esac
    digest=$(sha256sum "$cert" | cut -c1-64)
    [ -d "$dir/certs/$digest" ] && continue
    mkdir -p "$dir/certs/$digest"
    cp "$cert" "$dir/certs/$digest/"
    for side in "$cert.sigstore.json" "$cert.intoto.sigstore.json"; do
      if [ -f "$side" ]; then cp "$side" "$dir/certs/$digest/"; fi
    done
    added=$((added + 1))
  done < <(find "$fresh" -type f -name '*.json' -print0)
  if [ "$added" -eq 0 ]; then
    echo "cert store: nothing new to store"
    return 0
  fi
  git -C "$dir" add -A
  git -C "$dir" -c user.name="github-actions[bot]" \
    -c user.email="41898282+github-actions[bot]@users.noreply.github.com" \
    commit --quiet -m "store ${added} cert(s) from ${GITHUB_REPOSITORY:-?} run ${GITHUB_RUN_ID:-?}"
  # Certs are added under new names only, so another run's push rebases without conflict.
  for attempt in 1 2 3 4 5; do
    if git -C "$dir" push --quiet origin "HEAD:refs/heads/$branch"; then
      echo "cert store: pushed ${added} cert(s) to $branch"
      return 0
    fi
    echo "cert store: push refused (attempt $attempt); rebasing on the branch"
    git -C "$dir" fetch --quiet origin "$branch" || true
    git -C "$dir" rebase --quiet FETCH_HEAD || git -C "$dir" rebase --abort
    sleep "$attempt"
  done
  echo "::error::cert store: could not push to $branch"
  return 1
}

case "${1:-}" in
  fetch) fetch "${2:?DIR}" ;;
  push) push "${2:?DIR}" "${3:?FRESH}" ;;
  *)
    echo "usage: cert-store.sh fetch DIR | push DIR FRESH" >&2
    exit 2
    ;;
esac
