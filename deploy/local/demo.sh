#!/usr/bin/env bash
# The main job on the embedded default (the README's first command, `make demo`).
#
# Today it brings up what exists: the embedded model (prepared and verified through transformers
# and vLLM), a real Kafka broker, the local MLflow store and a Ray runtime, the feedback API and the
# event log (one interaction and a thumbs-up joined into a training sample). The full loop (serve -> feedback -> train -> canary -> promote) is not built yet; see the
# open issues.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
cli=.venv/bin/online-rl

echo "== 1/5 embedded model"
$cli model prepare
$cli model check --engine transformers
$cli model check --engine vllm
echo "== 2/5 Kafka broker"
bash deploy/local/kafka/kafka.sh start
echo "== 3/5 MLflow store and Ray runtime"
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
echo "== 4/5 event log: an interaction, a thumbs-up through the feedback API, the join"
export ORL_KAFKA__BOOTSTRAP_SERVERS=${ORL_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:${ORL_KAFKA_PORT:-9092}}
$cli bus create-topics
keys=$($cli keys new --scopes feedback 2>/dev/null)
key=$(echo "$keys" | sed -n 's/^key: *//p')
entry=$(echo "$keys" | sed -n 's/^entry: *//p')
ORL_FEEDBACK_API__API_KEYS="[\"$entry\"]" $cli serve feedback --port 8082 &
feedback_pid=$!
trap 'kill $feedback_pid 2>/dev/null || true' EXIT
ORL_DEMO_KEY=$key .venv/bin/python - <<'PY'
import os, time, uuid
import httpx
from online_rl.bus import INTERACTIONS, open_bus
from online_rl.client import FeedbackClient
from online_rl.config import load_settings
from online_rl.events import Interaction, Message, encode

for _ in range(100):  # wait for the feedback API
    try:
        if httpx.get("http://127.0.0.1:8082/readyz", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.3)
else:
    raise SystemExit("the feedback API did not become ready on 127.0.0.1:8082 (is the port taken?)")
bus = open_bus(load_settings())
rid = f"demo-{uuid.uuid4().hex[:8]}"
bus.producer().send(INTERACTIONS, encode(Interaction(
    request_id=rid, user_id="demo-user", created_at=time.time(), model="SmolLM2-135M-Instruct",
    prompt=[Message(role="user", content="What is the capital of France?")], prompt_token_ids=[1],
    completion="The capital of France is Paris.", completion_token_ids=[2], completion_logprobs=[-0.1],
)), rid.encode())
with FeedbackClient("http://127.0.0.1:8082", os.environ["ORL_DEMO_KEY"]) as client:
    print("feedback API answered:", client.thumbs(rid, user_id="demo-user", up=True))
PY
timeout -s TERM 20 $cli join --window 2 || true
$cli bus tail orl.samples --count 1
echo "== 5/5 the learning loop"
echo "Not built yet: serving, training and canary rollout land with the next issues."
echo "The Kafka broker is left running; stop it with: make kafka-stop"
