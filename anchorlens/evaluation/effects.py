"""Task effects, paired per example: accuracy, label NLL and KL(first checkpoint ‖ this one) at the answer.

Every checkpoint runs on the same batches, one batch at a time, so the first checkpoint's next-token
distribution is compared with each other's while the batch is at hand (memory stays flat in the number of
examples). A task with labels is scored as ``evaluate`` scores it (the summed log-likelihood of each label's whole
verbalizer, :func:`~anchorlens.evaluation.scoring.answer_scores`; the NLL is the gold verbalizer's, and KL is
taken at the position that predicts the first distinguishing verbalizer token); a task without labels (``--task text``) reports
the mean NLL of the text's own next tokens and the mean KL over those positions. :func:`effects_table` gives
per checkpoint the mean with a bootstrap CI, the paired difference to the first checkpoint with a bootstrap CI,
McNemar (accuracy) or sign-flip (NLL, KL) p-values, and Benjamini-Hochberg q-values across the comparison.
Accuracy takes score intervals instead of the bootstrap (Wilson for the mean, Newcombe for the paired difference,
with the count of examples that changed): a bootstrap of 0/1 outcomes reads "no example changed" at n = 8 as
Δ 0 [0, 0]. A difference within the rounding tolerance (:mod:`anchorlens.analyses.tolerance`) has no p or q.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from anchorlens.analyses.stats import (
    benjamini_hochberg,
    mcnemar_test,
    newcombe_paired_interval,
    paired_counts,
    paired_differences,
    paired_summary,
    rounding_only,
    summarize,
    wilson_interval,
)
from anchorlens.analyses.tolerance import kind_of, tolerance
from anchorlens.capture.collect import PromptRenderer, encode_batches
from anchorlens.evaluation.batches import length_sorted_batches, scoring_batch
from anchorlens.evaluation.scoring import answer_scores, resolve_scoring
from anchorlens.evaluation.verbalizers import verbalizer_ids
from anchorlens.heap import release_free_memory
from anchorlens.methods.guided import GuidedModel
from anchorlens.tasks import Task

EFFECT_COLUMNS = ("checkpoint", "example", "metric", "value")
# metric -> (label, paired test); ``kl`` is already paired (it is 0 for the first checkpoint)
EFFECTS = {
    "correct": ("accuracy", "mcnemar"),
    "nll": ("{kind} NLL", "sign-flip"),
    "kl": ("KL({first} ‖ ·)", "sign-flip"),
}
TEXT_BATCH = 2  # examples per forward when every position's distribution is kept ([B, T, V] float32)


def _kl(ref: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(p_ref ‖ p) over the last dimension of log-probabilities [..., V] -> [...] (float rounding below 0 is 0)."""
    return torch.nn.functional.kl_div(logp, ref, log_target=True, reduction="none").sum(-1).clamp_min(0.0)


@torch.no_grad()
def example_effects(
    models: Mapping[str, GuidedModel],
    examples: Sequence[dict],
    task: Task,
    prompts: PromptRenderer,
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    window: int | None = None,
    scoring: str = "auto",
) -> pd.DataFrame:
    """Long frame (checkpoint, example, metric, value): per example ``correct`` (1/0), ``nll`` and ``kl`` (vs the
    first of ``models``); unlabelled examples of a labelled task have NaN ``correct`` and ``nll``.

    ``window``: a labelled task's batches are cut from each run of ``window`` consecutive examples sorted by length
    (less padding; the same windows give the same batches, so ranks that split the examples at window bounds
    compute what one process does); None keeps the examples' order. Rows come in the examples' order either way.
    ``scoring``: ``sum``, ``first_token`` or ``auto`` (one for all models: :func:`~anchorlens.evaluation.scoring.resolve_scoring`).

    Every model must share one base (``compare`` loads them so). A task without labels gives ``nll`` (mean over
    the text's next tokens) and ``kl`` (mean over the same positions); an encoder-decoder base gives no rows
    for it.
    """
    if task.has_labels:
        records = _label_effects(models, examples, task, prompts, batch_size, max_length, window, scoring)
    else:
        records = _text_effects(models, examples, prompts, batch_size, max_length)
    return pd.DataFrame.from_records(records, columns=list(EFFECT_COLUMNS))


def _label_effects(
    models: Mapping[str, GuidedModel],
    examples: Sequence[dict],
    task: Task,
    prompts: PromptRenderer,
    batch_size: int,
    max_length: int | None,
    window: int | None = None,
    scoring: str = "auto",
) -> list[tuple]:
    first = next(iter(models.values()))
    base = first.base
    scoring = resolve_scoring(scoring, models.values(), base.tokenizer, task)
    verbalizers = verbalizer_ids(base.tokenizer, task, scoring)
    out: list[tuple] = []
    for span in _batches(examples, prompts, batch_size, window):
        part = [examples[i] for i in span]
        batch = scoring_batch(
            base, task, part, verbalizers, example_ids=list(span), max_length=max_length, prompts=prompts
        ).to(first.device)
        labels = batch.labels
        has = labels >= 0
        ref = None
        for name, model in models.items():
            scores, logp = answer_scores(model, batch, verbalizers)
            ref = logp if ref is None else ref
            nll = -scores.gather(1, labels.clamp_min(0)[:, None]).squeeze(1)
            correct = (scores.argmax(1) == labels).float()
            nan = torch.full_like(nll, float("nan"))
            values = {
                "correct": torch.where(has, correct, nan),
                "nll": torch.where(has, nll, nan),
                "kl": _kl(ref, logp),
            }
            for metric, v in values.items():
                out.extend((name, i, metric, float(x)) for i, x in zip(span, v.tolist()))
        del batch, scores, logp, ref
        release_free_memory()  # the batch's logits and activations: their pages back to the OS, not a growing heap
    order = {name: k for k, name in enumerate(models)}
    kinds = {metric: k for k, metric in enumerate(EFFECTS)}
    return sorted(out, key=lambda r: (r[1] // batch_size, order[r[0]], kinds[r[2]], r[1]))  # the examples' order


def _batches(examples: Sequence[dict], prompts: PromptRenderer, batch_size: int, window: int | None) -> list[list[int]]:
    """Example indices per batch (:func:`~anchorlens.evaluation.batches.length_sorted_batches`)."""
    lengths = [len(prompts.render(ex).text) for ex in examples] if window is not None else [0] * len(examples)
    return length_sorted_batches(lengths, batch_size, window)


def _text_effects(
    models: Mapping[str, GuidedModel],
    examples: Sequence[dict],
    prompts: PromptRenderer,
    batch_size: int,
    max_length: int | None,
) -> list[tuple]:
    first = next(iter(models.values()))
    if first.is_encoder_decoder:
        return []
    out: list[tuple] = []
    size = max(1, min(batch_size, TEXT_BATCH))
    for batch in encode_batches(first, examples, prompts, batch_size=size, max_length=max_length):
        batch = batch.to(first.device)
        valid = batch.attention_mask.bool()
        pairs = (valid[:, 1:] & valid[:, :-1]).float()  # positions t whose next token t+1 is text
        count = pairs.sum(1).clamp_min(1.0)
        targets = batch.input_ids[:, 1:]
        ids = batch.example_ids.tolist()
        ref = None
        for name, model in models.items():
            logp = torch.log_softmax(model.forward(batch).logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
            ref = logp if ref is None else ref
            nll = -(logp.gather(-1, targets[..., None]).squeeze(-1) * pairs).sum(1) / count
            kl = (_kl(ref, logp) * pairs).sum(1) / count
            for metric, v in (("nll", nll), ("kl", kl)):
                out.extend((name, int(i), metric, float(x)) for i, x in zip(ids, v.tolist()))
            del logp
    return out


def effects_table(
    frame: pd.DataFrame,
    checkpoints: Sequence[str],
    *,
    labelled: bool = True,
    n_boot: int = 2000,
    n_perm: int = 10000,
    seed: int = 0,
    dtype: object | None = None,
) -> pd.DataFrame:
    """One row per (metric, checkpoint): mean, ci_lo, ci_hi (bootstrap over examples), n; for every checkpoint
    after the first: diff, diff_lo, diff_hi (paired bootstrap of this − first; for KL, the KL itself), p_value
    (McNemar for accuracy, sign-flip otherwise), test and q_value (Benjamini-Hochberg across the whole table).

    Columns label and stack name the row as the headline table does: ``label NLL (answer token)`` for a task with
    labels (``labelled``), ``text NLL (every token)`` without.

    Accuracy: ci_lo/ci_hi is the Wilson score interval (``interval`` "wilson", else "bootstrap"), diff_lo/diff_hi
    Newcombe's paired score interval (``diff_interval`` "newcombe", else "bootstrap"), ``changed`` the examples
    right on one side only (NaN for other metrics). max_abs_diff: the largest per-example |Δ| (for KL, the largest
    KL); ``tolerance`` the metric's rounding tolerance in ``dtype`` (default float32); ``within_tolerance``: every
    |Δ| within it (for accuracy: no example changed), the difference is rounding and has no p_value or q_value (not
    in the BH family); ``constant``: every example has the same value (NLL, KL; range within the tolerance).
    """
    where = "answer token" if labelled else "every token"
    rows: list[dict] = []
    if frame.empty:
        return pd.DataFrame(rows)
    baseline = checkpoints[0]
    for metric, (label, test) in EFFECTS.items():
        sub = frame[frame["metric"] == metric]
        if sub.empty or not np.isfinite(sub["value"].to_numpy(np.float64)).any():
            continue
        means = summarize(sub, "checkpoint", n_boot=n_boot, seed=seed).set_index("checkpoint")
        first = sub[sub["checkpoint"] == baseline]
        name = label.format(kind="label" if labelled else "text", first=baseline)
        tol = tolerance(kind_of(metric), dtype)
        accuracy = kind_of(metric) == "accuracy"
        for ckpt in checkpoints:
            if ckpt not in means.index:
                continue
            m = means.loc[ckpt]
            values = sub.loc[sub["checkpoint"] == ckpt, "value"].to_numpy(np.float64)
            values = values[np.isfinite(values)]
            row = {
                "checkpoint": ckpt,
                "metric": metric,
                "label": name,
                "stack": where,
                "mean": m["mean"],
                "ci_lo": m["ci_lo"],
                "ci_hi": m["ci_hi"],
                "n": int(m["n"]),
                "diff": np.nan,
                "diff_lo": np.nan,
                "diff_hi": np.nan,
                "p_value": np.nan,
                "test": "",
                "interval": "bootstrap",
                "diff_interval": "",
                "changed": np.nan,
                "max_abs_diff": np.nan,
                "tolerance": tol,
                "within_tolerance": False,
                "constant": False,
            }
            if accuracy:
                row["ci_lo"], row["ci_hi"] = wilson_interval(int((values > 0.5).sum()), len(values))
                row["interval"] = "wilson"
            elif len(values):
                row["constant"] = bool(rounding_only(np.ptp(values), tol))
            if ckpt != baseline:
                row.update(_paired_row(sub[sub["checkpoint"] == ckpt], first, metric, test, tol, n_boot, n_perm, seed))
            rows.append(row)
    table = pd.DataFrame(rows)
    table["q_value"] = benjamini_hochberg(table["p_value"].to_numpy(np.float64))[1]
    return table


def _paired_row(
    mine: pd.DataFrame, first: pd.DataFrame, metric: str, test: str, tol: float, n_boot: int, n_perm: int, seed: int
) -> dict:
    """The paired columns of one checkpoint's row of :func:`effects_table` (empty when nothing pairs)."""
    diffs = mine.assign(diff=mine["value"]) if metric == "kl" else paired_differences(mine, first, on=["example"])
    paired = paired_summary(diffs, [], n_boot=n_boot, n_perm=n_perm, seed=seed, tolerance=tol)
    if not len(paired):
        return {}
    p = paired.iloc[0]
    row = {
        "diff": p["diff"],
        "diff_lo": p["ci_lo"],
        "diff_hi": p["ci_hi"],
        "p_value": p["p_value"],
        "test": test,
        "diff_interval": "bootstrap",
        "max_abs_diff": p["max_abs_diff"],
        "within_tolerance": bool(p["within_tolerance"]),
    }
    if metric == "correct":
        _, only_a, only_b, _ = paired_counts(diffs["value_a"], diffs["value_b"])
        row["diff_lo"], row["diff_hi"] = newcombe_paired_interval(diffs["value_a"], diffs["value_b"])
        row["diff_interval"], row["changed"] = "newcombe", only_a + only_b
        row["p_value"] = np.nan if row["within_tolerance"] else mcnemar_test(diffs["value_a"], diffs["value_b"])
    return row
