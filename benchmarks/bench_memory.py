"""Peak memory of ``anchorlens capture`` and ``compare`` against the number of examples: flat in N, side by side.

    python benchmarks/bench_memory.py                          # SmolLM2, real RTE rows, N = 64, 512, 2490
    python benchmarks/bench_memory.py --n 64,512 --base tiny-llama
    python benchmarks/bench_memory.py --commands compare       # only compare
    python benchmarks/bench_memory.py --n "" --corpus 200,2000 --base tiny-llama   # corpus against corpus
    python benchmarks/bench_memory.py --corpus 2000            # also: a 2,000-document parquet corpus, --task text

Each N runs ``capture --ckpt instance`` and ``compare --ckpt base --ckpt instance --no-figures`` in their own
processes (batch 8 unless ``--batch-size``, chunks of 32 examples); the peak RSS of each process (``wait4``'s
ru_maxrss) and its wall time are printed with the ratio to the smallest N of the same command, and for compare
the seconds of its phases from the run's manifest (capture of both checkpoints, task effects, statistics: paired
tests, bootstrap CIs and FDR read back from disk) (corpus rows,
``capture --ckpt base --task text``: to the smallest corpus). Real rows come from ``../shared/data/superglue/RTE/train.jsonl`` (the bundled 24 examples, cycled,
when it is absent). The corpus is made of those rows' premises joined into documents of 3-12 sentences.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RTE = REPO.parent / "shared" / "data" / "superglue" / "RTE" / "train.jsonl"


def _rows() -> list[dict]:
    """Real RTE rows (or the bundled ones)."""
    path = RTE if RTE.is_file() else REPO / "anchorlens" / "tasks" / "examples" / "rte.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _data(folder: Path, n: int) -> Path:
    """A jsonl of ``n`` RTE rows (cycled when there are fewer)."""
    rows = _rows()
    path = folder / f"rte-{n}.jsonl"
    path.write_text("".join(json.dumps({**rows[i % len(rows)], "idx": i}) + "\n" for i in range(n)))
    return path


def _corpus(folder: Path, docs: int) -> Path:
    """A parquet corpus of ``docs`` documents built from RTE premises (3-12 sentences each)."""
    import pandas as pd

    premises = [r["premise"] for r in _rows()]
    texts, k = [], 0
    for d in range(docs):
        size = 3 + d % 10
        texts.append("\n".join(premises[(k + j) % len(premises)] for j in range(size)))
        k += size
    path = folder / f"corpus-{docs}.parquet"
    pd.DataFrame({"text": texts}).to_parquet(path)
    return path


def _run(args: list[str]) -> tuple[float, float]:
    """(peak RSS MiB, wall s) of one ``anchorlens`` process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "anchorlens", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"capture failed: {err.strip().splitlines()[-1] if err.strip() else status}")
    return usage.ru_maxrss / 1024, wall


def main() -> int:
    """Run the sizes and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="64,512,2490", help="numbers of examples")
    ap.add_argument("--base", default="smollm2-135m")
    ap.add_argument("--commands", default="capture,compare", help="comma-separated: capture, compare")
    ap.add_argument(
        "--corpus", default="", help="also capture corpora of these many documents (--task text), e.g. 200,2000"
    )
    ap.add_argument("--max-length", type=int, default=256, help="window of the corpus runs")
    ap.add_argument("--batch-size", type=int, default=8, help="examples (windows) per forward pass, every run")
    opts = ap.parse_args()
    sizes = [int(v) for v in opts.n.split(",") if v.strip()]
    commands = [c.strip() for c in opts.commands.split(",") if c.strip()]
    corpora = [int(v) for v in opts.corpus.split(",") if v.strip()]
    batch = str(opts.batch_size)
    print(f"on {opts.base}: capture --ckpt instance / compare --ckpt base --ckpt instance --no-figures; batch {batch},")
    print("chunks of 32 examples, one process per row")
    print(
        f"{'run':>22}  {'peak RSS MiB':>12}  {'x smallest':>10}  {'wall s':>8}  {'s/example':>9}  "
        f"{'capture s':>9}  {'effects s':>9}  {'stats s':>8}"
    )
    with tempfile.TemporaryDirectory(prefix="anchorlens-bench-memory-") as tmp:
        folder = Path(tmp)
        first: dict[str, float] = {}
        for n in sizes:
            data = _data(folder, n)
            for command in commands:
                out = folder / f"out-{command}-{n}"
                ckpts = ["--ckpt", "instance"] if command == "capture" else ["--ckpt", "base", "--ckpt", "instance"]
                extra = ["--no-progress"] if command == "capture" else ["--no-figures"]
                rss, wall = _run([command, *ckpts, "--base", opts.base, "--data", str(data), "--out", str(out),
                                  "--batch-size", batch, *extra])  # fmt: skip
                first.setdefault(command, rss)
                label = f"{command} N={n:,}"
                phases = ""
                if command == "compare":
                    sec = json.loads((out / "manifest.json").read_text())["seconds"]
                    phases = f"  {sec['capture']:>9.1f}  {sec['task_effects']:>9.1f}  {sec['statistics']:>8.1f}"
                print(
                    f"{label:>22}  {rss:>12,.0f}  {rss / first[command]:>10.3f}  {wall:>8.1f}  {wall / n:>9.3f}{phases}",
                    flush=True,
                )
                shutil.rmtree(out, ignore_errors=True)
        smallest = None
        for docs in corpora:
            corpus = _corpus(folder, docs)
            out = folder / f"out-corpus-{docs}"
            rss, wall = _run(["capture", "--ckpt", "base", "--base", opts.base, "--task", "text", "--data", str(corpus),
                              "--max-length", str(opts.max_length), "--out", str(out), "--no-progress",
                              "--batch-size", batch])  # fmt: skip
            smallest = smallest or rss
            windows = json.loads((out / "manifest.json").read_text())["n_examples"]
            label = f"corpus {docs:,} docs"
            print(
                f"{label:>22}  {rss:>12,.0f}  {rss / smallest:>10.3f}  {wall:>8.1f}  ({windows:,} windows)", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
