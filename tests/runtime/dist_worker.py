"""One rank of the 2-process gloo tests (started by test_distributed.py with RANK/WORLD_SIZE set)."""

from __future__ import annotations

import json
from pathlib import Path

from anchorlens.analyses import default_reducers
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.runtime import distributed as rt
from anchorlens.workflows.capture_run import run_capture
from tests.runtime.synth import SITES, feed, make_items

N_SYNTH = 10


def synthetic_plan(rank: int) -> list[tuple[list[int], tuple]]:
    """Uneven work: rank 0 sees examples 0-6 at site 0 only; rank 1 sees 7-9 at both sites."""
    return [(list(range(7)), SITES[:1])] if rank == 0 else [([7, 8, 9], SITES)]


def main(out: str, scratch: str) -> None:
    """Reduce synthetic events, check ``agree``, then run_capture into ``out``."""
    started = rt.init_if_needed()
    info = rt.dist_info()
    scratch_dir = Path(scratch)
    reducers = default_reducers()
    data = make_items(N_SYNTH, seed=3)
    for ids, sites in synthetic_plan(info.rank):
        feed(reducers, data, [ids[i : i + 3] for i in range(0, len(ids), 3)], sites)
    rt.all_reduce_reducers(reducers)
    for r in reducers:
        r.frame().to_parquet(scratch_dir / f"{r.name}-rank{info.rank}.parquet", index=False)

    def fail_on_rank1() -> None:
        if info.rank == 1:
            raise UsageError("rank 1 says no")

    try:
        rt.agree(fail_on_rank1)
        raised = None
    except UsageError as err:
        raised = str(err)
    (scratch_dir / f"agree-rank{info.rank}.json").write_text(json.dumps({"raised": raised, "info": info.__dict__}))

    run_capture("base", "tiny-llama", "rte", None, 12, Selection(), 4, Path(out), False, chunk_size=3, progress=False)
    rt.shutdown(started)
