"""The single chat-turn rendering the trainer's probe, the anchors and the learning benchmark share."""

from __future__ import annotations

from pathlib import Path

from online_rl.models import user_turn_ids


def test_a_user_turn_is_the_templates_own_tokens_with_no_second_bos(embedded_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    ids = user_turn_ids(tokenizer, "What is the capital of France?")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                             add_generation_prompt=True, tokenize=True)
    templated = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    assert ids == templated
    text = tokenizer.decode(ids)
    assert "What is the capital of France?" in text and text.rstrip().endswith("assistant")
    if tokenizer.bos_token_id is not None:  # the template's own BOS at most, never the tokenizer's too
        assert ids[:2].count(tokenizer.bos_token_id) <= 1
