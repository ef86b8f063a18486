"""The documents a user reads describe the product by version, date and commit, never by rounds of work."""

from __future__ import annotations

import re

import pytest

import anchorlens
from tests.conftest import REPO

# "session 3", "session-4 code", "sessions 5 and 6": how the code was built, which a reader cannot place.
WORK_ROUNDS = re.compile(
    r"\bsessions?[- ](\d+|one|two|three)\b|\bround \d+ of (the )?work\b|\bthis (round|session)\b", re.I
)
DOCS = ["CHANGELOG.md"]  # README.md joins once its rewrite lands (issue 30)


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
