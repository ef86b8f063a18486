"""Label scores: verbalizer log-likelihoods from a model's logits (differentiable, used for training too)."""

from __future__ import annotations

import torch

from anchorlens.evaluation.batches import ScoringBatch
from anchorlens.evaluation.model import Scorable
from anchorlens.evaluation.verbalizers import Verbalizers


def seq2seq_scores(logits: torch.Tensor, gold: torch.Tensor, weight: torch.Tensor, num_labels: int) -> torch.Tensor:
    """[B, L] summed target log-likelihoods from logits [B*L, S, V], gold and weight [B*L, S]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    token = logp.gather(-1, gold.to(logits.device).unsqueeze(-1)).squeeze(-1)  # [B*L, S]
    total = (token * weight.to(token)).sum(-1)
    return total.view(-1, num_labels)


def label_scores(model: Scorable, batch: ScoringBatch, verbalizers: Verbalizers) -> torch.Tensor:
    """[B, L] score of every label for every example (higher is more likely); batch on the model's device."""
    return answer_scores(model, batch, verbalizers)[0]


def answer_scores(model: Scorable, batch: ScoringBatch, verbalizers: Verbalizers) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, L] label scores as :func:`label_scores`, [B, V] float32 log-probabilities of the next token at the
    answer position): decoder-only, the last input position; encoder-decoder, the first target position."""
    if batch.answer_pos is not None:  # the LM head only at the answer positions
        logp = torch.log_softmax(model.next_token_logits(batch.encoded, batch.answer_pos).float(), dim=-1)
        choice = torch.tensor(verbalizers.choice, dtype=torch.long, device=logp.device)
        return logp[:, choice], logp
    logits = model.forward(batch.encoded).logits
    if batch.target_labels is None or batch.target_weight is None:
        raise ValueError("a scoring batch needs answer positions (decoder) or target labels (encoder-decoder)")
    scores = seq2seq_scores(logits, batch.target_labels, batch.target_weight, batch.num_labels)
    first = logits.view(scores.shape[0], batch.num_labels, *logits.shape[1:])[:, 0, 0]  # every label row: same start
    return scores, torch.log_softmax(first.float(), dim=-1)
