"""encode(): per-token roles and fields from character offsets, padding, truncation."""

from __future__ import annotations

import re

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from anchorlens.models.tiny_tokenizers import tiny_tokenizer
from anchorlens.roles import Encoded, Literal, Role, Template, encode, token_role
from anchorlens.roles.scheme import RoleScheme
from anchorlens.tasks import bundled_examples, get_task

S, T, C = Role.SPECIAL, Role.STRUCTURAL, Role.CONTENT
RTE = get_task("rte").template


def _rows(enc: Encoded, b: int = 0) -> list[tuple[str, Role, str]]:
    """(token, role, field) of the valid positions of example ``b``."""
    keep = enc.attention_mask[b].bool().tolist()
    return [(tok, Role(r), f) for tok, r, f, k in zip(enc.tokens[b], enc.roles[b].tolist(), enc.fields[b], keep) if k]


def _clean(token: str) -> str:
    """Token text without byte-level / metaspace / wordpiece markers and whitespace."""
    token = token.replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ")
    token = token[2:] if token.startswith("##") else token
    return re.sub(r"\s+", "", token)


def _regex_tokenizer(pieces: list[str], *, bos: bool = True, pad: bool = True) -> PreTrainedTokenizerFast:
    """Word-level tokenizer whose tokens are exactly ``pieces`` (matched leftmost-first)."""
    specials = (["<pad>"] if pad else []) + (["<s>"] if bos else []) + ["<unk>"]
    vocab = {p: i for i, p in enumerate(specials + pieces)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("|".join(re.escape(p) for p in pieces)), behavior="isolated")
    tok.add_special_tokens(specials)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    kwargs = {"unk_token": "<unk>"}
    if bos:
        kwargs["bos_token"] = "<s>"
    if pad:
        kwargs["pad_token"] = "<pad>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


# --- shipped templates with llama-style and bert-style tokenizers ---------------------------------


@pytest.mark.parametrize("style", ["llama", "bert"])
@pytest.mark.parametrize("name", ["rte", "cb", "boolq", "copa"])
def test_shipped_templates_split_into_structure_and_content(name, style):
    task = get_task(name)
    example = bundled_examples(name)[0]
    rendered = task.template.render(example)
    enc = encode([rendered], tiny_tokenizer(style))
    rows = _rows(enc)
    fold = str.lower if style == "bert" else (lambda s: s)

    # specials: BOS for llama; [CLS] ... [SEP] for bert; nothing else is special
    if style == "llama":
        assert rows[0] == ("<s>", S, "")
        assert [r for r in rows if r[1] == S] == [rows[0]]
    else:
        assert rows[0] == ("[CLS]", S, "") and rows[-1] == ("[SEP]", S, "")
        assert [r for r in rows if r[1] == S] == [rows[0], rows[-1]]

    # the first real tokens spell the first field name and its colon, and are structural
    first = task.template.segments[0]
    assert isinstance(first, Literal)
    head = [r for r in rows if r[1] != S][:2]
    assert [_clean(t) for t, _, _ in head] == [first.name[:-1], ":"]
    assert all(role == T and field == first.name for _, role, field in head)

    # structural tokens spell each literal exactly; content tokens spell each field's text exactly
    for seg in task.template.segments:
        if isinstance(seg, Literal):
            spelled = "".join(_clean(t) for t, r, f in rows if r == T and f == seg.name)
            assert spelled == fold(re.sub(r"\s+", "", seg.text))
    for field in task.template.fields:
        spelled = "".join(_clean(t) for t, r, f in rows if r == C and f == field)
        assert spelled == fold(re.sub(r"\s+", "", rendered.field_text(field)))

    # the premise/passage's final '.' is content, not structure
    first_field = task.template.fields[0]
    last_of_field = [r for r in rows if r[2] == first_field][-1]
    assert _clean(last_of_field[0]) == "." and last_of_field[1] == C


def test_rte_llama_roles_in_order():
    example = {"premise": "The bakery sells bread.", "hypothesis": "The bakery is open."}
    rows = _rows(encode([RTE.render(example)], tiny_tokenizer("llama")))
    compact = [(_clean(t), r.label, f) for t, r, f in rows]
    p, h, a = "premise:", "hypothesis:", "answer:"
    assert compact[:3] == [("<s>", "special", ""), ("premise", "structural", p), (":", "structural", p)]
    assert ("", "structural", h) in compact  # the lone "\n" token is structural
    i = compact.index(("hypothesis", "structural", h))
    assert compact[i - 2] == (".", "content", "premise")
    assert compact[-4:] == [
        (".", "content", "hypothesis"),
        ("", "structural", a),
        ("answer", "structural", a),
        (":", "structural", a),
    ]


def test_gpt2_style_leading_space_goes_with_the_content_word():
    tok = tiny_tokenizer("gpt2")
    rendered = RTE.render({"premise": "The cat sat.", "hypothesis": "A cat sat."})
    raw = tok(rendered.text, return_offsets_mapping=True)
    # untrimmed offsets: "ĠThe" covers the template's space (8) and the premise's "The"
    assert raw["offset_mapping"][2] == (8, 12)
    rows = _rows(encode([rendered], tok))
    assert rows[2] == ("ĠThe", C, "premise")
    assert all(r != S for _, r, _ in rows)  # gpt2 adds no specials


def test_t5_style_appends_eos_and_keeps_roles():
    rendered = RTE.render({"premise": "The cat sat.", "hypothesis": "A cat sat."})
    rows = _rows(encode([rendered], tiny_tokenizer("t5")))
    assert rows[-1] == ("</s>", S, "")
    assert rows[0][1:] == (T, "premise:")
    assert {f for _, r, f in rows if r == C} == {"premise", "hypothesis"}


# --- straddling tokens --------------------------------------------------------------------------


def test_tokens_straddling_a_boundary_follow_the_documented_rule():
    pieces = ["premis", "e: A", " cat", " sat", ".\nhy", "pothesis", ": ", "A", ".", "\n", "answer", ":"]
    tok = _regex_tokenizer(pieces)
    rendered = RTE.render({"premise": "A cat sat.", "hypothesis": "A cat."})
    rows = _rows(encode([rendered], tok))
    p, h, a = "premise:", "hypothesis:", "answer:"
    assert rows == [
        ("<s>", S, ""),
        ("premis", T, p),
        ("e: A", C, "premise"),  # structural "e: " + content "A": any content character wins
        (" cat", C, "premise"),
        (" sat", C, "premise"),
        (".\nhy", C, "premise"),  # content "." + structural "\nhy"
        ("pothesis", T, h),
        (": ", T, h),
        ("A", C, "hypothesis"),
        (" cat", C, "hypothesis"),
        (".", C, "hypothesis"),
        ("\n", T, a),  # whitespace-only token inside a structural span
        ("answer", T, a),
        (":", T, a),
    ]


def test_straddling_two_fields_takes_the_larger_overlap():
    tok = _regex_tokenizer(["x", "yzz", "z", "!"])
    rendered = Template.parse("{a}{b}!").render({"a": "xy", "b": "zzz"})
    rows = _rows(encode([rendered], tok))
    assert rows[1:] == [("x", C, "a"), ("yzz", C, "b"), ("z", C, "b"), ("!", T, "!")]


def test_whitespace_of_content_does_not_make_a_template_word_content():
    tok = _regex_tokenizer(["q", "why", " answer", ":", " ", "so"])
    rendered = Template.parse("q: {q}answer: {a}").render({"q": "why ", "a": " so"})
    rows = _rows(encode([rendered], tok))
    assert rows[1:] == [
        ("q", T, "q:"),
        (":", T, "q:"),
        (" ", T, "q:"),
        ("why", C, "q"),
        (" answer", T, "answer:"),  # content's trailing space + structural word -> structural
        (":", T, "answer:"),
        (" ", T, "answer:"),  # the template's own space
        (" ", C, "a"),  # whitespace-only token inside content stays content
        ("so", C, "a"),
    ]


def test_zero_width_token_takes_the_role_of_its_position():
    rendered = RTE.render({"premise": "A.", "hypothesis": "B."})
    assert token_role(rendered, 9, 9) == ("content", "premise")
    assert token_role(rendered, 8, 8) == ("structural", "premise:")
    assert token_role(rendered, len(rendered.text), len(rendered.text)) == ("structural", "answer:")


# --- padding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["llama", "bert", "gpt2", "t5"])
def test_left_and_right_padding_give_identical_per_example_roles(style):
    tok = tiny_tokenizer(style)
    examples = bundled_examples("rte")[:3]
    rendered = [RTE.render(e) for e in examples]
    right = encode(rendered, tok, padding_side="right")
    left = encode(rendered, tok, padding_side="left")
    assert right.padding_side == "right" and left.padding_side == "left"
    assert right.input_ids.shape == left.input_ids.shape
    lengths = right.attention_mask.sum(1)
    assert lengths.unique().numel() > 1  # padding is exercised
    width = right.input_ids.shape[1]
    for b in range(3):
        n = int(lengths[b])
        assert _rows(right, b) == _rows(left, b)
        assert right.input_ids[b, :n].tolist() == left.input_ids[b, width - n :].tolist()
        assert right.attention_mask[b, :n].all() and not right.attention_mask[b, n:].any()
        assert left.attention_mask[b, width - n :].all() and not left.attention_mask[b, : width - n].any()
        for enc, pad in ((right, slice(n, None)), (left, slice(0, width - n))):
            assert (enc.roles[b, pad] == int(S)).all()
            assert (enc.input_ids[b, pad] == tok.pad_token_id).all()
            assert set(enc.fields[b][pad]) <= {""}
            assert set(enc.tokens[b][pad]) <= {tok.pad_token}


def test_default_padding_side_is_the_tokenizers():
    tok = tiny_tokenizer("llama")
    rendered = [RTE.render(e) for e in bundled_examples("rte")[:2]]
    assert encode(rendered, tok).padding_side == "right"
    tok.padding_side = "left"
    enc = encode(rendered, tok)
    assert enc.padding_side == "left" and enc.attention_mask[:, -1].all()


def test_batch_tensors_and_defaults():
    rendered = [RTE.render(e) for e in bundled_examples("rte")[:3]]
    enc = encode(rendered, tiny_tokenizer("llama"))
    b, t = enc.input_ids.shape
    assert b == 3 and enc.roles.shape == (b, t) and enc.attention_mask.shape == (b, t)
    assert enc.input_ids.dtype == enc.roles.dtype == enc.attention_mask.dtype == torch.long
    assert len(enc.fields) == len(enc.tokens) == 3 and all(len(f) == t for f in enc.fields)
    assert enc.example_ids.tolist() == [0, 1, 2] and enc.example_ids.dtype == torch.long
    assert enc.meta["truncated"] == 0
    assert torch.equal(enc.input_sequence().valid, enc.attention_mask.bool())
    ids = encode(rendered, tiny_tokenizer("llama"), example_ids=[7, 8, 9]).example_ids
    assert ids.tolist() == [7, 8, 9]
    with pytest.raises(ValueError):
        encode(rendered, tiny_tokenizer("llama"), example_ids=[1])
    with pytest.raises(ValueError):
        encode([], tiny_tokenizer("llama"))
    with pytest.raises(ValueError):
        encode(rendered, tiny_tokenizer("llama"), padding_side="middle")


def test_without_special_tokens_nothing_is_special():
    rendered = [RTE.render(e) for e in bundled_examples("rte")[:1]]
    rows = _rows(encode(rendered, tiny_tokenizer("bert"), scheme=RoleScheme(add_special_tokens=False)))
    assert rows[0] == ("premise", T, "premise:") and all(r != S for _, r, _ in rows)


def test_pad_falls_back_to_eos_and_errors_without_either():
    tok = tiny_tokenizer("llama")
    tok.pad_token = None
    rendered = [RTE.render(e) for e in bundled_examples("rte")[:2]]
    enc = encode(rendered, tok)
    n = int(enc.attention_mask[0].sum())
    assert (enc.input_ids[0, n:] == tok.eos_token_id).all()
    assert set(enc.tokens[0][n:]) == {"</s>"}
    bare = _regex_tokenizer(["a", " "], bos=False, pad=False)
    with pytest.raises(ValueError, match="neither a pad nor an eos"):
        encode([Template.parse("{x}").render({"x": "a a"})], bare)


# --- truncation --------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["llama", "bert"])
def test_truncation_keeps_the_left_part_and_counts(style):
    tok = tiny_tokenizer(style)
    tok.truncation_side = "left"  # encode always keeps the left part, and restores this
    rendered = [RTE.render(e) for e in bundled_examples("rte")[:3]]
    rendered.append(Template.parse("{text}").render({"text": "yes"}))
    full = encode(rendered, tok)
    cut = encode(rendered, tok, max_length=12)
    assert tok.truncation_side == "left"
    assert cut.input_ids.shape == (4, 12)
    assert cut.meta["truncated"] == 3
    for b in range(3):
        rows_full, rows_cut = _rows(full, b), _rows(cut, b)
        assert len(rows_cut) == 12
        if style == "llama":
            assert rows_cut == rows_full[:12]
        else:  # bert keeps its closing [SEP]
            assert rows_cut[:11] == rows_full[:11] and rows_cut[-1] == ("[SEP]", S, "")
    assert _rows(cut, 3) == _rows(full, 3)
