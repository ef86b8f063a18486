"""A user's own experiment end to end on a tiny base: a task file and a CSV, few-shot, plain text from parquet;
the run's roles reach metrics.parquet, the manifests, figures, ``flow`` and ``inspect``."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.cli import app

runner = CliRunner()
TINY = ["--base", "tiny-llama"]
TASK = """\
name = "reviews"
description = "Sentiment of a product review"
template = [
  { text = "### Review\\n", role = "scaffold" },
  { field = "text" },
  { text = "\\nSentiment:" },
]
labels = { positive = " good", negative = " bad" }
label_field = "stars"

[roles]
punct = '^\\s*[^\\w\\s]+\\s*$'
"""
POSITIVE = ["a great film, truly.", "loved it! wonderful acting.", "a joy to watch; superb."]
NEGATIVE = ["boring plot, sadly.", "terrible: a waste of time.", "awful pacing. dull."]


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    d = tmp_path_factory.mktemp("own")
    (d / "reviews.toml").write_text(TASK)
    with (d / "reviews.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["review_body", "stars"])
        for i in range(12):
            w.writerow([(POSITIVE if i % 2 else NEGATIVE)[i % 3], "positive" if i % 2 else "negative"])
    return d


def _data(d):
    return ["--task", d / "reviews.toml", "--data", d / "reviews.csv", "--field-map", "text=review_body"]


def test_capture_compare_evaluate_figures_and_flow_on_a_users_task(experiment):
    d = experiment
    r = run("capture", "--ckpt", "instance", *TINY, *_data(d), "--out", d / "cap", "--no-progress")
    assert r.exit_code == 0, r.output
    metrics = pd.read_parquet(d / "cap" / "metrics.parquet")
    flow = metrics[metrics["metric"] == "role_flow"]
    assert {"scaffold", "punct", "content", "structural", "instance"} <= set(flow["key_role"])
    assert {"scaffold", "punct"} <= set(flow["query_role"])
    manifest = json.loads((d / "cap" / "manifest.json").read_text())
    assert manifest["roles"]["names"][6:] == ["scaffold", "punct"]
    assert manifest["roles"]["added"]["scaffold"] == "task reviews"
    assert manifest["task_source"]["name"] == "reviews" and manifest["task_source"]["source"].endswith("reviews.toml")
    assert manifest["task_source"]["fields"] == ["text"] and manifest["task_source"]["label_field"] == "stars"
    assert manifest["task_source"]["labels"] == [["positive", " good"], ["negative", " bad"]]
    assert manifest["data_facts"]["field_map"] == {"text": "review_body"} and manifest["n_examples"] == 12

    r = run("compare", "--ckpt", "base", "--ckpt", "instance", *TINY, *_data(d), "--out", d / "cmp")
    assert r.exit_code == 0, r.output
    cmp_metrics = pd.read_parquet(d / "cmp" / "metrics.parquet")
    decomposition = cmp_metrics[cmp_metrics["metric"] == "decomposition"]
    assert {"scaffold", "punct"} <= set(decomposition["key_role"])
    assert (d / "cmp" / "figures" / "role_flow.png").is_file()
    headline = pd.read_csv(d / "cmp" / "headline.csv")
    parts = headline[(headline["metric"] == "decomposition") & (headline["stack"] == "decoder")]
    assert {"input → scaffold (sink excluded)", "input → punct (sink excluded)"} <= set(parts["label"])
    for _, rows in parts.groupby("checkpoint"):  # with the task's own roles the parts of input attention sum to 1
        assert rows["mean"].fillna(0).sum() == pytest.approx(1.0, abs=1e-4)

    r = run("flow", d / "cmp", "--queries", "content", "--checkpoint", "instance")
    assert r.exit_code == 0, r.output
    header = r.output.splitlines()[1].split()
    assert header[:2] == ["key", "role"] and {"scaffold", "punct", "instance"} <= set(header)
    assert "soft_prompt" not in header and "capsule" not in header  # roles the run has not got are left out

    r = run("evaluate", "--ckpt", "base", *TINY, *_data(d))
    assert r.exit_code == 0, r.output
    assert "base on reviews: accuracy" in r.output and "(n=12)" in r.output

    r = run("figures", d / "cmp", "--out", d / "figs")
    assert r.exit_code == 0, r.output
    assert {"role_flow.png", "layer_curves.png", "attention_maps.png"} <= {p.name for p in (d / "figs").iterdir()}


def test_the_figures_of_a_users_task_name_its_roles(experiment, tmp_path):
    """The role-flow and attention-map figures of the compare run, read back from SVG text, carry the task's own
    roles (scaffold from its template, punct from its rule) beside the built-ins the run has."""
    from anchorlens.reports.comparison import comparison_figures, load_comparison
    from tests.figures.runs import saved_texts

    if not (experiment / "cmp" / "metrics.parquet").is_file():
        pytest.skip("needs the compare run of test_capture_compare_evaluate_figures_and_flow_on_a_users_task")
    figures = {stem: fig for stem, _, fig in comparison_figures(load_comparison(experiment / "cmp"))}
    flow = saved_texts(figures["role_flow"], tmp_path / "flow.svg")
    assert {"scaffold", "punct", "content", "structural", "instance"} <= set(flow)
    assert "soft_prompt" not in flow and "capsule" not in flow  # roles the run has not got are not drawn
    maps = " ".join(saved_texts(figures["attention_maps"], tmp_path / "maps.svg"))
    assert "scaffold" in maps and "punct" in maps


def test_few_shot_runs_show_demo_roles(experiment):
    d = experiment
    r = run(
        "capture",
        "--ckpt",
        "base",
        *TINY,
        *_data(d),
        "--shots",
        "2",
        "--shots-seed",
        "1",
        "--out",
        d / "shots",
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    flow = pd.read_parquet(d / "shots" / "metrics.parquet", filters=[("metric", "==", "role_flow")])
    assert {"demo", "demo_label"} <= set(flow["query_role"])
    manifest = json.loads((d / "shots" / "manifest.json").read_text())
    assert manifest["prompt"]["shots"] == 2 and manifest["prompt"]["seed"] == 1
    r = run("capture", "--ckpt", "base", *TINY, *_data(d), "--shots", "20", "--out", d / "too-many")
    assert r.exit_code == 2 and "--shots 20 needs 20 labelled demonstrations" in r.output
    assert not (d / "too-many").exists()


def test_plain_text_corpus_from_parquet(tmp_path):
    docs = [f"Document {i}. It has a sentence, and another one!\nA new line follows." * (1 + i % 3) for i in range(40)]
    pd.DataFrame({"text": docs}).to_parquet(tmp_path / "corpus.parquet")
    r = run("capture", "--ckpt", "base", *TINY, "--task", "text", "--data", tmp_path / "corpus.parquet",
            "--max-length", "24", "--out", tmp_path / "text", "--no-progress")  # fmt: skip
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "text" / "manifest.json").read_text())
    assert manifest["n_examples"] > 40  # windows, not documents
    flow = pd.read_parquet(tmp_path / "text" / "metrics.parquet", filters=[("metric", "==", "role_flow")])
    assert {"newline", "punct", "content"} <= set(flow["query_role"])
    r = run("evaluate", "--ckpt", "base", *TINY, "--task", "text", "--data", tmp_path / "corpus.parquet")
    assert r.exit_code == 2 and "task text has no labels" in r.output


def test_chat_without_a_chat_template_is_one_line(experiment):
    r = run("capture", "--ckpt", "base", *TINY, *_data(experiment), "--chat", "--out", experiment / "chat")
    assert r.exit_code == 2 and "has no chat template; drop --chat" in r.output
    assert not (experiment / "chat").exists()


def test_inspect_takes_a_task_file_and_names_its_roles(experiment, tiny_base):
    import anchorlens as al

    view = al.inspect(
        "instance", {"text": "a joy to watch; superb."}, task=experiment / "reviews.toml", base=tiny_base("tiny-llama")
    )
    sm = view.maps[view.maps.default_stack]
    names = {sm.role_name(r) for r in sm.k_roles.tolist()}
    assert {"scaffold", "punct", "content", "instance"} <= names
    metrics = view.metrics()
    assert "scaffold" in set(metrics["key_role"]) and "roles: special" in view.summary()
    text_view = al.inspect("base", "One line.\nAnother, here.", base=tiny_base("tiny-llama"))
    assert {"newline", "punct"} <= {
        text_view.maps["decoder"].role_name(r) for r in text_view.maps["decoder"].k_roles.tolist()
    }


def test_evaluate_refuses_data_without_the_tasks_group_field_before_running(experiment, tmp_path):
    grouped = tmp_path / "grouped.toml"
    grouped.write_text(TASK.replace("[roles]", 'metrics = ["accuracy", "em"]\ngroup_field = "qid"\n\n[roles]'))
    args = ["--task", grouped, "--data", experiment / "reviews.csv", "--field-map", "text=review_body"]
    r = run("evaluate", "--ckpt", "base", *TINY, *args, "--out", tmp_path / "ev")
    assert r.exit_code == 2 and "missing field 'qid': task reviews groups its examples by it" in r.output
    assert r.output.count("\n") == 1 and not (tmp_path / "ev").exists()


def test_a_querys_demonstrations_do_not_depend_on_the_limit(experiment):
    from anchorlens.models.tiny_tokenizers import tiny_tokenizer
    from anchorlens.tasks.prompts import PromptOptions
    from anchorlens.workflows.inputs import resolve_inputs

    tok, options = tiny_tokenizer("llama"), PromptOptions(shots=3)
    args = dict(field_map="text=review_body", prompt=options)
    whole = resolve_inputs(experiment / "reviews.toml", experiment / "reviews.csv", **args)
    first = resolve_inputs(experiment / "reviews.toml", experiment / "reviews.csv", 2, **args)
    assert len(first.examples) == 2 and len(whole.examples) == 12
    for i in range(2):  # the same prompt text with --limit 2 as in the whole run, drawn from all 12 rows
        assert first.prompts(tok).render(first.examples[i]).text == whole.prompts(tok).render(whole.examples[i]).text
    # --shots 3 with --limit 2 works: the demonstrations come from the whole file, not from the 2 queries
    assert len(first.prompts(tok).demos.draw(first.examples[0])) == 3
