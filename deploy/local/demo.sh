#!/usr/bin/env bash
# The main job on the embedded default (the README's first command, `make demo`).
#
# Today it brings up what exists: the embedded model (prepared and verified through transformers
# and vLLM), a real Kafka broker, the local MLflow store and a Ray runtime, and checks each one.
# The full loop (serve -> feedback -> train -> canary -> promote) is not built yet; see the
# open issues.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
cli=.venv/bin/online-rl

echo "== 1/4 embedded model"
$cli model prepare
$cli model check --engine transformers
$cli model check --engine vllm
echo "== 2/4 Kafka broker"
bash deploy/local/kafka/kafka.sh start
echo "== 3/4 MLflow store and Ray runtime"
.venv/bin/python - <<'PY'
import ray
from online_rl.config import load_settings
from online_rl.ray_runtime import init_ray
from online_rl.tracking import mlflow_client

settings = load_settings()
client = mlflow_client(settings)
print(f"MLflow store: {settings.mlflow_tracking_uri}")
init_ray(settings)
print(f"Ray runtime: {ray.cluster_resources().get('CPU', 0):.0f} CPUs")
ray.shutdown()
PY
echo "== 4/4 the learning loop"
echo "Not built yet: serving, feedback, training and canary rollout land with the next issues."
echo "The Kafka broker is left running; stop it with: make kafka-stop"
