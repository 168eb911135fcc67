#!/usr/bin/env bash
# The main job on the embedded default (the README's first command, `make demo`).
#
# 1. the embedded model (SmolLM2-135M-Instruct from PyPI, converted once and verified), the machine
#    line and what `precision: auto` picks here, and the trainer's cadence for this machine's speed;
# 2. `online-rl up --fresh`: the Kafka broker, the MLflow server (SQLite, UI), an inference replica,
#    the feedback API, the joiner, the trainer and the canary gateway as local processes;
# 3. `online-rl demo`: simulated users who like short answers chat through the gateway and give
#    thumbs through the feedback API until a version trained on their feedback has been promoted
#    through the canary and measured (or the time budget is spent), then the report
#    (demo-report/report.md, reward.png, report.json).
# The loop keeps running afterwards so you can look around (MLflow UI, rollout page);
# `.venv/bin/online-rl down` stops it (ORL_DEMO_DOWN=1 stops it at the end of this script).
# ORL_DEMO_ANCHORS=neutral uses the base model's own answers as the cold-start anchors instead of the
# short factual ones (online_rl/demo/anchors.py).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
cli=.venv/bin/online-rl
export ORL_CONFIG=${ORL_CONFIG:-deploy/local/demo.yaml}
out=${ORL_DEMO_OUT:-demo-report}

echo "== 1/3 the embedded model, the trainer's cold-start anchors (against forgetting), this machine"
$cli model prepare
ORL_TRAINER__COLD_START=$(.venv/bin/python -m online_rl.demo.anchors --style "${ORL_DEMO_ANCHORS:-short}")
export ORL_TRAINER__COLD_START
$cli version | tail -4
# one training step of the demo's shape, timed: the trainer's batch and publish cadence follow it
tuned=$(.venv/bin/python -m online_rl.demo.tune)
eval "$tuned"
echo "== 2/3 the loop: every component as a local process"
$cli down >/dev/null 2>&1 || true   # a previous demo's run, if one is still up
$cli up --fresh
echo "== 3/3 simulated users until a version is promoted through the canary, then the report"
rc=0
$cli demo --out "$out" --budget "${ORL_DEMO_BUDGET:-1200}" || rc=$?  # 1: nothing was promoted
if [ "${ORL_DEMO_DOWN:-0}" = 1 ]; then
  $cli down
else
  echo "The loop is still running: MLflow UI and rollout page above; stop it with: $cli down"
fi
exit $rc
