"""Run a declared reproduction plan (TOML: tasks x methods x seeds x budget) and write paper-style tables.

A plan (see ``examples/reproduce-*.toml``)::

    name = "smoke"
    base = "tiny-llama"
    [budget]            # training budget of every cell (train() options) and evaluation size
    steps = 4           # or epochs = 5
    lr = 0.3
    batch_size = 4
    n_train = 16        # examples used for training (omit: all)
    n_eval = 16         # examples evaluated (omit: all)
    [[tasks]]
    name = "rte"
    data = "../shared/data/fewglue/RTE/train.jsonl"   # omit: the bundled examples; relative to the plan
    eval_data = "..."                                 # omit: the bundled examples
    [run]
    methods = ["prompt:n=4", "capsule"]
    seeds = [0]
    ablations = ["capsule:fusion=add", "capsule:fusion=prepend"]
    ablation_seeds = [0]            # omit: every seed (ablations and sweeps cost as much as training)
    sweep_seeds = [0]               # seeds whose checkpoints the instance and position sweeps use
    instance_on = "prompt:n=4"      # Finding II: instance tokens added to the prompt-tuned checkpoint
    instance_k = [0, 1, 2]
    instance_positions = ["first", "last"]
    positions_on = "capsule"        # Finding III: where the trained anchor sits
    positions = ["first", "middle", "last"]

Every cell (one training run, one sweep) is cached by its spec: ``OUT/cells/<digest>.json`` holds
the spec and the result, and a rerun skips the cells it finds (``force`` reruns them). Training
runs live in ``OUT/runs/<digest>/``. Tables (csv + markdown) go to ``OUT/tables/`` and
``OUT/summary.md``: accuracy per task x method with bootstrap CIs over examples (paper Table 1's
shape), parameters / time / memory per step, the instance-token sweep on the prompt-tuned model
(Fig. 2's shape), the position sweep (Finding III) and the ablations.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import tomllib

from anchorlens.analyses.stats import bootstrap_ci
from anchorlens.atomic import write_json, write_text
from anchorlens.errors import DataError, UsageError
from anchorlens.rundir import OutClaim, claimed, manifest

CELL_VERSION = 1  # bump when a cell's result format changes (old caches are then recomputed)


@dataclass(frozen=True)
class TaskPlan:
    """One task of a plan: its name and optional train / eval jsonl files."""

    name: str
    data: str | None = None
    eval_data: str | None = None


@dataclass(frozen=True)
class Plan:
    """A parsed reproduction plan (module docstring)."""

    name: str
    base: str
    tasks: tuple[TaskPlan, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    budget: dict[str, Any] = field(default_factory=dict)
    ablations: tuple[str, ...] = ()
    ablation_seeds: tuple[int, ...] | None = None  # None: every seed
    sweep_seeds: tuple[int, ...] | None = None  # None: every seed
    instance_on: str | None = None
    instance_k: tuple[int, ...] = (0, 1, 2, 4)
    instance_positions: tuple[str, ...] = ("first", "last")
    positions_on: str | None = None
    positions: tuple[str, ...] = ("first", "middle", "last")


# budget keys handed to workflows.train as they are; the others shape the data (lengths, example counts)
_TRAIN_KEYS = (
    "steps",
    "epochs",
    "lr",
    "batch_size",
    "grad_accum",
    "optimizer",
    "eval_every",
    "patience",
    "weight_decay",
    "group_by_length",
)
_BUDGET_KEYS = {*_TRAIN_KEYS, "max_length", "n_train", "n_eval"}


def load_plan(path: str | Path, smoke: bool = False) -> Plan:
    """Read a plan TOML; ``smoke`` applies its ``[smoke]`` table over the plan (a CI-sized run)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"plan {path} not found; pass a TOML plan such as examples/reproduce-smoke.toml") from None
    except tomllib.TOMLDecodeError as err:
        raise DataError(f"plan {path} is not valid TOML ({err}); fix the file") from None
    if smoke:
        for key, value in raw.pop("smoke", {}).items():
            raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    run, budget = raw.get("run", {}), dict(raw.get("budget", {}))
    unknown = set(budget) - _BUDGET_KEYS
    if unknown:
        raise UsageError(f"plan {path}: unknown budget keys {sorted(unknown)}; known: {sorted(_BUDGET_KEYS)}")
    tasks = tuple(
        TaskPlan(t["name"], _resolve(path, t.get("data")), _resolve(path, t.get("eval_data")))
        for t in raw.get("tasks", [])
    )
    if not tasks or not run.get("methods"):
        raise UsageError(f"plan {path} needs [[tasks]] and run.methods; see examples/reproduce-smoke.toml")
    return Plan(
        name=str(raw.get("name", path.stem)),
        base=str(raw.get("base", "smollm2-135m")),
        tasks=tasks,
        methods=tuple(run["methods"]),
        seeds=tuple(int(s) for s in run.get("seeds", [0])),
        budget=budget,
        ablations=tuple(run.get("ablations", ())),
        ablation_seeds=_seeds(run, "ablation_seeds"),
        sweep_seeds=_seeds(run, "sweep_seeds"),
        instance_on=run.get("instance_on"),
        instance_k=tuple(int(k) for k in run.get("instance_k", (0, 1, 2, 4))),
        instance_positions=tuple(run.get("instance_positions", ("first", "last"))),
        positions_on=run.get("positions_on"),
        positions=tuple(run.get("positions", ("first", "middle", "last"))),
    )


def _seeds(run: dict, key: str) -> tuple[int, ...] | None:
    """``run[key]`` as a tuple of seeds, or None (every seed) when absent."""
    return None if key not in run else tuple(int(s) for s in run[key])


def _resolve(plan_path: Path, value: str | None) -> str | None:
    """A data path relative to the plan file (absolute paths pass; None stays None)."""
    if not value:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (plan_path.parent / p).resolve())


def cell_digest(spec: dict) -> str:
    """16 hex digits identifying a cell spec (sorted JSON, with the cell format version)."""
    text = json.dumps({"version": CELL_VERSION, **spec}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class CellCache:
    """``OUT/cells/<digest>.json``: one result per cell spec, reused unless ``force``."""

    def __init__(self, out: Path, force: bool = False) -> None:
        self.dir, self.force = out / "cells", force
        self.ran: list[str] = []
        self.reused: list[str] = []

    def get(self, spec: dict, compute: Callable[[str], dict]) -> dict:
        """The cached result of ``spec``, or ``compute(digest)``'s result, saved atomically."""
        digest = cell_digest(spec)
        path = self.dir / f"{digest}.json"
        if path.is_file() and not self.force:
            self.reused.append(digest)
            return json.loads(path.read_text())["result"]
        result = compute(digest)
        write_json(path, {"spec": spec, "result": result})
        self.ran.append(digest)
        return result


@dataclass
class Reproduction:
    """The tables of a reproduction run and which cells ran or came from the cache."""

    plan: Plan
    out: Path
    tables: dict[str, pd.DataFrame]
    ran: list[str]
    reused: list[str]


def _train_spec(plan: Plan, task: TaskPlan, method: str, seed: int) -> dict:
    return {
        "kind": "train",
        "base": plan.base,
        "task": task.name,
        "data": task.data,
        "eval_data": task.eval_data,
        "method": method,
        "seed": seed,
        "budget": plan.budget,
    }


def _train_cell(plan: Plan, task: TaskPlan, method: str, seed: int, out: Path, base) -> Callable[[str], dict]:
    """Compute function of one training cell: train, then evaluate the trained model per example."""
    from anchorlens.workflows.evaluate import evaluate
    from anchorlens.workflows.train import train

    b = plan.budget
    options = {k: b[k] for k in _TRAIN_KEYS if k in b}

    def compute(digest: str) -> dict:
        run_dir = out / "runs" / digest
        started = time.perf_counter()
        run = train(
            method,
            task.name,
            task.data,
            None,
            base=base,
            seed=seed,
            out=run_dir,
            force=True,
            n=b.get("n_train"),
            max_length=b.get("max_length", 512),
            progress=False,
            **options,
        )
        result = evaluate(run.guided, task.name, task.eval_data, b.get("n_eval"), batch_size=b.get("batch_size", 8))
        preds = result.predictions
        s = run.summary
        return {
            "accuracy": float(result.metrics["accuracy"]),
            "n": int(result.metrics["n"]),
            "idx": [int(i) for i in preds["idx"]],
            "correct": [bool(c) for c in preds["correct"]],
            "num_trainable": s.get("num_trainable"),
            "time_per_step_s": s.get("time_per_step_s"),
            "peak_rss_mb": s.get("peak_rss_mb"),
            "steps": s.get("steps"),
            "checkpoint": str(run_dir / "final"),
            "wall_s": round(time.perf_counter() - started, 2),
        }

    return compute


def _trained(plan: Plan, task: TaskPlan, method: str, seed: int, out: Path, base, cache: CellCache) -> dict:
    """A training cell's result, retraining when its checkpoint is gone."""
    spec = _train_spec(plan, task, method, seed)
    result = cache.get(spec, _train_cell(plan, task, method, seed, out, base))
    if not Path(result["checkpoint"]).is_dir():
        forced = CellCache(out, force=True)
        result = forced.get(spec, _train_cell(plan, task, method, seed, out, base))
        cache.ran += forced.ran
    return result


def accuracy_table(cells: list[dict]) -> pd.DataFrame:
    """task x method rows: accuracy averaged over seeds per example, with its bootstrap CI over examples."""
    rows = []
    for (task, method), group in pd.DataFrame(cells).groupby(["task", "method"], sort=False):
        per_example = pd.concat(
            [pd.Series(c, index=i, dtype=float) for c, i in zip(group["correct"], group["idx"])], axis=1
        ).mean(axis=1)
        mean, lo, hi = bootstrap_ci(per_example.to_numpy())
        rows.append(
            {
                "task": task,
                "method": method,
                "seeds": len(group),
                "n": len(per_example),
                "accuracy": mean,
                "ci_lo": lo,
                "ci_hi": hi,
                "seed_sd": float(np.std(group["accuracy"], ddof=1)) if len(group) > 1 else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def efficiency_table(cells: list[dict]) -> pd.DataFrame:
    """method rows: trainable parameters, time per step and peak RSS (means over tasks and seeds)."""
    df = pd.DataFrame(cells)
    return (
        df.groupby("method", sort=False)
        .agg(
            num_trainable=("num_trainable", "first"),
            time_per_step_s=("time_per_step_s", "mean"),
            peak_rss_mb=("peak_rss_mb", "max"),
        )
        .reset_index()
    )


def reproduce(
    plan: Plan | str | Path,
    out: str | Path | OutClaim,
    *,
    smoke: bool = False,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> Reproduction:
    """Run every cell of ``plan`` (cached cells are reused unless ``force``) and write the tables to ``out``.

    ``out`` is claimed for the whole run (a path, or the claim the CLI took); an existing reproduce run
    there is continued, anything anchorlens did not write is refused.
    """
    plan = plan if isinstance(plan, Plan) else load_plan(plan, smoke=smoke)
    with claimed(out, kind="reproduce", resume=True) as claim:
        claim.start_in_place({"plan": plan.name, "smoke": smoke})
        result = _reproduce(plan, claim.path, smoke, force, log or (lambda _msg: None))
        claim.finish_in_place(
            manifest("reproduce", plan=plan.name, smoke=smoke, cells=len(result.ran) + len(result.reused))
        )
    return result


def _reproduce(plan: Plan, out: Path, smoke: bool, force: bool, say: Callable[[str], None]) -> Reproduction:
    """The cells of ``plan`` and the tables, in the claimed ``out``."""
    from anchorlens.models.loading import load_base
    from anchorlens.workflows.positions import sweep_positions
    from anchorlens.workflows.sweeps import sweep_instance

    cache = CellCache(out, force)
    base = load_base(plan.base)
    b = plan.budget
    trained: list[dict] = []
    ablations: list[dict] = []
    instance: list[dict] = []
    positions: list[dict] = []
    for task in plan.tasks:
        for seed in plan.seeds:
            ablations_here = plan.ablations if plan.ablation_seeds is None or seed in plan.ablation_seeds else ()
            for method in dict.fromkeys(plan.methods + ablations_here):
                say(f"train {method} on {task.name} (seed {seed})")
                r = _trained(plan, task, method, seed, out, base, cache)
                row = {"task": task.name, "method": method, "seed": seed, **r}
                (trained if method in plan.methods else ablations).append(row)
                if ablations_here and method in plan.methods:
                    ablations.append(row)  # the methods on the ablation seeds: compared like for like
            if plan.sweep_seeds is not None and seed not in plan.sweep_seeds:
                continue
            if plan.instance_on:
                ckpt = _trained(plan, task, plan.instance_on, seed, out, base, cache)["checkpoint"]
                spec = {
                    "kind": "instance",
                    "of": _train_spec(plan, task, plan.instance_on, seed),
                    "k": plan.instance_k,
                    "positions": plan.instance_positions,
                }
                say(f"instance sweep on {plan.instance_on} ({task.name}, seed {seed})")

                def instance_cell(_digest: str, c: str = ckpt, t: TaskPlan = task) -> dict:
                    table = sweep_instance(
                        c,
                        t.name,
                        t.eval_data,
                        plan.instance_k,
                        plan.instance_positions,
                        base=base,
                        n=b.get("n_eval"),
                        batch_size=b.get("batch_size", 8),
                        anchors=True,
                    )
                    return {"rows": table.to_dict("records")}

                res = cache.get(spec, instance_cell)
                instance += [{"task": task.name, "seed": seed, "on": plan.instance_on, **r} for r in res["rows"]]
            if plan.positions_on:
                ckpt = _trained(plan, task, plan.positions_on, seed, out, base, cache)["checkpoint"]
                spec = {
                    "kind": "positions",
                    "of": _train_spec(plan, task, plan.positions_on, seed),
                    "positions": plan.positions,
                }
                say(f"position sweep of {plan.positions_on} ({task.name}, seed {seed})")

                def positions_cell(_digest: str, c: str = ckpt, t: TaskPlan = task) -> dict:
                    sweep = sweep_positions(
                        c,
                        plan.positions,
                        base=plan.base,
                        task=t.name,
                        data=t.eval_data,
                        n=b.get("n_eval"),
                        batch_size=b.get("batch_size", 8),
                    )
                    return {"rows": sweep.summary.to_dict("records")}

                res = cache.get(spec, positions_cell)
                positions += [{"task": task.name, "seed": seed, "on": plan.positions_on, **r} for r in res["rows"]]
    tables = {"accuracy": accuracy_table(trained), "efficiency": efficiency_table(trained)}
    if ablations:
        tables["ablations"] = accuracy_table(ablations)
    if instance:
        tables["instance_sweep"] = pd.DataFrame(instance)
    if positions:
        tables["positions"] = pd.DataFrame(positions)
    _write_tables(out, plan, tables, smoke)
    return Reproduction(plan, out, tables, cache.ran, cache.reused)


_CAPTIONS = {
    "accuracy": "Accuracy per task and method (paper Table 1's shape): per-example correctness averaged over seeds, "
    "mean with 95% seeded percentile bootstrap CI over examples.",
    "efficiency": "Trainable parameters, time per training step and peak RSS per method.",
    "ablations": "Ablations (capsule fusion add vs prepend, capsule count n) next to the plan's methods on the same "
    "seeds: accuracy as in the first table.",
    "instance_sweep": "Training-free instance tokens added to the prompt-tuned checkpoint (Finding II, Fig. 2's "
    "shape): accuracy per (k, position) with bootstrap CI; anchor metrics the causal mask fixes "
    "are NaN with the reason in `fixed`.",
    "positions": "Where the trained anchor sits (Finding III): attention input queries give it and its own "
    "attention to structural tokens, per position; n/a rows are fixed by the causal mask.",
}


def _markdown(df: pd.DataFrame) -> str:
    """A GitHub markdown table, numbers to 3 decimals."""
    cols = [c for c in df.columns if c not in ("idx", "correct", "spec")]
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df[cols].itertuples(index=False)]
    return "\n".join(lines)


def _write_tables(out: Path, plan: Plan, tables: dict[str, pd.DataFrame], smoke: bool) -> None:
    """tables/<name>.csv and .md, and summary.md with every table and its caption."""
    md = [
        f"# anchorlens reproduce: {plan.name}{' (smoke)' if smoke else ''}",
        "",
        f"Base {plan.base}; tasks {', '.join(t.name for t in plan.tasks)}; methods {', '.join(plan.methods)}; "
        f"seeds {', '.join(map(str, plan.seeds))}"
        + (f" (ablations: {', '.join(map(str, plan.ablation_seeds))})" if plan.ablation_seeds is not None else "")
        + (f" (sweeps: {', '.join(map(str, plan.sweep_seeds))})" if plan.sweep_seeds is not None else "")
        + f"; budget {json.dumps(plan.budget, sort_keys=True)}.",
        "",
    ]
    for name, df in tables.items():
        write_text(
            out / "tables" / f"{name}.csv", df.drop(columns=["idx", "correct"], errors="ignore").to_csv(index=False)
        )
        write_text(out / "tables" / f"{name}.md", _markdown(df) + "\n")
        md += [f"## {name}", "", _CAPTIONS.get(name, ""), "", _markdown(df), ""]
    write_text(out / "summary.md", "\n".join(md))
