"""Learning happens: DPO, KTO, PPO and the reward model move a LoRA adapter on the tiny Llama towards
a synthetic preference, and only the adapter's weights change.

DPO and KTO learn a preference that depends on the prompt ("prompts on topic A want the answer to end
with PREFERRED, on topic B with AVOIDED"), measured on held-out prompts over two seeds against a control
trained on the same data with shuffled labels; the reward model ranks the endings; PPO learns to "emit
even token ids" (scored by a rule on its own samples) against a control at learning rate 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from online_rl.algos import (
    AdaptiveKLController,
    DPOConfig,
    KLControlConfig,
    KTOConfig,
    PPOConfig,
    RewardModel,
    RewardModelConfig,
    Sample,
    forward,
    pack,
    policy_loss,
    ppo_advantages,
    value_loss,
)
from online_rl.algos.batch import (
    dpo_batch_loss,
    kto_batch_loss,
    reference_logprobs,
    reward_batch_loss,
    reward_thumbs_loss,
)
from online_rl.algos.policy import LoraSpec, lora_policy, trainable_parameters

PREFERRED, AVOIDED = 1000, 2000
# Prompts and answers are new sentences over a small shared vocabulary, as held-out text is made of known
# words. With ids spread over the whole vocabulary every held-out token is one the adapter never saw, and
# what a random model does on unseen random tokens is luck: DPO and KTO then learn the training prompts
# (margins +2 to +4 there) and move fresh ones either way (-1.0 to +0.9 over seeds 1-3).
WORDS = range(100, 300)


def _ids(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.choice(WORDS) for _ in range(rng.randint(low, high))]


def _policy(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return lora_policy(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), LoraSpec(rank=8))


def _frozen(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}


def _adapter(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainable_parameters(policy).items()}


def _assert_only_the_adapter_changed(policy: Any, frozen: dict[str, torch.Tensor],
                                     adapter: dict[str, torch.Tensor]) -> None:
    for name, parameter in policy.named_parameters():
        if name in frozen:
            assert torch.equal(parameter, frozen[name]), f"{name} is frozen but changed"
    moved = [n for n, p in trainable_parameters(policy).items() if not torch.equal(p, adapter[n])]
    assert moved and all("lora_" in n for n in moved)
    assert any("lora_A" in n for n in moved) and any("lora_B" in n for n in moved)


def _ending_logprob(policy: Any, held_out: list[tuple[list[int], list[int]]], token: int) -> float:
    """Mean log-probability of ending the held-out stems with `token`."""
    batch = pack([Sample(prompt, [[*stem, token]]) for prompt, stem in held_out])
    with torch.no_grad():
        out = forward(policy, batch)
    last = torch.cumsum(batch.lengths, 0) - 1
    return out.token_logprobs[last].mean().item()


def _train(policy: Any, steps: int, loss_of: Callable[[int], torch.Tensor], lr: float = 5e-3) -> list[float]:
    optimizer = torch.optim.AdamW(list(trainable_parameters(policy).values()), lr=lr)
    losses = []
    for step in range(steps):
        loss = loss_of(step)
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


# The preference depends on the prompt: prompts on topic A want the answer to end with PREFERRED, those
# on topic B with AVOIDED. A policy that only learned "end with PREFERRED" gains nothing on average.
TOPIC_A, TOPIC_B = 50, 60


def _right(topic: int) -> tuple[int, int]:
    """(the ending this topic's users like, the one they dislike)."""
    return (PREFERRED, AVOIDED) if topic == TOPIC_A else (AVOIDED, PREFERRED)


def _topical(rng: random.Random, count: int) -> list[tuple[int, list[int], list[int]]]:
    """(topic, prompt opening with its topic word, answer stem) items."""
    items = []
    for _ in range(count):
        topic = rng.choice((TOPIC_A, TOPIC_B))
        items.append((topic, [topic, *_ids(rng, 2, 6)], _ids(rng, 1, 3)))
    return items


def _right_margin(policy: Any, held_out: list[tuple[int, list[int], list[int]]]) -> float:
    """Mean log-probability margin of the liked ending over the disliked one on held-out prompts."""
    def ending_logprobs(which: int) -> torch.Tensor:
        batch = pack([Sample(prompt, [[*stem, _right(topic)[which]]]) for topic, prompt, stem in held_out])
        with torch.no_grad():
            out = forward(policy, batch)
        return out.token_logprobs[torch.cumsum(batch.lengths, 0) - 1]

    return (ending_logprobs(0) - ending_logprobs(1)).mean().item()


def _preference_run(model_dir: Path, kind: str, seed: int, shuffled: bool) -> tuple[float, list[float], Any]:
    """Train DPO (on pairs) or KTO (on unpaired thumbs) on the topical preference; with `shuffled` the
    labels are drawn at random (the control: the same data, steps and seeds without the signal).
    Returns the held-out margin's change, the losses and the policy."""
    rng, labels = random.Random(seed), random.Random(seed + 100)
    train, held_out = _topical(rng, 64), _topical(rng, 32)
    policy = _policy(model_dir)
    before = _right_margin(policy, held_out)
    if kind == "dpo":
        pairs = []
        for topic, prompt, stem in train:
            good, bad = _right(topic)
            if shuffled and labels.random() < 0.5:
                good, bad = bad, good
            pairs.append((prompt, [*stem, good], [*stem, bad]))
        dpo = DPOConfig(beta=0.1)
        losses = _train(policy, 32, lambda step: dpo_batch_loss(policy, pairs[(step % 8) * 8:][:8], dpo).loss)
    else:
        thumbs = []
        for i, (topic, prompt, stem) in enumerate(train):  # unpaired: one answer and one thumb per prompt
            up = i % 2 == 0
            thumbs.append((prompt, [*stem, _right(topic)[0 if up else 1]], labels.random() < 0.5 if shuffled
                           else up))
        kto = KTOConfig(beta=0.1)
        losses = _train(policy, 48,
                        lambda step: kto_batch_loss(policy, thumbs[(step % 8) * 8:][:8], kto).loss)
    return _right_margin(policy, held_out) - before, losses, policy


def test_dpo_learns_a_prompt_dependent_preference_over_its_shuffled_control(tiny_model: Path) -> None:
    for seed in (0, 1):
        frozen = _frozen(_policy(tiny_model))
        gain, losses, policy = _preference_run(tiny_model, "dpo", seed, shuffled=False)
        control, _, _ = _preference_run(tiny_model, "dpo", seed, shuffled=True)
        # measured: learned +3.7 on both seeds, the shuffled control -0.8 and -2.2
        assert gain > control + 1.5 and gain > 1.0, (seed, gain, control)
        assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.1, losses
        _assert_only_the_adapter_changed(policy, frozen, _adapter(_policy(tiny_model)))


def test_kto_learns_a_prompt_dependent_preference_from_unpaired_thumbs_over_its_control(
        tiny_model: Path) -> None:
    gains, controls = [], []
    for seed in (0, 1):
        frozen = _frozen(_policy(tiny_model))
        gain, losses, policy = _preference_run(tiny_model, "kto", seed, shuffled=False)
        control, _, _ = _preference_run(tiny_model, "kto", seed, shuffled=True)
        gains.append(gain)
        controls.append(control)
        assert gain > control, (seed, gain, control)
        assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4, losses
        _assert_only_the_adapter_changed(policy, frozen, _adapter(_policy(tiny_model)))
    # measured: learned +2.8 and +1.5, the shuffled control -0.9 and +0.8 (KTO's noise is wider)
    assert sum(gains) / 2 > sum(controls) / 2 + 1.0, (gains, controls)


def test_reward_model_learns_to_rank_preferences(tiny_model: Path) -> None:
    rng = random.Random(2)

    def pair() -> tuple[list[int], list[int], list[int]]:
        prompt, stem = _ids(rng, 2, 6), _ids(rng, 1, 3)
        return prompt, [*stem, PREFERRED], [*stem, AVOIDED]

    train, held_out = [pair() for _ in range(64)], [pair() for _ in range(32)]
    backbone = _policy(tiny_model)
    reward_model = RewardModel(backbone)
    frozen, adapter = _frozen(backbone), _adapter(backbone)
    config = RewardModelConfig()
    with torch.no_grad():
        before = reward_batch_loss(reward_model, held_out, config)
    optimizer = torch.optim.AdamW([p for p in reward_model.parameters() if p.requires_grad], lr=5e-3)
    for step in range(32):
        loss = reward_batch_loss(reward_model, train[(step % 8) * 8 :][:8], config).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        after = reward_batch_loss(reward_model, held_out, config)
    assert after.accuracy.item() >= 0.9 and after.loss.item() < before.loss.item() - 0.3, (before, after)
    _assert_only_the_adapter_changed(backbone, frozen, adapter)


def _thumbs_run(tiny_model: Path, shuffled: bool) -> tuple[float, float]:
    """A reward model taught by thumbs on answers ending in PREFERRED (up) or AVOIDED (down), a fifth of
    them up and a tenth of the verdicts flipped, as users give them; with `shuffled` the verdicts are
    dealt to other answers. Its accuracy and loss on held-out thumbs with the true verdicts."""
    rng = random.Random(3)

    def thumb(flip: float) -> tuple[list[int], list[int], bool]:
        liked = rng.random() < 0.2
        verdict = liked != (rng.random() < flip)
        return _ids(rng, 2, 6), [*_ids(rng, 1, 3), PREFERRED if liked else AVOIDED], verdict

    train, held_out = [thumb(0.1) for _ in range(96)], [thumb(0.0) for _ in range(48)]
    if shuffled:
        verdicts = [up for _, _, up in train]
        rng.shuffle(verdicts)
        train = [(p, c, up) for (p, c, _), up in zip(train, verdicts, strict=True)]
    backbone = _policy(tiny_model)
    reward_model = RewardModel(backbone)
    optimizer = torch.optim.AdamW([p for p in reward_model.parameters() if p.requires_grad], lr=5e-3)
    for step in range(36):
        loss = reward_thumbs_loss(reward_model, train[(step % 12) * 8 :][:8]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        after = reward_thumbs_loss(reward_model, held_out)
    return after.accuracy.item(), after.loss.item()


def test_reward_model_learns_from_noisy_unbalanced_thumbs_over_a_shuffled_control(tiny_model: Path) -> None:
    accuracy, loss = _thumbs_run(tiny_model, shuffled=False)
    control_accuracy, control_loss = _thumbs_run(tiny_model, shuffled=True)
    assert accuracy >= 0.85 and accuracy > control_accuracy + 0.2, (accuracy, control_accuracy)
    assert loss < control_loss, (loss, control_loss)


def _small_vocab_llama(path: Path) -> Path:
    """A tiny Llama over 16 tokens, so that a rule over token ids is reachable by sampling.

    Its weights are drawn 5x wider than usual: with the default (0.02) no hidden state can tilt the
    output towards even ids by more than ~0.6 logits, and the reachable reward stops near 0.65.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, bos_token_id=None,
                         eos_token_id=None, pad_token_id=0, tie_word_embeddings=False,
                         initializer_range=0.1)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def _even_share(completions: torch.Tensor) -> torch.Tensor:
    """The rule-based reward: the share of completion tokens with an even id."""
    return (completions % 2 == 0).float().mean(-1)


def test_ppo_raises_a_rule_based_reward_on_its_own_samples_over_its_lr0_control(tmp_path: Path) -> None:
    def gain(rewards: list[float]) -> float:  # the last 5 iterations' mean reward over the first 5's
        return sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5

    learned = _ppo_run(tmp_path, lr=3e-3, iterations=30)
    control = _ppo_run(tmp_path, lr=0.0, iterations=30)  # the same seeds and prompts, no update
    # each is the mean of 5 x 192 tokens' rewards
    assert abs(gain(control)) < 0.1, control
    assert gain(learned) > gain(control) + 0.25, (learned, control)


def _ppo_run(tmp_path: Path, lr: float, iterations: int) -> list[float]:
    policy = _policy(_small_vocab_llama(tmp_path / f"llama16-{lr}"))
    frozen, adapter = _frozen(policy), _adapter(policy)
    value_head = torch.nn.Linear(64, 1)
    config = PPOConfig(clip_low=0.2, clip_high=0.2, gamma=1.0, lam=0.95, kl=KLControlConfig(coef=0.02))
    kl_control = AdaptiveKLController(config.kl)
    adapter_and_head = [*trainable_parameters(policy).values(), *value_head.parameters()]
    optimizer = torch.optim.AdamW(adapter_and_head, lr=lr)
    generator = torch.Generator().manual_seed(0)
    rewards_seen = []
    for _ in range(iterations):
        # collect: 32 rollouts of 6 tokens from the current policy
        prompts = torch.randint(1, 16, (32, 4), generator=generator)
        with torch.no_grad():
            completions = policy.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                                          do_sample=True, max_new_tokens=6, min_new_tokens=6,
                                          top_k=0, pad_token_id=0)[:, 4:]
        scores = _even_share(completions)
        rewards_seen.append(scores.mean().item())
        batch = pack([Sample(p.tolist(), [c.tolist()]) for p, c in zip(prompts, completions, strict=True)])
        # score: behaviour log-probs, values, reference KL, advantages
        with torch.no_grad():
            behaviour = forward(policy, batch)
            old_values, mask = batch.padded(value_head(behaviour.hidden).squeeze(-1))
        old_logprobs, _ = batch.padded(behaviour.token_logprobs)
        ref_logprobs, _ = batch.padded(reference_logprobs(policy, batch).token_logprobs)
        rollout = ppo_advantages(scores, old_logprobs, ref_logprobs, old_values, mask, config,
                                 kl_control.value)
        kl_control.update(rollout.sequence_kl, samples=len(scores))
        advantages, returns = rollout.advantages, rollout.returns
        # update: two epochs over the batch
        for _epoch in range(2):
            out = forward(policy, batch)
            logprobs, _ = batch.padded(out.token_logprobs)
            values, _ = batch.padded(value_head(out.hidden.detach()).squeeze(-1))
            loss = (policy_loss(logprobs, old_logprobs, advantages, mask, config).loss
                    + value_loss(values, old_values, returns, mask, config).loss)
            assert torch.isfinite(loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if lr > 0:
        _assert_only_the_adapter_changed(policy, frozen, adapter)
    return rewards_seen
