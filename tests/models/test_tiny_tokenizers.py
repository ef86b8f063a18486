"""Tiny offline tokenizers: specials per style, determinism, speed and independent copies."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from anchorlens.models import tiny_tokenizers as tt
from anchorlens.models.tiny_tokenizers import STYLES, tiny_corpus, tiny_tokenizer
from anchorlens.tasks import bundled_examples, bundled_tasks, get_task

TEXT = "premise: The cat sat.\nanswer:"


def _ids(style: str, text: str = TEXT) -> list[str]:
    """Token strings of ``text`` with special tokens added."""
    tok = tiny_tokenizer(style)
    return list(tok.convert_ids_to_tokens(tok(text)["input_ids"]))


@pytest.mark.parametrize("style", STYLES)
def test_each_style_has_a_small_fast_vocab(style):
    tok = tt._BUILDERS[style]()
    assert 512 <= len(tok) <= 1000
    assert tok.is_fast and tok.padding_side == "right"


def test_llama_style():
    tok = tiny_tokenizer("llama")
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    toks = _ids("llama")
    assert toks[0] == "<s>" and toks[1] == "premise" and "</s>" not in toks
    assert tok.decode(tok(TEXT)["input_ids"], skip_special_tokens=True) == TEXT


def test_gpt2_style():
    tok = tiny_tokenizer("gpt2")
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    assert tok.pad_token_id == tok.eos_token_id
    toks = _ids("gpt2")
    assert "<|endoftext|>" not in toks and toks[0] == "premise"
    assert tok.decode(tok(TEXT)["input_ids"]) == TEXT


def test_bert_style():
    tok = tiny_tokenizer("bert")
    assert (tok.pad_token, tok.pad_token_id, tok.unk_token, tok.mask_token) == ("[PAD]", 0, "[UNK]", "[MASK]")
    toks = _ids("bert", "Premise: The CAT sat.")
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]"
    assert toks[1:3] == ["premise", ":"] and "the" in toks


def test_t5_style():
    tok = tiny_tokenizer("t5")
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert (tok.pad_token, tok.eos_token, tok.unk_token) == ("<pad>", "</s>", "<unk>")
    toks = _ids("t5")
    assert toks[-1] == "</s>" and toks[0].startswith("▁") and toks.count("</s>") == 1


@pytest.mark.parametrize("style", ["bert", "t5"])
def test_bundled_texts_need_no_unknown_token(style):
    tok = tiny_tokenizer(style)
    for name in bundled_tasks():
        task = get_task(name)
        for ex in bundled_examples(name):
            assert tok.unk_token_id not in tok(task.template.render(ex).text)["input_ids"]


def test_unknown_style_lists_choices():
    with pytest.raises(ValueError, match="llama, gpt2, bert, t5"):
        tiny_tokenizer("xlnet")
    assert tiny_tokenizer(" LLaMA ").bos_token == "<s>"


def test_returns_independent_copies():
    a = tiny_tokenizer("llama")
    a.pad_token = None
    a.padding_side = "left"
    b = tiny_tokenizer("llama")
    assert a is not b and b.pad_token == "<pad>" and b.padding_side == "right"


def test_corpus_covers_templates_and_bundled_texts():
    corpus = tiny_corpus()
    assert any(line.startswith("premise: {premise}") for line in corpus)
    assert any("hypothesis" in line for line in corpus)
    assert bundled_examples("copa")[0]["premise"] in corpus


def _fingerprint() -> str:
    """Hash of every style's serialized backend."""
    blob = "".join(tiny_tokenizer(s).backend_tokenizer.to_str() for s in STYLES)
    return hashlib.sha256(blob.encode()).hexdigest()


def test_deterministic_across_processes():
    code = "from tests.models.test_tiny_tokenizers import _fingerprint; print(_fingerprint())"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _fingerprint()
