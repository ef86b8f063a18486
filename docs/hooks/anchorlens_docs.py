"""MkDocs hook of the anchorlens docs: executed tutorials, the CLI reference and tables generated from the code.

- Every ``docs/tutorials/*.ipynb`` is executed top to bottom (nbclient, a fresh kernel, in a scratch folder
  holding ``examples/``) and becomes the page ``tutorials/<name>.md``: the outputs shown are the ones this
  build computed. A cell that fails fails the build.
- ``contributing.md`` is the repository's ``CONTRIBUTING.md``.
- ``<!-- cli-reference -->`` becomes ``anchorlens COMMAND --help`` of every command of the typer app.
- ``<!-- tolerance-table -->`` becomes the rounding tolerance table of ``anchorlens.analyses.tolerance``.
- After the build, every HTML page is checked for assets loaded from the network (the site builds and reads
  offline): a ``src``/``href`` of a script, stylesheet, image or font on ``http(s)://`` fails the build.
"""

from __future__ import annotations

import html
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:  # the tests import the generators and checks below without the docs extra installed
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files
except ImportError:  # pragma: no cover - the docs build always has mkdocs
    PluginError = RuntimeError  # type: ignore[misc,assignment]
    File = Files = Any  # type: ignore[misc,assignment]

log = logging.getLogger("mkdocs.plugins.anchorlens")
REPO = Path(__file__).resolve().parents[2]
TUTORIALS = REPO / "docs" / "tutorials"
# tutorials kept outside docs/ (the example notebook the tests also run): page name -> notebook
EXTRA_TUTORIALS = {"inspect-attention": REPO / "examples" / "inspect_attention.ipynb"}
_RAW: dict[str, str] = {}  # token -> raw HTML of a notebook output, put back after markdown rendering
_TOKEN = "nboutput{:04d}x"


# ----------------------------------------------------------------------------------------------- notebooks
def execute_notebook(path: Path, timeout: int = 900) -> Any:
    """The notebook at ``path`` executed in a scratch folder that holds the repository's ``examples/``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    bindir = str(Path(sys.executable).parent)  # `!anchorlens ...` in a cell finds this environment's CLI
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    work = Path(tempfile.mkdtemp(prefix="anchorlens-tutorial-"))
    try:
        (work / "examples").symlink_to(REPO / "examples", target_is_directory=True)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(work)}})
        try:
            client.execute()
        except Exception as err:  # CellExecutionError and kernel failures: one message naming the notebook
            raise PluginError(f"tutorial {path.name} failed to execute: {err}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _relative_paths(nb, work)
    _check_shell_errors(nb, path)
    return nb


# what a failed `!anchorlens ...` prints: the cell itself succeeds, so its output is read instead
_SHELL_ERROR = re.compile(r"^(error:|internal error|Traceback \(most recent call last\))", re.M)


def _check_shell_errors(nb: Any, path: Path) -> None:
    """Fail when a code cell printed a command's error, unless the cell is tagged ``expect-error``."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "expect-error" in cell.get("metadata", {}).get("tags", []):
            continue
        text = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
        found = _SHELL_ERROR.search(text)
        if found:
            line = text[found.start() :].splitlines()[0]
            raise PluginError(f"tutorial {path.name}, cell {index}: a command failed: {line}")


def _relative_paths(nb: Any, work: Path) -> None:
    """Outputs name the files the notebook wrote as it named them (``runs/x``), not the scratch folder's path."""
    prefixes = [f"{work.resolve()}/", f"{work}/"]
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = _strip(out["text"], prefixes)
            for mime in ("text/plain", "text/html"):
                if mime in out.get("data", {}):
                    out["data"][mime] = _strip(out["data"][mime], prefixes)


def _strip(text: str, prefixes: list[str]) -> str:
    for prefix in prefixes:
        text = text.replace(prefix, "")
    return text


def _raw(content: str) -> str:
    """A placeholder paragraph for raw HTML, replaced after the markdown is rendered."""
    token = _TOKEN.format(len(_RAW))
    _RAW[token] = content
    return f"\n{token}\n"


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _terminal(text: str) -> str:
    """What a terminal shows of ``text``: ANSI codes dropped, a line rewritten by ``\\r`` shown as its last state."""
    lines = []
    for line in _ANSI.sub("", text).split("\n"):
        if "\r" in line:
            shown = [part for part in line.split("\r") if part.strip()]
            line = shown[-1].strip() if shown else ""
        lines.append(line)
    return "\n".join(lines)


def _text_block(text: str) -> str:
    text = _terminal(text).rstrip("\n")
    return f"\n```text\n{text}\n```\n" if text.strip() else ""


def _output(out: Any) -> str:
    """One cell output as markdown (text) or a raw-HTML placeholder (tables, views, images)."""
    kind = out.get("output_type")
    if kind == "stream":
        return _text_block(out.get("text", ""))
    if kind == "error":
        return _text_block("\n".join(out.get("traceback", [])))
    data = out.get("data", {})
    if "text/html" in data:
        return _raw(f'<div class="nb-output">{data["text/html"]}</div>')
    if "image/png" in data:
        png = data["image/png"].replace("\n", "")
        alt = html.escape(data.get("text/plain", "figure").strip()[:200], quote=True)
        return _raw(f'<div class="nb-output"><img alt="{alt}" src="data:image/png;base64,{png}"></div>')
    if "image/svg+xml" in data:
        return _raw(f'<div class="nb-output">{data["image/svg+xml"]}</div>')
    if "text/plain" in data:
        return _text_block(data["text/plain"])
    return ""


def _merged_streams(outputs: list) -> list:
    """Consecutive stream outputs (stdout and stderr interleaved, as a terminal shows them) as one."""
    merged: list = []
    for out in outputs:
        if out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream":
            merged[-1] = {"output_type": "stream", "text": merged[-1]["text"] + out["text"]}
        else:
            merged.append(out)
    return merged


def notebook_markdown(nb: Any) -> str:
    """An executed notebook as a markdown page: markdown cells as they are, code and its outputs in order."""
    parts: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        elif cell.cell_type == "code":
            parts.append(f"```python\n{cell.source}\n```")
            parts.extend(_output(out) for out in _merged_streams(cell.get("outputs", [])))
    return "\n\n".join(p for p in parts if p) + "\n"


# ----------------------------------------------------------------------------------------- generated text
def cli_reference() -> str:
    """``anchorlens --help`` and ``anchorlens COMMAND --help`` of every command, as the terminal prints them."""
    import typer
    from typer.testing import CliRunner

    from anchorlens.cli import app

    group = typer.main.get_command(app)
    runner = CliRunner()

    def helptext(args: list[str]) -> str:
        done = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "110"}, prog_name="anchorlens")
        if done.exit_code != 0:
            raise PluginError(f"`anchorlens {' '.join(args)} --help` exited {done.exit_code}: {done.output[-300:]}")
        return done.output.rstrip()

    sections = ["## `anchorlens`\n\n```text\n" + helptext([]) + "\n```\n"]

    def walk(cmd: Any, path: list[str]) -> None:
        if path:
            sections.append(f"## `anchorlens {' '.join(path)}`\n\n```text\n{helptext(path)}\n```\n")
        if hasattr(cmd, "list_commands"):  # a group (typer vendors its own click: no isinstance)
            ctx = cmd.context_class(cmd)
            for name in sorted(cmd.list_commands(ctx)):
                sub = cmd.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name])

    walk(group, [])
    return "\n".join(sections)


def tolerance_table() -> str:
    """The rounding tolerance of each kind of measurement by dtype, read from the code."""
    from anchorlens.analyses.tolerance import TOLERANCES

    dtypes = list(next(iter(TOLERANCES.values())))
    lines = ["| measurement (kind) | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for kind, row in TOLERANCES.items():
        lines.append(f"| `{kind}` | " + " | ".join(f"{row[d]:g}" for d in dtypes) + " |")
    return "\n".join(lines)


GENERATED = {"<!-- cli-reference -->": cli_reference, "<!-- tolerance-table -->": tolerance_table}


# ---------------------------------------------------------------------------------------------- the hooks
def tutorials() -> dict[str, Path]:
    """Every tutorial notebook by page name (``tutorials/<name>.md``)."""
    return {**{p.stem: p for p in sorted(TUTORIALS.glob("*.ipynb"))}, **EXTRA_TUTORIALS}


def on_files(files: Files, config: Any) -> Files:
    # the repository's CONTRIBUTING.md, as the page contributing.md
    files.append(File.generated(config, "contributing.md", content=(REPO / "CONTRIBUTING.md").read_text()))
    # ANCHORLENS_DOCS_EXECUTE=0 renders the tutorials without running them, while editing prose; `make docs`
    # always runs them
    run = os.environ.get("ANCHORLENS_DOCS_EXECUTE", "1") != "0"
    for name, path in tutorials().items():
        if run:
            start = time.perf_counter()
            nb = execute_notebook(path)
            log.info(f"tutorial {path.name} executed in {time.perf_counter() - start:.0f} s")
        else:
            import nbformat

            nb = nbformat.read(path, as_version=4)
        files.append(File.generated(config, f"tutorials/{name}.md", content=notebook_markdown(nb)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def on_page_content(content: str, page: Any, config: Any, files: Files) -> str:
    for token in re.findall(r"nboutput\d{4}x", content):
        content = content.replace(f"<p>{token}</p>", _RAW[token]).replace(token, _RAW[token])
    return content


# a script, stylesheet, image, font or frame loaded from the network (links a reader clicks are fine)
_REMOTE = re.compile(
    r"<(?:script|img|iframe|source|audio|video)\b[^>]*\bsrc=[\"']?(?:https?:)?//"
    r"|<link\b[^>]*\bhref=[\"']?(?:https?:)?//"
    r"|@import\s+(?:url\()?[\"']?(?:https?:)?//"
    r"|url\([\"']?(?:https?:)?//",
    re.I,
)


def remote_assets(site: Path) -> list[str]:
    """``page: snippet`` for every asset of the built site loaded from the network."""
    found = []
    for page in sorted([*site.rglob("*.html"), *site.rglob("*.css")]):
        text = page.read_text(errors="replace")
        for m in _REMOTE.finditer(text):
            found.append(f"{page.relative_to(site)}: {text[m.start() : m.start() + 120]!r}")
    return found


def on_post_build(config: Any) -> None:
    found = remote_assets(Path(config["site_dir"]))
    if found:
        raise PluginError("the site loads assets from the network (it must read offline):\n" + "\n".join(found[:20]))
