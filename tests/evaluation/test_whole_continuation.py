"""Whole-continuation scoring (lm-evaluation-harness acc / acc_norm) against the HF model run on prompt + answer."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from anchorlens.evaluation import predict, scoring_batch, task_metrics, verbalizer_ids
from anchorlens.evaluation.effects import example_effects
from anchorlens.evaluation.model import as_model
from anchorlens.evaluation.rows import split_rows, strip_trailing_specials
from anchorlens.evaluation.scoring import label_scores
from anchorlens.tasks import bundled_examples, get_task
from anchorlens.training.losses import classification_loss, dataset_loss


def reference_loglik(base, task, example, answer: str) -> float:
    """log p(answer | prompt) summed over the answer's tokens, from the HF model on prompt + answer token ids."""
    enc = base.encode([task.template.render(example)])
    prompt = strip_trailing_specials(split_rows(enc)[0]).ids
    cont = base.tokenizer(answer, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + cont])
    with torch.no_grad():
        logits = base.model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(cont))


@pytest.mark.parametrize("name", ["cb", "copa", "rte"])
def test_sum_scores_match_the_model_on_prompt_plus_answer(tiny_base, name):
    base = tiny_base("tiny-llama")
    task = get_task(name)  # cb: " maybe" is 4 tokens; copa: " 1"/" 2" share " "; rte: " yes" is 2 tokens here
    examples = bundled_examples(name, limit=3)
    df = predict(base, examples, task, batch_size=2)
    for b, ex in enumerate(examples):
        want = {label: reference_loglik(base, task, ex, v) for label, v in zip(task.labels, task.verbalizers)}
        for label, value in want.items():
            assert df.loc[b, f"score_{label}"] == pytest.approx(value, abs=1e-5)
        assert df.loc[b, "pred"] == max(want, key=want.get)
        norm = {label: value / len(v) for (label, value), v in zip(want.items(), task.verbalizers)}
        assert df.loc[b, "pred_norm"] == max(norm, key=norm.get)


def test_sum_scores_with_left_padding_and_guidance(tiny_base):
    from anchorlens.methods import load_guided

    base = tiny_base("tiny-llama")
    task = get_task("cb")
    examples = bundled_examples("cb", limit=4)
    plain = predict(base, examples, task, batch_size=4)
    one = predict(base, examples, task, batch_size=1)  # no padding
    cols = [c for c in plain if c.startswith("score_")]
    assert plain[cols].to_numpy() == pytest.approx(one[cols].to_numpy(), abs=1e-5)
    soft = load_guided("prompt", base)  # inserted positions: logits read at the right places
    guided = predict(soft, examples, task, batch_size=2)
    single = predict(soft, examples[:1], task, batch_size=1)
    assert guided[cols].to_numpy()[:1] == pytest.approx(single[cols].to_numpy(), abs=1e-5)


def test_single_token_verbalizers_keep_their_numbers(tiny_base):
    """Verbalizers of one token each (as " yes"/" no" are for SmolLM2): sum == first token, bit for bit."""
    base = tiny_base("tiny-llama")
    tok = base.tokenizer
    words = [w for w in (" no", " the", " a", " and") if len(tok(w, add_special_tokens=False)["input_ids"]) == 1]
    assert len(words) >= 2
    task = replace(get_task("rte"), verbalizers=tuple(words[:2]))
    examples = bundled_examples("rte", limit=4)
    a = predict(base, examples, task, batch_size=2)
    b = predict(base, examples, task, batch_size=2, scoring="first_token")
    cols = [c for c in a if c.startswith("score_")]
    assert (a[cols].to_numpy() == b[cols].to_numpy()).all()
    assert (a["pred"] == b["pred"]).all()


def test_first_token_stays_a_named_option(tiny_base):
    base = tiny_base("tiny-llama")
    task = get_task("cb")
    examples = bundled_examples("cb", limit=2)
    verb = verbalizer_ids(base.tokenizer, task, "first_token")
    batch = scoring_batch(base, task, examples, verb)
    logits = base.forward(batch.encoded).logits
    df = predict(base, examples, task, scoring="first_token")
    for b in range(len(examples)):
        logp = torch.log_softmax(logits[b, int(batch.answer_pos[b])], -1)
        for label, choice in zip(task.labels, verb.choice):
            assert df.loc[b, f"score_{label}"] == pytest.approx(float(logp[choice]), abs=1e-5)
    with pytest.raises(Exception, match="scoring must be one of"):
        verbalizer_ids(base.tokenizer, task, "mean")


def test_label_nll_loss_and_effects_use_the_whole_answer(tiny_base):
    base = tiny_base("tiny-llama")
    task = get_task("cb")
    examples = [ex for ex in bundled_examples("cb", limit=8) if ex.get("label") is not None][:4]
    df = predict(base, examples, task)
    metrics = task_metrics(df, task, n_boot=50)
    gold = [-reference_loglik(base, task, ex, task.verbalizer(ex["label"])) for ex in examples]
    assert metrics["label_nll"] == pytest.approx(sum(gold) / len(gold), abs=1e-5)
    assert metrics["acc_norm"] == pytest.approx(df["correct_norm"].mean())
    model = as_model(base)
    verb = verbalizer_ids(base.tokenizer, task)
    batch = scoring_batch(base, task, examples, verb)
    scores = label_scores(model, batch, verb)
    want = classification_loss(scores, batch.labels)
    assert dataset_loss(base, examples, task, batch_size=3) == pytest.approx(float(want), abs=1e-5)
    ref = torch.tensor([[reference_loglik(base, task, ex, v) for v in task.verbalizers] for ex in examples])
    assert float(want) == pytest.approx(float(torch.nn.functional.cross_entropy(ref, batch.labels)), abs=1e-5)
    effects = example_effects({"base": model}, examples, task, task.template, batch_size=2)
    nll = effects[effects["metric"] == "nll"]["value"].tolist()
    assert nll == pytest.approx(gold, abs=1e-5)


def test_training_gradients_flow_through_label_rows(tiny_base):
    from anchorlens.methods import load_guided

    base = tiny_base("tiny-llama")
    task = get_task("cb")
    examples = [ex for ex in bundled_examples("cb", limit=6) if ex.get("label") is not None][:2]
    soft = load_guided("prompt", base)
    verb = verbalizer_ids(base.tokenizer, task)
    batch = scoring_batch(base, task, examples, verb)
    assert batch.per_row
    loss = classification_loss(label_scores(soft, batch, verb), batch.labels)
    loss.backward()
    grads = [p.grad for p in soft.trainable_parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_t5_first_token_scores_up_to_the_distinguishing_token(tiny_base):
    base = tiny_base("tiny-t5")
    task = get_task("cb")
    example = bundled_examples("cb", limit=1)[0]
    verb = verbalizer_ids(base.tokenizer, task, "first_token")
    df = predict(base, [example], task, scoring="first_token")
    enc = base.encode([task.template.render(example)])
    for label, target in zip(task.labels, verb.targets):
        enc.target_ids = torch.tensor([[base.config.decoder_start_token_id, *target[:-1]]])
        enc.target_mask = torch.ones_like(enc.target_ids)
        enc.target_roles = torch.zeros_like(enc.target_ids)
        with torch.no_grad():
            logp = torch.log_softmax(base.forward(enc).logits[0], -1)
        upto = len(verb.shared) + 1
        want = sum(float(logp[i, t]) for i, t in enumerate(target[:upto]))
        assert df.loc[0, f"score_{label}"] == pytest.approx(want, abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rte", "boolq"])
def test_builtin_yes_no_tasks_keep_their_numbers_on_smollm2(smollm2, name):
    """ " yes"/" no" are one token each for SmolLM2: the default (sum) scores equal first-token scores exactly."""
    task = get_task(name)
    verb = verbalizer_ids(smollm2.tokenizer, task)
    assert verb.one_pass and verb.shared == () and all(len(p) == 1 for p in verb.plain)
    examples = bundled_examples(name, limit=3)
    a = predict(smollm2, examples, task, batch_size=3)
    b = predict(smollm2, examples, task, batch_size=3, scoring="first_token")
    cols = [c for c in a if c.startswith("score_")]
    assert (a[cols].to_numpy() == b[cols].to_numpy()).all() and (a["pred"] == b["pred"]).all()


@pytest.mark.parametrize("spec", ["instance", "capsule", "prompt:pos=last"])
def test_guidance_that_would_see_the_appended_answer_never_reads_it(tiny_base, spec):
    """Label rows append each answer to the input: an instance token or capsule would average it in (the label would
    leak into its own score) and a guidance after the input would follow it. ``auto`` scores such a run by the first
    distinguishing token (every model of the run alike, recorded); forcing ``sum`` is one line, never a number."""
    from anchorlens.errors import UsageError
    from anchorlens.evaluation.effects import example_effects
    from anchorlens.methods import load_guided

    base = tiny_base("tiny-llama")
    task = get_task("cb")  # " maybe" is several tokens on tiny-llama: one row per label under sum scoring
    examples = bundled_examples("cb", limit=2)
    guided = load_guided(spec, base)
    with pytest.raises(UsageError, match="appends each answer to the input") as info:
        predict(guided, examples, task, batch_size=2, scoring="sum")
    assert "\n" not in str(info.value)
    auto = predict(guided, examples, task, batch_size=2)
    first = predict(guided, examples, task, batch_size=2, scoring="first_token")
    assert auto.attrs["scoring"] == "first_token" and auto.equals(first)
    assert predict(load_guided("prompt", base), examples, task, batch_size=2).attrs["scoring"] == "sum"  # prompt first
    models = {"base": load_guided("base", base), "guided": guided}  # one scoring for every model of a run
    rows = example_effects(models, examples, task, task.template, batch_size=2)
    plain = predict(base, examples, task, batch_size=2, scoring="first_token")
    nll = rows[(rows.checkpoint == "base") & (rows.metric == "nll")]["value"].to_numpy()
    want = [-plain.loc[i, f"score_{plain.loc[i, 'label']}"] for i in range(len(plain))]
    assert nll == pytest.approx(want, abs=1e-5)
