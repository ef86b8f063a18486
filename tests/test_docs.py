"""The documents a user reads describe the product by version, date and commit, never by rounds of work; every
file, figure, page and section they point to exists; every command they show is one the CLI accepts; and the
docs site reaches every page, lists every public name and loads nothing from the network."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

import anchorlens
from anchorlens.models.verified import VERIFIED, verified_table
from tests.conftest import REPO

# "session 3", "session-4 code", "sessions 5 and 6": how the code was built, which a reader cannot place.
WORK_ROUNDS = re.compile(
    r"\bsessions?[- ](\d+|one|two|three)\b|\bround \d+ of (the )?work\b|\bthis (round|session)\b", re.I
)
ROOT_DOCS = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"]
SITE = REPO / "docs"
PAGES = sorted(str(p.relative_to(REPO)) for p in SITE.rglob("*.md"))
TUTORIALS = sorted(str(p.relative_to(REPO)) for p in (SITE / "tutorials").glob("*.ipynb"))
DOCS = ROOT_DOCS + PAGES
README_MAX_LINES = 250


def _hook():
    """The docs build's hook module (its generators and checks), loaded from its file."""
    path = SITE / "hooks" / "anchorlens_docs.py"
    spec = importlib.util.spec_from_file_location("anchorlens_docs_hook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _text(name: str) -> str:
    """A document's text; a notebook's markdown and code cells joined (what its page shows besides outputs)."""
    path = REPO / name
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells)
    return path.read_text()


@pytest.mark.parametrize("name", DOCS + TUTORIALS)
def test_documents_name_versions_not_rounds_of_work(name):
    hits = [m.group(0) for m in WORK_ROUNDS.finditer(_text(name))]
    assert not hits, f"{name} names rounds of work: {hits[:5]}"


def test_changelog_lists_the_current_version():
    text = (REPO / "CHANGELOG.md").read_text()
    assert re.search(
        rf"^## \[{re.escape(anchorlens.__version__)}\] — \d{{4}}-\d{{2}}-\d{{2}} \(commit `[0-9a-f]{{7,}}`\)$",
        text,
        re.M,
    )


# [text](target) and ![alt](target); a target may end in "#fragment" or carry a "title".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# `anchorlens/...`, `tests/...`: files of this repository the text names in code spans.
REPO_PATH = re.compile(r"`((?:anchorlens|tests|benchmarks|examples|docs)/[^`\s]*)`")


def _slug(heading: str) -> str:
    """GitHub's (and MkDocs') anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _outside_code_blocks(text: str) -> str:
    """The markdown text without its fenced code blocks (a shell line may look like a link)."""
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)


def _site_page(path: Path) -> bool:
    """Whether a link target is a page of the built site: a markdown page, a tutorial, or a generated page."""
    if path.suffix == ".md" and path.parent == SITE and path.name == "contributing.md":
        return True  # generated from CONTRIBUTING.md
    if path.suffix == ".md" and path.parent == SITE / "tutorials":
        return path.stem in _hook().tutorials()
    return path.exists()


@pytest.mark.parametrize("name", DOCS)
def test_every_link_image_and_named_file_exists(name):
    text = (REPO / name).read_text()
    prose = _outside_code_blocks(text)
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", prose, re.M)}
    in_site = name.startswith("docs/")
    here = (REPO / name).parent
    missing = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        if not path:
            if fragment not in anchors:
                missing.append(target)
            continue
        resolved = (here / path).resolve()
        if in_site and not resolved.is_relative_to(SITE):
            missing.append(f"{target} (outside docs/: the site cannot link it)")
        elif not _site_page(resolved):
            missing.append(target)
    missing += [p for p in REPO_PATH.findall(text) if not (REPO / p).exists()]
    assert not missing, f"{name} points to what does not exist: {missing}"


MODELS_PAGE = "docs/reference/models.md"


def test_models_block_is_what_anchorlens_models_prints():
    """The verified-models table is generated: `anchorlens models` output, verbatim, between the markers."""
    text = (REPO / MODELS_PAGE).read_text()
    block = text.split("<!-- models:begin -->\n", 1)[1].split("\n<!-- models:end -->", 1)[0]
    assert block == verified_table(), f"regenerate the block in {MODELS_PAGE} with `anchorlens models`"
    assert len(block.splitlines()) == len(VERIFIED) + 2


def test_readme_opens_with_the_two_fresh_clone_commands_and_the_figure_before_other_commands():
    text = (REPO / "README.md").read_text()
    first_block = re.search(r"^```bash\n(.*?)^```", text, re.M | re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    rest = text[first_block.end() :]
    assert rest.index("## What anchorlens measures") < rest.index("```")
    assert rest.index("docs/figures/anchor-effect.png") < rest.index("```")


def test_readme_fits_on_a_screen_or_two_and_links_into_the_docs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {str((REPO / t.partition("#")[0]).resolve().relative_to(REPO)) for t in LINK.findall(text)}
    for section in ("getting-started.md", "reference/cli.md", "reference/api.md", "performance.md"):
        assert f"docs/{section}" in linked, f"the README does not link docs/{section}"


# ------------------------------------------------------------------------------------- commands in the docs
@cache
def _cli():
    import typer

    from anchorlens.cli import app

    return typer.main.get_command(app)


def _commands(text: str) -> list[str]:
    """Every `anchorlens ...` command line of the bash blocks (continuations joined, shell variables set in the
    block substituted), and every `!anchorlens ...` line of a notebook's code."""
    found = []
    for block in re.findall(r"^ *```bash\n(.*?)^ *```", text, re.M | re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        variables: dict[str, str] = {}
        for line in joined.splitlines():
            line = line.strip()
            assign = re.match(r'^([A-Z_]+)="(.*)"$', line)
            if assign:
                variables[assign.group(1)] = assign.group(2)
                continue
            for var, value in variables.items():
                line = line.replace(f"${var}", value)
            if re.match(r"^anchorlens\b", line) or " -m anchorlens " in line:
                found.append(re.sub(r"\s+", " ", line))
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if line.startswith("!anchorlens "):
            found.append(re.sub(r"\s+", " ", line[1:]))
    return found


def _check_command(line: str) -> str | None:
    """None when the CLI accepts the command's words and option names, else what is wrong."""
    words = shlex.split(line, comments=True)
    words = words[words.index("anchorlens") + 1 :]
    command, path = _cli(), ["anchorlens"]
    while words and not words[0].startswith("-") and hasattr(command, "list_commands"):
        sub = command.get_command(command.context_class(command), words[0])
        if sub is None:
            return f"{' '.join(path)} has no command {words[0]!r}"
        command, path, words = sub, [*path, words[0]], words[1:]
    names = {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in names]
    return f"{' '.join(path)} has no option {unknown[0]}" if unknown else None


@pytest.mark.parametrize("name", DOCS + TUTORIALS)
def test_every_command_in_the_docs_is_one_the_cli_accepts(name):
    commands = _commands(_text(name))
    wrong = [f"{line!r}: {why}" for line in commands if (why := _check_command(line))]
    assert not wrong, f"{name}: " + "; ".join(wrong)


def test_the_command_check_catches_unknown_commands_and_options():
    assert _check_command("anchorlens compare --ckpt base --out runs/x") is None
    assert _check_command("torchrun --nproc-per-node 4 -m anchorlens capture --ckpt base --limit 8") is None
    assert "no command 'comapre'" in _check_command("anchorlens comapre --ckpt base")
    assert "no option --ckpts" in _check_command("anchorlens compare --ckpts base")
    assert "no option --window" in _check_command("anchorlens sweep instance --window 5")
    assert _commands('```bash\nT="--task x.toml"\nanchorlens tasks $T \\\n  --n 2\n```\n') == [
        "anchorlens tasks --task x.toml --n 2"
    ]


# ------------------------------------------------------------------------------------------------ the site
def _nav_pages(entries) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_navigation_and_every_nav_entry_exists():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav))
    pages = {str(Path(p).relative_to("docs")) for p in PAGES} | {"contributing.md"}
    pages |= {f"tutorials/{name}.md" for name in _hook().tutorials()}
    assert set(nav) == pages, f"not in nav: {sorted(pages - set(nav))}; in nav, no page: {sorted(set(nav) - pages)}"


def test_site_builds_strict_offline_and_executes_the_tutorials():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["strict"] is True and config["theme"]["font"] is False
    assert config["hooks"] == ["docs/hooks/anchorlens_docs.py"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^docs: .*\n\t.*mkdocs build --strict", makefile, re.M)
    assert "make docs" in (REPO / ".ci" / "run").read_text() or re.search(r"^test: .*\bdocs\b", makefile, re.M)


def test_api_reference_lists_every_public_name():
    text = (REPO / "docs" / "reference" / "api.md").read_text()
    listed = {name: module.rstrip(".") for module, name in re.findall(r"^::: ((?:\w+\.)+)(\w+)$", text, re.M)}
    public = set(anchorlens.__all__) - {"__version__"}
    assert set(listed) == public, f"missing {sorted(public - set(listed))}, extra {sorted(set(listed) - public)}"
    wrong = {n: m for n, m in listed.items() if anchorlens._EXPORTS[n] != m}
    assert not wrong, f"listed under another module than anchorlens exports them from: {wrong}"
    assert "`anchorlens.__version__`" in text


def test_cli_reference_covers_every_command():
    assert "<!-- cli-reference -->" in (REPO / "docs" / "reference" / "cli.md").read_text()
    text = _hook().cli_reference()
    titles = set(re.findall(r"^## `anchorlens ?(.*)`$", text, re.M))
    group = _cli()

    def names(command, prefix: str) -> set[str]:
        if not hasattr(command, "list_commands"):
            return set()
        out = set()
        for name in command.list_commands(command.context_class(command)):
            full = f"{prefix} {name}".strip()
            out |= {full} | names(command.get_command(command.context_class(command), name), full)
        return out

    assert titles == {""} | names(group, "")
    assert "Usage: anchorlens sweep knockout [OPTIONS]" in text and "--ckpt" in text


def test_tolerance_and_certificate_pages_hold_the_code_values():
    from anchorlens.analyses.tolerance import TOLERANCES
    from anchorlens.capture.certificate import THRESHOLDS

    table = _hook().tolerance_table()
    for kind, row in TOLERANCES.items():
        assert f"| `{kind}` | " + " | ".join(f"{v:g}" for v in row.values()) + " |" in table
    text = (REPO / "docs" / "reference" / "certificate.md").read_text()
    rows = dict(re.findall(r"^\| (float\d+|bfloat16) \| ([0-9.e-]+) \|$", text, re.M))
    assert {str(d).removeprefix("torch."): float(t) for d, t in THRESHOLDS.items()} == {
        d: float(t) for d, t in rows.items()
    }


def test_the_offline_check_finds_assets_from_the_network_and_not_links(tmp_path):
    (tmp_path / "a.html").write_text('<a href="https://example.org">a link</a><img src="data:image/png;base64,AA">')
    assert _hook().remote_assets(tmp_path) == []
    (tmp_path / "b.html").write_text('<script src="https://cdn.example.org/x.js"></script>')
    (tmp_path / "c.css").write_text("@import url('https://fonts.example.org/css');")
    (tmp_path / "d.html").write_text('<link rel="stylesheet" href="//cdn.example.org/x.css">')
    assert [f.split(":")[0] for f in _hook().remote_assets(tmp_path)] == ["b.html", "c.css", "d.html"]


def test_a_notebook_page_shows_code_then_its_outputs():
    import nbformat

    hook = _hook()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("print(1)")]
    nb.cells[1].outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="step 1/2\rstep 2/2\n"),
        nbformat.v4.new_output("stream", name="stdout", text="\x1b[1mdone\x1b[0m\n"),
        nbformat.v4.new_output("execute_result", data={"text/html": "<table></table>", "text/plain": "T"}),
    ]
    page = hook.notebook_markdown(nb)
    assert page.index("# Title") < page.index("```python\nprint(1)\n```") < page.index("```text\nstep 2/2\ndone\n```")
    token = re.findall(r"nboutput\d{4}x", page)[-1]
    assert hook._RAW[token] == '<div class="nb-output"><table></table></div>'
    rendered = hook.on_page_content(f"<p>{token}</p>", None, None, None)
    assert rendered == '<div class="nb-output"><table></table></div>'


# ---------------------------------------------------------------------------------------- packaging, citing
def test_citation_cites_this_version_and_the_capt_paper():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["version"] == anchorlens.__version__
    assert any("2510.16670" in json.dumps(ref) for ref in cff["references"])


def test_pyproject_has_project_urls_and_a_docs_extra():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # only addresses that exist: the paper (the project publishes no repository or site address yet)
    assert project["urls"] == {"Paper": "https://arxiv.org/abs/2510.16670"}
    docs = " ".join(project["optional-dependencies"]["docs"])
    assert "mkdocs-material" in docs and "mkdocstrings[python]" in docs and "nbclient" in docs


def test_a_tutorial_whose_command_fails_fails_the_build_unless_the_cell_expects_it():
    import nbformat

    hook = _hook()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("!anchorlens compare --ckpt nope")]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="error: unknown spec 'nope'\n")]
    with pytest.raises(hook.PluginError, match="cell 0: a command failed: error: unknown spec 'nope'"):
        hook._check_shell_errors(nb, Path("t.ipynb"))
    nb.cells[0].metadata["tags"] = ["expect-error"]
    hook._check_shell_errors(nb, Path("t.ipynb"))  # shown on purpose


def test_tutorials_tag_the_cells_that_show_an_error_on_purpose():
    tagged = []
    for name in TUTORIALS:
        for cell in json.loads((REPO / name).read_text())["cells"]:
            if "expect-error" in cell.get("metadata", {}).get("tags", []):
                tagged.append("".join(cell["source"]))
    assert tagged == ["!anchorlens tasks mytask.toml --data mydata.csv"]
