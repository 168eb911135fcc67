"""The trainer's Prometheus metrics, in a registry of its own (served by `online-rl trainer`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["TrainerMetrics"]


class TrainerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.steps = Counter("orl_trainer_steps", "Optimizer steps taken.", registry=self.registry)
        self.samples = Counter("orl_trainer_samples", "Samples trained on.", registry=self.registry)
        self.dead_letters = Counter("orl_trainer_dead_letters", "Samples sent to the dead-letter topic.",
                                    registry=self.registry)
        self.lag = Gauge("orl_trainer_lag_records", "Records on the samples topic not yet trained on.",
                         registry=self.registry)
        self.loss = Gauge("orl_trainer_loss", "Loss of the last step.", registry=self.registry)
        self.step_seconds = Histogram("orl_trainer_step_seconds", "Wall time of one optimizer step.",
                                      buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
                                      registry=self.registry)
        self.commits_refused = Counter("orl_trainer_commits_refused",
                                       "Offset commits the group refused (rebalances); training carried on.",
                                       registry=self.registry)
        self.publish_failures = Counter("orl_trainer_publish_failures",
                                        "Publishes MLflow did not take (outages); each is retried next step.",
                                        registry=self.registry)
        self.ability_refusals = Counter("orl_trainer_ability_refusals",
                                        "Versions the ability gate refused to publish (the adapter went back "
                                        "to the last published one).", registry=self.registry)
        self.metrics_waiting = Gauge("orl_trainer_mlflow_metrics_waiting",
                                     "Metric rows waiting for MLflow to take them (non-zero in an outage).",
                                     registry=self.registry)
        self.published_version = Gauge("orl_trainer_last_published_version",
                                       "Registry version number of the last published adapter (0: none).",
                                       registry=self.registry)
        self.published_at = Gauge("orl_trainer_last_publish_timestamp_seconds",
                                  "When the last adapter was published (Unix seconds; 0: none yet): the age "
                                  "of what learning has delivered.", registry=self.registry)
        self.stepped_at = Gauge("orl_trainer_last_step_timestamp_seconds",
                                "When the last optimizer step ended (Unix seconds).", registry=self.registry)
