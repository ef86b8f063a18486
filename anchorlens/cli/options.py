"""Shared CLI pieces: option types (inseq-style, declared once), error handling, parsers."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from anchorlens.errors import UsageError

Base_ = Annotated[str, typer.Option("--base", help="Base model: smollm2-135m (embedded), tiny-llama/-qwen2/-gpt2/-bert/-t5, or a local HF dir.")]
Task_ = Annotated[str, typer.Option("--task", help="SuperGLUE task: rte, cb, boolq, copa, wic, wsc, multirc.")]
Data_ = Annotated[Optional[Path], typer.Option("--data", help="SuperGLUE jsonl file (default: the bundled examples).")]
N_ = Annotated[Optional[int], typer.Option("--n", "--limit", help="Use the first N examples (--limit under torchrun, which claims --n).")]
Layers_ = Annotated[Optional[str], typer.Option("--layers", help="Layers to capture, e.g. 0,5-8,-1 (default all).")]
Heads_ = Annotated[Optional[str], typer.Option("--heads", help="Heads to capture, e.g. 0-3 (default all).")]
Batch_ = Annotated[int, typer.Option("--batch-size", min=1, help="Examples per forward pass.")]
Dtype_ = Annotated[str, typer.Option("--dtype", help="float32 or bfloat16.")]
Force_ = Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")]
Device_ = Annotated[Optional[str], typer.Option("--device", help="cpu (default), cuda:0, or auto (spread a large base over the node's GPUs).")]
Ckpts_ = Annotated[list[str], typer.Option("--ckpt", help="Checkpoint spec (repeat): base, instance, instance:k=2,pos=middle, capsule, a checkpoint dir or a PEFT dir.")]


def fail(message: str) -> None:
    """Print ``error: message`` on stderr and exit with code 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def usage_errors(fn: Callable) -> Callable:
    """Turn UsageError (and missing files) into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as err:
            fail(str(err))
        except FileNotFoundError as err:
            fail(f"{err.filename}: no such file or directory")
        except KeyboardInterrupt:
            typer.secho("interrupted", err=True)
            raise typer.Exit(130)
        except (typer.Exit, SystemExit):
            raise
        except Exception as err:  # an anchorlens bug: one line, full traceback on request
            if os.environ.get("ANCHORLENS_DEBUG"):
                raise
            typer.secho(f"internal error: {type(err).__name__}: {err} (rerun with ANCHORLENS_DEBUG=1 for the traceback)",
                        fg=typer.colors.RED, err=True)
            raise typer.Exit(1)

    return wrapper


def selection_of(layers: str | None, heads: str | None):
    from anchorlens.capture.selection import Selection, parse_layers

    try:
        return Selection(layers=parse_layers(layers), heads=parse_layers(heads))
    except ValueError:
        raise UsageError(f"cannot parse --layers {layers!r} / --heads {heads!r}; use forms like 0,2,5-8,-1") from None


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Show warnings as ``warning: ...`` on stderr, without source lines."""
    print(f"warning: {message}", file=file or sys.stderr)


def parse_ints(text: str, what: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None

