"""Tiny, deterministic, offline tokenizers in the style of common model families (for tests and demos).

Each is trained with the ``tokenizers`` library on a fixed corpus (the task templates and the
bundled example texts), so no download is ever needed. Styles: ``llama`` (byte-level BPE, BOS
``<s>``), ``gpt2`` (byte-level BPE, no specials added, pad = eos), ``bert`` (lower-case WordPiece,
``[CLS] ... [SEP]``) and ``t5`` (BPE with Metaspace, appends ``</s>``).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from anchorlens.roles.templates import Literal
from anchorlens.tasks.bundled import bundled_examples, bundled_tasks
from anchorlens.tasks.registry import TASKS

VOCAB_SIZE = 768
STYLES: tuple[str, ...] = ("llama", "gpt2", "bert", "t5")
CORPUS_TASKS: tuple[str, ...] = ("rte", "cb", "boolq", "copa", "wic", "wsc", "multirc")  # fixed: new tasks must not
# change the tiny tokenizers (and with them every tiny-model number the tests compare)


@functools.lru_cache(maxsize=1)
def tiny_corpus() -> tuple[str, ...]:
    """The fixed training corpus: the SuperGLUE tasks' template text, field names, verbalizers and bundled texts."""
    lines: list[str] = []
    for task in (TASKS[name] for name in CORPUS_TASKS):
        lines.append(task.template.spec)
        lines.extend(seg.text for seg in task.template.segments if isinstance(seg, Literal))
        lines.extend(f"{name}: {name}" for name in task.fields)
        lines.extend(f"answer:{word}" for word in task.verbalizers)
        lines.extend(str(label) for label in task.labels)
    for name in (n for n in bundled_tasks() if n in CORPUS_TASKS):  # later bundled sets leave the vocabulary as is
        task = TASKS[name]
        for ex in bundled_examples(name):
            lines.extend(str(ex[field]) for field in task.fields)
            lines.append(task.template.render(ex).text)
    return tuple(lines)


def _byte_bpe(special: list[str], trim_offsets: bool) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 / Llama-3 style pre-tokenization) with ``special`` first in the vocab."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=trim_offsets)
    return tok


def _llama() -> PreTrainedTokenizerFast:
    """Byte-level BPE that prepends ``<s>``; pad ``<pad>``, eos ``</s>``."""
    tok = _byte_bpe(["<pad>", "<s>", "</s>"], trim_offsets=True)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=True),
            processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", bos)]),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def _gpt2() -> PreTrainedTokenizerFast:
    """Byte-level BPE that adds nothing; eos ``<|endoftext|>`` doubles as pad (offsets keep the leading space)."""
    tok = _byte_bpe(["<|endoftext|>"], trim_offsets=False)
    eos = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eos, eos_token=eos, pad_token=eos)


def _wordpiece_vocab(tok: Tokenizer, special: list[str]) -> dict[str, int]:
    """Deterministic WordPiece vocab from the corpus: specials, characters, frequent words, frequent suffixes.

    (The ``tokenizers`` WordPiece trainer breaks ties by hash order, so its vocab differs between runs.)
    """
    words: Counter[str] = Counter()
    for line in tiny_corpus():
        norm = tok.normalizer.normalize_str(line)
        words.update(piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(norm))
    chars = sorted({c for w in words for c in w})
    pieces = list(special) + chars + [f"##{c}" for c in chars]
    suffixes: Counter[str] = Counter()
    for word, count in words.items():
        for n in range(2, min(5, len(word))):
            suffixes["##" + word[-n:]] += count
    ranked = [w for w in sorted(words, key=lambda w: (-words[w], w)) if len(w) > 1]
    ranked += [s for s in sorted(suffixes, key=lambda s: (-suffixes[s], s)) if suffixes[s] > 2]
    seen = set(pieces)
    for piece in ranked:
        if len(pieces) >= VOCAB_SIZE:
            break
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    return {piece: i for i, piece in enumerate(pieces)}


def _bert() -> PreTrainedTokenizerFast:
    """Lower-case WordPiece with ``[CLS] ... [SEP]``; ``[PAD]`` is id 0."""
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    probe = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    probe.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, clean_text=True)
    probe.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok = Tokenizer(models.WordPiece(_wordpiece_vocab(probe, special), unk_token="[UNK]"))
    tok.normalizer = probe.normalizer
    tok.pre_tokenizer = probe.pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(special)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
    )


def _t5() -> PreTrainedTokenizerFast:
    """BPE with Metaspace (``▁`` word prefix) that appends ``</s>``; ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2.

    Real T5 is Unigram; BPE is used because the ``tokenizers`` Unigram trainer is not deterministic.
    """
    special = ["<pad>", "</s>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=special, show_progress=False)
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B:1 </s>:1", special_tokens=[("</s>", eos)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


_BUILDERS: dict[str, Callable[[], PreTrainedTokenizerFast]] = {
    "llama": _llama,
    "gpt2": _gpt2,
    "bert": _bert,
    "t5": _t5,
}


@functools.cache
def _trained(style: str) -> tuple[str, dict]:
    """Backend JSON and wrapper settings of one style, trained once per process."""
    wrapper = _BUILDERS[style]()
    settings = {
        key: getattr(wrapper, key)
        for key in ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
        if getattr(wrapper, key) is not None
    }
    return wrapper.backend_tokenizer.to_str(), settings


def tiny_tokenizer(style: str = "llama") -> PreTrainedTokenizerFast:
    """A fresh copy of the tiny tokenizer of ``style`` (one of STYLES); trained once per process."""
    key = style.strip().lower()
    if key not in _BUILDERS:
        raise ValueError(f"unknown tokenizer style {style!r}; choose one of: {', '.join(STYLES)}")
    backend, settings = _trained(key)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(backend), **settings)
