#!/usr/bin/env bash
# The test command (`make test`, and so CI): lint, type-check, then pytest against a real Kafka
# broker that this script starts on a test port and always stops. pytest's exit code 5 (no tests
# collected) is a failure here.
#   PYTEST_ARGS   extra pytest arguments (e.g. "-m 'not slow'")
#   ORL_TEST_KAFKA_PORT  broker port for the tests (default 19092)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
export ORL_KAFKA_PORT=${ORL_TEST_KAFKA_PORT:-19092}
kafka=deploy/local/kafka/kafka.sh

echo "== ruff"
.venv/bin/ruff check online_rl services tests bench
echo "== mypy"
.venv/bin/mypy

echo "== kafka broker"
trap 'bash "$kafka" stop || true' EXIT
ORL_TEST_KAFKA_BOOTSTRAP=$(bash "$kafka" start)
export ORL_TEST_KAFKA_BOOTSTRAP

echo "== model"
.venv/bin/online-rl model prepare

echo "== pytest"
set +e
eval ".venv/bin/python -m pytest --durations=40 ${PYTEST_ARGS:-}"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "run-tests: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit $rc
