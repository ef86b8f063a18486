"""Verbalizer scoring for decoder and encoder-decoder bases, truncation and the predictions table."""

from __future__ import annotations

import pytest
import torch

from anchorlens.evaluation import predict, scoring_batch, verbalizer_ids
from anchorlens.evaluation.rows import Row, fit_row
from anchorlens.roles.kinds import Role
from anchorlens.tasks import bundled_examples, get_task


def test_verbalizers_share_a_prefix_and_differ_after_it(tiny_base):
    base = tiny_base("tiny-llama")
    copa = verbalizer_ids(base.tokenizer, get_task("copa"))  # " 1" / " 2" -> [" ", "1"] / [" ", "2"]
    assert len(copa.shared) == 1 and len(set(copa.choice)) == 2
    rte = verbalizer_ids(base.tokenizer, get_task("rte"))
    yes, no = (tuple(base.tokenizer(w, add_special_tokens=False)["input_ids"]) for w in (" yes", " no"))
    assert rte.shared == () and rte.choice == (yes[0], no[0]) and rte.plain == (yes, no)


def test_decoder_scores_are_log_probs_at_the_answer_token(tiny_base):
    base = tiny_base("tiny-llama")
    task = get_task("copa")
    examples = bundled_examples("copa", limit=3)
    verb = verbalizer_ids(base.tokenizer, task)
    batch = scoring_batch(base, task, examples, verb)
    for b in range(len(examples)):  # the answer position holds the shared prefix token, right after "answer:"
        pos = int(batch.answer_pos[b])
        assert batch.encoded.input_ids[b, pos] == verb.shared[-1]
        assert batch.encoded.tokens[b][pos - 1] == ":" and batch.encoded.attention_mask[b, pos + 1 :].sum() == 0
    df = predict(base, examples, task, batch_size=2, scoring="first_token")  # the default sums " " + "1" too
    logits = base.forward(batch.encoded).logits
    for b in range(len(examples)):
        logp = torch.log_softmax(logits[b, int(batch.answer_pos[b])], -1)
        assert df.loc[b, "score_0"] == pytest.approx(float(logp[verb.choice[0]]), abs=1e-5)
        assert df.loc[b, "score_1"] == pytest.approx(float(logp[verb.choice[1]]), abs=1e-5)


def test_t5_scores_sum_the_target_log_likelihood(tiny_base):
    base = tiny_base("tiny-t5")
    task = get_task("cb")  # " maybe" is several tokens in the tiny tokenizer
    ex = bundled_examples("cb", limit=2)
    verb = verbalizer_ids(base.tokenizer, task)
    df = predict(base, ex, task)
    for b, example in enumerate(ex):
        enc = base.encode([task.template.render(example)])
        for label, target in zip(task.labels, verb.targets):
            enc.target_ids = torch.tensor([[base.config.decoder_start_token_id, *target[:-1]]])
            enc.target_mask = torch.ones_like(enc.target_ids)
            enc.target_roles = torch.zeros_like(enc.target_ids)
            logp = torch.log_softmax(base.forward(enc).logits[0], -1)
            want = sum(float(logp[i, t]) for i, t in enumerate(target))
            assert df.loc[b, f"score_{label}"] == pytest.approx(want, abs=1e-4)


def test_fit_row_cuts_the_longest_field_and_keeps_the_template_end():
    roles = (
        [Role.SPECIAL]
        + [Role.STRUCTURAL]
        + [Role.CONTENT] * 6
        + [Role.STRUCTURAL]
        + [Role.CONTENT] * 2
        + [Role.STRUCTURAL] * 2
    )
    fields = ["", "premise:"] + ["premise"] * 6 + ["h:"] + ["hypothesis"] * 2 + ["answer", ":"]
    row = Row(list(range(len(roles))), [int(r) for r in roles], fields, [str(i) for i in range(len(roles))])
    cut = fit_row(row, 9)
    assert len(cut.ids) == 9
    assert cut.ids[-2:] == row.ids[-2:] and cut.ids[0] == 0
    assert cut.fields.count("premise") == 2 and cut.fields.count("hypothesis") == 2
    with pytest.raises(ValueError):
        fit_row(row, 4)


def test_long_inputs_are_cut_to_max_length(tiny_base):
    base = tiny_base("tiny-llama")
    task = get_task("boolq")
    ex = [dict(bundled_examples("boolq", limit=1)[0], passage="word " * 300)]
    batch = scoring_batch(base, task, ex, verbalizer_ids(base.tokenizer, task, "first_token"), max_length=40)
    assert batch.encoded.input_ids.shape[1] == 40
    assert batch.encoded.tokens[0][-2:] == ["answer", ":"]
    cb = get_task("cb")  # " maybe" is several tokens here: each label a row, prompt + answer
    verb = verbalizer_ids(base.tokenizer, cb)
    long_cb = [dict(bundled_examples("cb", limit=1)[0], premise="word " * 300)]
    batch = scoring_batch(base, cb, long_cb, verb, max_length=40)
    assert batch.per_row and batch.encoded.input_ids.shape[1] == 40
    maybe = len(verb.plain[2])  # the longest answer's row fills the 40 positions: input cut to 40 - its length
    assert maybe > 1 and batch.encoded.tokens[2][-maybe - 2 : -maybe] == ["answer", ":"]


def test_predict_table_columns(tiny_base):
    df = predict(tiny_base("tiny-gpt2"), bundled_examples("rte", limit=5), "rte", batch_size=2)
    assert list(df.columns) == [
        "idx", "label", "pred", "score_entailment", "score_not_entailment", "correct", "pred_norm", "correct_norm"
    ]  # fmt: skip
    assert len(df) == 5 and df["correct"].dtype == bool


def test_evaluation_takes_guided_models_only(tiny_base):
    from types import SimpleNamespace

    from anchorlens.evaluation.model import as_model
    from anchorlens.methods import GuidedModel, load_guided

    base = tiny_base("tiny-llama")
    plain = as_model(base)
    assert isinstance(plain, GuidedModel) and plain.base is base and plain.num_trainable() == 0
    guided = load_guided("instance", base)
    assert as_model(guided) is guided
    with pytest.raises(TypeError, match="expected a Base or a GuidedModel"):  # duck typing used to pass this through
        as_model(SimpleNamespace(base=base, forward=base.forward))
    examples = bundled_examples("rte", limit=3)
    a = predict(base, examples, get_task("rte"), batch_size=2)
    b = predict(load_guided("base", base), examples, get_task("rte"), batch_size=2)
    pd_cols = [c for c in a.columns if c.startswith("score_")]
    assert (a[pd_cols].to_numpy() == b[pd_cols].to_numpy()).all()
