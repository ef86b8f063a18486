"""A comparison's results built chunk by chunk: per-example rows go to disk, memory holds bounded summaries.

``compare`` feeds each checkpoint's metric rows one chunk of examples at a time into :class:`Summaries`:

- every row is appended to ``metrics.parquet`` (one row group per chunk, a ``checkpoint`` column), the file
  users read; nothing of a finished chunk stays in memory;
- the paired metrics' values (per head, and averaged over heads) go to :class:`~anchorlens.analyses.spill.CellSpill`
  files, read back one block of cells at a time for the paired tests, bootstrap CIs and BH of ``paired.csv``;
- the headline's per-example values (a few numbers per example) stay in memory for ``headline.csv``;
- with the evidence reducers on, :class:`~anchorlens.analyses.evidence_table.EvidenceSummaries`: per-example weight
  vs norm mass, sink rates and massive activations spilled to disk for ``evidence.csv`` (never in ``paired.csv``);
- :class:`FigureSummaries`: each cell's mean over examples (head grids, role flow, attention budget, the demo's
  per-layer view) and the layer curves' bootstrap summaries, whatever the number of examples.

The numbers equal the in-memory functions over the whole frame (``compare_frames``, ``headline_table``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses import average_heads
from anchorlens.analyses.compare import HeadlineRows, compare_spill, headline_from_rows, paired_cell
from anchorlens.analyses.evidence_table import EvidenceSummaries
from anchorlens.analyses.frames import ROW_KEYS, arrow_schema, conform
from anchorlens.analyses.headline import GUIDANCE_MASS, INPUT_ENTROPY, SINK_MASS, STRUCTURAL_MASS, HeadlineMetric
from anchorlens.analyses.spill import CellMeans, CellSpill
from anchorlens.analyses.stats import summarize
from anchorlens.heap import release_free_memory
from anchorlens.workflows.metrics_file import read_metrics

# metrics compared per layer and head (paired.csv); the headline rows come from analyses.headline
PAIRED_METRICS = (
    "decomposition",
    "guidance_absorption",
    "entropy",
    "island_score",
    "anchor_mass",
    "anchor_structural",
    "field_flow",  # role flow to and from the template's fields (content:<field>), BH within its own family
)
CURVES = (SINK_MASS, GUIDANCE_MASS, STRUCTURAL_MASS, INPUT_ENTROPY)  # the layer-curves figure
CELL = paired_cell(ROW_KEYS)  # metric, stack, layer, head, query_role, key_role
CHUNKED_KEY = b"anchorlens.row_groups_are_chunks"


def curve_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Head-averaged rows of each curve's headline metric, the metric column set to its label."""
    return average_heads(pd.concat([m.rows(df).assign(metric=m.label) for m in CURVES], ignore_index=True))


def _reason(err: OSError) -> str:
    """The system's reason of an OSError (pyarrow's message ends with it: '... Detail: [errno 27] File too large')."""
    if err.errno is not None:
        import os

        return os.strerror(err.errno)
    return str(err).rsplit("] ", 1)[-1]


class MetricsWriter:
    """``metrics.parquet`` written as chunks come: one row group per chunk, the columns of the first chunk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: Any = None
        self._columns: list[str] = []
        self.rows = 0

    def write(self, frame: pd.DataFrame, checkpoint: str) -> None:
        """Append one checkpoint's chunk of tidy rows (and ``fixed``), with a ``checkpoint`` column."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if frame.empty:
            return
        if self._writer is None:
            self._columns = [c for c in frame.columns if c != "checkpoint"]
        elif list(frame.columns) != self._columns:
            frame = frame.reindex(columns=self._columns)
        table = pa.Table.from_pandas(frame, schema=arrow_schema(self._columns), preserve_index=False)
        table = table.append_column(
            pa.field("checkpoint", pa.string()), pa.array([checkpoint] * len(frame), pa.string())
        )
        try:
            if self._writer is None:
                schema = table.schema.with_metadata({**(table.schema.metadata or {}), CHUNKED_KEY: b"1"})
                self._writer = pq.ParquetWriter(self.path, schema, compression="zstd")
            table = table.replace_schema_metadata(self._writer.schema.metadata)
            self._writer.write_table(table)
        except OSError as err:  # a full disk: one line naming this file, and no writer left to fail again on exit
            self.abandon()
            raise OSError(err.errno, _reason(err), str(self.path)) from None
        self.rows += table.num_rows

    def abandon(self) -> None:
        """Drop a writer whose file cannot be written (its own close would raise again when collected)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError:
                pass
            self._writer.is_open = False
            self._writer = None

    def close(self) -> None:
        """Finish the file (an empty tidy file when no row came)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        elif not self.path.exists():
            from anchorlens.analyses.frames import empty_frame

            empty_frame().assign(checkpoint=pd.Series(dtype="str")).to_parquet(self.path, index=False)


class FigureSummaries:
    """What the figures and reports read, bounded by layers x heads x roles: every cell's mean over examples
    (``means``; head-averaged role-flow rows added) and the layer curves' summaries (mean, bootstrap CI, n)."""

    def __init__(self, folder: Path, n_examples: int) -> None:
        self.cells: dict[str, CellMeans] = {}  # per checkpoint
        self.flow: dict[str, CellMeans] = {}
        self.curves = CellSpill(folder / "curves", CELL, n_examples)

    def add(self, checkpoint: str, df: pd.DataFrame) -> None:
        """Fold one checkpoint's chunk of rows in."""
        self.cells.setdefault(checkpoint, CellMeans(CELL)).add(df)
        self.flow.setdefault(checkpoint, CellMeans(CELL)).add(average_heads(df[df["metric"] == "role_flow"]))
        self.curves.add(checkpoint, curve_rows(df))

    def means(self) -> pd.DataFrame:
        """Per checkpoint and cell: ``value`` (mean over examples), ``count``; role flow averaged over heads too."""
        parts = [
            means.frame().assign(checkpoint=name) for group in (self.cells, self.flow) for name, means in group.items()
        ]
        out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*CELL, "value", "count", "n"])
        return out[["checkpoint", *CELL, "value", "count", "n"]]

    def curve_summary(self) -> pd.DataFrame:
        """Per checkpoint, curve and layer: mean, ci_lo, ci_hi, n over examples (a ``layer_curves`` summary)."""
        parts = []
        by = ["checkpoint", *CELL]
        for side in self.curves.sides:
            for ids, values in self.curves.blocks(side):
                rows = self.curves.long_rows(side, ids, values).assign(checkpoint=side)
                if len(rows):
                    parts.append(summarize(rows, by))
        return (
            pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*by, "mean", "ci_lo", "ci_hi", "n"])
        )


class Summaries:
    """Everything ``compare`` reports, gathered chunk by chunk (see the module docstring); used as a context manager,
    so an error anywhere drops the open metrics writer."""

    def __init__(
        self,
        n_examples: int,
        headline: Sequence[HeadlineMetric],
        evidence_anchors: Mapping[str, Sequence[str]] | None = None,
        scratch_dir: str | Path | None = None,
        knocked_out: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """``evidence_anchors``: checkpoint -> its guidance roles, when the evidence reducers run (None: off);
        ``knocked_out``: checkpoint -> its knockouts' keys (the evidence table's ``includes`` column says which
        measures include them);
        ``scratch_dir``: where the spill's temporary folder goes (default the system's temp dir; ``compare --out``
        puts it beside the output, on the disk the user chose for the run)."""
        if scratch_dir is not None:
            Path(scratch_dir).mkdir(parents=True, exist_ok=True)
        self.scratch = tempfile.TemporaryDirectory(prefix=".anchorlens-compare-scratch-", dir=scratch_dir)
        folder = Path(self.scratch.name)
        self.evidence = (
            None
            if evidence_anchors is None
            else EvidenceSummaries(folder / "evidence", n_examples, evidence_anchors, knocked_out)
        )
        self.writer = MetricsWriter(folder / "metrics.parquet")
        self.per_head = CellSpill(folder / "paired", CELL, n_examples)
        self.layer_means = CellSpill(folder / "layers", CELL, n_examples)
        self.headline = HeadlineRows(headline)
        self.figures = FigureSummaries(folder, n_examples)

    def __enter__(self) -> Summaries:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """On an error anywhere in the run (a chunk's shard on a full disk, an interrupt), drop the metrics writer: its
        buffered rows would otherwise be flushed when it is collected at exit, fail again and print a traceback."""
        if kind is not None:
            self.writer.abandon()

    def add(self, checkpoint: str, df: pd.DataFrame) -> None:
        """Fold one checkpoint's metric rows of one chunk of examples in (and append them to metrics.parquet)."""
        self.writer.write(df, checkpoint)
        keep = df[df["metric"].isin(PAIRED_METRICS)]
        self.per_head.add(checkpoint, keep)
        self.layer_means.add(checkpoint, average_heads(keep))
        self.headline.add(checkpoint, df)
        self.figures.add(checkpoint, df)
        if self.evidence is not None:
            self.evidence.add(checkpoint, df)

    def result(self, names: Sequence[str], n_boot: int, dtype: object | None = None) -> dict:
        """headline, paired, means, curves, metrics_file, scratch and evidence: the fields of a Comparison."""
        self.writer.close()
        per, fixed = self.headline.result()
        headline = headline_from_rows(per, fixed, names, self.headline.metrics, n_boot=n_boot, dtype=dtype)
        del per
        release_free_memory()  # each step's freed arrays back to the OS before the next one allocates its own
        family = ["checkpoint", "metric"]
        paired = pd.concat(
            [
                compare_spill(spill, names[0], n_boot=n_boot, n_perm=2000, family=family, dtype=dtype)
                for spill in (self.per_head, self.layer_means)
            ],
            ignore_index=True,
        )
        release_free_memory()
        return {
            "headline": headline,
            "paired": paired,
            "means": self.figures.means(),
            "curves": self.figures.curve_summary(),
            "metrics_file": self.writer.path,
            "scratch": self.scratch,
            "evidence": pd.DataFrame() if self.evidence is None else self.evidence.table(names, n_boot),
        }


def figure_summaries(metrics_file: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(means, curves) of a compare run's metrics file (``anchorlens figures``, a run read back): a file written
    chunk by chunk is read one row group (one chunk of examples) at a time; an older file whole."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="anchorlens-figures-") as tmp:
        if metrics_file.suffix == ".parquet" and _chunked(metrics_file):
            file = pq.ParquetFile(metrics_file)
            figures = FigureSummaries(Path(tmp), _max_example(file) + 1)
            for group in range(file.num_row_groups):
                _fold(figures, conform(file.read_row_group(group).to_pandas()))
        else:
            frame = read_metrics(metrics_file)
            figures = FigureSummaries(Path(tmp), int(frame["example"].max()) + 1 if len(frame) else 1)
            _fold(figures, frame)
        return figures.means(), figures.curve_summary()


def _max_example(file: Any) -> int:
    """The largest example id of a parquet file: from its row groups' column statistics (read per row group where
    a statistic is missing), never the whole column at once."""
    column = file.schema_arrow.get_field_index("example")
    best = -1
    for group in range(file.num_row_groups):
        stats = file.metadata.row_group(group).column(column).statistics
        if stats is not None and stats.has_min_max:
            best = max(best, int(stats.max))
        else:
            values = file.read_row_group(group, columns=["example"])["example"].to_numpy()
            best = max(best, int(values.max()) if len(values) else -1)
    return max(best, 0)


def _chunked(path: Path) -> bool:
    """Whether a parquet metrics file was written by :class:`MetricsWriter` (a row group per chunk of examples)."""
    import pyarrow.parquet as pq

    return (pq.read_schema(path).metadata or {}).get(CHUNKED_KEY) == b"1"


def _fold(figures: FigureSummaries, frame: pd.DataFrame) -> None:
    """Feed a frame of several checkpoints, checkpoint by checkpoint."""
    for name, rows in frame.groupby("checkpoint", sort=False):
        figures.add(str(name), rows.drop(columns="checkpoint"))
