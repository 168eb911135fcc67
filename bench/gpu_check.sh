#!/usr/bin/env bash
# GPU readiness (issue 26): the vLLM-on-CUDA and NCCL paths in one run, sized for under 8 minutes on one
# GPU. Run from the repository root on a machine with an NVIDIA GPU:
#
#     bash bench/gpu_check.sh
#
# 1. setup with the GPU lock (deploy/setup.sh with ORL_DEVICE=gpu: vllm from PyPI, CUDA torch) and the
#    embedded model;
# 2. serving on vLLM (CUDA) with a LoRA hot swap (tests/services/inference/test_vllm_service.py);
# 3. the rollout flow on vLLM (CUDA) with in-memory LoRA sync and the asynchronous pipeline
#    (tests/hybrid/test_vllm_rollout.py: the engine and the training device share the GPU);
# 4. NCCL resharding at tp = 1 (tests/hybrid/test_reshard.py::test_nccl_reshard_on_one_gpu...).
#
# Each part prints PASS or FAIL with its seconds; the last line is one JSON object of the results.
# `--no-setup` skips part 1 and runs the tests with `$PY` (default python3) where the packages are
# already installed (a lent device machine reaches no package index), after preparing the model.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
nvidia-smi -L || { echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L lists none)" >&2; exit 2; }
declare -A result seconds
part() {  # part NAME COMMAND...
  local name="$1"; shift
  local start=$SECONDS
  if "$@"; then result[$name]=pass; else result[$name]=fail; fi
  seconds[$name]=$((SECONDS - start))
  echo "gpu_check: $name ${result[$name]^^} in ${seconds[$name]}s"
}
export ORL_DEVICE=gpu
if [ "${1:-}" = --no-setup ]; then
  python="${PY:-python3}"
  part setup "$python" -m online_rl.cli model prepare
else
  python=.venv/bin/python
  part setup bash -c 'bash deploy/setup.sh && .venv/bin/online-rl model prepare'
fi
py=("$python" -m pytest -q -x -p no:randomly)
part serving_hot_swap timeout 180 "${py[@]}" tests/services/inference/test_vllm_service.py
part rollout_vllm timeout 240 "${py[@]}" tests/hybrid/test_vllm_rollout.py
part nccl_reshard timeout 120 "${py[@]}" tests/hybrid/test_reshard.py -k nccl
json="{"
for name in setup serving_hot_swap rollout_vllm nccl_reshard; do
  json+="\"$name\": {\"result\": \"${result[$name]}\", \"seconds\": ${seconds[$name]}}, "
done
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "${json}\"gpu\": \"$gpu\"}"
for name in "${!result[@]}"; do [ "${result[$name]}" = pass ] || exit 1; done
