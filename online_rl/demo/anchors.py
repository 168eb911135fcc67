"""The demo's cold-start set: anchors mixed into every training batch against forgetting
(`trainer.cold_start`, `trainer.cold_start_weight`).

Learning from a few hundred thumbs moves a 135M model quickly; without an anchor its greedy answers
to factual questions drift (measured in the first recorded demo: 4 of the 8 general-ability prompts
still right, against 8 for the base model). Two styles:

- `short` (the default until the neutral ones are measured on the demo and the suite): short correct
  answers to factual questions, the base model's answer cut to its first sentence. They agree with
  users who like short answers (the demo's taste) and pull against users who like long or chatty ones.
- `neutral`: the base model's own full answers (greedy, float32, up to 64 tokens) to general prompts
  of every kind (facts, explanations, how-to, advice, writing). They lean towards no taste: whatever
  the users like, the anchors only hold the model near what it already did.

None of the anchor prompts is among the users' prompts (the demo's and the preference suite's) or the
ability check's.

    python -m online_rl.demo.anchors [--style neutral|short] [OUT.jsonl]
        # for the configured base model; prints the path (default <cache_dir>/demo/cold-start.jsonl)
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path
from typing import Any, Literal

from online_rl.config import Settings, load_settings
from online_rl.events import Completion, FeedbackKind, Message, TrainingSample
from online_rl.models.chat import user_turn_ids

__all__ = ["ANCHORS", "NEUTRAL_PROMPTS", "AnchorStyle", "base_answers", "cold_start_samples",
           "write_cold_start"]

AnchorStyle = Literal["neutral", "short"]
NEUTRAL_MAX_TOKENS = 64

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


# General prompts of every kind the users' prompts have, none of them among those prompts. The factual
# ones are among those the base model answers correctly (it names El Salvador as Spain's capital).
NEUTRAL_PROMPTS: tuple[str, ...] = (
    "What is the capital of Germany?",
    "What is the capital of Japan?",
    "What is the chemical symbol for gold?",
    "Who was the first person to walk on the moon?",
    "Why do we need to sleep?",
    "How do plants make food?",
    "Why is the sky dark at night?",
    "How does a bicycle stay upright?",
    "How do I make a sandwich?",
    "How do I water a cactus?",
    "How do I write a shopping list?",
    "How do I sharpen a pencil?",
    "How can I remember names better?",
    "How can I spend less time on my phone?",
    "How can I keep my desk tidy?",
    "How do I get better at drawing?",
    "Write a sentence about a river.",
    "Describe a garden in spring.",
    "Write a short line about music.",
    "Describe a train station.",
)


def base_answers(settings: Settings, prompts: tuple[str, ...] = NEUTRAL_PROMPTS,
                 max_new_tokens: int = NEUTRAL_MAX_TOKENS, tokenizer: Any = None,
                 ) -> list[tuple[str, list[int], list[int]]]:
    """(prompt, prompt token ids, answer token ids) of the base model's own greedy answers in float32,
    the end-of-sequence token included when the answer ends within `max_new_tokens`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(settings.model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(settings.model_dir), dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    out = []
    for prompt in prompts:
        ids = user_turn_ids(tokenizer, prompt)
        inputs = torch.tensor([ids])
        with torch.no_grad():
            generated = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                                       max_new_tokens=max_new_tokens, pad_token_id=eos)
        answer = generated[0, len(ids):].tolist()
        if eos in answer:
            answer = answer[: answer.index(eos) + 1]
        out.append((prompt, ids, answer))
    return out


def _sample(settings: Settings, prompt: str, prompt_ids: list[int], answer: str,
            answer_ids: list[int], style: str) -> TrainingSample:
    digest = hashlib.sha256(f"{style}\n{prompt}\n{answer}".encode()).hexdigest()[:16]
    return TrainingSample(
        sample_id=f"anchor-{digest}", kind="single", model=settings.model.name, user_id="cold-start",
        prompt=[Message(role="user", content=prompt)], prompt_token_ids=prompt_ids,
        completion=Completion(request_id=f"anchor-{digest}", text=answer, token_ids=answer_ids, logprobs=[]),
        reward=1.0, feedback_kind=FeedbackKind.thumbs, label=True,
        reward_mapping_version=f"cold-start-{style}", behaviour_versions=[None], created_at=time.time())


def cold_start_samples(settings: Settings, style: AnchorStyle = "short") -> list[TrainingSample]:
    """The anchors as desirable (thumbs-up) training samples for the configured base model."""
    from transformers import AutoTokenizer

    if style not in ("neutral", "short"):
        raise ValueError(f"anchor style {style!r}: use 'neutral' or 'short'")
    tokenizer = AutoTokenizer.from_pretrained(str(settings.model_dir))
    if style == "neutral":
        return [_sample(settings, prompt, ids, str(tokenizer.decode(answer, skip_special_tokens=True)),
                        answer, style) for prompt, ids, answer in base_answers(settings, tokenizer=tokenizer)]
    return [_sample(settings, prompt, user_turn_ids(tokenizer, prompt), answer,
                    [*tokenizer(answer, add_special_tokens=False).input_ids, tokenizer.eos_token_id], style)
            for prompt, answer in ANCHORS]


def write_cold_start(settings: Settings, path: Path, style: AnchorStyle = "short") -> Path:
    """Write the anchors as a JSONL file of training samples (`trainer.cold_start`)."""
    samples = cold_start_samples(settings, style)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s.model_dump_json() + "\n" for s in samples))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m online_rl.demo.anchors",
                                     description="Write the trainer's cold-start anchors for the configured "
                                                 "base model and print the file's path.")
    parser.add_argument("out", nargs="?", type=Path, help="default: <cache_dir>/demo/cold-start.jsonl")
    parser.add_argument("--style", choices=["neutral", "short"], default="short",
                        help="short: short correct answers to factual questions (default); neutral: the "
                             "base model's own full answers to general prompts")
    args = parser.parse_args(argv)
    settings = load_settings()
    out = args.out or settings.cache_dir / "demo" / "cold-start.jsonl"
    print(write_cold_start(settings, out.resolve(), args.style))


if __name__ == "__main__":
    main()
