#!/usr/bin/env bash
# The test command (`make test`, and so CI): lint, type-check, then pytest against a real Kafka
# broker that this script starts on a test port and always stops. pytest runs twice: the tests not
# marked `serial` side by side in pytest-xdist workers (most of the suite waits on brokers, processes
# and timeouts, not on the CPU), then those marked `serial` alone (their figures include time bounds).
# No test collected by either run is a failure here.
#   PYTEST_MARK   a marker expression that selects tests in both runs (e.g. "not slow")
#   PYTEST_ARGS   extra pytest arguments for both runs (e.g. "-k joiner" or "tests/stream")
#   ORL_TEST_WORKERS  workers of the first run (default: the cores, at least 2 and at most 4; 0 runs
#                 it in one process)
#   ORL_TEST_KAFKA_PORT  broker port for the tests (default 19092)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
export ORL_KAFKA_PORT=${ORL_TEST_KAFKA_PORT:-19092}

# The broker and the embedded model are made ready in the background while ruff and mypy run (mypy
# alone takes a minute on a fresh clone): the same steps, side by side.
scratch=$(mktemp -d)
# A broker folder of this run's own: the suite creates thousands of topics (each test its own prefix),
# and a folder kept from earlier runs grows by that much each time until the broker spends a core on
# its partitions alone (15,000 after a day of runs here: requests timed out, tests failed). Only this
# broker's start and stop are told (the brokers tests start themselves keep folders of their own).
kafka() { ORL_KAFKA_RUN="$scratch/kafka" bash deploy/local/kafka/kafka.sh "$@"; }
# (the broker's start is waited for before it is stopped: stopping first would find no broker, and the
# start would then leave one running)
trap 'kill "${model_job:-}" 2>/dev/null || true; wait "${kafka_job:-}" 2>/dev/null || true
      kafka stop || true; rm -rf "$scratch"' EXIT
kafka start > "$scratch/bootstrap" 2> "$scratch/kafka.log" &
kafka_job=$!
.venv/bin/online-rl model prepare > "$scratch/model.log" 2>&1 &
model_job=$!

echo "== ruff"
.venv/bin/ruff check online_rl services tests bench
echo "== mypy"
.venv/bin/mypy

echo "== kafka broker"
if ! wait "$kafka_job"; then
  cat "$scratch/kafka.log" >&2
  echo "run-tests: the Kafka broker did not start (its output is above)" >&2
  exit 1
fi
cat "$scratch/kafka.log" >&2
ORL_TEST_KAFKA_BOOTSTRAP=$(cat "$scratch/bootstrap")
export ORL_TEST_KAFKA_BOOTSTRAP

echo "== model"
if ! wait "$model_job"; then
  cat "$scratch/model.log" >&2
  echo "run-tests: the embedded model could not be prepared (its output is above)" >&2
  exit 1
fi
cat "$scratch/model.log"

workers=${ORL_TEST_WORKERS:-$(n=$(nproc); echo $(( n < 2 ? 2 : (n > 4 ? 4 : n) )))}
mark=${PYTEST_MARK:-}
only() { if [ -n "$mark" ]; then echo "($mark) and $1"; else echo "$1"; fi; }

set +e
echo "== pytest: $workers workers side by side (the tests not marked serial)"
eval ".venv/bin/python -m pytest -n $workers --durations=80 --junitxml=.ci-junit.xml" \
  "-m \"$(only 'not serial')\" ${PYTEST_ARGS:-}"
side_by_side=$?
echo "== pytest: alone (the tests marked serial)"
eval ".venv/bin/python -m pytest --durations=10 --junitxml=.ci-junit-serial.xml" \
  "-m \"$(only serial)\" ${PYTEST_ARGS:-}"
alone=$?
set -e
if [ $side_by_side -eq 5 ] && [ $alone -eq 5 ]; then
  echo "run-tests: pytest collected no tests; that is a failure" >&2
  exit 1
fi
for rc in $side_by_side $alone; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
exit 0
