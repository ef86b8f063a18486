"""A compare run's report.html as a reader opens it, in headless Chromium with the network cut: it opens with the
summary and the headline table, no console error, no request leaves the page, its interactive view answers a hover,
and a screenshot is not blank. Skips where no Chromium is installed."""

from __future__ import annotations

import io
import json

import pytest

from tests.views.browser import Browser, chromium_or_skip


@pytest.fixture(scope="module")
def opened(compare_run):
    chromium_or_skip()
    with Browser() as browser:
        browser.open(compare_run / "report.html")
        yield browser


def test_the_report_opens_with_the_summary_then_the_headline_table(opened):
    headings = opened.eval("Array.from(document.querySelectorAll('h2'), h => h.textContent.trim())")
    assert headings[0] == "Summary"
    assert headings[1].startswith("Table 1:") and "attention goes" in headings[1]
    first_table = opened.eval("document.querySelector('table').textContent")
    assert "input → sink" in first_table and "entropy of input queries" in first_table


def test_the_report_loads_offline_without_errors_and_its_view_answers_a_hover(opened):
    roots = opened.eval("Object.keys(window.anchorlensViews || {})")
    assert len(roots) == 1, roots
    api = f"window.anchorlensViews[{json.dumps(roots[0])}]"
    opened.eval(f"{api}.ready()")
    token = f"#{roots[0]} .alv-tok[data-i='3']"
    opened.eval(f"document.querySelector({json.dumps(token)}).scrollIntoView({{block: 'center'}})")
    before = opened.eval(f"{api}.text()")
    opened.hover(*opened.center(token))
    assert opened.eval(f"{api}.state()")["focus"] == {"r": 3, "c": 3}
    assert opened.eval(f"{api}.text()") != before  # the text is now coloured by token 3's attention
    assert opened.errors == [], opened.errors
    assert opened.outside_requests == [], opened.outside_requests


def test_a_screenshot_of_the_report_is_not_blank(opened):
    from PIL import Image

    image = Image.open(io.BytesIO(opened.screenshot())).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50
