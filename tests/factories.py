"""Builders of valid events for tests (override any field by keyword)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from online_rl.bus import Bus, Consumer, Record
from online_rl.events import Completion, Feedback, FeedbackKind, Interaction, Message, TrainingSample


def interaction(request_id: str, created_at: float = 100.0, **overrides: Any) -> Interaction:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "user_id": "u1",
        "created_at": created_at,
        "model": "SmolLM2-135M-Instruct",
        "adapter_version": None,
        "prompt": [Message(role="user", content="Say hi")],
        "prompt_token_ids": [1, 2, 3],
        "completion": "hi",
        "completion_token_ids": [7, 8],
        "completion_logprobs": [-0.1, -0.2],
    }
    fields.update(overrides)
    return Interaction(**fields)


def thumbs(request_id: str, up: bool, created_at: float = 101.0, event_id: str | None = None,
           **overrides: Any) -> Feedback:
    fields: dict[str, Any] = {
        "event_id": event_id or f"e-{request_id}-{created_at}-{up}",
        "request_id": request_id,
        "user_id": "u1",
        "created_at": created_at,
        "kind": FeedbackKind.thumbs,
        "value": 1.0 if up else -1.0,
    }
    fields.update(overrides)
    return Feedback(**fields)


def rating(request_id: str, value: float, created_at: float = 101.0, event_id: str | None = None) -> Feedback:
    return Feedback(
        event_id=event_id or f"r-{request_id}-{created_at}",
        request_id=request_id,
        user_id="u1",
        created_at=created_at,
        kind=FeedbackKind.rating,
        value=value,
        scale=(1.0, 5.0),
    )


def preference(request_id: str, other: str, winner: str = "this", created_at: float = 102.0,
               event_id: str | None = None) -> Feedback:
    return Feedback(
        event_id=event_id or f"p-{request_id}-{other}",
        request_id=request_id,
        user_id="u1",
        created_at=created_at,
        kind=FeedbackKind.preference,
        other_request_id=other,
        winner=winner,  # type: ignore[arg-type]
    )


BusFactory = Callable[..., Bus]


def drain(consumer: Consumer, count: int, timeout: float = 30.0) -> list[Record]:
    """Poll until `count` records arrived or `timeout` passed."""
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out.extend(consumer.poll(500, 0.5))
    return out


def lora_adapter(base_dir: Path, out_dir: Path, base_model: str, seed: int = 0, rank: int = 8,
                 scale: float = 1.0, seal: bool = True) -> Path:
    """A random (non-zero) PEFT LoRA adapter for the model in `base_dir`, saved as safetensors with
    its lineage manifest; `scale` multiplies lora_B so adapters differ visibly from the base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from online_rl.registry import write_lineage

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "o_proj"],
                        init_lora_weights=False, lora_dropout=0.0)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(scale)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    if seal:
        write_lineage(out_dir, base_model)
    return out_dir


STEER_CHANNEL = 0  # the hidden channel a steerable model holds constant


def steerable_llama(base_dir: Path, out_dir: Path) -> Path:
    """A copy of the tiny Llama in `base_dir` whose hidden channel `STEER_CHANNEL` is the same large
    positive value at every position (set in the embeddings, never written by a layer), so a rank-1
    LoRA on `lm_head` reading that channel adds a fixed amount to chosen tokens' logits: adapters
    whose effect on the text is known by construction."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, STEER_CHANNEL] = 0.5
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[STEER_CHANNEL].zero_()
            layer.mlp.down_proj.weight[STEER_CHANNEL].zero_()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (base_dir / name).is_file():
            shutil.copy(base_dir / name, out_dir / name)
    return out_dir


def steering_adapter(out_dir: Path, base_model: str, hidden_size: int, vocab_size: int, token_id: int,
                     strength: float = 4.0) -> Path:
    """A sealed rank-1 LoRA on `lm_head` of a `steerable_llama` that raises `token_id`'s logit."""
    import json

    import torch
    from safetensors.torch import save_file

    from online_rl.registry import write_lineage

    out_dir.mkdir(parents=True, exist_ok=True)
    a = torch.zeros(1, hidden_size)
    a[0, STEER_CHANNEL] = 1.0
    b = torch.zeros(vocab_size, 1)
    b[token_id, 0] = strength
    save_file({"base_model.model.lm_head.lora_A.weight": a, "base_model.model.lm_head.lora_B.weight": b},
              str(out_dir / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 1, "lora_alpha": 1, "lora_dropout": 0.0,
              "target_modules": ["lm_head"], "bias": "none", "base_model_name_or_path": base_model}
    (out_dir / "adapter_config.json").write_text(json.dumps(config))
    write_lineage(out_dir, base_model)
    return out_dir


def tls_folder(out: Path) -> Path:
    """A CA and a broker certificate for 127.0.0.1, as deploy/local/kafka/kafka.sh reads them
    (server.pem: key, then chain; ca.pem)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2))

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
             signer: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(valid[0]).not_valid_after(valid[1])
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "online-rl test CA")])
    ca_cert = cert("online-rl test CA", ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    server = cert("127.0.0.1", key, ca_name, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    out.mkdir(parents=True, exist_ok=True)
    (out / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (out / "server.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + server.public_bytes(pem) + ca_cert.public_bytes(pem))
    return out


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    """The token ids of `question` as a one-turn chat prompt."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             add_generation_prompt=True, tokenize=True)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def short_answer_pairs(model_dir: Path, questions: list[str],
                       model_name: str) -> tuple[list[TrainingSample], list[Any]]:
    """Users who prefer short answers: of four sampled answers, the shortest beats the longest (samples
    for the stream, and the same pairs as (prompt, chosen, rejected) token ids)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    samples, pairs = [], []
    for i, question in enumerate(questions):
        prompt = chat_ids(tokenizer, question)
        out = model.generate(torch.tensor([prompt] * 4), max_new_tokens=24, do_sample=True, temperature=1.0,
                             pad_token_id=tokenizer.eos_token_id)[:, len(prompt):].tolist()
        eos = tokenizer.eos_token_id
        answers = [o[: o.index(eos) + 1] if eos in o else o for o in out]
        words = [len(tokenizer.decode(a, skip_special_tokens=True).split()) for a in answers]
        short, long_ = answers[words.index(min(words))], answers[words.index(max(words))]
        if max(words) - min(words) < 4:
            continue
        completions = [Completion(request_id=f"r{i}-{k}", text=tokenizer.decode(a), token_ids=a,
                                  logprobs=[0.0] * len(a)) for k, a in enumerate((short, long_))]
        samples.append(TrainingSample(
            sample_id=f"pair-{i}", kind="pair", model=model_name, user_id=f"u{i}",
            prompt=[Message(role="user", content=question)], prompt_token_ids=prompt,
            chosen=completions[0], rejected=completions[1], feedback_kind="preference",
            reward_mapping_version="test", behaviour_versions=[None, None], created_at=float(i)))
        pairs.append((prompt, short, long_))
    return samples, pairs
