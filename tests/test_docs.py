"""The documents a user reads describe the product by version, date and commit, never by rounds of work, and
every file, figure and section they point to exists."""

from __future__ import annotations

import re

import pytest

import anchorlens
from anchorlens.models.verified import VERIFIED, verified_table
from tests.conftest import REPO

# "session 3", "session-4 code", "sessions 5 and 6": how the code was built, which a reader cannot place.
WORK_ROUNDS = re.compile(
    r"\bsessions?[- ](\d+|one|two|three)\b|\bround \d+ of (the )?work\b|\bthis (round|session)\b", re.I
)
DOCS = ["README.md", "CHANGELOG.md"]


@pytest.mark.parametrize("name", DOCS)
def test_documents_name_versions_not_rounds_of_work(name):
    text = (REPO / name).read_text()
    hits = [m.group(0) for m in WORK_ROUNDS.finditer(text)]
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
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _outside_code_blocks(text: str) -> str:
    """The markdown text without its fenced code blocks (a shell line may look like a link)."""
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)


@pytest.mark.parametrize("name", DOCS)
def test_every_link_image_and_named_file_exists(name):
    text = (REPO / name).read_text()
    prose = _outside_code_blocks(text)
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", prose, re.M)}
    missing = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        if path and not (REPO / path).exists():
            missing.append(target)
        elif not path and fragment not in anchors:
            missing.append(target)
    missing += [p for p in REPO_PATH.findall(text) if not (REPO / p).exists()]
    assert not missing, f"{name} points to what does not exist: {missing}"


def test_readme_models_block_is_what_anchorlens_models_prints():
    """The README's model table is generated: `anchorlens models` output, verbatim, between the markers."""
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- models:begin -->\n", 1)[1].split("\n<!-- models:end -->", 1)[0]
    assert block == verified_table(), "regenerate the README block with `anchorlens models`"
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
