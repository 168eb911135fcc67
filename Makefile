# The two commands of the README, and what they stand on.
#   make demo   run the main job on the embedded default
#   make test   run the whole test suite (ruff, mypy, pytest with a real Kafka broker)
.PHONY: setup setup-test test test-fast lint demo kafka-start kafka-stop clean

setup:
	@bash deploy/setup.sh

setup-test:
	@bash deploy/setup.sh --test-tools

lint: setup
	.venv/bin/ruff check online_rl services tests bench
	.venv/bin/mypy

test: setup-test
	@bash deploy/local/run-tests.sh

test-fast: setup-test
	@PYTEST_MARK="not slow" bash deploy/local/run-tests.sh

demo: setup
	@bash deploy/local/demo.sh

kafka-start:
	@bash deploy/local/kafka/kafka.sh start

kafka-stop:
	@bash deploy/local/kafka/kafka.sh stop

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
