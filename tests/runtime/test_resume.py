"""Resumable capture runs: kill and resume, refusal to overwrite, run-key checks."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.runtime.shards import Progress
from anchorlens.workflows import capture_run
from anchorlens.workflows.capture_run import run_capture
from tests.runtime.helpers import read_metrics, spawn
from tests.runtime.synth import feed, make_items

N, BATCH, CHUNK = 12, 2, 2


def capture(out: Path, force: bool = False, **kw) -> Path:
    """run_capture on tiny-llama with the test's fixed options."""
    kw.setdefault("n", N)
    return run_capture(
        "base",
        "tiny-llama",
        "rte",
        None,
        kw.pop("n"),
        Selection(),
        BATCH,
        out,
        force,
        chunk_size=CHUNK,
        progress=False,
        **kw,
    )


def snapshot(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``out`` with its bytes and mtime."""
    return {
        str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """A finished run with the test options."""
    return capture(tmp_path_factory.mktemp("full") / "out")


def count_computed(monkeypatch) -> list[int]:
    """Record the example ids run_capture actually forwards (not loaded from shards)."""
    seen: list[int] = []
    real = capture_run.stream_statistics

    def counting(model, batches, reducers, selection, progress=None, **kwargs):
        def tap():
            for b in batches:
                seen.extend(b.example_ids.tolist())
                yield b

        return real(model, tap(), reducers, selection, progress=progress, **kwargs)

    monkeypatch.setattr(capture_run, "stream_statistics", counting)
    return seen


def kill_after_chunk(out: Path, chunk: int, sig: int = signal.SIGKILL) -> None:
    """(Subprocess) capture into ``out`` and send ``sig`` to itself once ``chunk`` is saved."""

    def die(saved: int) -> None:
        if saved == chunk:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the signal arrives

    capture(out, on_chunk_saved=die)


def test_kill_and_resume_equals_uninterrupted(tmp_path, uninterrupted, monkeypatch):
    out = tmp_path / "out"
    proc = spawn(
        f"from tests.runtime.test_resume import kill_after_chunk; from pathlib import Path; "
        f"kill_after_chunk(Path({str(out)!r}), 1)"
    )
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    progress = out / ".progress"
    done = len(list(progress.glob("shard-*.json")))
    assert done == 2 and not (out / "manifest.json").exists()

    computed = count_computed(monkeypatch)
    capture(out)
    assert len(computed) == N - CHUNK * done and len(set(computed)) == len(computed)
    assert not progress.exists() and (out / "manifest.json").is_file()
    pd.testing.assert_frame_equal(read_metrics(out), read_metrics(uninterrupted), check_exact=True)


def test_resume_skips_saved_chunks_in_process(tmp_path, uninterrupted, monkeypatch):
    out = tmp_path / "out"
    key = json.loads((uninterrupted / "manifest.json").read_text())["run_key"]
    # a run interrupted during its third chunk leaves chunks 0 and 1 saved
    calls = {"n": 0}
    real = capture_run.stream_statistics

    def fail_third(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(capture_run, "stream_statistics", fail_third)
    with pytest.raises(KeyboardInterrupt):
        capture(out)
    assert sorted(Progress(out, key).finished()) == [0, 1]
    monkeypatch.setattr(capture_run, "stream_statistics", real)
    computed = count_computed(monkeypatch)
    capture(out)
    assert sorted(computed) == list(range(4, N))
    pd.testing.assert_frame_equal(read_metrics(out), read_metrics(uninterrupted), check_exact=True)


def test_finished_run_is_never_overwritten_without_force(uninterrupted):
    before = snapshot(uninterrupted)
    with pytest.raises(UsageError, match="already holds a finished run; pass --force"):
        capture(uninterrupted)
    with pytest.raises(UsageError, match="finished run"):
        capture(uninterrupted, n=4)
    assert snapshot(uninterrupted) == before


def test_force_replaces_a_finished_run_but_never_a_file_the_user_put_in_it(tmp_path):
    out = capture(tmp_path / "out", n=4)
    (out / "stray.txt").write_text("x")
    with pytest.raises(UsageError, match="holds stray.txt, which anchorlens did not write"):
        capture(out, force=True, n=6)
    assert (out / "stray.txt").read_text() == "x" and json.loads((out / "manifest.json").read_text())["n_examples"] == 4
    (out / "stray.txt").unlink()
    capture(out, force=True, n=6)
    assert set(pd.read_parquet(out / "metrics.parquet")["example"]) == set(range(6))
    assert json.loads((out / "manifest.json").read_text())["n_examples"] == 6


def test_progress_of_another_command_is_refused(tmp_path):
    out = tmp_path / "out"
    Progress(out, "someotherkey0000").start()
    before = snapshot(out)
    with pytest.raises(UsageError, match="different command"):
        capture(out)
    assert snapshot(out) == before
    capture(out, force=True)
    assert (out / "manifest.json").is_file()


def test_foreign_directory_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds no anchorlens run"):
        capture(out)
    with pytest.raises(UsageError, match="--force replaces only what anchorlens wrote"):
        capture(out, force=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        capture(tmp_path / "file")
    with pytest.raises(UsageError, match="at least 1"):
        run_capture("base", "tiny-llama", "rte", None, 4, Selection(), 0, tmp_path / "x", False)
    assert (out / "notes.txt").read_text() == "mine"


class _SyntheticRun:
    """A finished run of synthetic chunks (2 examples each) and the compute that records which examples it did."""

    def __init__(self, folder, n: int, seed: int) -> None:
        from anchorlens.runtime.shards import chunk_indices, concat_shards, run_chunks

        self.folder = folder
        self.data = make_items(n, seed=seed)
        self.chunks = list(enumerate(chunk_indices(n, 2)))
        self.computed: list[int] = []
        self.store = Progress(folder, "key-a")
        self.store.start()
        run_chunks(self.chunks, self.compute, self.store)
        concat_shards(self.store, self.chunks, folder / "want.parquet")

    def compute(self, ids):
        """The chunk's metric frame, its examples recorded."""
        from anchorlens.analyses import default_reducers, metrics_frame

        self.computed.extend(ids)
        reducers = default_reducers()
        feed(reducers, self.data, [list(ids)])
        return metrics_frame(reducers)

    def rerun(self) -> list[int]:
        """Run again; the examples computed this time."""
        from anchorlens.runtime.shards import run_chunks

        self.computed.clear()
        run_chunks(self.chunks, self.compute, self.store)
        return sorted(self.computed)

    def assert_concat_equals_first(self) -> None:
        """The concatenated shards equal the first run's, exactly."""
        from anchorlens.runtime.shards import concat_shards

        concat_shards(self.store, self.chunks, self.folder / "got.parquet")
        pd.testing.assert_frame_equal(
            pd.read_parquet(self.folder / "got.parquet"),
            pd.read_parquet(self.folder / "want.parquet"),
            check_exact=True,
        )


def test_damaged_shards_are_recomputed_not_trusted(tmp_path):
    from anchorlens.errors import DataError
    from anchorlens.runtime.shards import concat_shards, run_chunks

    run = _SyntheticRun(tmp_path, 10, seed=5)
    store, chunks = run.store, run.chunks
    st1, _ = store.paths(1)
    st1.write_bytes(st1.read_bytes()[:50])  # truncated rows
    store.paths(2)[1].write_text("{not json")  # garbage marker
    marker3 = store.paths(3)[1]
    marker3.write_text(marker3.read_text().replace("6", "9"))  # edited example ids
    other = Progress(tmp_path / "other", "key-b")
    other.start()
    run_chunks(chunks[4:], run.compute, other)
    os.replace(other.paths(4)[0], store.paths(4)[0])  # rows of another run under a valid marker
    with pytest.raises(DataError, match=r"chunk\(s\) 1, 2, 3, 4 of this run are missing or damaged.*rerun"):
        concat_shards(store, chunks, tmp_path / "got.parquet")
    assert run.rerun() == [2, 3, 4, 5, 6, 7, 8, 9]
    run.assert_concat_equals_first()
    assert run.rerun() == []  # the recomputed chunks were saved again


def test_a_shard_damaged_under_an_intact_footer_is_set_aside_and_recomputed(tmp_path):
    from anchorlens.errors import DataError
    from anchorlens.runtime.shards import concat_shards

    run = _SyntheticRun(tmp_path, 6, seed=7)
    shard = run.store.paths(1)[0]
    body = bytearray(shard.read_bytes())
    middle = len(body) // 2
    body[middle - 64 : middle + 64] = bytes(128)  # compressed rows zeroed, footer untouched
    shard.write_bytes(bytes(body))
    assert run.store.done(1, run.chunks[1][1])  # the footer alone cannot tell
    with pytest.raises(DataError, match=r"rows of chunk 1 are damaged.*rerun the same command"):
        concat_shards(run.store, run.chunks, tmp_path / "got.parquet")
    assert not (tmp_path / "got.parquet").exists()
    assert run.rerun() == list(run.chunks[1][1])  # only the damaged chunk again
    run.assert_concat_equals_first()


def test_a_shard_written_from_rows_equals_one_written_from_the_frame(tmp_path):
    from anchorlens.analyses import default_reducers, metrics_rows
    from anchorlens.analyses.rows import Rows

    reducers = default_reducers()
    feed(reducers, make_items(6, seed=3), [[0, 1, 2], [3, 4, 5]])
    rows = metrics_rows(reducers, anchors=("capsule", "first_token"))
    assert (rows.frame()["fixed"] != "").any() and rows.frame()["head"].isna().any()  # flags and head means travel
    store = Progress(tmp_path, "key")
    store.start()
    assert store.save(0, [0], rows) == store.save(1, [0], rows.frame()) == len(rows)
    assert store.save(2, [1], Rows.empty()) == store.save(3, [1], Rows.empty().frame()) == 0
    for a, b in ((0, 1), (2, 3)):
        assert store.read(a).equals(store.read(b))
        assert store.done(a, [0] if a == 0 else [1])
    pd.testing.assert_frame_equal(
        store.read(0).to_pandas(), rows.frame().astype({"head": "float64"}), check_dtype=False
    )
