"""Label scores: verbalizer log-likelihoods from a model's logits (differentiable, used for training too).

How a label is scored (summed log-likelihood of its whole verbalizer, or its first distinguishing token) is the
verbalizers' ``scoring`` (:mod:`anchorlens.evaluation.verbalizers`); the batch's layout follows from it
(:func:`~anchorlens.evaluation.batches.scoring_batch`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.evaluation.batches import ScoringBatch
from anchorlens.evaluation.model import Scorable
from anchorlens.evaluation.verbalizers import AUTO, Verbalizers, verbalizer_ids
from anchorlens.models.base import skip_lm_head
from anchorlens.roles.kinds import Role


def seq2seq_scores(logits: torch.Tensor, gold: torch.Tensor, weight: torch.Tensor, num_labels: int) -> torch.Tensor:
    """[B, L] summed target log-likelihoods from logits [B*L, S, V], gold and weight [B*L, S]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    token = logp.gather(-1, gold.to(logits.device).unsqueeze(-1)).squeeze(-1)  # [B*L, S]
    total = (token * weight.to(token)).sum(-1)
    return total.view(-1, num_labels)


def logits_at(model: Scorable, batch: ScoringBatch, positions: torch.Tensor) -> torch.Tensor:
    """[R, C, V] decoder logits at ``positions`` ([R, C] long positions of each row of ``batch.encoded``), the LM
    head run only at those positions when the base takes ``logits_to_keep`` (as ``next_token_logits``)."""
    encoded = batch.encoded.to(model.device)
    positions = positions.to(model.device)
    rows = torch.arange(encoded.batch_size, device=model.device)[:, None]
    if not skip_lm_head(model.base.model):
        return model.forward(encoded).logits[rows, positions]
    at = positions
    plan = model.plan(encoded) if model.guidance_list() else None
    if plan is not None and plan.inputs is not None:  # inserted positions: where each row's position moved to
        at = (plan.inputs.splice.src[:, None, :] == positions[:, :, None]).int().argmax(-1)
    keep = torch.unique(at)  # sorted: the positions every row computes logits at
    logits = model.forward(encoded, logits_to_keep=keep).logits  # [R, len(keep), V]
    return logits[rows, torch.searchsorted(keep, at)]


def label_scores(model: Scorable, batch: ScoringBatch, verbalizers: Verbalizers) -> torch.Tensor:
    """[B, L] score of every label for every example (higher is more likely); batch on the model's device.

    A document with fewer choices than L (choices per document) has -inf for the missing ones."""
    return answer_scores(model, batch, verbalizers)[0]


def answer_scores(model: Scorable, batch: ScoringBatch, verbalizers: Verbalizers) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, L] label scores as :func:`label_scores`, [B, V] float32 log-probabilities of the next token at the
    answer position): decoder-only, the position that predicts the first distinguishing verbalizer token (after the
    verbalizers' shared prefix); encoder-decoder, the first target position."""
    if batch.per_row:
        return _row_scores(model, batch)
    if batch.answer_pos is not None:  # the LM head only at the answer positions
        choice = torch.tensor(verbalizers.choice, dtype=torch.long, device=model.device)
        n_shared = len(verbalizers.shared)
        if verbalizers.scoring == "first_token" or n_shared == 0:
            logp = torch.log_softmax(model.next_token_logits(batch.encoded, batch.answer_pos).float(), dim=-1)
            return logp[:, choice], logp
        # sum: the shared tokens' log-likelihood (the same for every label) + the distinguishing token's
        offsets = torch.arange(-n_shared, 1, device=batch.answer_pos.device)
        every = torch.log_softmax(logits_at(model, batch, batch.answer_pos[:, None] + offsets).float(), dim=-1)
        shared = torch.tensor(verbalizers.shared, dtype=torch.long, device=every.device)
        prefix = every[:, :-1].gather(-1, shared.expand(every.shape[0], -1)[..., None]).squeeze(-1).sum(-1)
        logp = every[:, -1]
        return logp[:, choice] + prefix[:, None], logp
    logits = model.forward(batch.encoded).logits
    if batch.target_labels is None or batch.target_weight is None:
        raise ValueError("a scoring batch needs answer positions (decoder) or target labels (encoder-decoder)")
    scores = seq2seq_scores(logits, batch.target_labels, batch.target_weight, batch.num_labels)
    first = logits.view(scores.shape[0], batch.num_labels, *logits.shape[1:])[:, 0, 0]  # every label row: same start
    return scores, torch.log_softmax(first.float(), dim=-1)


def _sees_appended_answer(guidance: Any) -> bool:
    """Whether ``guidance`` would see an answer appended to the input: the instance token and the capsule summarise
    every input position, and a guidance placed relative to the input's end (``last``, ``middle``, an index) would
    sit after or among it. Prompts at ``first``/``start`` do not."""
    position = str(getattr(guidance.position, "value", "first"))
    return guidance.role in (Role.INSTANCE, Role.CAPSULE) or position not in ("first", "start")


def _guidances(model: Any) -> list[Any]:
    """The inserting guidances of ``model`` (none for a bare base)."""
    return model.guidance_list() if hasattr(model, "guidance_list") else []


def reads_appended_answer(model: Any) -> bool:
    """Whether some guidance of ``model`` would see an answer appended to the input (:func:`_sees_appended_answer`)."""
    return any(_sees_appended_answer(g) for g in _guidances(model))


def resolve_scoring(scoring: str, models: Iterable[Any], tokenizer: Any, task: Any) -> str:
    """The scoring a run uses: ``scoring`` itself unless ``auto``; ``auto`` is ``sum`` (the whole answer, as the
    harness's ``acc``), or ``first_token`` for the whole run when the task's answers need a row each (several tokens
    after their shared prefix) and some model's guidance would see the appended answer (:func:`reads_appended_answer`):
    the same scoring for every model of a run, and the label never leaks into its own score."""
    if scoring != AUTO:
        return scoring
    whole = verbalizer_ids(tokenizer, task, "sum")
    if not whole.one_pass and not whole.per_document and any(reads_appended_answer(m) for m in models):
        try:
            verbalizer_ids(tokenizer, task, "first_token")
        except UsageError:
            return "sum"  # labels one token cannot tell apart: sum scoring, and the guidance is refused
        return "first_token"
    return "sum"


def check_row_guidance(model: Scorable) -> None:
    """UsageError when a guidance would see the answer a label row appends to the input (:func:`_sees_appended_answer`)."""
    for g in _guidances(model):
        if _sees_appended_answer(g):
            raise UsageError(
                f"{g.config}: scoring answers of several tokens appends each answer to the input, which this guidance "
                "would read or follow; score the first distinguishing token (scoring='first_token') or give the task "
                "one-token answers"
            )


def _row_scores(model: Scorable, batch: ScoringBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Label rows (prompt + verbalizer): [B, L] summed verbalizer log-likelihoods and [B, V] answer distributions."""
    check_row_guidance(model)
    assert batch.cont_pos is not None and batch.cont_ids is not None and batch.cont_weight is not None
    assert batch.row_slot is not None and batch.answer_row is not None and batch.answer_col is not None
    logp = torch.log_softmax(logits_at(model, batch, batch.cont_pos).float(), dim=-1)  # [R, C, V]
    ids = batch.cont_ids.to(logp.device)
    token = logp.gather(-1, ids[..., None]).squeeze(-1) * batch.cont_weight.to(logp)  # [R, C]
    n = batch.labels.shape[0]
    flat = torch.full((n * batch.num_labels,), float("-inf"), device=logp.device, dtype=logp.dtype)
    scores = flat.scatter(0, batch.row_slot.to(logp.device), token.sum(-1)).view(n, batch.num_labels)
    answer = logp[batch.answer_row.to(logp.device), batch.answer_col.to(logp.device)]
    return scores, answer
