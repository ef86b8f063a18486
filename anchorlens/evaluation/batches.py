"""Turn task examples into scoring batches: decoder inputs ending at the answer, or T5 targets per label."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from anchorlens.capture.collect import PromptRenderer
from anchorlens.errors import UsageError
from anchorlens.evaluation.rows import Row, append_tokens, fit_row, join_rows, split_rows, strip_trailing_specials
from anchorlens.evaluation.verbalizers import Verbalizers, common_prefix, document_choices
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
    Label rows (decoder, sum scoring of multi-token verbalizers or choices per document): ``encoded`` holds R rows,
    prompt + one verbalizer each; cont_pos, cont_ids, cont_weight: [R, C] the position whose next-token
    distribution scores each verbalizer token, the token, and 1/0 whether it counts; row_slot: [R] long, the row's
    place b * num_labels + l in the [B, L] scores (a document with fewer choices leaves -inf); answer_row,
    answer_col: [B] long, the row and column of cont_pos whose distribution is the example's answer distribution.
    norm_chars: [B, L] float, the characters acc_norm divides each label's score by.
    """

    encoded: Encoded
    labels: torch.Tensor
    num_labels: int
    answer_pos: torch.Tensor | None = None
    target_labels: torch.Tensor | None = None
    target_weight: torch.Tensor | None = None
    cont_pos: torch.Tensor | None = None
    cont_ids: torch.Tensor | None = None
    cont_weight: torch.Tensor | None = None
    row_slot: torch.Tensor | None = None
    answer_row: torch.Tensor | None = None
    answer_col: torch.Tensor | None = None
    norm_chars: torch.Tensor | None = None

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
            cont_pos=move(self.cont_pos),
            cont_ids=move(self.cont_ids),
            cont_weight=move(self.cont_weight),
            row_slot=move(self.row_slot),
            answer_row=move(self.answer_row),
            answer_col=move(self.answer_col),
            norm_chars=move(self.norm_chars),
        )

    @property
    def per_row(self) -> bool:
        """Whether every label is a row of its own (prompt + verbalizer)."""
        return self.cont_pos is not None


def label_indices(task: Task, examples: Sequence[dict]) -> torch.Tensor:
    """[B] long: each example's label index, -1 for unlabelled examples."""
    out = [-1 if ex.get("label") is None else task.label_index(ex["label"]) for ex in examples]
    return torch.tensor(out, dtype=torch.long)


def _fit(row: Row, max_length: int, reserved: int) -> Row:
    """``row`` cut to ``max_length - reserved`` positions (``reserved``: the answer tokens appended after it);
    UsageError (one line naming the least limit that fits) when its template text and specials alone are longer."""
    try:
        return fit_row(row, max_length - reserved)
    except ValueError:
        content = sum(1 for r in row.roles if r == int(Role.CONTENT))
        need = len(row.ids) - content + reserved
        raise UsageError(
            f"a max length of {max_length} tokens cannot hold an input: its template text, special tokens and answer "
            f"alone take {need}; pass --max-length {need} or more (every example's text is cut to fit)"
        ) from None


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
            row = _fit(row, max_length, len(shared))
        rows.append(append_tokens(row, shared, shared_tokens, Role.STRUCTURAL, "answer"))
    batch = join_rows(encoded, rows, *_pad(base))
    lengths = torch.tensor([len(r.ids) for r in rows], dtype=torch.long)
    if batch.padding_side == "left":
        answer_pos = torch.full_like(lengths, batch.input_ids.shape[1] - 1)
    else:
        answer_pos = lengths - 1
    return batch, answer_pos


def _label_rows(
    base: Base, encoded: Encoded, conts: Sequence[Sequence[tuple[int, ...]]], max_length: int | None
) -> dict[str, Any]:
    """Every example once per label: its input (cut to fit, trailing specials dropped) + that label's verbalizer
    ``conts[b][l]`` (role structural, field ``answer``); the :class:`ScoringBatch` label-row fields (``encoded``,
    cont_pos, cont_ids, cont_weight, row_slot, answer_row, answer_col)."""
    tok = base.tokenizer
    width = max(len(c) for c in conts)
    rows: list[Row] = []
    row_example: list[int] = []
    conts_flat: list[tuple[int, ...]] = []
    starts: list[int] = []
    slots: list[int] = []
    answer_row: list[int] = []
    answer_col: list[int] = []
    for b, row in enumerate(split_rows(encoded)):
        row = strip_trailing_specials(row)
        longest = max(len(c) for c in conts[b])
        if max_length is not None:
            row = _fit(row, max_length, longest)
        shared = len(common_prefix(conts[b]))
        answer_row.append(len(rows))
        answer_col.append(min(shared, len(conts[b][0]) - 1))
        for label, ids in enumerate(conts[b]):
            rows.append(
                append_tokens(row, list(ids), list(tok.convert_ids_to_tokens(list(ids))), Role.STRUCTURAL, "answer")
            )
            row_example.append(b)
            conts_flat.append(ids)
            starts.append(len(row.ids) - 1)  # the last input position predicts the verbalizer's first token
            slots.append(b * width + label)
    joined = join_rows(encoded, rows, *_pad(base))
    n_rows, span = len(rows), max(len(c) for c in conts_flat)
    pos = torch.zeros((n_rows, span), dtype=torch.long)
    cont_ids = torch.zeros((n_rows, span), dtype=torch.long)
    weight = torch.zeros((n_rows, span))
    for r, (cont, start) in enumerate(zip(conts_flat, starts)):
        shift = joined.input_ids.shape[1] - len(rows[r].ids) if joined.padding_side == "left" else 0
        n = len(cont)
        pos[r] = shift + start + torch.arange(span).clamp_max(n - 1)
        cont_ids[r, :n] = torch.tensor(cont, dtype=torch.long)
        weight[r, :n] = 1.0
    index = torch.tensor(row_example, dtype=torch.long)
    return {
        "encoded": replace(joined, example_ids=encoded.example_ids[index]),
        "cont_pos": pos,
        "cont_ids": cont_ids,
        "cont_weight": weight,
        "row_slot": torch.tensor(slots, dtype=torch.long),
        "answer_row": torch.tensor(answer_row, dtype=torch.long),
        "answer_col": torch.tensor(answer_col, dtype=torch.long),
    }


def _seq2seq_batch(
    base: Base, encoded: Encoded, verbalizers: Verbalizers, max_length: int | None
) -> tuple[Encoded, torch.Tensor, torch.Tensor]:
    """Each example repeated once per label with that label's verbalizer as decoder target.

    Returns the batch ([B*L, T] inputs, [B*L, S] target_ids starting with decoder_start) and
    target_labels, target_weight: [B*L, S].
    """
    rows = split_rows(encoded)
    if max_length is not None:
        rows = [_fit(r, max_length, 0) for r in rows]
    pad_id, pad_token = _pad(base)
    batch = join_rows(encoded, rows, pad_id, pad_token)
    n_labels = verbalizers.num_labels
    index = torch.arange(batch.batch_size).repeat_interleave(n_labels)
    width = max(len(t) for t in verbalizers.targets)
    start = int(base.config.decoder_start_token_id)
    dec_ids = torch.full((n_labels, width), pad_id, dtype=torch.long)
    gold = torch.full((n_labels, width), pad_id, dtype=torch.long)
    weight = torch.zeros((n_labels, width), dtype=torch.long)
    valid = torch.zeros((n_labels, width), dtype=torch.long)  # the target positions (weight: those scored)
    for label, target in enumerate(verbalizers.targets):
        n = len(target)
        gold[label, :n] = torch.tensor(target)
        dec_ids[label, 0] = start
        dec_ids[label, 1:n] = torch.tensor(target[:-1], dtype=torch.long)
        valid[label, :n] = 1
        weight[label, : n if verbalizers.scoring == "sum" else min(n, len(verbalizers.shared) + 1)] = 1
    dec_roles = torch.where(valid.bool(), int(Role.STRUCTURAL), int(Role.SPECIAL))
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
        target_mask=valid.repeat(reps, 1),
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
    if verbalizers.per_document:
        tokenized = [document_choices(base.tokenizer, task, ex) for ex in examples]
        conts = [ids for ids, _ in tokenized]
        width = max(len(c) for c in conts)
        norm = torch.ones((len(examples), width))  # a missing choice: -inf / 1
        for b, (_, chars) in enumerate(tokenized):
            norm[b, : len(chars)] = torch.tensor(chars, dtype=torch.float)
            if int(labels[b]) >= len(chars):
                raise ValueError(f"task {task.name}: label {int(labels[b])} but the document has {len(chars)} choices")
        if base.is_encoder_decoder:
            raise UsageError(
                f"task {task.name}: its choices vary per document, which only decoder-only bases score; "
                "use a decoder-only base"
            )
        return ScoringBatch(
            labels=labels, num_labels=width, norm_chars=norm, **_label_rows(base, encoded, conts, max_length)
        )
    norm = torch.tensor(
        [list(verbalizers.norm_chars or [1] * verbalizers.num_labels)] * len(examples), dtype=torch.float
    )
    if base.is_encoder_decoder:
        batch, gold, weight = _seq2seq_batch(base, encoded, verbalizers, max_length)
        return ScoringBatch(
            batch, labels, verbalizers.num_labels, target_labels=gold, target_weight=weight, norm_chars=norm
        )
    if not verbalizers.one_pass:
        conts = [list(verbalizers.plain)] * len(examples)
        fields = _label_rows(base, encoded, conts, max_length)
        return ScoringBatch(labels=labels, num_labels=verbalizers.num_labels, norm_chars=norm, **fields)
    batch, answer_pos = _decoder_batch(base, encoded, verbalizers, max_length)
    return ScoringBatch(batch, labels, verbalizers.num_labels, answer_pos=answer_pos, norm_chars=norm)


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
