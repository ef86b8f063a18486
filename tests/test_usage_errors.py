"""Every usage error is one ``error:`` line with exit code 2: a walk over every registered command.

The walk is generated from the typer app, so a new command or option is covered without editing
this file: each command gets an unknown option, each option that takes a value gets no value, each
numeric option gets a non-number, a value below its minimum and -1, each input path a missing
file, each group an unknown command, and each command that loads a base a device this machine lacks.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from anchorlens import __version__
from anchorlens.cli import app

runner = CliRunner()
ROOT = typer.main.get_command(app)

# Path parameters the command reads (a missing one is an error) or writes (a missing one is created).
INPUT_PATHS = {"data", "eval_data", "plan", "run_dir"}
OUTPUT_PATHS = {"out"}
# Values for required parameters, so a command gets as far as loading its base.
SAMPLES: dict[str, list[str]] = {"ckpt": ["base", "instance"], "method": ["capsule"], "out": ["{tmp}/out"]}


@dataclass(frozen=True)
class Param:
    """What the walk needs to know of one parameter of one command."""

    name: str
    flag: str | None  # None for a positional argument
    kind: Any  # the Python type typer converts to (int, float, str, Path, bool)
    low: float | None  # the smallest accepted value of a numeric option
    required: bool
    multiple: bool


def _params(command: Any) -> list[Param]:
    out = []
    for p in command.params:
        info = p.type_descriptor
        parser = getattr(info.parameter_info, "parser", None)
        flags = [o for o in p.opts if o.startswith("--")]
        out.append(
            Param(
                p.name,
                flags[0] if flags and p.param_type_name == "option" else None,
                info.annotation,
                getattr(parser, "low", None),
                bool(p.required),
                bool(getattr(p, "multiple", False)),
            )
        )
    return out


def _walk(group: Any = ROOT, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, click command) of every command, subcommands of groups included."""
    found = []
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            found += _walk(command, (*prefix, name))
        else:
            found.append(((*prefix, name), command))
    return found


COMMANDS = _walk()
GROUPS: list[tuple[str, ...]] = [()] + [(name,) for name, c in ROOT.commands.items() if hasattr(c, "commands")]


def _ids(path: tuple[str, ...]) -> str:
    return " ".join(path) or "anchorlens"


def one_error_line(result: Any) -> str:
    """The output is exactly one ``error:`` line (no usage box, no traceback) and the exit code is 2."""
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    line = lines[0]
    assert line.startswith("error: "), line
    for noise in ("Usage:", "Try '", "Traceback", "internal error", "╭"):
        assert noise not in result.output, result.output
    return line


def test_the_walk_sees_every_command_and_subcommand():
    names = {_ids(path) for path, _ in COMMANDS}
    assert {"compare", "demo", "figures", "train", "sweep instance", "sweep length", "reproduce"} <= names
    assert ("sweep",) in GROUPS


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=_ids)
def test_every_path_parameter_is_classified(path):
    """A new Path option must be added to INPUT_PATHS or OUTPUT_PATHS, so the walk tests it."""
    command = dict(COMMANDS)[path]
    for p in _params(command):
        if p.kind is Path:
            assert p.name in INPUT_PATHS | OUTPUT_PATHS, f"{_ids(path)}: classify the path parameter {p.name!r}"


def _cases() -> list:
    cases = []
    for path, command in COMMANDS:
        cases.append(
            pytest.param(path, ["--no-such-option"], "has no option --no-such-option", id=f"{_ids(path)} unknown")
        )
        for p in _params(command):
            if p.flag is None or p.kind is bool:
                continue
            cases.append(pytest.param(path, [p.flag], f"{p.flag} needs a value", id=f"{_ids(path)} {p.flag} no value"))
            if p.kind in (int, float):
                values = ["abc"]
                if p.low is not None:
                    values += dict.fromkeys([str(int(p.low) - 1) if p.kind is int else "-0.5", "-1"])
                for value in values:
                    cases.append(
                        pytest.param(path, [p.flag, value], f"{p.flag}: ", id=f"{_ids(path)} {p.flag} {value}")
                    )
            if p.name in INPUT_PATHS:  # checked by the command itself: its required parameters are filled in
                cases.append(
                    pytest.param(
                        path,
                        ["{fill}", p.flag, "{tmp}/missing.jsonl"],
                        "no such file",
                        id=f"{_ids(path)} {p.flag} missing",
                    )
                )
        for p in _params(command):
            if p.flag is None and p.name in INPUT_PATHS:
                cases.append(pytest.param(path, ["{tmp}/missing"], "no such file", id=f"{_ids(path)} missing argument"))
    for group in GROUPS:
        cases.append(
            pytest.param(group, ["no-such-command"], "has no command 'no-such-command'", id=f"{_ids(group)} cmd")
        )
    return cases


@pytest.mark.parametrize("path, args, words", _cases())
def test_bad_argument_is_one_line_and_exit_2(path, args, words, tmp_path):
    fill = _fill_required(dict(COMMANDS)[path], tmp_path) if "{fill}" in args else []
    argv = [*path, *fill, *[a.replace("{tmp}", str(tmp_path)) for a in args if a != "{fill}"]]
    before = sorted(tmp_path.rglob("*"))
    line = one_error_line(runner.invoke(app, argv))
    assert words in line, line
    assert "None" not in line
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_numeric_errors_name_the_value_and_the_range():
    assert one_error_line(runner.invoke(app, ["compare", "--n", "0"])).startswith(
        "error: --n: 0 is below 1; give a whole number of at least 1"
    )
    assert "'abc' is not a whole number" in one_error_line(runner.invoke(app, ["compare", "--n", "abc"]))
    assert "-1 is below 1" in one_error_line(runner.invoke(app, ["capture", "--batch-size", "-1"]))
    assert "0 is below 1" in one_error_line(runner.invoke(app, ["train", "--batch-size", "0"]))
    assert "did you mean --n?" in one_error_line(runner.invoke(app, ["compare", "--nn", "3"]))
    assert "did you mean compare?" in one_error_line(runner.invoke(app, ["comapre"]))
    assert "`anchorlens demo --n ...`" in one_error_line(runner.invoke(app, ["--n", "4"]))
    assert "needs --ckpt" in one_error_line(runner.invoke(app, ["capture"]))
    assert "needs a command: instance, knockout, length" in one_error_line(runner.invoke(app, ["sweep"]))


def _fill_required(command: Any, tmp: Path) -> list[str]:
    """Sample values for every required parameter (fails the walk for one it has no sample for)."""
    args: list[str] = []
    for p in _params(command):
        if not p.required:
            continue
        if p.name not in SAMPLES:
            pytest.fail(f"give the usage-error walk a sample value for the required parameter {p.name!r}")
        values = SAMPLES[p.name] if p.multiple else SAMPLES[p.name][-1:]
        for value in values:
            args += ([p.flag] if p.flag else []) + [value.replace("{tmp}", str(tmp))]
    return args


def _missing_devices() -> list[tuple[str, str]]:
    devices = [("bogus-device", "unknown device 'bogus-device'")]
    if not torch.cuda.is_available():
        devices.append(("cuda:0", "device 'cuda:0' is not available"))
    if not torch.backends.mps.is_available():
        devices.append(("mps", "device 'mps' is not available"))
    return devices


DEVICE_COMMANDS = [path for path, command in COMMANDS if any(p.flag == "--device" for p in _params(command))]


@pytest.mark.parametrize("device, words", _missing_devices(), ids=[d for d, _ in _missing_devices()])
@pytest.mark.parametrize("path", DEVICE_COMMANDS, ids=_ids)
def test_a_device_this_machine_lacks_is_one_line(path, device, words, tmp_path):
    command = dict(COMMANDS)[path]
    argv = [*path, *_fill_required(command, tmp_path), "--base", "tiny-llama", "--device", device]
    if any(p.flag == "--out" for p in _params(command)) and "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    line = one_error_line(runner.invoke(app, argv))
    assert words in line and ("--device cpu" in line or "use cpu" in line), line
    assert not (tmp_path / "out").exists()


def test_device_check_names_the_gpu_count_and_a_missing_driver(monkeypatch):
    from anchorlens.devices import check_device
    from anchorlens.errors import UsageError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == "cuda:1" and check_device("cuda") == "cuda"
    with pytest.raises(UsageError, match=r"'cuda:2' does not exist: 2 CUDA GPU\(s\) are visible \(cuda:0 to cuda:1\)"):
        check_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(UsageError, match="no CUDA GPU is visible.*CUDA_VISIBLE_DEVICES"):
        check_device("cuda:0")
    assert check_device(None) is None and check_device("cpu") == "cpu" and check_device("auto") == "auto"


def test_version_is_one_line_from_the_one_source():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith(f"anchorlens {__version__} (python ") and "torch" in result.output
    from importlib import metadata

    assert metadata.version("anchorlens") == __version__  # pyproject reads the version from anchorlens/__init__


def test_version_and_a_usage_error_need_no_torch():
    import subprocess

    code = (
        "import sys\nfrom anchorlens.cli import main\nsys.argv = ['anchorlens'] + sys.argv[1:]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, 'torch' in sys.modules)\n"
    )
    for argv, expected in ((["--version"], "EXIT 0 False"), (["compare", "--n", "0"], "EXIT 2 False")):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env={**os.environ}
        )
        assert expected in done.stdout, (done.stdout, done.stderr)
