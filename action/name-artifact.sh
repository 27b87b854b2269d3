#!/usr/bin/env bash
# The composite action's second step: an artifact name unique per cell and run attempt (a
# re-run must not collide with the first attempt's artifact: upload-artifact v4 answers 409),
# and the attestation path when the cert was signed. Reads CELL_ID, CERT_PATH (empty: the step
# ended without a cert; the artifact then holds only the plan and the server logs, and is
# named bi-failed-... so that nothing that collects bi-cert-* artifacts mistakes it for a
# cert), RUN_ATTEMPT.
set -euo pipefail
: "${CELL_ID:?}" "${RUN_ATTEMPT:?}" "${GITHUB_OUTPUT:?}"
CERT_PATH=${CERT_PATH:-}
kind=cert
[ -n "$CERT_PATH" ] || kind=failed
attestation=""
if [ -n "$CERT_PATH" ] && [ -f "${CERT_PATH}.intoto.sigstore.json" ]; then
  attestation="${CERT_PATH}.intoto.sigstore.json"
fi
{
  echo "name=bi-${kind}-${CELL_ID}-a${RUN_ATTEMPT}"
  echo "attestation-path=${attestation}"
} >>"$GITHUB_OUTPUT"
