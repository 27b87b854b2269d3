#!/usr/bin/env bash
# The composite action's container step: run the action image the way the runner runs a
# Docker action (same mounts and variables), so the step can be followed by an upload step.
#
#   workspace       -> /github/workspace (also the working directory)
#   file commands   -> /github/file_commands (GITHUB_OUTPUT, GITHUB_STEP_SUMMARY live there)
#   $RUNNER_TEMP/_github_home -> /github/home (HOME: sigstore's cache)
#   INPUT_<NAME>    -> INPUT_<NAME-WITH-HYPHENS> (INPUT_SERVER_BIN -> INPUT_SERVER-BIN)
#
# and, beyond what a Docker action gets:
#
#   INPUT_MODELS_DIR -> /github/models, read-only (a relative `model` is looked up there)
#   INPUT_SERVER_DIR -> /github/server, read-only (a relative `server-bin` is looked up there)
#   $RUNNER_TOOL_CACHE/batch-invariance/<key> -> /github/toolcache (BATCH_INVARIANCE_CACHE:
#                       the embedded default's build and model, kept between jobs; <key> is a
#                       hash of the image's base, whose C library the build links against)
#   CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES of the runner, when set (GPU placement)
#
# The image is BI_IMAGE (must be pinned by digest, NAME@sha256:...) or, when empty, built from
# this action's own source (BI_ACTION_PATH, i.e. github.action_path) and tagged by a hash of
# that source, so a runner builds each version once. BI_BASE_IMAGE sets the build's
# BASE_IMAGE; BI_GPUS is passed as --gpus; BI_BUILD_NETWORK as `docker build --network`;
# BI_BUILD_ONLY=1 only makes sure the image exists and prints its name; BI_PRINT_CACHE=1 only
# prints the tool-cache folder the container would use (empty without RUNNER_TOOL_CACHE).
# The exit code is the container's: the verdict (0 pass, 1 RED, 3 not promotable, ...).
set -euo pipefail

# A workflow-command message, escaped as the runner unescapes it (%, CR, LF), so that a value
# in it (an input, a path) can neither end the line nor start a command of its own.
escape_data() {
  local text=$1
  text=${text//%/%25}
  text=${text//$'\r'/%0D}
  text=${text//$'\n'/%0A}
  printf '%s' "$text"
}

die() {
  printf '::error title=batch-invariance container step::%s\n' "$(escape_data "$1")"
  exit "${2:-2}"
}

: "${GITHUB_WORKSPACE:?GITHUB_WORKSPACE is not set}"
: "${GITHUB_OUTPUT:?GITHUB_OUTPUT is not set}"
action_path=${BI_ACTION_PATH:-$(cd "$(dirname "$0")/.." && pwd)}
command -v docker >/dev/null 2>&1 || die "docker is not on PATH: this action needs a runner with a Docker engine"

# The build cache's key: the image's base (a prebuilt image: its digest).
cache_key=$(printf '%s' "${BI_IMAGE:-base=${BI_BASE_IMAGE:-default}}" | sha256sum | cut -c1-16)
tool_cache=""
[ -n "${RUNNER_TOOL_CACHE:-}" ] && tool_cache="$RUNNER_TOOL_CACHE/batch-invariance/$cache_key"
if [ "${BI_PRINT_CACHE:-}" = 1 ]; then
  echo "$tool_cache"
  exit 0
fi

# A host folder for a read-only mount: absolute as given, relative under the workspace.
host_folder() {
  local name=$1 value=$2 folder
  [[ "$value" != *[$'\n\r']* ]] || die "input $name holds a line break; it takes one folder"
  folder=$value
  [[ "$folder" = /* ]] || folder="$GITHUB_WORKSPACE/$folder"
  [ -d "$folder" ] || die "input $name $value: no such folder on the runner ($folder)"
  folder_found=$(cd "$folder" && pwd -P)
}
models_dir=""
server_dir=""
if [ -n "${INPUT_MODELS_DIR:-}" ]; then
  host_folder models-dir "$INPUT_MODELS_DIR"
  models_dir=$folder_found
fi
if [ -n "${INPUT_SERVER_DIR:-}" ]; then
  host_folder server-dir "$INPUT_SERVER_DIR"
  server_dir=$folder_found
fi

# One runner per GPU: `gpus: device=N` renumbers the GPUs the container sees from 0, so a
# runner's CUDA_VISIBLE_DEVICES=N would then select nothing.
if [[ "${BI_GPUS:-}" == *device=* ]] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  die "input gpus ${BI_GPUS} and the runner's CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES} both pick GPUs; inside the container device= renumbers them from 0: set one of the two"
fi

image=${BI_IMAGE:-}
if [ -n "$image" ]; then
  [[ "$image" =~ ^[^@[:space:]]+@sha256:[0-9a-f]{64}$ ]] ||
    die "input image must be pinned by digest (NAME@sha256:<64 hex>), got '$image'"
  docker image inspect "$image" >/dev/null 2>&1 || docker pull --quiet "$image" >/dev/null ||
    die "cannot pull $image" 4
else
  key=$(
    cd "$action_path"
    find Dockerfile .dockerignore pyproject.toml README.md LICENSE NOTICE src -type f \
      ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 | LC_ALL=C sort -z |
      xargs -0 sha256sum | sha256sum | cut -c1-20
  )
  base_key=$(printf '%s' "${BI_BASE_IMAGE:-}" | sha256sum | cut -c1-8)
  image="batch-invariance-action:${key}-${base_key}"
  if docker image inspect "$image" >/dev/null 2>&1; then
    echo "action image $image: cached"
  else
    build=(build --quiet -t "$image")
    [ -n "${BI_BASE_IMAGE:-}" ] && build+=(--build-arg "BASE_IMAGE=$BI_BASE_IMAGE")
    [ -n "${BI_BUILD_NETWORK:-}" ] && build+=(--network "$BI_BUILD_NETWORK")
    echo "action image $image: building from $action_path"
    docker "${build[@]}" "$action_path" >/dev/null || die "docker build of the action image failed" 4
  fi
fi

if [ "${BI_BUILD_ONLY:-}" = 1 ]; then
  echo "$image"
  exit 0
fi
# The image the cell is measured in, for the cert's provenance.host.container_image: its name
# as run (pinned by digest, or the tag of a build from this action's source) and its image ID.
image_id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) || image_id=""

# What tells this step from the others of its run that may measure the same cell (a matrix's
# entries differ in their inputs, two jobs in their names): the artifact's name carries its
# hash (action/name-artifact.sh).
job_key=$({ printf '%s\n' "${GITHUB_JOB:-}" "${GITHUB_ACTION:-}"; env -0 | { grep -z '^INPUT_' || true; } |
  LC_ALL=C sort -z | tr '\0' '\n'; } | sha256sum | cut -c1-16)
echo "job-key=$job_key" >>"$GITHUB_OUTPUT"

file_commands=$(dirname "$GITHUB_OUTPUT")
summary=${GITHUB_STEP_SUMMARY:-}
home="${RUNNER_TEMP:-$(dirname "$GITHUB_WORKSPACE")}/_github_home"
mkdir -p "$home"

name="bi-cell-$$-${RANDOM}"
args=(run --rm --name "$name"
  -v "$GITHUB_WORKSPACE:/github/workspace" -w /github/workspace
  -v "$file_commands:/github/file_commands"
  -v "$home:/github/home"
  -e GITHUB_WORKSPACE=/github/workspace -e HOME=/github/home
  -e "GITHUB_OUTPUT=/github/file_commands/$(basename "$GITHUB_OUTPUT")"
  -e GITHUB_ACTIONS=true -e CI=true
  -e GITHUB_REPOSITORY -e GITHUB_RUN_ID -e GITHUB_RUN_ATTEMPT -e GITHUB_SHA -e GITHUB_REF
  -e GITHUB_API_URL -e GITHUB_TOKEN
  -e ACTIONS_ID_TOKEN_REQUEST_URL -e ACTIONS_ID_TOKEN_REQUEST_TOKEN
  -e "BATCH_INVARIANCE_IMAGE=$image" -e "BATCH_INVARIANCE_IMAGE_ID=$image_id")
if [ -n "$summary" ]; then
  if [ "$(dirname "$summary")" = "$file_commands" ]; then
    args+=(-e "GITHUB_STEP_SUMMARY=/github/file_commands/$(basename "$summary")")
  else
    args+=(-v "$summary:/github/step_summary" -e GITHUB_STEP_SUMMARY=/github/step_summary)
  fi
fi
[ -n "${BI_GPUS:-}" ] && args+=(--gpus "$BI_GPUS")
for name in CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES; do
  [ -n "${!name+set}" ] && args+=(-e "$name")
done
if [ -n "$tool_cache" ]; then
  mkdir -p "$tool_cache"
  args+=(-v "$tool_cache:/github/toolcache" -e BATCH_INVARIANCE_CACHE=/github/toolcache)
fi
[ -n "$models_dir" ] && args+=(-v "$models_dir:/github/models:ro" -e "INPUT_MODELS-DIR=/github/models")
[ -n "$server_dir" ] && args+=(-v "$server_dir:/github/server:ro" -e "INPUT_SERVER-DIR=/github/server")
# The runner's own paths of the mounts, so that a refusal names them (action/lookup.py).
args+=(-e "BI_HOST_WORKSPACE=$GITHUB_WORKSPACE" -e "BI_HOST_MODELS_DIR=$models_dir"
  -e "BI_HOST_SERVER_DIR=$server_dir" -e "BI_INPUT_MODELS_DIR=${INPUT_MODELS_DIR:-}"
  -e "BI_INPUT_SERVER_DIR=${INPUT_SERVER_DIR:-}")
# Inputs as the runner spells them for a Docker action: hyphens kept.
while IFS= read -r -d '' entry; do
  key=${entry%%=*}
  case "$key" in
    # The mount points above (act also sets the hyphenated spelling for a composite's inputs).
    INPUT_MODELS_DIR | INPUT_SERVER_DIR | INPUT_MODELS-DIR | INPUT_SERVER-DIR) ;;
    INPUT_*) args+=(-e "INPUT_$(printf '%s' "${key#INPUT_}" | tr '_' '-')=${entry#*=}") ;;
  esac
done < <(env -0)

# A cancelled job sends SIGTERM/SIGINT to this script: stop the container too, so the cell's
# servers end with it (the entrypoint turns SIGTERM into a clean, reported interruption).
stop() { docker stop --time 30 "$name" >/dev/null 2>&1 || true; }
trap stop TERM INT
rc=0
docker "${args[@]}" "$image" &
wait $! || rc=$?
if [ "$rc" -gt 128 ]; then
  stop
  wait || true
fi
exit "$rc"
