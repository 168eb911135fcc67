"""Packed, padding-free log-probabilities against one-sample-at-a-time teacher forcing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from online_rl.algos import RewardModel, Sample, completion_logprobs, entropy_from_logits, forward, pack
from online_rl.algos.batch import autocast, reference_logprobs

SAMPLES = [
    Sample([11, 12, 13, 14, 15], [[21, 22, 23], [31, 32, 33, 34]]),
    Sample([41], [[51]]),
    Sample([61, 62, 63, 64, 65, 66, 67, 68, 69], [[71, 72], [81, 82, 83, 84, 85, 86], [91]]),
    Sample([101, 102], [[111, 112, 113, 114, 115, 116, 117]]),
]


def _one_by_one(model: Any) -> torch.Tensor:
    return torch.cat([completion_logprobs(model, s.prompt, c) for s in SAMPLES for c in s.completions])


def test_packed_equals_one_sample_at_a_time(policy: Any) -> None:
    batch = pack(SAMPLES)
    # no padding: every token is a real one
    assert batch.num_tokens == sum(len(s.prompt) + sum(map(len, s.completions)) for s in SAMPLES)
    with torch.no_grad():
        out = forward(policy, batch, with_entropy=True)
        expected = _one_by_one(policy)
    assert torch.allclose(out.token_logprobs, expected, atol=1e-5)
    lengths = [len(c) for s in SAMPLES for c in s.completions]
    assert batch.lengths.tolist() == lengths
    sums = torch.stack([chunk.sum() for chunk in expected.split(lengths)])
    assert torch.allclose(out.sequence_logprobs, sums, atol=1e-5)
    padded, mask = batch.padded(out.token_logprobs)
    assert padded.shape == (len(lengths), max(lengths)) and mask.sum().item() == sum(lengths)
    assert torch.allclose((padded * mask).sum(1), sums, atol=1e-5)
    assert out.entropy is not None and bool((out.entropy > 0).all())


def test_entropy_matches_full_logits(policy: Any) -> None:
    sample = SAMPLES[0]
    with torch.no_grad():
        out = forward(policy, pack([Sample(sample.prompt, sample.completions[:1])]), with_entropy=True)
        ids = torch.tensor([list(sample.prompt) + list(sample.completions[0])])
        logits = policy(input_ids=ids).logits[0, len(sample.prompt) - 1 : -1]
    assert out.entropy is not None
    assert torch.allclose(out.entropy, entropy_from_logits(logits), atol=1e-4)


def test_reference_is_the_base_model_and_costs_no_copy(policy: Any, tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    batch = pack(SAMPLES)
    reference = reference_logprobs(policy, batch)
    with torch.no_grad():
        expected = _one_by_one(base)
        policy_side = forward(policy, batch).token_logprobs
    assert torch.allclose(reference.token_logprobs, expected, atol=1e-5)
    assert not torch.allclose(policy_side, expected, atol=1e-3)  # the adapter is on again afterwards
    with pytest.raises(TypeError, match="PEFT model"):
        reference_logprobs(base, batch)


def test_bf16_stays_close_to_fp32(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    from online_rl.algos.policy import LoraSpec, lora_policy

    def load() -> Any:
        return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)

    fp32, bf16 = lora_policy(load(), LoraSpec()), lora_policy(load(), LoraSpec(), "bf16")
    torch.manual_seed(0)
    for name, parameter in fp32.named_parameters():
        if "lora_B" in name:  # a trained-looking adapter, so the bf16 adapter path is exercised
            torch.nn.init.normal_(parameter, std=0.3)
    bf16.load_state_dict(fp32.state_dict())
    assert all(p.dtype == torch.float32 for p in bf16.parameters() if p.requires_grad)
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters() if not p.requires_grad)
    batch = pack(SAMPLES)
    with torch.no_grad():
        exact = forward(fp32, batch).token_logprobs
        with autocast("bf16"):
            approx = forward(bf16, batch).token_logprobs
            base = reference_logprobs(bf16, batch, "bf16").token_logprobs
    assert (approx - exact).abs().max().item() < 0.1
    assert (approx - base).abs().max().item() > 0.3  # the adapter is doing something


def test_reward_model_reads_each_completion_s_last_token(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    backbone = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    reward_model = RewardModel(backbone)
    with torch.no_grad():
        rewards = reward_model(pack(SAMPLES))
        expected = []
        for sample in SAMPLES:
            for completion in sample.completions:
                ids = torch.tensor([list(sample.prompt) + list(completion)])
                hidden = backbone.model(input_ids=ids).last_hidden_state[0, -1]
                expected.append(reward_model.head(hidden).item())
    assert rewards.tolist() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    ("samples", "message"),
    [([], "at least one sample"),
     ([Sample([], [[1]])], "sample 0 has an empty prompt"),
     ([Sample([1], [[2]]), Sample([1], [[]])], "sample 1 has no completion or an empty one"),
     ([Sample([1], [])], "sample 0 has no completion")],
)
def test_bad_samples_are_refused(samples: list[Sample], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pack(samples)



def test_a_frozen_champion_adapter_can_be_the_reference(policy: Any, tiny_model: Path,
                                                         tmp_path: Path) -> None:
    """`reference_policy(model, "anchor")`: the base plus the loaded champion adapter, not the trained
    one; afterwards the trained adapter is active and trainable again, the champion frozen."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from online_rl.algos.batch import implicit_rewards

    champion = tmp_path / "champion"
    policy.save_pretrained(champion)  # the champion: the current adapter, frozen from here on
    policy.load_adapter(str(champion), adapter_name="anchor", is_trainable=False)
    with torch.no_grad():  # the trained adapter moves away from the champion
        for name, weight in policy.named_parameters():
            if "lora_B.default" in name:
                weight.add_(0.05)
    batch = pack(SAMPLES)
    standalone = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), champion)
    with torch.no_grad():
        expected = forward(standalone, batch).token_logprobs
        policy_side = forward(policy, batch).token_logprobs
    anchored = reference_logprobs(policy, batch, reference="anchor").token_logprobs
    assert torch.allclose(anchored, expected, atol=1e-5)
    assert not torch.allclose(policy_side, expected, atol=1e-3)
    assert policy.active_adapter == "default"
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".default." in name for name in trainable)
    with pytest.raises(ValueError, match="'missing' is not loaded"):
        reference_logprobs(policy, batch, reference="missing")
    # held-out scores: beta * log(pi / pi_champion), chosen minus rejected; signed by the thumb
    pairs = [([11, 12, 13], [21, 22], [31, 32, 33])]
    thumbs = [([41, 42], [51, 52, 53], True), ([61], [71], False)]
    scores = implicit_rewards(policy, pairs, thumbs, 0.1, reference="anchor")
    with torch.no_grad():
        def ratio(prompt: list[int], completion: list[int]) -> torch.Tensor:
            return (completion_logprobs(policy, prompt, completion).sum()
                    - completion_logprobs(standalone, prompt, completion).sum())

        (prompt, chosen, rejected), (p1, c1, _), (p2, c2, _) = pairs[0], thumbs[0], thumbs[1]
        expected = 0.1 * torch.stack([ratio(prompt, chosen) - ratio(prompt, rejected), ratio(p1, c1),
                                      -ratio(p2, c2)])
    assert torch.allclose(scores, expected, atol=1e-5) and scores.abs().min() > 1e-4
