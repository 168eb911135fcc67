"""What the trainer waits out (an MLflow outage: its publish is retried next step) and what ends it (a
refusal: a bug or a misconfiguration that retrying cannot mend). Pure: the exceptions MLflow's client
and the artifact stores raise."""

from __future__ import annotations

import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import (
    INVALID_PARAMETER_VALUE,
    PERMISSION_DENIED,
    REQUEST_LIMIT_EXCEEDED,
    TEMPORARILY_UNAVAILABLE,
)

from online_rl.registry import mlflow_outage


@pytest.mark.parametrize("error", [
    MlflowException("API request to http://mlflow:5000 failed with exception Max retries exceeded"),
    MlflowException("busy", error_code=TEMPORARILY_UNAVAILABLE),
    MlflowException("slow down", error_code=REQUEST_LIMIT_EXCEEDED),
    requests.ConnectionError("refused"),
    ConnectionRefusedError(),
    TimeoutError(),
    OSError(28, "No space left on device"),
])
def test_an_outage_is_waited_out(error: BaseException) -> None:
    assert mlflow_outage(error)


@pytest.mark.parametrize("error", [
    MlflowException("no", error_code=PERMISSION_DENIED),
    MlflowException("bad", error_code=INVALID_PARAMETER_VALUE),
    PermissionError(13, "Permission denied"),
    ValueError("a bug"),
])
def test_a_refusal_ends_the_trainer(error: BaseException) -> None:
    assert not mlflow_outage(error)
