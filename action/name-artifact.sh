#!/usr/bin/env bash
# The composite action's second step: an artifact name unique per cell and run attempt (a
# re-run must not collide with the first attempt's artifact: upload-artifact v4 answers 409),
# and the attestation path when the cert was signed. Reads CELL_ID, CERT_PATH, RUN_ATTEMPT.
set -euo pipefail
: "${CELL_ID:?}" "${CERT_PATH:?}" "${RUN_ATTEMPT:?}" "${GITHUB_OUTPUT:?}"
attestation="${CERT_PATH}.intoto.sigstore.json"
[ -f "$attestation" ] || attestation=""
{
  echo "name=bi-cert-${CELL_ID}-a${RUN_ATTEMPT}"
  echo "attestation-path=${attestation}"
} >>"$GITHUB_OUTPUT"
