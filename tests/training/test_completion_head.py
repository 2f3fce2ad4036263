"""The LM head on the completion's positions only (training/completion_head.py): TRL's loss, gradients and metrics,
from fewer projected rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memreader.training.completion_head import completion_log_probs, score_completion_only
from memreader.training.config import make_train_config
from memreader.training.sft import build_trainer, load_tokenizer


def _trainer(tiny_model: str, train_file: Path, completion_head: bool):
    cfg = make_train_config(dict(
        train_file=str(train_file), model=tiny_model, r=8, lora_alpha=16, lora_dropout=0.0, max_steps=1,
        per_device_train_batch_size=4, max_length=512, bf16=False, save_strategy="no", seed=0,
        completion_head=completion_head, run=f"tiny-head-{completion_head}"))
    records = [json.loads(line) for line in train_file.read_text(encoding="utf-8").splitlines()]
    return build_trainer(cfg, tiny_model, load_tokenizer(tiny_model), records[:4])


def _step(trainer) -> tuple[float, dict[str, torch.Tensor], list[int], dict[str, float]]:
    """One loss and backward on the first batch of four: the loss, the LoRA gradients, the rows the LM head saw and
    TRL's logged metrics."""
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    head = trainer.model.get_base_model().get_output_embeddings()
    rows: list[int] = []
    hook = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    trainer.model.train()
    try:
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
    finally:
        hook.remove()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k != "num_tokens"}
    return loss.item(), grads, rows, metrics


@pytest.mark.integration
def test_completion_head_equals_trls_head_from_the_labelled_rows_only(tiny_model, sft_files):
    ours = _trainer(tiny_model, sft_files[0], completion_head=True)
    trls = _trainer(tiny_model, sft_files[0], completion_head=False)
    trls.model.load_state_dict(ours.model.state_dict())  # the same random LoRA A in both
    loss, grads, rows, metrics = _step(ours)
    ref_loss, ref_grads, _ref_rows, ref_metrics = _step(trls)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert grads.keys() == ref_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert metrics.keys() == ref_metrics.keys()
    for key, value in metrics.items():
        assert value == pytest.approx(ref_metrics[key], rel=1e-4, abs=1e-6), key
    batch = ours.data_collator([ours.train_dataset[i] for i in range(4)])
    labelled = int((batch["labels"][:, 1:] != -100).sum())
    assert rows == [labelled], "only the positions whose next token is a label reach the LM head"
    assert labelled < 0.9 * batch["labels"][:, 1:].numel()  # the test means something: prompts are there


def test_completion_log_probs_of_an_all_ignored_batch_is_a_differentiable_zero():
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    out = completion_log_probs(hidden, torch.full((2, 5), -100), head)
    assert out.loss.item() == 0.0 and not out.label_mask.any()
    out.loss.backward()
    assert hidden.grad is not None and (hidden.grad == 0).all()


def test_completion_log_probs_matches_cross_entropy():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=True)
    hidden = torch.randn(2, 6, 8)
    labels = torch.tensor([[-100, -100, 3, 4, 10, -100], [-100, 1, 2, 0, -100, -100]])
    out = completion_log_probs(hidden, labels, head, num_items_in_batch=torch.tensor(7))
    mask = labels != -100
    expected = torch.nn.functional.cross_entropy(head(hidden[mask]), labels[mask], reduction="sum") / 7
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert (out.log_probs[~mask] == 0).all() and (out.entropy[~mask] == 0).all()
    assert out.is_top1.dtype == torch.bool


def test_a_soft_capped_model_keeps_trls_head():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config)
    before = model.forward
    model.config.final_logit_softcapping = 30.0
    assert score_completion_only(model) is False and model.forward == before
    model.config.final_logit_softcapping = None
    assert score_completion_only(model) is True and model.forward != before
