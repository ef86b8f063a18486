"""The CLI end to end on a tiny base: artifacts written, bad input gives one line and exit 2."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.cli import app

runner = CliRunner()
TINY = ["--base", "tiny-llama"]


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp") / "run"
    result = run("compare", "--ckpt", "base", "--ckpt", "instance", *TINY, "--n", "6", "--out", str(out))
    assert result.exit_code == 0, result.output
    return out, result.output


def test_compare_writes_every_artifact(compare_dir):
    out, output = compare_dir
    for name in ("metrics.parquet", "summary.md", "report.html", "manifest.json", "headline.csv", "paired.csv"):
        assert (out / name).is_file(), name
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert {"attention_maps.png", "layer_curves.png", "role_flow.png"} <= set(pngs)
    assert len(list((out / "figures").glob("*.pdf"))) == len(pngs)
    html = (out / "report.html").read_text()
    assert "http://" not in html and "https://" not in html
    assert "<script" in html and not re.search(r"<script[^>]*\bsrc\s*=", html)  # the view's script is inline
    assert html.count("data:image/png;base64,") == len(pngs)
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert set(metrics.checkpoint) == {"base", "instance"}
    assert metrics.example.nunique() == 6
    summary = (out / "summary.md").read_text()
    assert "| metric | base | instance |" in summary and "Δ" in summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["base_fingerprint"]["model_type"] == "llama" and len(manifest["data_digest"]) == 16
    assert "input → sink" in output  # headline table printed


def test_instance_token_is_an_anchor_in_the_headline(compare_dir):
    out, _ = compare_dir
    head = pd.read_csv(out / "headline.csv", keep_default_na=False, na_values=[""])
    sink = head[head.name == "sink"].set_index("checkpoint")
    # the instance token at position 0 takes attention the input's first token (the sink) received before
    assert sink.loc["instance", "mean"] < sink.loc["base", "mean"] and sink.loc["instance", "diff"] < 0
    island = head[(head.name == "island") & (head.checkpoint == "instance")]
    assert island["fixed"].iloc[0].startswith("fixed by the causal mask")  # a lone first token sees only itself


def test_existing_out_is_refused_and_left_untouched(compare_dir):
    out, _ = compare_dir
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    result = run("compare", "--ckpt", "base", "--ckpt", "instance", *TINY, "--n", "2", "--out", str(out))
    assert result.exit_code == 2
    assert "already exists" in result.output and "--force" in result.output
    assert "Traceback" not in result.output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_figures_command_redraws_from_saved_run(compare_dir, tmp_path):
    out, _ = compare_dir
    result = run("figures", str(out), "--out", str(tmp_path / "fig"))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "fig").glob("*.png")) == sorted(
        p.name for p in (out / "figures").glob("*.png")
    )


def test_compare_under_torchrun_two_processes_matches_one(tmp_path, compare_dir):
    """`torchrun --nproc-per-node 2 -m anchorlens compare` (gloo) equals the single-process run."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this python")
    out = tmp_path / "dist"
    import socket

    with socket.socket() as sock:  # a free port for the gloo rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        str(torchrun),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "-m",
        "anchorlens",
        "compare",
        "--ckpt",
        "base",
        "--ckpt",
        "instance",
        *TINY,
        "--limit",
        "6",
        "--out",
        str(out),
    ]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    single, _ = compare_dir
    a, b = pd.read_parquet(single / "metrics.parquet"), pd.read_parquet(out / "metrics.parquet")
    keys = [c for c in a.columns if c not in ("value", "count")]
    a, b = a.sort_values(keys).reset_index(drop=True), b.sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(a[keys], b[keys])
    assert float((a.value - b.value).abs().max()) <= 1e-6
    shutil.rmtree(out)


def test_checkpoint_from_another_base_is_refused(tmp_path, tiny_base):
    from anchorlens.methods.checkpoints import save_checkpoint
    from anchorlens.methods.spec import load_guided

    ckpt = tmp_path / "capsule-llama"
    save_checkpoint(load_guided("capsule", base=tiny_base("tiny-llama")), ckpt)
    out = tmp_path / "out"
    result = run("compare", "--ckpt", "base", "--ckpt", str(ckpt), "--base", "tiny-t5", "--n", "2", "--out", str(out))
    assert result.exit_code == 2, result.output
    assert "trained on 'tiny-llama'" in result.output and "load it with its own base" in result.output
    # a loaded machine may show the stage's start line ("comparing 2 checkpoints ...") before the error
    errors = [line for line in result.output.strip().splitlines() if not line.endswith(" ...")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and not out.exists()


def test_params_reports_counts_and_share():
    result = run("params", "--ckpt", "capsule", "--ckpt", "prompt:n=10", *TINY)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.split()[:2] == ["capsule", "256"] for line in lines)  # 4 layers x d=64
    assert any(line.split()[:2] == ["prompt:n=10", "640"] for line in lines)  # 10 x 64


def test_sweep_instance_writes_accuracy_and_anchor_metrics(tmp_path):
    out = tmp_path / "sweep"
    result = run(
        "sweep",
        "instance",
        "--ckpt",
        "base",
        "--k",
        "0,1,2",
        "--positions",
        "first,last",
        *TINY,
        "--n",
        "6",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 6 and set(table.position) == {"first", "last"}
    assert table.accuracy.between(0, 1).all()
    # what the instance token receives: positive at first, nothing at last (no later query can see it)
    at = table.set_index(["k", "position"])
    assert at.loc[(1, "first"), "anchor_mass"] > 0 and np.isnan(at.loc[(1, "last"), "anchor_mass"])
    assert at.loc[0, "anchor_mass"].isna().all() and at.loc[0, "anchor_structural"].isna().all()  # k = 0: no anchor
    assert (at.loc[0, "sink_mass"] > 0).all()
    assert "fixed by the causal mask" in at.loc[(1, "last"), "fixed"]
    assert at.loc[(1, "last"), "accuracy"] == at.loc[(0, "last"), "accuracy"]  # after the scored token: no effect
    assert {"accuracy.png", "anchor_mass.png"} <= {p.name for p in (out / "figures").iterdir()}
    assert "| k |" in (out / "summary.md").read_text()


def test_sweep_length_trains_one_prompt_per_length(tmp_path):
    out = tmp_path / "len"
    result = run("sweep", "length", "--lengths", "1,3", "--steps", "2", *TINY, "--n", "12", "--out", str(out))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "sweep.csv")
    assert table.length.tolist() == [1, 3] and table.num_trainable.tolist() == [64, 192]
    assert (out / "runs" / "n-3" / "final" / "anchorlens.json").is_file()


# --- CLI conventions (issue 14) and typed option groups (issue 10) ---------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import typer  # noqa: E402

from anchorlens.cli.options import BatchOptions, DataOptions, OutputOptions, cli_command  # noqa: E402

BASE_LOADERS = [
    "demo",
    "compare",
    "positions",
    "capture",
    "params",
    "train",
    "evaluate",
    "sweep instance",
    "sweep length",
]
FIGURE_WRITERS = ["compare", "positions", "sweep instance", "sweep length"]


def _command(path: str):
    """The click command behind ``anchorlens PATH`` (``"sweep length"`` for a subcommand)."""
    command = typer.main.get_command(app)
    for name in path.split():
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def _all_commands() -> list[str]:
    group = typer.main.get_command(app)
    names = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        names += [f"{name} {sub}" for sub in command.commands] if hasattr(command, "commands") else [name]
    return names


def test_all_commands_include_subcommands():
    assert {"sweep instance", "sweep length", "compare", "demo"} <= set(_all_commands())


@pytest.mark.parametrize("path", _all_commands())
def test_help_shows_flags_as_flags_and_every_option_has_help(path):
    result = run(*path.split(), "--help")
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output and "╭" not in result.output
    assert "  --force " in result.output or "--force" not in result.output
    options = [param for param in _command(path).params if param.param_type_name == "option"]
    assert options  # every command has options (typer vendors click: no isinstance against click.Option)
    for param in options:
        assert (param.help or "").strip(), f"{path} {param.opts} has no help text"


@pytest.mark.parametrize("path", BASE_LOADERS)
def test_every_command_that_loads_a_base_takes_device_and_dtype(path):
    flags = {opt for param in _command(path).params for opt in param.opts}
    assert {"--base", "--device", "--dtype"} <= flags


@pytest.mark.parametrize("path", FIGURE_WRITERS)
def test_figure_writers_offer_no_figures(path):
    assert any("--no-figures" in param.opts for param in _command(path).params)


def test_train_and_sweep_length_share_their_defaults():
    def defaults(path):
        return {param.name: param.default for param in _command(path).params}

    train, sweep = defaults("train"), defaults("sweep length")
    for name in ("steps", "lr", "seed", "batch_size", "max_length", "base", "task"):
        assert train[name] == sweep[name], name


def test_option_groups_arrive_as_objects_with_per_command_defaults():
    seen = {}
    demo_app = typer.Typer()

    @demo_app.command()
    @cli_command
    def cmd(data: DataOptions, batch: BatchOptions, output: OutputOptions = OutputOptions(Path("here"))) -> None:
        seen.update(data=data, batch=batch, output=output)

    result = CliRunner().invoke(demo_app, ["--task", "cb", "--n", "3", "--force"])
    assert result.exit_code == 0, result.output
    assert seen == {
        "data": DataOptions("cb", None, 3),
        "batch": BatchOptions(None),
        "output": OutputOptions(Path("here"), True),
    }


def test_batch_size_defaults_to_the_device_and_an_explicit_one_wins():
    assert BatchOptions().size(None) == BatchOptions().size("cpu") == 8
    assert BatchOptions().size("cuda:0") == BatchOptions().size("auto") == 32
    assert BatchOptions(3).size("cuda:0") == BatchOptions(3).size(None) == 3


def test_evaluate_dtype_without_base_is_refused_not_ignored(tmp_path):
    result = run("evaluate", "--ckpt", "instance", "--dtype", "bfloat16", "--n", "2")
    assert result.exit_code == 2 and "--dtype/--device need --base" in result.output, result.output


REFUSALS = [
    ["compare", "--ckpt", "base", "--ckpt", "instance", "--out", "{existing}"],
    ["compare", "--ckpt", "base", "--ckpt", "instance", "--data", "{missing}", "--out", "{new}"],
    ["train", "--method", "capsule", "--out", "{existing}"],
    ["evaluate", "--ckpt", "base", "--data", "{missing}"],
    ["sweep", "length", "--out", "{existing}"],
    ["figures", "{missing}"],
]


@pytest.mark.parametrize("args", REFUSALS, ids=lambda a: " ".join(a[:2]))
def test_trivial_refusals_come_before_torch_is_imported(tmp_path, args):
    """Existing --out / missing file: refused without importing torch, transformers or matplotlib (issue 14)."""
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "f").write_text("x")
    names = {"existing": existing, "missing": tmp_path / "missing.jsonl", "new": tmp_path / "new"}
    argv = [a.format(**names) for a in args]
    code = (
        "import sys\nfrom anchorlens.cli import app\n"
        "try:\n    app(args=sys.argv[1:], prog_name='anchorlens')\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules)\n"
        "print('EXIT', code, 'HEAVY', ','.join(heavy) or '-')\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert "EXIT 2 HEAVY -" in done.stdout, (done.stdout, done.stderr)
    assert done.stderr.strip().startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
def test_compare_no_figures_writes_tables_only(tmp_path):
    out = tmp_path / "run"
    result = run(
        "compare", "--ckpt", "base", "--ckpt", "instance", *TINY, "--n", "2", "--no-figures", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    assert (out / "metrics.parquet").is_file() and (out / "report.html").is_file()
    assert not (out / "figures").exists() or not any((out / "figures").iterdir())
    assert "summary.md, report.html)" in result.output and "figures/" not in result.output  # says what it wrote
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # the spill beside --out is gone once it is read


def test_demo_called_directly_gets_the_flag_defaults(capsys, tmp_path, monkeypatch):
    """The root callback runs ``demo()`` without typer: option groups still get their defaults."""
    from anchorlens.cli import measure

    monkeypatch.setenv("ANCHORLENS_CACHE", str(tmp_path / "cache"))  # the default --out lives there
    measure.demo(base="tiny-llama", n=2)  # partial keywords: the rest come from the flags' defaults
    out = capsys.readouterr().out
    assert "tiny-llama on 2 rte examples" in out
    assert f"report: {tmp_path / 'cache' / 'demo' / 'report.html'}" in out


def test_train_then_evaluate_then_positions_on_a_tiny_base(tmp_path):
    run_dir = tmp_path / "train"
    result = run(
        "train",
        "--method",
        "capsule",
        *TINY,
        "--n",
        "12",
        "--steps",
        "2",
        "--eval-every",
        "1",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--out",
        str(run_dir),
    )
    assert result.exit_code == 0, result.output
    assert "2 steps" in result.output and (run_dir / "final" / "anchorlens.json").is_file()
    evaluated = tmp_path / "eval"
    result = run("evaluate", "--ckpt", str(run_dir / "final"), *TINY, "--n", "4", "--out", str(evaluated))
    assert result.exit_code == 0, result.output
    metrics = json.loads((evaluated / "metrics.json").read_text())
    assert metrics["num_examples"] == 4 and 0 <= metrics["accuracy"] <= 1
    moved = tmp_path / "positions"
    result = run(
        "positions",
        "--ckpt",
        str(run_dir / "final"),
        "--positions",
        "first,last",
        *TINY,
        "--n",
        "2",
        "--out",
        str(moved),
    )
    assert result.exit_code == 0, result.output
    assert set(pd.read_csv(moved / "positions.csv").position) == {"first", "last"}


@pytest.mark.parametrize(
    "err, line",
    [
        (
            OSError(28, "No space left on device", "/runs/x/metrics.parquet"),
            "error: cannot use /runs/x/metrics.parquet: no space left on the device",
        ),
        (
            PermissionError(13, "Permission denied", "/data/a.jsonl"),
            "error: cannot use /data/a.jsonl: permission denied",
        ),
        (OSError(28, "No space left on device"), "error: cannot use an output file: no space left on the device"),
    ],
)
def test_os_errors_anywhere_in_a_command_are_one_line_naming_the_path(err, line):
    broken = typer.Typer()

    @broken.command()
    @cli_command
    def cmd(batch: BatchOptions) -> None:
        raise err

    result = CliRunner().invoke(broken, [])
    assert result.exit_code == 2 and result.output.strip() == line, result.output


def test_long_stages_say_what_they_do_when_output_is_not_a_terminal(compare_dir):
    """Drawing six figures takes seconds: its stage line and its done line appear (plain lines, not a bar)."""
    _, output = compare_dir
    lines = output.splitlines()
    assert "writing tables, figures and report.html ..." in lines
    assert any(line.startswith("writing tables, figures and report.html: done in ") for line in lines)
    assert not any("\r" in line for line in lines)  # no carriage-return bar in a log
