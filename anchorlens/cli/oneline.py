"""Typer's own usage errors (bad values, unknown options and commands) as one ``error:`` line, exit 2.

Click prints a usage box (``Usage: ...``, ``Try ... --help``, ``Error: ...``) for the checks it makes
itself: a value that is not an integer, a count below its minimum, an unknown option or command, an
option without its value. Every other anchorlens refusal is one line (see
:func:`anchorlens.cli.options.cli_command`); :class:`OneLineGroup` makes these the same: one line
naming the flag and the value, and where to look (``anchorlens COMMAND --help``).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.29 vendors click
    from typer._click.exceptions import BadParameter, ClickException, MissingParameter, NoSuchOption
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - older typer on the real click
    from click.exceptions import BadParameter, ClickException, MissingParameter, NoSuchOption  # type: ignore[assignment]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]

EXIT_USAGE = 2


def _flatten(text: str) -> str:
    """One line: whitespace runs (newlines included) to single spaces, no trailing full stop."""
    return " ".join(str(text).split()).rstrip(".")


def _command_path(err: ClickException, fallback: str = "anchorlens") -> str:
    """``anchorlens compare`` for an error raised while parsing that command (``fallback`` without a context)."""
    ctx = getattr(err, "ctx", None)
    return ctx.command_path if ctx is not None and ctx.command_path else fallback


def command_path_of(group: Any, args: Sequence[str], prog_name: str) -> str:
    """``anchorlens sweep length`` from the leading command names of ``args`` (for errors without a context)."""
    words = [prog_name]
    for arg in args:
        commands = getattr(group, "commands", None)
        if not isinstance(commands, dict) or arg not in commands:
            break
        words.append(arg)
        group = commands[arg]
    return " ".join(words)


def _param_flag(err: BadParameter) -> str:
    """The flag (``--n``) or argument name (``PLAN``) a bad value was given for."""
    param = getattr(err, "param", None)
    if param is not None:
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")] or list(getattr(param, "opts", []))
        if getattr(param, "param_type_name", "") == "argument":
            return (param.human_readable_name or param.name or "argument").upper()
        if opts:
            return opts[0]
    hint = getattr(err, "param_hint", None)
    if isinstance(hint, (list, tuple)):
        hint = hint[0] if hint else None
    return str(hint).strip("'\"") if hint else "a value"


def _commands(err: ClickException) -> list[str]:
    """Names of the commands of the group an unknown-command error was raised in."""
    ctx = getattr(err, "ctx", None)
    commands = getattr(getattr(ctx, "command", None), "commands", None)
    return sorted(commands) if isinstance(commands, dict) else []


def _demo_has(err: NoSuchOption) -> bool:
    """Whether an option unknown to the root group is one of the ``demo`` command's (``anchorlens --n 4``)."""
    ctx = getattr(err, "ctx", None)
    commands = getattr(getattr(ctx, "command", None), "commands", None)
    command = commands.get("demo") if isinstance(commands, dict) else None
    return command is not None and any(err.option_name in p.opts for p in command.params)


def usage_line(err: ClickException, fallback: str = "anchorlens") -> str:
    """The one line (without ``error: ``) for one of click's usage errors (``fallback``: the command path if unknown)."""
    where = _command_path(err, fallback)
    help_hint = f"see `{where} --help`"
    message = _flatten(err.message if isinstance(err, BadParameter) else err.format_message())
    if isinstance(err, NoSuchOption):
        options = sorted(getattr(err, "possibilities", None) or [])
        close = difflib.get_close_matches(err.option_name, options, n=1) or options[:1]
        if not close and _demo_has(err):
            return (
                f"{where} has no option {err.option_name}; the demo's options go after its name: "
                f"`anchorlens demo {err.option_name} ...` (see `anchorlens demo --help`)"
            )
        guess = f"; did you mean {close[0]}?" if close else ""
        return f"{where} has no option {err.option_name}{guess} ({help_hint})"
    if isinstance(err, BadParameter):
        flag = _param_flag(err)
        if isinstance(err, MissingParameter):
            return f"{where} needs {flag} ({help_hint})"
        return f"{flag}: {message} ({help_hint})"
    if message.startswith("No such command"):
        name = message.split("'")[1] if message.count("'") >= 2 else message
        close = difflib.get_close_matches(name, _commands(err), n=1)
        guess = f"did you mean {close[0]}? " if close else ""
        known = ", ".join(_commands(err))
        return f"{where} has no command {name!r}; {guess}the commands are {known} ({help_hint})"
    if message == "Missing command":
        return f"{where} needs a command: {', '.join(_commands(err))} ({help_hint})"
    if message.endswith("requires an argument"):
        flag = message.split("'")[1] if message.count("'") >= 2 else message
        return f"{flag} needs a value ({help_hint})"
    return f"{message[:1].lower()}{message[1:]} ({help_hint})"


class OneLineGroup(TyperGroup):
    """The app's root group: click's usage errors become one ``error:`` line with exit code 2."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the CLI; in standalone mode exit with the command's code, a usage error as one line (exit 2)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickUsageError as err:
            where = command_path_of(self, argv, prog_name or self.name or "anchorlens")
            typer.secho(f"error: {usage_line(err, where)}", fg=typer.colors.RED, err=True)
            sys.exit(EXIT_USAGE)
        except ClickException as err:  # e.g. a FileError: a problem with the user's input too
            typer.secho(f"error: {_flatten(err.format_message())}", fg=typer.colors.RED, err=True)
            sys.exit(EXIT_USAGE)
        except typer.Abort:
            typer.secho("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
