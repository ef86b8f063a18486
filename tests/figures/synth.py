"""Synthetic StackMaps and metric frames for the figure tests (no model needed)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from anchorlens.capture.maps import AttentionMaps, StackMaps
from anchorlens.roles.kinds import Role

S, C, T, P, K, X = (
    int(Role.STRUCTURAL),
    int(Role.CONTENT),
    int(Role.SPECIAL),
    int(Role.SOFT_PROMPT),
    int(Role.CAPSULE),
    int(Role.INSTANCE),
)


def sequence(
    guidance: str = "soft_prompt", n_guidance: int = 4, premise: int = 6, hypothesis: int = 4, seed: int = 0
) -> tuple[list[int], list[str]]:
    """Roles and tokens of an RTE-like input with guidance positions in front."""
    rng = np.random.default_rng(seed)
    words = ["Ġthe", "Ġcat", "Ġsat", "Ġon", "Ġa", "Ġmat", "Ġ$5", "Ġdog", "Ġran", "\n", "▁rain", "Ġcosts"]
    roles, toks = [T], ["<s>"]
    if guidance == "capsule":
        roles, toks = [K] + roles, ["<capsule>"] + toks
    elif guidance:
        roles += [int(getattr(Role, guidance.upper()))] * n_guidance
        toks += [f"<{guidance}>"] * n_guidance
    for name, n in (("Premise", premise), ("Hypothesis", hypothesis)):
        roles += [S, S]
        toks += [name, ":"]
        roles += [C] * n
        toks += list(rng.choice(words, n))
    roles += [S, S, S]
    toks += ["Ċ", "Answer", ":"]
    return roles, toks


def stack_maps(
    roles: list[int], tokens: list[str], layers: int = 3, heads: int = 2, seed: int = 0, sink: float = 0.5
) -> StackMaps:
    """Causal attention with a sink at position 0 and extra mass on structural keys."""
    rng = np.random.default_rng(seed)
    n = len(roles)
    logits = rng.normal(size=(layers, heads, n, n))
    logits[..., 0] += np.log(sink * n + 1)
    logits[..., np.array(roles) == S] += 1.0
    logits = np.where(np.tril(np.ones((n, n), bool)), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    r = torch.tensor(roles, dtype=torch.long)
    return StackMaps(
        torch.tensor(probs, dtype=torch.float32),
        list(range(layers)),
        list(range(heads)),
        r,
        r.clone(),
        list(tokens),
        list(tokens),
    )


def attention_maps(example_id: int = 3, **kw) -> AttentionMaps:
    roles, toks = sequence(**{k: v for k, v in kw.items() if k in ("guidance", "n_guidance", "premise", "hypothesis")})
    return AttentionMaps(example_id, {"decoder": stack_maps(roles, toks, seed=example_id)})


CKPTS = ("prompt_tuning", "capt")
METRICS = ("anchor_mass", "first_token_mass", "entropy")


def tidy(n_examples: int = 6, layers: int = 4, heads: int = 3, seed: int = 0) -> pd.DataFrame:
    """Raw tidy rows: per checkpoint/example/layer/head (plus head <NA> means)."""
    rng = np.random.default_rng(seed)
    rows = []
    for ci, ck in enumerate(CKPTS):
        for ex in range(n_examples):
            for m in METRICS:
                for layer in range(layers):
                    vals = rng.normal(0.2 + 0.3 * ci + 0.05 * layer, 0.05, heads)
                    for h in range(heads):
                        rows.append((ck, ex, "decoder", layer, h, m, "content", "", float(vals[h])))
                    rows.append((ck, ex, "decoder", layer, None, m, "content", "", float(vals.mean())))
    cols = ["checkpoint", "example", "stack", "layer", "head", "metric", "query_role", "key_role", "value"]
    return pd.DataFrame(rows, columns=cols).astype({"head": "Int64"})


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """mean, ci_lo, ci_hi, n per (checkpoint, stack, layer, head, metric, roles)."""
    keys = ["checkpoint", "stack", "layer", "head", "metric", "query_role", "key_role"]
    g = df.groupby(keys, dropna=False)["value"].agg(["mean", "std", "count"]).reset_index()
    half = 2.0 * g["std"] / np.sqrt(g["count"])
    return g.assign(ci_lo=g["mean"] - half, ci_hi=g["mean"] + half, n=g["count"]).drop(columns=["std", "count"])


def compare(layers: int = 4, heads: int = 3, seed: int = 1) -> pd.DataFrame:
    """Shaped like analyses.compare.compare_frames: diff = checkpoint - baseline, q_value (BH)."""
    rng = np.random.default_rng(seed)
    rows = []
    for ck in ("capt", "instance"):
        for layer in range(layers):
            for h in range(heads):
                d = float(rng.normal(0, 0.2))
                q = 0.01 if abs(d) > 0.15 else 0.4
                rows.append(
                    (
                        ck,
                        "prompt_tuning",
                        "anchor_mass",
                        "decoder",
                        layer,
                        h,
                        "content",
                        "",
                        5,
                        d,
                        d - 0.1,
                        d + 0.1,
                        q / 2,
                        q,
                        q < 0.05,
                    )
                )
    return pd.DataFrame(
        rows,
        columns=[
            "checkpoint",
            "baseline",
            "metric",
            "stack",
            "layer",
            "head",
            "query_role",
            "key_role",
            "n",
            "diff",
            "ci_lo",
            "ci_hi",
            "p_value",
            "q_value",
            "significant",
        ],
    )


def role_flow(n_examples: int = 3, layers: int = 2) -> pd.DataFrame:
    rng = np.random.default_rng(2)
    roles = {
        "prompt_tuning": ["special", "structural", "content", "soft_prompt"],
        "capt": ["special", "structural", "content", "capsule"],
    }
    rows = []
    for ck, rs in roles.items():
        for ex in range(n_examples):
            for layer in range(layers):
                for qr in ("structural", "content"):
                    w = rng.dirichlet(np.ones(len(rs)))
                    for kr, v in zip(rs, w):
                        rows.append((ck, ex, "decoder", layer, -1, "role_flow", qr, kr, float(v)))
    return pd.DataFrame(
        rows, columns=["checkpoint", "example", "stack", "layer", "head", "metric", "query_role", "key_role", "value"]
    )


POSITIONS = ("last", "first", "7", "middle", "after_structural", "2")


def sweep(n_examples: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(3)
    rows, acc = [], []
    for ci, ck in enumerate(CKPTS):
        for pos in POSITIONS:
            a = 0.6 + 0.05 * ci + 0.02 * len(pos)
            acc.append((ck, pos, a))
            for ex in range(n_examples):
                for layer in range(3):
                    rows.append(
                        (
                            ck,
                            ex,
                            "decoder",
                            layer,
                            -1,
                            "anchor_mass",
                            "content",
                            "",
                            pos,
                            float(rng.normal(0.3 + 0.1 * ci + 0.02 * len(pos), 0.05)),
                        )
                    )
    df = pd.DataFrame(
        rows,
        columns=[
            "checkpoint",
            "example",
            "stack",
            "layer",
            "head",
            "metric",
            "query_role",
            "key_role",
            "position",
            "value",
        ],
    )
    return df, pd.DataFrame(acc, columns=["checkpoint", "position", "accuracy"])
