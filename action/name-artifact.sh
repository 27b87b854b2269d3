#!/usr/bin/env bash
# The artifact-naming step of the composite action and of cell.yml: a name unique per job and
# run attempt (upload-artifact v4 answers 409 to a second artifact of one name in a run), and
# the attestation path when the cert was signed. Reads CELL_ID, CERT_PATH (empty: the step
# ended without a cert; the artifact then holds only the plan and the server logs, and is
# named bi-failed-... so that nothing that collects bi-cert-* artifacts mistakes it for a
# cert), RUN_ATTEMPT (a re-run) and JOB_KEY: what tells this job from the others of its run
# that may measure the same cell (the cell id names only model, ctx and N: two matrix jobs of
# one cell with two KV layouts or flag sets differ in their inputs). The name carries the first
# 8 hex digits of its sha256: bi-cert-<cell-id>-<key>-a<attempt>.
set -euo pipefail
: "${CELL_ID:?}" "${RUN_ATTEMPT:?}" "${JOB_KEY:?}" "${GITHUB_OUTPUT:?}"
CERT_PATH=${CERT_PATH:-}
kind=cert
[ -n "$CERT_PATH" ] || kind=failed
key=$(printf '%s' "$JOB_KEY" | sha256sum | cut -c1-8)
attestation=""
if [ -n "$CERT_PATH" ] && [ -f "${CERT_PATH}.intoto.sigstore.json" ]; then
  attestation="${CERT_PATH}.intoto.sigstore.json"
fi
{
  echo "name=bi-${kind}-${CELL_ID}-${key}-a${RUN_ATTEMPT}"
  echo "attestation-path=${attestation}"
} >>"$GITHUB_OUTPUT"
