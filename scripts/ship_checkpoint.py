"""Copy a finished ``anchorlens train`` run into the package as a shipped checkpoint ``NAME@TASK``.

    python scripts/ship_checkpoint.py RUN_DIR NAME@TASK --validation FILE [--batch-size 32]

The run's ``final/`` checkpoint is evaluated on ``--validation`` (every row) and copied to
``anchorlens/methods/trained/<task>/<name>/`` with its ``training`` block extended by what a reader needs:
the command that trained it (from the run's manifest), the digests of the training and held-out examples,
the sha256 of the data files and the validation accuracy with its Wilson interval. The machine-specific
path of the base's cache is dropped from the provenance. Maintainers run this; users load the result
with ``--ckpt NAME@TASK``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _command(manifest: dict) -> str:
    """The training command as a shell line (``anchorlens train ...``), from the manifest's argv."""
    argv = manifest["command"]
    argv = ast.literal_eval(argv) if isinstance(argv, str) else list(argv)
    return shlex.join(["anchorlens", *argv[1:]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("address")
    parser.add_argument("--validation", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    import anchorlens
    from anchorlens.analyses.stats import wilson_interval
    from anchorlens.methods.checkpoints import META_FILE, TENSOR_FILE, read_meta, validate_meta
    from anchorlens.methods.shipped import SHIPPED_NAME, shipped_root

    match = SHIPPED_NAME.fullmatch(args.address)
    if match is None:
        parser.error(f"address {args.address!r} must be NAME@TASK, e.g. capsule@sst2")
    final = args.run / "final"
    meta = read_meta(final)
    manifest = json.loads((args.run / "manifest.json").read_text())
    if meta.get("task") != match["task"]:
        parser.error(f"{final} was trained on task {meta.get('task')!r}, not {match['task']!r}")

    result = anchorlens.evaluate(str(final), task=match["task"], data=str(args.validation), batch_size=args.batch_size)
    correct = int(result.predictions["correct"].sum())
    n = len(result.predictions)
    low, high = wilson_interval(correct, n)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    data_file = Path(manifest["data"])
    training = {
        **meta.get("training", {}),
        "command": _command(manifest),
        "anchorlens_commit": head.stdout.strip() or None,
        "task_sha256": manifest.get("task_source", {}).get("sha256"),
        "data_file": f"glue/SST-2/{data_file.name}" if match["task"] == "sst2" else data_file.name,
        "data_sha256": _sha256(data_file),
        "data_digest": manifest.get("data_digest"),
        "eval_digest": manifest.get("eval_digest"),
        "validation": {
            "data_file": f"glue/SST-2/{args.validation.name}" if match["task"] == "sst2" else args.validation.name,
            "data_sha256": _sha256(args.validation),
            "n": n,
            "correct": correct,
            "accuracy": correct / n,
            "interval": [low, high],
            "interval_method": "wilson 95%",
            "label_nll": float(result.metrics["label_nll"]),
        },
    }
    training.pop("data", None)  # a path on the training machine; data_file and data_sha256 name the file
    base = dict(meta["base"])
    base["provenance"] = {**base.get("provenance", {}), "path": None}
    shipped = {**meta, "base": base, "training": training}
    validate_meta(shipped, final / META_FILE)

    dest = shipped_root() / match["task"] / match["name"]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copyfile(final / TENSOR_FILE, dest / TENSOR_FILE)
    (dest / META_FILE).write_text(json.dumps(shipped, indent=2) + "\n")
    print(f"{args.address}: validation accuracy {correct / n:.3f} [{low:.3f}, {high:.3f}] (n={n}) -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
