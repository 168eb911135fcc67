#!/usr/bin/env bash
# The main job on the embedded default (the README's first command, `make demo`).
#
# Today it brings up what exists: the embedded model (prepared and verified through transformers
# and vLLM), a real Kafka broker, the local MLflow store and a Ray runtime, the inference service
# (OpenAI-compatible; it logs the interaction), the feedback API (a thumbs-up on that answer) and
# the join into a training sample, and the trainer learning from it and publishing a version to
# MLflow, and the canary gateway loading that version into the inference service (hot swap) and
# starting its rollout. The one-command launcher with simulated users (the whole loop, judged and
# promoted) comes with its issue.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
cli=.venv/bin/online-rl

echo "== 1/6 embedded model"
$cli model prepare
$cli model check --engine transformers
$cli model check --engine vllm
echo "== 2/6 Kafka broker"
bash deploy/local/kafka/kafka.sh start
echo "== 3/6 MLflow store and Ray runtime"
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
echo "== 4/6 serving and feedback: a real answer, a thumbs-up on it, the join"
export ORL_KAFKA__BOOTSTRAP_SERVERS=${ORL_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:${ORL_KAFKA_PORT:-9092}}
$cli bus create-topics
keys=$($cli keys new --scopes feedback,inference,admin 2>/dev/null)
key=$(echo "$keys" | sed -n 's/^key: *//p')
entry=$(echo "$keys" | sed -n 's/^entry: *//p')
ORL_FEEDBACK_API__API_KEYS="[\"$entry\"]" $cli serve feedback --port 8082 &
feedback_pid=$!
ORL_INFERENCE__API_KEYS="[\"$entry\"]" $cli serve inference --port 8081 &
inference_pid=$!
trap 'kill $feedback_pid $inference_pid 2>/dev/null || true' EXIT
ORL_DEMO_KEY=$key .venv/bin/python - <<'PY'
import os, time
import httpx
import openai
from online_rl.client import FeedbackClient

def wait(url: str, name: str) -> None:
    for _ in range(300):
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the {name} did not become ready on {url} (is the port taken?)")

wait("http://127.0.0.1:8082", "feedback API")
wait("http://127.0.0.1:8081", "inference service")
llm = openai.OpenAI(base_url="http://127.0.0.1:8081/v1", api_key=os.environ["ORL_DEMO_KEY"])
answer = llm.chat.completions.create(
    model="SmolLM2-135M-Instruct", user="demo-user", max_tokens=32, temperature=0,
    messages=[{"role": "user", "content": "What is the capital of France?"}])
print(f"inference service answered ({answer.model}, request_id {answer.id}):")
print("  ", answer.choices[0].message.content)
with FeedbackClient("http://127.0.0.1:8082", os.environ["ORL_DEMO_KEY"]) as client:
    print("feedback API answered:", client.thumbs(answer.id, user_id="demo-user", up=True))
PY
timeout -s TERM 20 $cli join --window 2 || true
$cli bus tail orl.samples --count 1
echo "== 5/6 the learning loop: train on the joined sample, publish a version to MLflow"
run_dir=$(mktemp -d)
ORL_TRAINER__CHECKPOINT_DIR="$run_dir/checkpoints" ORL_TRAINER__GROUP_ID="demo-$(basename "$run_dir")" \
  ORL_TRAINER__PUBLISH_EVERY_SAMPLES=1 ORL_TRAINER__BATCH_TIMEOUT_S=2 ORL_TRAINER__PRECISION=bf16 \
  $cli trainer --idle-exit 8
.venv/bin/python - <<'PY'
import tempfile
from pathlib import Path

import mlflow
from online_rl.config import load_settings
from online_rl.registry import read_lineage
from online_rl.tracking import mlflow_client

settings = load_settings()
client = mlflow_client(settings)  # also points MLflow's model registry at this store
name = settings.mlflow.registered_model
version = client.get_model_version_by_alias(name, "challenger")
with tempfile.TemporaryDirectory() as tmp:
    folder = mlflow.artifacts.download_artifacts(f"models:/{name}@challenger", dst_path=tmp)
    lineage = read_lineage(Path(folder))
print(f"MLflow: {name} version {version.version} (alias challenger), adapter {lineage.adapter_sha256[:12]}, "
      f"trained on {lineage.offsets}, behaviour versions {lineage.behaviour_versions}")
print(f"Browse it: .venv/bin/mlflow ui --backend-store-uri {settings.mlflow_tracking_uri}")
PY
rm -rf "$run_dir"
echo "== 6/6 the canary gateway: the new version hot-swapped into serving, its rollout started"
ORL_GATEWAY__API_KEYS="[\"$entry\"]" ORL_GATEWAY__UPSTREAM_API_KEY=$key ORL_GATEWAY__ROLLOUT__INTERVAL_S=1 \
  ORL_GATEWAY__ROLLOUT__STATE_DIR="$(mktemp -d)" $cli serve gateway --port 8080 &
gateway_pid=$!
trap 'kill $feedback_pid $inference_pid $gateway_pid 2>/dev/null || true' EXIT
ORL_DEMO_KEY=$key .venv/bin/python - <<'PY'
import os, time
import httpx
import openai

key = os.environ["ORL_DEMO_KEY"]
admin = {"Authorization": f"Bearer {key}"}
for _ in range(240):
    try:
        status = httpx.get("http://127.0.0.1:8080/rollout", headers=admin, timeout=5).json()
        if status.get("rollout") and status["rollout"]["status"] == "running":
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
else:
    raise SystemExit("the gateway did not start the rollout of the new version")
rollout = status["rollout"]
print(f"gateway: rollout {rollout['rollout_id']} of version {rollout['challenger']} at {rollout['weight']:.0%}")
llm = openai.OpenAI(base_url="http://127.0.0.1:8080/v1", api_key=key)
served = {}
for user in [f"user-{i}" for i in range(40)]:
    raw = llm.chat.completions.with_raw_response.create(
        model="any", user=user, max_tokens=4, temperature=0, messages=[{"role": "user", "content": "Hi!"}])
    served[raw.headers["x-orl-version"]] = served.get(raw.headers["x-orl-version"], 0) + 1
print(f"40 users through the gateway (sticky split): {served}")
PY
$cli rollout status --url http://127.0.0.1:8080 --key "$key"
echo "The rollout page: http://127.0.0.1:8080/rollout/ui (while the gateway runs; an admin key opens it)."
echo "Not built yet: simulated users whose feedback walks the rollout to promotion (the next issue)."
echo "The Kafka broker is left running; stop it with: make kafka-stop"
