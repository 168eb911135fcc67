"""One typed configuration tree for every component.

Values come from, in rising priority: defaults here, one YAML file (``ORL_CONFIG`` or an
explicit path), and environment variables ``ORL_<SECTION>__<FIELD>`` (for example
``ORL_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092``). Nothing is built at import time: call
`get_settings()` (cached) or `load_settings(path)` and pass the result where it is needed.

This module knows nothing about how the values are used.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from online_rl.algos.config import CriticFreeConfig, DPOConfig, KLControlConfig, PPOConfig
from online_rl.algos.policy import LoraSpec
from online_rl.errors import ConfigError
from online_rl.flow.errors import RewardRuleError
from online_rl.flow.rewards import RewardFunctionSpec, RewardRule

if TYPE_CHECKING:
    from online_rl.bus.topics import Topics

__all__ = [
    "BusConfig",
    "FeedbackApiConfig",
    "GatewayConfig",
    "HybridConfig",
    "InferenceConfig",
    "JoinSettings",
    "KafkaConfig",
    "MlflowConfig",
    "ModelConfig",
    "RayConfig",
    "RewardsConfig",
    "RolloutConfig",
    "Settings",
    "TrainerConfig",
    "default_cache_dir",
    "get_settings",
    "load_settings",
]


def default_cache_dir() -> Path:
    """`$ORL_CACHE_DIR`, else `$XDG_CACHE_HOME/online-rl`, else `~/.cache/online-rl`."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "online-rl"


class ModelConfig(BaseModel):
    """Which base model to serve and train."""

    name: str = Field(
        default="SmolLM2-135M-Instruct",
        min_length=1,
        description="Base model id, recorded in every event and lineage manifest.",
    )
    path: Path | None = Field(
        default=None,
        description="A Hugging Face model folder. Empty means the embedded default, prepared "
        "by `online-rl model prepare` under <cache_dir>/models/.",
    )


class KafkaConfig(BaseModel):
    """Where the Kafka broker is. Empty bootstrap servers mean the embedded bus."""

    bootstrap_servers: str | None = Field(
        default=None,
        description="host:port[,host:port...] of a Kafka cluster, or empty for the embedded bus.",
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"{server!r} is not host:port; write e.g. '127.0.0.1:9092' "
                    "(several servers separated by commas)"
                )
        return value.strip()

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        description="How clients talk to the brokers: TLS (SSL), SASL authentication, or both (SASL_SSL).",
    )
    sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"] | None = Field(
        default=None,
        description="The SASL mechanism, required with SASL_PLAINTEXT or SASL_SSL. OAUTHBEARER takes its "
        "token endpoint and client credentials from `client` (librdkafka's sasl.oauthbearer.* options).",
    )
    sasl_username: str | None = Field(default=None, description="The SASL user (SCRAM and PLAIN).")
    sasl_password: SecretStr | None = Field(
        default=None,
        description="The SASL user's password (SCRAM and PLAIN); pass it as ORL_KAFKA__SASL_PASSWORD from a "
        "Secret rather than in the file.",
    )
    ssl_ca_location: Path | None = Field(
        default=None,
        description="PEM file of the CA that signed the brokers' certificates; empty uses the system's CAs.",
    )
    ssl_certificate_location: Path | None = Field(
        default=None, description="PEM client certificate, for brokers that authenticate clients by TLS."
    )
    ssl_key_location: Path | None = Field(
        default=None, description="PEM private key of `ssl_certificate_location`."
    )
    client: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="More librdkafka options passed to every producer, consumer and admin client (e.g. "
        "sasl.oauthbearer.token.endpoint.url). The options the fields above set are refused here.",
    )

    @model_validator(mode="after")
    def _check_security(self) -> KafkaConfig:
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol.endswith("SSL")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"kafka.sasl_mechanism is required with security_protocol "
                             f"{self.security_protocol}; set it to SCRAM-SHA-512 (what Strimzi's "
                             "scram-sha-512 users speak), SCRAM-SHA-256, PLAIN or OAUTHBEARER")
        if not sasl and (self.sasl_mechanism or self.sasl_username or self.sasl_password):
            raise ValueError("kafka.sasl_* is set but security_protocol is "
                             f"{self.security_protocol}; set security_protocol to SASL_SSL "
                             "(or SASL_PLAINTEXT)")
        if sasl and self.sasl_mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN") and (
                not self.sasl_username or self.sasl_password is None):
            raise ValueError("kafka.sasl_username and kafka.sasl_password are required with "
                             f"{self.sasl_mechanism}; set the password with ORL_KAFKA__SASL_PASSWORD")
        if not tls and (self.ssl_ca_location or self.ssl_certificate_location or self.ssl_key_location):
            raise ValueError("kafka.ssl_* is set but security_protocol is "
                             f"{self.security_protocol}; set security_protocol to SSL or SASL_SSL")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("kafka.ssl_certificate_location and kafka.ssl_key_location go together; "
                             "set both or neither")
        for key in self.client:
            if key in _OWNED_CLIENT_OPTIONS:
                raise ValueError(f"kafka.client.{key} is set by the typed kafka settings; use "
                                 f"{_OWNED_CLIENT_OPTIONS[key]} instead")
        return self

    def client_options(self) -> dict[str, Any]:
        """The librdkafka options every client of this cluster needs, bootstrap servers excepted."""
        options: dict[str, Any] = {"security.protocol": self.security_protocol.lower()}
        if self.sasl_mechanism:
            options["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            options["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            options["sasl.password"] = self.sasl_password.get_secret_value()
        for option, path in (("ssl.ca.location", self.ssl_ca_location),
                             ("ssl.certificate.location", self.ssl_certificate_location),
                             ("ssl.key.location", self.ssl_key_location)):
            if path is not None:
                if not path.is_file():
                    raise ConfigError(f"kafka.{option.replace('.', '_')}: {path} is not a readable file; "
                                      "mount the certificate there or fix the path")
                options[option] = str(path)
        options.update(self.client)
        return options


_OWNED_CLIENT_OPTIONS = {
    "bootstrap.servers": "kafka.bootstrap_servers",
    "security.protocol": "kafka.security_protocol",
    "sasl.mechanism": "kafka.sasl_mechanism",
    "sasl.mechanisms": "kafka.sasl_mechanism",
    "sasl.username": "kafka.sasl_username",
    "sasl.password": "kafka.sasl_password",
    "ssl.ca.location": "kafka.ssl_ca_location",
    "ssl.certificate.location": "kafka.ssl_certificate_location",
    "ssl.key.location": "kafka.ssl_key_location",
}


class BusConfig(BaseModel):
    """Topic names and the embedded bus."""

    topic_prefix: str = Field(
        default="orl",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="Topics are <prefix>.interactions, <prefix>.feedback, ...",
    )
    partitions: int = Field(default=4, ge=1, le=1024, description="Partitions of new topics.")
    embedded_path: Path | None = Field(
        default=None, description="SQLite file of the embedded bus (default <cache_dir>/bus/bus.db)."
    )


class JoinSettings(BaseModel):
    """The feedback join (see online_rl/stream/join.py)."""

    window_s: float = Field(default=60.0, gt=0, description="Reward wait window, seconds.")
    aggregation: Literal["sum", "mean", "earliest", "latest"] = "mean"
    default_reward: float | None = Field(
        default=None, ge=0, le=1, description="Reward when no feedback came; empty drops the sample."
    )
    retention_s: float = Field(default=600.0, gt=0, description="How long joined requests are kept.")
    max_feedback_per_request: int = Field(
        default=64, ge=1, le=10_000,
        description="Feedback events the join keeps per request id (later ones are counted and dropped); "
        "free text (comment, corrected_completion) is never kept in the join state.",
    )
    max_clock_skew_s: float = Field(
        default=60.0, ge=0, le=86400,
        description="How far ahead of the server's clock an event may be dated: the feedback API refuses "
        "created_at further ahead (and older than retention_s), the joiner takes such an event as dated "
        "this far ahead, so one client's clock cannot close other users' windows.",
    )
    instance: str = Field(
        default="0", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$",
        description="This joiner's name among its replicas: its transactional id is "
        "<join.group_id>-<instance> (orl-joiner-<instance> by default), so each replica needs its own (the "
        "chart uses the pod's name); a restarted replica with the same name fences its predecessor.",
    )
    group_id: str = Field(
        default="orl-joiner", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$",
        description="The joiners' consumer group: replicas in one group share the partitions. Unset, it is "
        "<bus.topic_prefix>-joiner (orl-joiner), so deployments with their own topics on one Kafka have "
        "their own group (the chart's ACLs and lag autoscaling name the same).",
    )


class FeedbackApiConfig(BaseModel):
    """The feedback REST API (services/feedback)."""

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8082, ge=1, le=65535)
    api_keys: list[str] = Field(
        default_factory=list,
        description="SHA-256 hashes of the API keys allowed to post (`online-rl keys new`), each "
        "optionally followed by scopes: '<hash> feedback'.",
    )
    api_keys_file: Path | None = Field(
        default=None, description="A file of such hashes, one per line (e.g. a mounted Secret)."
    )
    rate_limit_per_s: float = Field(default=5000.0, gt=0, description="Events per second per API key.")
    rate_burst: float = Field(default=10000.0, ge=1, description="Burst size per API key (at least 1).")
    user_cap: int = Field(default=120, ge=1, description="Events per user id per user_cap_window_s.")
    user_cap_window_s: float = Field(default=60.0, gt=0)
    max_batch: int = Field(default=500, ge=1, le=10_000, description="Events per batch request.")
    max_body_bytes: int = Field(default=2_000_000, ge=1024, description="Largest request body.")
    max_concurrency: int = Field(default=1024, ge=1, description="Connections and requests served at once "
                                 "(503 past it).")
    write_timeout_s: float = Field(default=5.0, gt=0, description="Wait this long for the bus.")
    retry_after_s: int = Field(default=2, ge=1, description="Retry-After sent with 503 answers.")


class EdgeLimits(BaseModel):
    """What an OpenAI-compatible service (inference, gateway) refuses at its edge
    (services/common/limits.py)."""

    max_body_bytes: int = Field(default=4_000_000, ge=1024,
                                description="Largest request body (413 past it, refused before it is read).")
    rate_limit_per_s: float = Field(default=1000.0, gt=0, description="Requests per second per API key (429 "
                                    "past it, with Retry-After).")
    rate_burst: float = Field(default=2000.0, ge=1, description="Burst size per API key (at least 1).")
    max_concurrency: int = Field(default=1024, ge=1, description="Connections and requests served at once "
                                 "(503 past it).")


class InferenceConfig(EdgeLimits):
    """The inference service (services/inference) and its generation engine."""

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8081, ge=1, le=65535)
    engine: Literal["auto", "vllm", "transformers"] = Field(
        default="auto",
        description="auto: vLLM on a GPU, transformers on a CPU (measured faster there; "
        "docs/serving.md).",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="SHA-256 hashes of API keys (`online-rl keys new`), optionally with scopes: "
        "'inference' to generate, 'admin' to load adapters and move aliases.",
    )
    api_keys_file: Path | None = Field(default=None, description="A file of such entries, one per line.")
    max_model_len: int = Field(default=2048, ge=16, le=1_048_576, description="Prompt + completion tokens.")
    max_tokens_default: int = Field(default=256, ge=1, description="max_tokens when a request sets none.")
    max_batch: int = Field(default=16, ge=1, le=4096, description="Requests decoded together.")
    max_loras: int = Field(default=4, ge=1, le=64, description="Adapters resident at once.")
    max_lora_rank: int = Field(default=16, ge=1, le=512, description="Largest LoRA rank accepted (vLLM).")
    kv_cache_gib: float = Field(default=1.0, gt=0, description="vLLM on CPU: KV cache size.")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="The serving dtype: auto picks bfloat16 where the device runs it natively and faster "
        "(measured once per machine on a CPU), else float32; vLLM gets it as its dtype.",
    )
    vllm_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More vLLM engine arguments (AsyncEngineArgs names), e.g. {gpu_memory_utilization: "
        "0.85, tensor_parallel_size: 2}; the ones this section sets are refused here (dtype: "
        "inference.precision).",
    )
    log_buffer: int = Field(default=10_000, ge=1, description="Interactions held while the bus is down.")
    log_confirm_s: float = Field(
        default=2.0, ge=0, le=60,
        description="Hold an answer's last chunk until Kafka confirms its interaction record, at most this "
        "long (skipped while the bus is away), so that a replica killed after answering has logged what "
        "it answered; 0 answers at once (a SIGKILL may then lose the records still buffered).",
    )
    adapters_dir: Path | None = Field(
        default=None, description="Where adapters from MLflow are downloaded (default <cache_dir>/adapters)."
    )


    @field_validator("vllm_args")
    @classmethod
    def _check_vllm_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        owned = {"model": "model.path", "max_model_len": "inference.max_model_len",
                 "max_num_seqs": "inference.max_batch", "max_loras": "inference.max_loras",
                 "max_cpu_loras": "inference.max_loras", "max_lora_rank": "inference.max_lora_rank",
                 "enable_lora": "(always on)", "kv_cache_memory_bytes": "inference.kv_cache_gib",
                 "dtype": "inference.precision"}
        for name in args:
            if name in owned:
                raise ValueError(f"vllm_args.{name} is set by {owned[name]}; set it there instead")
        return args


class MlflowConfig(BaseModel):
    """The MLflow tracking store and model registry."""

    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI. Empty means a local SQLite store under <cache_dir>/mlflow.",
    )
    artifact_root: str | None = Field(
        default=None,
        description="Where new experiments store artifacts (a folder or an s3://... URI). Empty means "
        "<cache_dir>/mlflow/artifacts.",
    )
    registered_model: str = Field(
        default="online-rl-policy",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Name of the registered model that holds the trained adapters.",
    )
    signing_key_file: Path | None = Field(
        default=None,
        description="The trainer's Ed25519 private key (PEM) that signs every version's lineage manifest "
        "(`online-rl keys signing` makes one). Only the trainer needs it; keep it in a Secret.",
    )
    trusted_signers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Public keys (base64, printed by `online-rl keys signing`) whose signatures serving "
        "accepts. When set, a version whose manifest none of them signed is never loaded; empty loads "
        "any version whose files match its manifest. In the environment: a JSON list, or keys separated "
        "by commas or spaces.",
    )

    @field_validator("trusted_signers", mode="before")
    @classmethod
    def _split_signers(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [key for key in text.replace(",", " ").split() if key]
        return value

    @field_validator("trusted_signers")
    @classmethod
    def _public_keys(cls, keys: list[str]) -> list[str]:
        import base64
        import binascii

        for key in keys:
            try:
                raw = base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != 32:
                raise ValueError(f"{key[:16]!r} is not an Ed25519 public key (base64 of 32 bytes); list the "
                                 "`public:` line `online-rl keys signing` printed")
        return keys


class RayConfig(BaseModel):
    """The Ray runtime the trainer uses."""

    address: str | None = Field(
        default=None, description="Address of a running Ray cluster; empty starts Ray locally."
    )
    num_cpus: int = Field(default=2, ge=1, le=1024, description="CPUs for a local Ray runtime.")


# The algorithms' defaults, which the settings below expose: written once, in online_rl/algos.
_DPO, _KL, _LORA, _PPO = DPOConfig(), KLControlConfig(), LoraSpec(), PPOConfig()


class TrainerConfig(BaseModel):
    """The long-running trainer (`online-rl trainer`)."""

    algorithm: Literal["auto", "dpo", "kto", "ppo"] = Field(
        default="auto",
        description="auto: DPO on preference pairs, KTO on thumbs, PPO (with a critic) on graded rewards "
        "(ratings, scalars, implicit signals); dpo, kto or ppo: only what that algorithm trains on (ppo: "
        "every rewarded single); the others are skipped, not dead-lettered.",
    )
    batch_size: int = Field(default=8, ge=1, le=4096, description="Samples per training step.")
    batch_timeout_s: float = Field(
        default=5.0, gt=0, description="Train on a partial batch after this many idle seconds."
    )
    flow: str = Field(
        default="feedback", min_length=1,
        description="What the trainer runs on every batch: feedback (learn from users' samples: DPO, KTO, "
        "PPO), rollout (learn from fresh rollouts on the hybrid engine, the hybrid.* settings) or "
        "'package.module:function', a function build(trainer) -> Flow (docs/trainer.md#flows).")
    learning_rate: float = Field(default=5e-5, ge=0, le=1.0,
                                 description="AdamW learning rate; 0 keeps the adapter where it starts (a "
                                 "no-learning control).")
    beta: float = Field(default=_DPO.beta, gt=0, description="DPO/KTO beta: the strength of the KL anchor.")
    kto_desirable_weight: float = Field(default=1.0, gt=0, le=100.0,
                                        description="KTO: the weight of a thumbs-up's loss.")
    kto_undesirable_weight: float = Field(default=1.0, gt=0, le=100.0,
                                          description="KTO: the weight of a thumbs-down's loss.")
    kto_balance: float | None = Field(
        default=None, ge=1.0, le=100.0,
        description="KTO: weigh the rarer of thumbs-up and thumbs-down up so that weight x count is the same "
        "for both over the thumbs trained so far (the KTO paper keeps that ratio near 1), by at most this "
        "factor (e.g. 10): a taste its users rarely meet still gets a signal from its few thumbs-up. "
        "Empty: the two weights above, fixed.",
    )
    pair_thumbs: bool = Field(
        default=False,
        description="Make a thumbs-up and a thumbs-down on the same prompt one DPO pair (the liked answer "
        "chosen), within a batch or with an unpaired thumb of the last pair_thumbs_memory: the pair "
        "cancels what both answers share, the prompt included; the thumbs left over train as KTO "
        "thumbs. Needs trainer.algorithm=auto.",
    )
    pair_thumbs_memory: int = Field(
        default=1024, ge=0, le=1_000_000,
        description="With pair_thumbs: unpaired thumbs of earlier batches kept (in memory) to pair with a "
        "later opposite thumb on the same prompt; 0 pairs within a batch only.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="auto: bfloat16 where the device runs it natively and faster (a GPU with native bf16; "
        "on a CPU, measured once per machine), else float32; bf16: base weights in bfloat16, adapter in "
        "float32 (fast on AMX CPUs and GPUs, ~90x slower on AVX2-only CPUs); fp32: everything float32.",
    )
    lora_rank: int = Field(default=_LORA.rank, ge=1, le=256, description="LoRA rank.")
    lora_alpha: int = Field(default=_LORA.alpha, ge=1, description="LoRA alpha (scale = alpha / rank).")
    lora_targets: list[str] = Field(
        default_factory=lambda: list(_LORA.targets), min_length=1,
        description="Modules that get a LoRA adapter.",
    )
    publish_every_samples: int = Field(
        default=256, ge=1, description="Publish a new version after this many samples trained since the last."
    )
    publish_every_s: float = Field(
        default=600.0, gt=0, description="...or after this many seconds, if any sample was trained since."
    )
    checkpoint_dir: Path | None = Field(
        default=None, description="Where checkpoints live. Empty means <cache_dir>/trainer/checkpoints."
    )
    keep_checkpoints: int = Field(default=3, ge=1, description="Checkpoints kept on disk.")
    experiment: str = Field(default="online-rl-trainer", min_length=1, description="MLflow experiment.")
    group_id: str = Field(default="orl-trainer", min_length=1,
                          description="Consumer group on the samples. Unset, it is "
                          "<bus.topic_prefix>-trainer (orl-trainer), so deployments with their own topics "
                          "on one Kafka have their own.")
    seed: int = Field(default=0, ge=0, le=1_000_000,
                      description="Seed of the adapter's initialisation and of dropout (and of the rollout "
                      "flow's prompt draws and sampling).")
    ppo_epochs: int = Field(default=2, ge=1, le=16, description="PPO: optimizer steps over each batch.")
    kl_coef: float = Field(default=_KL.coef, ge=0, description="PPO: the KL penalty's initial coefficient.")
    kl_target: float | None = Field(
        default=None, gt=0, description="PPO: adapt the KL coefficient so the KL per sample tracks this."
    )
    critic_learning_rate: float = Field(default=1e-4, gt=0, le=1.0, description="PPO: the critic's rate.")
    critic_placement: Literal["auto", "shared", "separate"] = Field(
        default="auto",
        description="PPO's critic (value model) worker: shared runs it in policy rank 0's CPU bundle "
        "(time-shared, as verl colocates); separate gives it its own bundle of cpus_per_worker (and "
        "gpus_per_worker); auto: shared on CPUs, separate with GPUs.",
    )
    kl_anchor: Literal["base", "champion"] = Field(
        default="base",
        description="The reference the DPO/KTO KL term holds the adapter to: the base model, or the version "
        "MLflow's `champion` alias points at (re-read after every publish; the base until there is one).",
    )
    eval_holdout: float = Field(
        default=0.0, ge=0.0, lt=0.5,
        description="Share of live samples held out of training (by a hash of the sample id) to evaluate "
        "the adapter on; 0: no evaluation.",
    )
    eval_size: int = Field(default=64, ge=1, le=4096, description="The newest this many held-out samples.")
    eval_every_steps: int = Field(default=10, ge=1, description="Evaluate on the held-out set every N steps.")
    publish_on_eval_gain: float | None = Field(
        default=None, gt=0,
        description="Also publish when the held-out score (mean beta * log-ratio margin) beats the last "
        "published version's by this much; empty: evaluation never triggers a publish.",
    )
    cold_start: Path | None = Field(
        default=None,
        description="JSONL file of training samples (the TrainingSample JSON form) mixed into every batch "
        "against forgetting; empty: none.",
    )
    cold_start_weight: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="Share of each batch drawn from `cold_start` (0 to <1)."
    )
    cold_start_loss: Literal["label", "kl"] = Field(
        default="label",
        description="How the cold-start samples act. label: trained as the feedback they carry (a thumbs-up "
        "as desirable, a pair as preferred), which pulls towards their form. kl: not trained on; at every "
        "answer position the policy's next-token distribution is held to the reference's (the `kl_anchor`) "
        "by cold_start_kl_coef * the mean KL(reference || policy) per token, which leans towards no taste "
        "(a term of the DPO/KTO step: a batch of PPO rollouts only has none).",
    )
    cold_start_kl_coef: float = Field(
        default=4.0, ge=0.0, le=1000.0,
        description="Weight of the cold-start KL term (cold_start_loss: kl) against the preference loss; "
        "with cold_start_kl_target, its starting value.",
    )
    cold_start_kl_target: float | None = Field(
        default=None, gt=0, le=10.0,
        description="Adapt the cold-start KL term's weight after every step so the mean KL per anchor token "
        "tracks this (nats, e.g. 0.02): the weight grows while the answers to the anchor prompts drift "
        "past it and falls back while they stay within, each step by at most cold_start_kl_rate, never "
        "below cold_start_kl_coef (the floor). Empty: the weight stays cold_start_kl_coef.",
    )
    cold_start_kl_rate: float = Field(
        default=0.2, gt=0, le=1.0,
        description="With cold_start_kl_target: the most the weight changes in one step, as a fraction (0.2: "
        "x1.2 or x0.8).",
    )
    ability_gate: bool = Field(
        default=True,
        description="Before each publish, answer a fixed probe of factual prompts greedily with the new "
        "adapter; a version that lost more than ability_tolerance of those the base answers correctly is "
        "not published: the trainer goes back to the last published adapter and trains on at "
        "ability_backoff x its learning rate.",
    )
    ability_probe: Path | None = Field(
        default=None,
        description="The gate's probe: JSON lines of {\"prompt\": ..., \"accept\": [words a correct answer "
        "contains]}. Empty: the built-in 16 (online_rl/trainer/gate.py).",
    )
    ability_tolerance: int = Field(
        default=1, ge=0, le=1000,
        description="The ability gate passes a version that lost at most this many probe prompts.",
    )
    ability_backoff: float = Field(
        default=0.5, gt=0, le=1.0,
        description="After the ability gate refused a version, the learning rate is multiplied by this.",
    )
    ability_recovery: float = Field(
        default=1.0, ge=1.0, le=100.0,
        description="After a version passed the ability gate at the first try, a learning rate lowered by "
        "refusals is multiplied by this, up to the configured one (2 with the default backoff: halved at a "
        "refusal, doubled back at each pass). 1: a lowered rate stays.",
    )
    ability_retries: int = Field(
        default=0, ge=0, le=10,
        description="After a refusal, train the batches since the last publish again from the version "
        "gone back to, at the lowered learning rate, and ask the probe again, up to this many times "
        "before the refusal stands (0: drop them at once). Kept in memory (at most 4096 samples): after "
        "a restart only the batches since then are trained again.",
    )
    ability_shrink: list[float] = Field(
        default_factory=list, max_length=8,
        description="After the probe fails, before stepping back all the way: keep only this share of the "
        "adapter's change since the last published version (the base before the first), for each share in "
        "turn (decreasing, each in (0, 1), e.g. [0.5, 0.25]), and ask the probe again; the first that passes "
        "is published and training goes on from it (the learning rate unchanged). Empty: a failed probe "
        "steps back at once.",
    )
    ability_max_tokens: int = Field(
        default=48, ge=1, le=1024, description="The ability gate's answers: at most this many tokens."
    )
    rehearsal_prompts: int = Field(
        default=0, ge=0, le=64,
        description="Fact rehearsal against forgetting: at every step, the adapter being trained samples "
        "rehearsal_samples answers to this many prompts of the rehearsal set, a verifier marks them by the "
        "words a correct answer contains, and a correct answer preferred over a wrong one to the same "
        "prompt joins the step as a DPO pair (a prompt answered all right or all wrong makes none): right "
        "over wrong, in the adapter's own register, so it holds facts without holding the taste. Needs "
        "trainer.algorithm auto or dpo. 0: off.",
    )
    rehearsal_samples: int = Field(
        default=4, ge=2, le=32, description="Fact rehearsal: answers sampled per rehearsal prompt."
    )
    rehearsal_rejected: Literal["edited", "sampled"] = Field(
        default="edited",
        description="Fact rehearsal: what a correct answer is preferred over. edited: the same answer with "
        "its fact swapped for another rehearsal fact's (a capital for a capital), a minimal pair that "
        "differs in the fact alone, so it says nothing about the register; any prompt with a correct "
        "sample makes one. sampled: a wrong answer the adapter sampled to the same prompt (which also "
        "differs in form: a right answer is often the plainer one).",
    )
    rehearsal_temperature: float = Field(
        default=1.0, gt=0, le=2.0, description="Fact rehearsal: the sampling temperature of its answers."
    )
    rehearsal_set: Path | None = Field(
        default=None,
        description="Fact rehearsal's prompts: JSON lines of {\"prompt\": ..., \"accept\": [words a correct "
        "answer contains]}, as trainer.ability_probe. Empty: the built-in 35 "
        "(online_rl/trainer/rehearsal.py), none of them in the ability probe or the benchmarks' fact checks.",
    )
    workers: int = Field(
        default=1, ge=1, le=256,
        description="Data-parallel policy workers (Ray actors); each trains a share of every batch and "
        "their gradients are summed (gloo on CPU, NCCL on GPU), so any count learns the same as one.",
    )
    cpus_per_worker: float | None = Field(
        default=None, gt=0,
        description="CPUs reserved for each worker. Empty: ray.num_cpus / workers (at least 1).",
    )
    gpus_per_worker: float = Field(
        default=0.0, ge=0, description="GPUs for each worker; above 0 the workers train on CUDA with NCCL."
    )
    placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        default="PACK",
        description="Ray placement-group strategy for the workers: PACK shares nodes, SPREAD separates them.",
    )


    @model_validator(mode="after")
    def _check_resources(self) -> TrainerConfig:
        if self.gpus_per_worker and self.critic_placement == "shared":
            raise ValueError("trainer.critic_placement=shared cannot share a GPU bundle with policy rank "
                             "0: set trainer.critic_placement=separate when trainer.gpus_per_worker > 0")
        if self.workers > 1 and 0 < self.gpus_per_worker < 1:
            raise ValueError(f"trainer.gpus_per_worker={self.gpus_per_worker} would put two ranks on one "
                             "GPU, which NCCL refuses: use whole GPUs (e.g. 1) with several workers")
        if self.kl_target is not None and self.kl_coef == 0:
            raise ValueError("trainer.kl_coef=0 cannot adapt towards trainer.kl_target: start it above 0, "
                             "e.g. 0.05, or leave kl_target empty")
        if self.cold_start_kl_target is not None and (self.cold_start_loss != "kl"
                                                      or self.cold_start_kl_coef == 0):
            raise ValueError("trainer.cold_start_kl_target adapts the cold-start KL term's weight: set "
                             "trainer.cold_start_loss=kl and a starting trainer.cold_start_kl_coef above 0 "
                             "(e.g. 0.25), or leave cold_start_kl_target empty")
        if self.pair_thumbs and self.algorithm != "auto":
            raise ValueError(f"trainer.pair_thumbs makes DPO pairs of thumbs and trains the rest with KTO, "
                             f"and trainer.algorithm={self.algorithm} trains only one of them: set "
                             "trainer.algorithm=auto, or pair_thumbs false")
        shrink = self.ability_shrink
        if any(not 0 < keep < 1 for keep in shrink) or shrink != sorted(set(shrink), reverse=True):
            raise ValueError(f"trainer.ability_shrink={shrink} must be decreasing shares in (0, 1) of the "
                             "change to keep, e.g. [0.5, 0.25] (empty: step back at once)")
        if self.rehearsal_prompts and self.algorithm not in ("auto", "dpo"):
            raise ValueError(f"trainer.rehearsal_prompts={self.rehearsal_prompts} adds DPO pairs, and "
                             f"trainer.algorithm={self.algorithm} trains none: set trainer.algorithm=auto, "
                             "or rehearsal_prompts 0")
        if self.cold_start_loss == "kl" and self.algorithm == "ppo":
            raise ValueError("trainer.cold_start_loss=kl holds the DPO/KTO step to its anchors, and "
                             "trainer.algorithm=ppo takes none: use cold_start_loss=label, or algorithm auto")
        return self


class HybridConfig(BaseModel):
    """Colocated PPO on fresh rollouts (`online-rl hybrid`): the HybridEngine's layouts and the loop."""

    dp: int = Field(default=1, ge=1, le=256, description="Training: data-parallel replicas.")
    fsdp: int = Field(default=1, ge=1, le=256, description="Training: FSDP shards per replica.")
    tp: int = Field(
        default=1, ge=1, le=64,
        description="Generation: tensor-parallel size of each engine replica; divides dp × fsdp and the "
        "model's attention heads and MLP width (SmolLM2-135M: 1 or 3).",
    )
    aligned: bool = Field(
        default=True, description="Shard each weight for training along the dimension generation splits it "
        "(zero-redundancy resharding); false: FSDP's default, dimension 0 everywhere.",
    )
    keep_base: bool = Field(
        default=True, description="Reshard the frozen base once and keep its generation copy; each "
        "transition then moves only the adapter. False: reshard everything every time and free the copy "
        "when training resumes.",
    )
    engine: Literal["tp", "vllm"] = Field(
        default="tp",
        description="What generates the rollouts: tp (the hybrid devices' own tensor-parallel engine, the "
        "HybridEngine resharding into it) or vllm (a vLLM engine beside the devices on engine_cpus / "
        "engine_gpus: the base loaded once by vLLM, each adapter version installed from memory).",
    )
    engine_cpus: float = Field(default=1.0, ge=0, description="CPUs of the vLLM rollout engine's actor.")
    engine_gpus: float = Field(default=0.0, ge=0, description="GPUs of the vLLM rollout engine's actor.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra vllm.LLM arguments of the vLLM rollout engine (e.g. gpu_memory_utilization; on a "
        "GPU it defaults to 0.4, leaving the rest to training on a shared GPU).",
    )
    engine_max_model_len: int = Field(
        default=1024, ge=16, le=131072, description="Longest prompt + completion the vLLM engine takes.")
    max_staleness: int = Field(
        default=0, ge=0, le=64,
        description="Versions a rollout may lag the policy it trains (vllm engine): 0 samples every batch "
        "with the newest adapter, in turn with the update; above 0 the next batch is sampled while the "
        "current one trains.",
    )
    rollout_ahead: int | None = Field(
        default=None, ge=0, le=64,
        description="Batches the vLLM engine samples ahead of the update (empty: max_staleness). Above "
        "max_staleness, batches can arrive older than the bound, and `stale` says what happens to them.",
    )
    stale: Literal["wait", "drop", "keep"] = Field(
        default="wait",
        description="A batch that would be trained more than max_staleness versions after the adapter that "
        "sampled it: wait (the engine samples no further ahead than the bound allows), drop (sampled, then "
        "discarded and counted) or keep (trained, its behaviour log-probs correcting the update).",
    )
    behaviour_cap: float = Field(
        default=_PPO.behaviour_cap, ge=1.0, le=100.0,
        description="Truncation of each token's importance weight pi_old / pi_behaviour (decoupled PPO), "
        "which corrects for rollouts sampled by an older adapter: 1 only ever weighs such tokens down.",
    )
    rollout_batch: int = Field(default=8, ge=1, le=4096, description="Prompts sampled per PPO iteration.")
    max_new_tokens: int = Field(default=32, ge=1, le=4096, description="Longest completion sampled.")
    temperature: float = Field(default=1.0, gt=0, le=5, description="Sampling temperature of the rollouts.")
    prompt_window: int = Field(default=512, ge=1, description="The newest this many prompts are drawn from.")
    min_pairs: int = Field(default=8, ge=0,
                           description="Preference pairs or thumbs (one each) seen before PPO starts.")
    learning_rate: float = Field(default=1e-4, ge=0, le=1.0,
                                 description="The policy's AdamW rate (0: a control that learns nothing).")
    ppo_epochs: int = Field(default=2, ge=1, le=16, description="Optimizer steps over each batch.")
    kl_coef: float = Field(default=_KL.coef, ge=0, description="The KL penalty's initial coefficient.")
    kl_target: float | None = Field(
        default=2.0, gt=0, description="Adapt the coefficient so the KL per completion tracks this (nats).")
    kl_horizon: int = Field(
        default=16, ge=1, description="Rollouts over which the coefficient adapts (Ziegler's horizon).")
    critic_learning_rate: float = Field(default=1e-4, gt=0, le=1.0, description="The critic's rate.")
    reward_learning_rate: float = Field(default=1e-4, gt=0, le=1.0, description="The reward model's rate.")
    reward_steps: int = Field(default=4, ge=0, description="Reward-model steps per iteration.")
    reward_batch: int = Field(default=8, ge=1, description="Pairs per reward-model step.")
    reward_window: int = Field(default=2048, ge=1, description="Newest pairs the reward model replays.")
    publish_every_steps: int = Field(default=20, ge=1, description="Publish a version every N iterations.")
    rehearsal_prompts: int = Field(
        default=0, ge=0, le=256,
        description="Fact rehearsal against forgetting: every iteration adds this many prompts of the "
        "rehearsal set (trainer.rehearsal_set, empty: the built-in one) to the rollout batch, and a verifier "
        "adds rehearsal_weight to the reward of each of their answers that holds the fact; the reward model "
        "scores them as any other, so the answers are compared by the taste and by being right. 0: off.",
    )
    rehearsal_weight: float = Field(
        default=1.0, gt=0, le=100.0,
        description="Fact rehearsal: what the verifier adds to a right answer's reward (the reward model's "
        "scores are logits, mostly within a few units).",
    )
    experiment: str = Field(default="online-rl-hybrid", min_length=1, description="MLflow experiment.")
    group_id: str = Field(default="orl-hybrid", min_length=1,
                          description="Consumer group on the samples. Unset, it is <bus.topic_prefix>-hybrid "
                          "(orl-hybrid), so deployments with their own topics on one Kafka have their own.")
    cpus_per_worker: float | None = Field(
        default=None, gt=0, description="CPUs per hybrid device. Empty: ray.num_cpus / (dp × fsdp).")
    gpus_per_worker: float = Field(default=0.0, ge=0, description="GPUs per device (NCCL above 0).")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="Matrix products of the policy's training passes, the critic and the reward model: "
        "auto picks bfloat16 where the device runs it natively and faster, else float32 (the weights the "
        "HybridEngine reshards stay float32).",
    )
    critic_free: CriticFreeConfig | None = Field(
        default=None,
        description="Empty: PPO with a critic (GAE). Set, e.g. {estimator: grpo, group_size: 4}: advantages "
        "from group_size answers sampled per prompt, no critic (GRPO, RLOO, REINFORCE++; see "
        "docs/algorithms.md); rollout_batch prompts then make rollout_batch × group_size rollouts.",
    )

    @property
    def world(self) -> int:
        return self.dp * self.fsdp

    @field_validator("critic_free", mode="before")
    @classmethod
    def _critic_free(cls, value: Any) -> Any:
        if isinstance(value, dict):
            try:
                return CriticFreeConfig(**value)
            except TypeError as exc:
                raise ValueError(f"hybrid.critic_free: {exc}; the fields are those of CriticFreeConfig "
                                 "(docs/algorithms.md)") from exc
            except ConfigError as exc:
                raise ValueError(f"hybrid.{exc}") from exc
        return value

    @model_validator(mode="after")
    def _check_layout(self) -> HybridConfig:
        if self.world % self.tp:
            raise ValueError(f"hybrid.tp={self.tp} must divide hybrid.dp × hybrid.fsdp = {self.world}: every "
                             "device serves in exactly one engine replica")
        if self.engine == "tp" and (self.max_staleness or self.rollout_ahead):
            raise ValueError("hybrid.max_staleness and hybrid.rollout_ahead need hybrid.engine=vllm: the tp "
                             "engine runs on the training devices, in turn with the update; set both to 0")
        if self.rehearsal_prompts and self.engine == "vllm" and (self.max_staleness or self.rollout_ahead):
            raise ValueError(f"hybrid.rehearsal_prompts={self.rehearsal_prompts} needs rollouts sampled in "
                             "turn with the update: set hybrid.max_staleness and hybrid.rollout_ahead to 0, "
                             "or hybrid.rehearsal_prompts to 0")
        if self.rollout_batch < self.world:
            raise ValueError(f"hybrid.rollout_batch={self.rollout_batch} must be >= dp × fsdp = {self.world} "
                             "so that every FSDP device trains on a rollout")
        if self.kl_target is not None and self.kl_coef == 0:
            raise ValueError("hybrid.kl_coef=0 cannot adapt towards hybrid.kl_target: start above 0, "
                             "e.g. 0.05")
        if self.critic_free is not None:
            if self.critic_free.loss_aggregation == "seq-mean-token-sum-norm":
                raise ValueError("hybrid.critic_free.loss_aggregation: the rollout flow trains with "
                                 "token-mean or seq-mean-token-mean")
            if self.critic_free.ratio_level != "token":
                raise ValueError("hybrid.critic_free.ratio_level: the rollout flow clips per token; "
                                 "set 'token'")
        return self


class RewardsConfig(BaseModel):
    """Rewards written as code (docs/rewards.md): the reward functions of the rollout flow, and how their
    scores combine with users' feedback and the learned reward model."""

    functions: list[RewardFunctionSpec] = Field(
        default_factory=list,
        description="Reward functions, each {name, target: 'package.module:function', weight (1), batched "
        "(false), timeout_s (10), gate (empty)}; they run in a Ray actor, out of the trainer's process.",
    )
    weights: dict[str, float] = Field(
        default_factory=lambda: {"reward_model": 1.0},
        description="Weights of the built-in sources: 'feedback' (users' feedback) and 'reward_model' (the "
        "learned reward model); a function's weight is its own `weight`. When a rollout lacks some sources, "
        "the others' weights are scaled up to the same total.",
    )
    gate_failed: float = Field(
        default=0.0, allow_inf_nan=False,
        description="The reward of a rollout that scores below a function's `gate`.",
    )

    @model_validator(mode="after")
    def _check_rule(self) -> RewardsConfig:
        try:
            self.rule()
        except RewardRuleError as exc:
            raise ValueError(f"rewards.{exc}") from exc
        return self

    def rule(self) -> RewardRule:
        """The combination rule these settings declare."""
        return RewardRule.from_specs(self.functions, self.weights, self.gate_failed)


class RolloutConfig(BaseModel):
    """The canary rollout plan the gateway's controller runs (online_rl/rollout)."""

    steps: list[float] = Field(
        default_factory=lambda: [0.05, 0.25, 0.5, 1.0], min_length=1,
        description="Challenger traffic weights, increasing, in (0, 1]; promotion follows the last.",
    )
    min_samples: int = Field(
        default=200, ge=1,
        description="Rewards per arm before a step may pass, or end without a verdict (a quiet service "
        "waits for them instead of rolling a version back unjudged).",
    )
    margin: float = Field(default=0.02, ge=0, le=1, description="'No worse than' tolerance, 0-1 reward.")
    max_step_samples: int | None = Field(
        default=None, ge=1,
        description="A step without a verdict ends once each arm has this many rewards in it (at full "
        "weight: the challenger; the limit follows the evidence, whatever the traffic); empty: 5 × "
        "min_samples.",
    )
    max_step_s: float | None = Field(
        default=None, gt=0,
        description="Optionally also a time limit of a step without a verdict (counted only once both arms "
        "have min_samples rewards); empty: none.",
    )
    on_timeout: Literal["rollback", "advance"] = Field(
        default="rollback", description="What a step that reached its limit without a verdict does.")
    alpha: float = Field(default=0.05, gt=0, lt=1, description="Error level of the always-valid comparison.")
    tau: float = Field(default=0.1, gt=0, description="Mixture scale: the reward difference worth detecting.")
    max_error_rate_increase: float = Field(default=0.01, ge=0, le=1, description="Guardrail vs the champion.")
    max_p99_latency_ratio: float = Field(default=1.5, gt=0, description="Guardrail: challenger/champion p99.")
    max_kl: float | None = Field(default=None, gt=0, description="Guardrail on the KL to the champion.")
    guardrail_min_requests: int = Field(
        default=50, ge=1, description="Requests per version before error rate and latency are judged."
    )
    auto_start: bool = Field(
        default=True, description="Start a rollout when MLflow's `challenger` alias names a new version."
    )
    interval_s: float = Field(default=5.0, gt=0, le=3600, description="Seconds between two analyses.")
    reward_bucket_s: float = Field(default=10.0, gt=0, description="Time bucket of reward per version.")
    state_dir: Path | None = Field(
        default=None, description="Rollout state and audit log. Empty means <cache_dir>/rollout."
    )
    offpolicy_gate: bool = Field(
        default=False,
        description="Before any exposure, estimate the challenger's reward from the champion's logged "
        "traffic (self-normalised importance sampling) and roll back if it falls short.",
    )
    offpolicy_min_samples: int = Field(default=50, ge=1, description="Logged answers the gate needs.")
    offpolicy_margin: float = Field(default=0.05, ge=0, le=1, description="Allowed estimated reward drop.")
    offpolicy_min_ess: float = Field(default=10.0, gt=0, description="Effective samples to trust the gate.")

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[float]) -> list[float]:
        if any(not 0 < w <= 1 for w in steps) or steps != sorted(set(steps)):
            raise ValueError(f"{steps} must be increasing weights in (0, 1], e.g. [0.05, 0.25, 0.5, 1.0]")
        return steps

    @model_validator(mode="after")
    def _limits(self) -> RolloutConfig:
        if self.max_step_samples is not None and self.max_step_samples < self.min_samples:
            raise ValueError(f"gateway.rollout.max_step_samples={self.max_step_samples} must be >= "
                             f"min_samples={self.min_samples}: a step cannot end for lack of evidence before "
                             "it may pass")
        return self


class GatewayConfig(EdgeLimits):
    """The canary gateway (services/gateway): routes requests to replicas and runs the rollout."""

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8080, ge=1, le=65535)
    replicas: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8081"], min_length=1,
        description="Base URLs of the inference replicas; dns+http://host:port stands for every address "
        "the name resolves to, re-resolved each controller pass (a Kubernetes headless Service).",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="SHA-256 hashes of API keys, optionally with scopes: 'inference' to send requests, "
        "'admin' to control rollouts.",
    )
    api_keys_file: Path | None = Field(default=None, description="A file of such entries, one per line.")
    upstream_api_key: SecretStr | None = Field(
        default=None,
        description="The raw key the gateway presents to the replicas (scopes 'inference' and 'admin').",
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, description="Connecting to a replica.")
    read_timeout_s: float = Field(default=300.0, gt=0, description="Waiting for a replica's next bytes.")
    max_connections: int = Field(default=512, ge=1, description="Pooled connections to all replicas.")
    startup_tick_s: float = Field(
        default=20.0, gt=0, description="At start, wait this long for the controller's first pass "
        "(the champion loaded into the replicas) before serving.",
    )
    replica_cooldown_s: float = Field(
        default=5.0, ge=0, description="How long a replica that refused a connection is skipped."
    )
    holdout: float = Field(
        default=0.0, ge=0.0, le=0.5,
        description="Share of users (by a hash of the user id) the base model serves through every rollout: "
        "a concurrent baseline that measures what learning gained in the same period (X-ORL-Arm: holdout). "
        "0: none; e.g. 0.1 keeps one user in ten on the base model.",
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    role: Literal["all", "proxy", "controller"] = Field(
        default="all",
        description="all: one process routes and runs the rollout controller (state in state_dir). proxy: "
        "routes only, by the rollout state read from the bus (<prefix>.rollout), and reports each answer's "
        "health there; any number of them. controller: routes as a proxy and contends for the controller "
        "lease; the holder runs the rollout (state on the bus), the others stand by (readyz 503).",
    )
    election: Literal["auto", "file", "kubernetes"] = Field(
        default="auto",
        description="How controllers pick the one that runs the rollout: file (a lock on "
        "<state_dir>/controller.lock, for processes of one machine), kubernetes (a coordination.k8s.io "
        "Lease), auto (kubernetes inside a pod, else file).",
    )
    lock_file: Path | None = Field(
        default=None, description="The lock the controllers of one machine contend for (election: file); "
        "default <state_dir>/controller.lock.",
    )
    lease_name: str = Field(default="orl-rollout-controller", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                            description="The Kubernetes Lease's name (election: kubernetes).")
    lease_duration_s: float = Field(
        default=15.0, ge=2, le=600,
        description="A controller that has not renewed its lease for this long is replaced; it renews every "
        "third of it and stops acting when a renewal fails.",
    )
    advertise_url: str | None = Field(
        default=None,
        description="Where proxies reach this controller for the admin API (/rollout): default "
        "http://<host>:<port> (127.0.0.1 for 0.0.0.0). The chart sets the controller Service.",
    )
    controller_url: str | None = Field(
        default=None,
        description="Where a proxy relays the admin API (/rollout): a fixed address (the chart sets the "
        "controller Service), so a record on the bus cannot point it elsewhere; empty: the URL the "
        "controller's heartbeat advertises.",
    )
    health_report_s: float = Field(
        default=1.0, gt=0, le=60,
        description="How often a proxy publishes its answers' health (version, latency, success) for the "
        "controller's guardrails.",
    )

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://", "dns+http://", "dns+https://")):
                raise ValueError(f"{url!r} is not a replica URL: write http://host:port, or "
                                 "dns+http://host:port for every address of a (headless Service) name")
        return urls


class LaunchConfig(BaseModel):
    """`online-rl up`: every component as a local process (see docs/quickstart.md)."""

    run_dir: Path | None = Field(
        default=None, description="The run's folder: logs, pids, keys, MLflow, checkpoints, rollout state "
        "and the broker's data. Empty means <cache_dir>/run.",
    )
    bus: Literal["auto", "kafka", "embedded"] = Field(
        default="auto", description="kafka: a local Kafka broker (deploy/local/kafka), or the broker at "
        "kafka.bootstrap_servers when one is configured; embedded: the SQLite log; auto: kafka when Java "
        "and the broker script are there, else embedded.",
    )
    kafka_port: int = Field(default=9092, ge=1, le=65534, description="Local broker (+1: its controller).")
    mlflow_port: int = Field(default=5000, ge=1, le=65535, description="The MLflow tracking server and UI.")
    trainer_metrics_port: int = Field(default=9400, ge=1, le=65535, description="The trainer's /metrics.")
    joiner_metrics_port: int = Field(default=9108, ge=1, le=65535, description="The joiner's /metrics.")
    ready_timeout_s: float = Field(default=300.0, gt=0, description="How long a component may take to start.")
    stop_timeout_s: float = Field(
        default=30.0, gt=0, description="How long `down` waits for a component to exit before killing it."
    )
    inference_threads: int = Field(
        default=0, ge=0, description="CPU threads of the inference replica; 0: half of this machine's cores. "
        "The trainer gets the rest (unless trainer.cpus_per_worker is set): the two never fight for a core.",
    )
    restart: bool = Field(
        default=True, description="Restart a component that exits (as a Kubernetes Deployment would): a "
        "watchdog process started by `up` and stopped by `down`.",
    )
    restart_backoff_s: float = Field(
        default=1.0, gt=0, description="Wait before the first restart; doubled for each further restart in "
        "the window, up to restart_backoff_max_s.",
    )
    restart_backoff_max_s: float = Field(default=60.0, gt=0, description="The longest wait before a restart.")
    max_restarts: int = Field(
        default=5, ge=1, description="Give up on a component after this many restarts within "
        "restart_window_s (`status` then shows it failed, with why and its log's last lines).",
    )
    restart_window_s: float = Field(default=600.0, gt=0, description="The window max_restarts counts in.")


_yaml_data: ContextVar[dict[str, Any] | None] = ContextVar("_yaml_data", default=None)


class _YamlSource(PydanticBaseSettingsSource):
    """The YAML file's values, lowest priority (handed over by `load_settings`)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return _yaml_data.get() or {}


class Settings(BaseSettings):
    """The whole configuration tree."""

    model_config = SettingsConfigDict(
        env_prefix="ORL_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where prepared models, Kafka jars and local stores live.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    bus: BusConfig = Field(default_factory=BusConfig)
    join: JoinSettings = Field(default_factory=JoinSettings)
    feedback_api: FeedbackApiConfig = Field(default_factory=FeedbackApiConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    hybrid: HybridConfig = Field(default_factory=HybridConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments > environment > the YAML file given to `load_settings`.
        return init_settings, env_settings, _YamlSource(settings_cls)

    @model_validator(mode="after")
    def _groups_follow_the_topic_prefix(self) -> Settings:
        """A consumer group left unset is named after the topics (`bus.topic_prefix`): two deployments
        with topics of their own on one Kafka cluster do not share a group (a member of one would take part
        in the other's rebalances, and a killed one stall them). The default prefix keeps the names."""
        for section, suffix in (("trainer", "trainer"), ("hybrid", "hybrid"), ("join", "joiner")):
            config = getattr(self, section)
            if "group_id" not in config.model_fields_set:
                named = f"{self.bus.topic_prefix}-{suffix}"
                setattr(self, section, config.model_copy(update={"group_id": named}))
        return self

    @property
    def model_dir(self) -> Path:
        """The base model folder: the configured path or the embedded default's cache folder."""
        if self.model.path is not None:
            return self.model.path
        return self.cache_dir / "models" / self.model.name

    @property
    def topics(self) -> Topics:
        """This deployment's topic names (`bus.topic_prefix`)."""
        from online_rl.bus.topics import Topics

        return Topics(self.bus.topic_prefix)

    @property
    def bus_path(self) -> Path:
        """The embedded bus's SQLite file."""
        return self.bus.embedded_path or self.cache_dir / "bus" / "bus.db"

    @property
    def checkpoint_dir(self) -> Path:
        """Where the trainer's checkpoints live."""
        return self.trainer.checkpoint_dir or self.cache_dir / "trainer" / "checkpoints"

    @property
    def rollout_dir(self) -> Path:
        """Where the rollout controller keeps its state and audit log."""
        return self.gateway.rollout.state_dir or self.cache_dir / "rollout"

    @property
    def run_dir(self) -> Path:
        """The folder of `online-rl up`'s run."""
        return self.launch.run_dir or self.cache_dir / "run"

    @property
    def adapters_dir(self) -> Path:
        """Where adapter versions fetched from MLflow are kept."""
        return self.inference.adapters_dir or self.cache_dir / "adapters"

    @property
    def mlflow_tracking_uri(self) -> str:
        """The configured tracking URI, or the local SQLite store under the cache folder."""
        if self.mlflow.tracking_uri:
            return self.mlflow.tracking_uri
        return f"sqlite:///{self.cache_dir / 'mlflow' / 'mlflow.db'}"

    @property
    def mlflow_artifact_root(self) -> str:
        """The configured artifact root, or a folder beside the local tracking store."""
        return self.mlflow.artifact_root or str(self.cache_dir / "mlflow" / "artifacts")


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in err.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(root)"
        env_name = "ORL_" + "__".join(str(part).upper() for part in item["loc"])
        lines.append(f"  - {field}: {item['msg']} (set it in the YAML file or as {env_name})")
    return "\n".join(lines)


def load_settings(path: str | Path | None = None) -> Settings:
    """Build the settings from an optional YAML file and the environment.

    Raises `ConfigError` naming each bad field and how to set it.
    """
    path = path or os.environ.get("ORL_CONFIG") or None
    data: dict[str, Any] = {}
    source = "environment"
    if path is not None:
        file = Path(path)
        source = str(file)
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {file} does not exist; fix ORL_CONFIG or --config") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {file} must hold a mapping at the top level")
        data = loaded
    token = _yaml_data.set(data)
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from exc
    finally:
        _yaml_data.reset(token)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, loaded once on first use (tests call `cache_clear()`)."""
    return load_settings()
