#!/usr/bin/env bash
# One small cell per engine on a GPU host; skips every engine that is not installed.
#
#   MODEL_GGUF=path/to/model.gguf   (llama-server, llama-cpp-python)
#   MODEL_HF=path/or/hf-id          (vLLM, SGLang; a local folder on an offline host)
#   LLAMA_SERVER=path/to/llama-server   LLAMA_CPP_PYTHON=python-with-llama-cpp-python
#   VLLM_PYTHON=python-with-vllm   SGLANG_PYTHON=python-with-sglang   OUT=gpu-smoke-out
#
# Prints one line per engine: the verdict, or why it was skipped. Exit 0 unless a cell that
# ran failed to produce a cert (RED/AMBER/UNVERIFIED are results, not failures here).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

OUT=${OUT:-gpu-smoke-out}
WORKSET=${WORKSET:-src/batch_invariance/data/worksets/demo.json}
CELL=(--workset "$WORKSET" --ctx 2048 --parallel 4 --gate-passes 2 --n-predict 64)
status=0

run_cell() {  # name, then run-live arguments
  local name=$1
  shift
  local dir="$OUT/$name"
  rm -rf "$dir"
  batch-invariance run-live "$@" "${CELL[@]}" --out-dir "$dir" > "$OUT/$name.log" 2>&1
  local code=$?
  local cert
  cert=$(find "$dir" -maxdepth 1 -name '*.json' 2>/dev/null | head -n 1)
  if [[ -z "$cert" ]]; then
    echo "$name: no cert (exit $code); see $OUT/$name.log"
    status=1
  else
    echo "$name: $(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["verdict"], c["source"], "|", c["decision_reasons"][0][:100])' "$cert") (exit $code)"
  fi
}

skip() { echo "$1: skipped ($2)"; }

mkdir -p "$OUT"
if [[ -n "${MODEL_GGUF:-}" && -x "${LLAMA_SERVER:-}" ]]; then
  run_cell llama-server --server-bin "$LLAMA_SERVER" --model "$MODEL_GGUF"
else
  skip llama-server "set LLAMA_SERVER and MODEL_GGUF"
fi
if [[ -n "${MODEL_GGUF:-}" && -n "${LLAMA_CPP_PYTHON:-}" ]] \
  && "$LLAMA_CPP_PYTHON" -c 'import llama_cpp.server' 2>/dev/null; then
  run_cell llama-cpp-python --engine llama-cpp-python --server-bin "$LLAMA_CPP_PYTHON" \
    --model "$MODEL_GGUF"
else
  skip llama-cpp-python "set LLAMA_CPP_PYTHON (a python with llama-cpp-python[server]) and MODEL_GGUF"
fi
VLLM_PY=${VLLM_PYTHON:-python3}
if [[ -n "${MODEL_HF:-}" ]] && "$VLLM_PY" -c 'import vllm' 2>/dev/null; then
  run_cell vllm --engine vllm --server-bin "$VLLM_PY" --model "$MODEL_HF" --ready-timeout 900
else
  skip vllm "vllm not importable by $VLLM_PY or MODEL_HF not set"
fi
SG_PY=${SGLANG_PYTHON:-python3}
if [[ -n "${MODEL_HF:-}" ]] && "$SG_PY" -c 'import sglang' 2>/dev/null; then
  run_cell sglang --engine sglang --server-bin "$SG_PY" --model "$MODEL_HF" --ready-timeout 900
else
  skip sglang "sglang not importable by $SG_PY or MODEL_HF not set"
fi
exit $status
