"""DPO, IPO and KTO against TRL's own trainers on identical inputs.

TRL builds its LoRA adapter on the tiny Llama; the adapter is then given random weights so that the
policy differs from the reference (the same model with the adapter disabled, for TRL and for us).
TRL's loss comes from its trainer's `_compute_loss` on a batch its own collator made; ours from
`dpo_batch_loss` / `kto_batch_loss` on the same token ids (packed, each prompt once).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from online_rl.algos import DPOConfig, KTOConfig
from online_rl.algos.batch import dpo_batch_loss, kto_batch_loss

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _trainer(kind: str, tiny_model: Path, tmp_path: Path, **options: Any) -> Any:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    peft = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    common = {"output_dir": str(tmp_path), "report_to": [], "use_cpu": True, "per_device_train_batch_size": 2}
    if kind == "dpo":
        from trl import DPOConfig as TRLDPOConfig
        from trl import DPOTrainer

        data = Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}] * 2)
        trainer = DPOTrainer(model=model, args=TRLDPOConfig(**common, **options), train_dataset=data,
                             processing_class=tokenizer, peft_config=peft)
    else:
        from trl import KTOConfig as TRLKTOConfig
        from trl import KTOTrainer

        data = Dataset.from_list([{"prompt": "a", "completion": "b", "label": i % 2 == 0} for i in range(4)])
        trainer = KTOTrainer(model=model, args=TRLKTOConfig(**common, **options), train_dataset=data,
                             processing_class=tokenizer, peft_config=peft)
    torch.manual_seed(0)
    for name, parameter in trainer.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.3)
    trainer.model.eval()
    return trainer


@pytest.fixture
def dpo_trainer(tiny_model: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    yield _trainer("dpo", tiny_model, tmp_path, **request.param)


@pytest.mark.parametrize(
    ("dpo_trainer", "ours"),
    [({"beta": 0.1, "loss_type": ["sigmoid"]}, DPOConfig(beta=0.1)),
     ({"beta": 0.5, "loss_type": ["sigmoid"]}, DPOConfig(beta=0.5)),
     ({"beta": 0.2, "loss_type": ["ipo"]}, DPOConfig(beta=0.2, loss="ipo"))],
    indirect=["dpo_trainer"],
    ids=["sigmoid-0.1", "sigmoid-0.5", "ipo-0.2"],
)
def test_dpo_loss_and_gradients_match_trl(dpo_trainer: Any, ours: DPOConfig, pairs: list[Any]) -> None:
    model = dpo_trainer.model
    examples = [{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r} for p, c, r in pairs]
    batch = dpo_trainer.data_collator(examples)
    expected = dpo_trainer._compute_loss(model, batch, False)
    lora = [p for p in model.parameters() if p.requires_grad]
    expected_grads = torch.autograd.grad(expected, lora)

    actual = dpo_batch_loss(model, pairs, ours)
    actual_grads = torch.autograd.grad(actual.loss, lora)

    assert abs(expected.item() - 0.6931) > 1e-3, "the policy must differ from the reference for a real check"
    assert torch.allclose(actual.loss, expected, atol=1e-5), (actual.loss.item(), expected.item())
    for mine, theirs in zip(actual_grads, expected_grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.5)], ids=["equal", "undesirable-1.5"])
def test_kto_loss_and_gradients_match_trl(tiny_model: Path, tmp_path: Path,
                                          weights: tuple[float, float]) -> None:
    trainer = _trainer("kto", tiny_model, tmp_path, beta=0.1, desirable_weight=weights[0],
                       undesirable_weight=weights[1])
    model = trainer.model
    rng = random.Random(3)
    torch.manual_seed(3)
    samples = []
    for up in (True, False, True, True, False, False, True):
        # Completions sampled from the policy itself, so that its KL to the reference shows (z0 > 0).
        prompt = [rng.randrange(100, 5000) for _ in range(rng.randint(2, 8))]
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt]), do_sample=True, min_new_tokens=1,
                                 max_new_tokens=rng.randint(1, 6), pad_token_id=0)
        samples.append((prompt, out[0, len(prompt):].tolist(), up))
    # TRL's KL sequences are supplied as our mismatched pairs: prompt i with completion i + 1.
    examples = [{"prompt_ids": p, "completion_ids": c, "label": up,
                 "KL_completion_ids": samples[(i + 1) % len(samples)][1]}
                for i, (p, c, up) in enumerate(samples)]
    batch = trainer.data_collator(examples)
    expected = trainer._compute_loss(model, batch, False)
    lora = [p for p in model.parameters() if p.requires_grad]
    expected_grads = torch.autograd.grad(expected, lora)

    actual = kto_batch_loss(model, samples, KTOConfig(beta=0.1, desirable_weight=weights[0],
                                                      undesirable_weight=weights[1]))
    actual_grads = torch.autograd.grad(actual.loss, lora)

    assert float(actual.reference_point) > 0, "the KL reference point must be active for a real check"
    assert torch.allclose(actual.loss, expected, atol=1e-6), (actual.loss.item(), expected.item())
    for mine, theirs in zip(actual_grads, expected_grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6, rtol=1e-4)
