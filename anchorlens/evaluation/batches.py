"""Turn task examples into scoring batches: decoder inputs ending at the answer, or T5 targets per label."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from anchorlens.capture.collect import PromptRenderer
from anchorlens.evaluation.rows import append_tokens, fit_row, join_rows, split_rows, strip_trailing_specials
from anchorlens.evaluation.verbalizers import Verbalizers
from anchorlens.models.base import Base
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import Role
from anchorlens.tasks import Task

DEFAULT_MAX_LENGTH = 384  # input tokens; leaves room for 100 prompt tokens in a 512-position model


@dataclass
class ScoringBatch:
    """Model inputs plus where to read each label's score.

    encoded: the batch to run ([B, T] inputs; encoder-decoder: [B*L, T] inputs, [B*L, S] targets,
    example b's label l in row b*L + l). answer_pos: [B] long, the last input position (decoder).
    target_labels, target_weight: [B*L, S] the target token to score at each decoder position and
    1/0 whether it counts (encoder-decoder). labels: [B] long label indices, -1 when unlabelled.
    """

    encoded: Encoded
    labels: torch.Tensor
    num_labels: int
    answer_pos: torch.Tensor | None = None
    target_labels: torch.Tensor | None = None
    target_weight: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> ScoringBatch:
        """Copy with every tensor on ``device``."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(
            self,
            encoded=self.encoded.to(device),
            labels=self.labels.to(device),
            answer_pos=move(self.answer_pos),
            target_labels=move(self.target_labels),
            target_weight=move(self.target_weight),
        )


def label_indices(task: Task, examples: Sequence[dict]) -> torch.Tensor:
    """[B] long: each example's label index, -1 for unlabelled examples."""
    out = [-1 if ex.get("label") is None else task.label_index(ex["label"]) for ex in examples]
    return torch.tensor(out, dtype=torch.long)


def _pad(base: Base) -> tuple[int, str]:
    """The tokenizer's pad id and token."""
    tok = base.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return int(pad_id), tok.convert_ids_to_tokens(int(pad_id))


def _decoder_batch(
    base: Base, encoded: Encoded, verbalizers: Verbalizers, max_length: int | None
) -> tuple[Encoded, torch.Tensor]:
    """Inputs cut to fit, trailing specials dropped, the verbalizers' shared prefix appended; [B] answer positions."""
    tok = base.tokenizer
    shared = list(verbalizers.shared)
    shared_tokens = list(tok.convert_ids_to_tokens(shared)) if shared else []
    rows = []
    for row in split_rows(encoded):
        row = strip_trailing_specials(row)
        if max_length is not None:
            row = fit_row(row, max_length - len(shared))
        rows.append(append_tokens(row, shared, shared_tokens, Role.STRUCTURAL, "answer"))
    batch = join_rows(encoded, rows, *_pad(base))
    lengths = torch.tensor([len(r.ids) for r in rows], dtype=torch.long)
    if batch.padding_side == "left":
        answer_pos = torch.full_like(lengths, batch.input_ids.shape[1] - 1)
    else:
        answer_pos = lengths - 1
    return batch, answer_pos


def _seq2seq_batch(
    base: Base, encoded: Encoded, verbalizers: Verbalizers, max_length: int | None
) -> tuple[Encoded, torch.Tensor, torch.Tensor]:
    """Each example repeated once per label with that label's verbalizer as decoder target.

    Returns the batch ([B*L, T] inputs, [B*L, S] target_ids starting with decoder_start) and
    target_labels, target_weight: [B*L, S].
    """
    rows = split_rows(encoded)
    if max_length is not None:
        rows = [fit_row(r, max_length) for r in rows]
    pad_id, pad_token = _pad(base)
    batch = join_rows(encoded, rows, pad_id, pad_token)
    n_labels = verbalizers.num_labels
    index = torch.arange(batch.batch_size).repeat_interleave(n_labels)
    width = max(len(t) for t in verbalizers.targets)
    start = int(base.config.decoder_start_token_id)
    dec_ids = torch.full((n_labels, width), pad_id, dtype=torch.long)
    gold = torch.full((n_labels, width), pad_id, dtype=torch.long)
    weight = torch.zeros((n_labels, width), dtype=torch.long)
    for label, target in enumerate(verbalizers.targets):
        n = len(target)
        gold[label, :n] = torch.tensor(target)
        dec_ids[label, 0] = start
        dec_ids[label, 1:n] = torch.tensor(target[:-1], dtype=torch.long)
        weight[label, :n] = 1
    dec_roles = torch.where(weight.bool(), int(Role.STRUCTURAL), int(Role.SPECIAL))
    dec_roles[:, 0] = int(Role.SPECIAL)
    reps = batch.batch_size
    repeated = replace(
        batch,
        input_ids=batch.input_ids[index],
        attention_mask=batch.attention_mask[index],
        roles=batch.roles[index],
        fields=[batch.fields[i] for i in index.tolist()],
        tokens=[batch.tokens[i] for i in index.tolist()],
        example_ids=batch.example_ids[index],
        target_ids=dec_ids.repeat(reps, 1),
        target_mask=weight.repeat(reps, 1),
        target_roles=dec_roles.repeat(reps, 1),
    )
    return repeated, gold.repeat(reps, 1), weight.repeat(reps, 1)


def scoring_batch(
    base: Base,
    task: Task,
    examples: Sequence[dict],
    verbalizers: Verbalizers,
    example_ids: Sequence[int] | None = None,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    prompts: PromptRenderer | None = None,
) -> ScoringBatch:
    """Render (``prompts``: the task's prompts with chat and demonstrations; default its template), encode and shape
    ``examples`` for label scoring (inputs longer than ``max_length`` lose field tail tokens)."""
    renderer: PromptRenderer = task.template if prompts is None else prompts
    rendered = [renderer.render(ex) for ex in examples]
    encoded = base.encode(rendered, example_ids=example_ids, scheme=renderer.scheme)
    labels = label_indices(task, examples)
    if base.is_encoder_decoder:
        batch, gold, weight = _seq2seq_batch(base, encoded, verbalizers, max_length)
        return ScoringBatch(batch, labels, verbalizers.num_labels, target_labels=gold, target_weight=weight)
    batch, answer_pos = _decoder_batch(base, encoded, verbalizers, max_length)
    return ScoringBatch(batch, labels, verbalizers.num_labels, answer_pos=answer_pos)


def length_sorted_batches(lengths: Sequence[int], batch_size: int, window: int | None) -> list[list[int]]:
    """Example indices per batch: in order (``window`` None), or each run of ``window`` consecutive examples sorted
    longest first (``lengths``: any size measure, e.g. rendered characters), so batches carry little padding."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    n = len(lengths)
    step = n if window is None else max(1, window)
    out: list[list[int]] = []
    for start in range(0, n, max(1, step)):
        ids = list(range(start, min(start + step, n)))
        if window is not None:
            ids.sort(key=lambda i: lengths[i], reverse=True)
        out += [ids[k : k + batch_size] for k in range(0, len(ids), batch_size)]
    return out
