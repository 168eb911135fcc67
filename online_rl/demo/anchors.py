"""The demo's cold-start set: a few short, correct answers mixed into every training batch against
forgetting (`trainer.cold_start`, `trainer.cold_start_weight`).

Learning from a few hundred thumbs moves a 135M model quickly; without an anchor its greedy answers
to factual questions drift (measured in the first recorded demo: 4 of the 8 general-ability prompts
still right, against 8 for the base model). Each anchor is the base model's own answer to a factual
question, cut to its first sentence — what the simulated users like anyway, so it does not pull
against their taste. None of these questions is among the users' prompts or the ability check's.

    python -m online_rl.demo.anchors [OUT.jsonl]   # for the configured base model; prints the path
                                                   # (default <cache_dir>/demo/cold-start.jsonl)
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from online_rl.config import Settings, load_settings
from online_rl.events import Completion, FeedbackKind, Message, TrainingSample

__all__ = ["ANCHORS", "cold_start_samples", "write_cold_start"]

ANCHORS: tuple[tuple[str, str], ...] = (
    ("What is the capital of England?", "The capital of England is London."),
    ("What is the capital of Russia?", "The capital of Russia is Moscow."),
    ("What is the capital of China?", "The capital of China is Beijing."),
    ("What is the capital of Canada?", "The capital of Canada is Ottawa."),
    ("What is the capital of Egypt?", "The capital of Egypt is Cairo."),
    ("What is the capital of Greece?", "The capital of Greece is Athens."),
    ("What is the capital of India?", "The capital of India is New Delhi."),
    ("What is the capital of Australia?", "The capital of Australia is Canberra."),
    ("What is the opposite of day?", "The opposite of day is night."),
    ("What is the opposite of up?", "The opposite of up is down."),
    ("What is 10 + 10?", "10 + 10 = 20."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("What is the main language of Mexico?", "The main language of Mexico is Spanish."),
    ("What is the largest animal on Earth?", "The largest animal on Earth is the Blue Whale."),
    ("How many seconds are in a minute?", "A minute is equivalent to 60 seconds."),
    ("What is the currency of Japan?", "The currency of Japan is the Japanese Yen (JPY)."),
    ("What is the longest river in Africa?", "The longest river in Africa is the Nile River."),
    ("What is the largest desert in the world?", "The largest desert in the world is the Sahara Desert."),
)


def cold_start_samples(settings: Settings) -> list[TrainingSample]:
    """The anchors as desirable (thumbs-up) training samples for the configured base model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(settings.model_dir))
    out = []
    for prompt, answer in ANCHORS:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(text, add_special_tokens=False).input_ids
        answer_ids = [*tokenizer(answer, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        digest = hashlib.sha256(f"{prompt}\n{answer}".encode()).hexdigest()[:16]
        out.append(TrainingSample(
            sample_id=f"anchor-{digest}", kind="single", model=settings.model.name, user_id="cold-start",
            prompt=[Message(role="user", content=prompt)], prompt_token_ids=prompt_ids,
            completion=Completion(request_id=f"anchor-{digest}", text=answer, token_ids=answer_ids,
                                  logprobs=[]),
            reward=1.0, feedback_kind=FeedbackKind.thumbs, label=True, reward_mapping_version="cold-start",
            behaviour_versions=[None], created_at=time.time()))
    return out


def write_cold_start(settings: Settings, path: Path) -> Path:
    """Write the anchors as a JSONL file of training samples (`trainer.cold_start`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s.model_dump_json() + "\n" for s in cold_start_samples(settings)))
    return path


if __name__ == "__main__":
    if len(sys.argv) > 2:
        raise SystemExit("usage: python -m online_rl.demo.anchors [OUT.jsonl]")
    settings = load_settings()
    out = Path(sys.argv[1]) if len(sys.argv) == 2 else settings.cache_dir / "demo" / "cold-start.jsonl"
    print(write_cold_start(settings, out.resolve()))
