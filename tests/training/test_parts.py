"""Data order, splits, optimizer state round trips and the no-pickle rule."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from anchorlens.tasks import bundled_examples, get_task
from anchorlens.training import BatchOrder, load_optimizer_state, make_optimizer, optimizer_state, split_train_eval


def test_batch_order_is_seeded_and_resumable():
    a, b = BatchOrder(10, 4, seed=3), BatchOrder(10, 4, seed=3)
    first = [a.next_batch() for _ in range(4)]
    assert first == [b.next_batch() for _ in range(4)]
    assert sorted(i for batch in first[:3] for i in batch) == list(range(10))  # 4 + 4 + 2 covers an epoch
    tensors, facts = a.state()
    c = BatchOrder(10, 4, seed=99)
    c.load_state(tensors, facts)
    assert [a.next_batch() for _ in range(5)] == [c.next_batch() for _ in range(5)]


def test_grouped_order_covers_each_epoch_and_cuts_padding():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 300, (1003,), generator=gen).tolist()
    grouped, plain = BatchOrder(1003, 8, seed=1, lengths=lengths), BatchOrder(1003, 8, seed=1)
    per_epoch = -(-1003 // 8)

    def epoch(order: BatchOrder) -> list[list[int]]:
        return [order.next_batch() for _ in range(per_epoch)]

    def padded(batches: list[list[int]]) -> int:
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    g1, g2, p1 = epoch(grouped), epoch(grouped), epoch(plain)
    for batches in (g1, g2):
        assert sorted(i for b in batches for i in b) == list(range(1003))  # every example once per epoch
        assert [len(b) for b in batches[:-1]] == [8] * (per_epoch - 1) and len(batches[-1]) == 1003 % 8
    assert g1 != g2  # a fresh order each epoch
    assert padded(g1) < 0.7 * padded(p1)  # similar lengths batched together: much less padding
    assert sum(lengths) <= padded(g1)
    tensors, facts = grouped.state()  # resumable like the plain order
    again = BatchOrder(1003, 8, seed=5, lengths=lengths)
    again.load_state(tensors, facts)
    assert epoch(grouped) == epoch(again)


def test_resume_settings_include_grouping_and_accept_older_runs():
    from anchorlens.training import TrainConfig

    config = TrainConfig(steps=3, group_by_length=True)
    saved = config.to_json()
    assert config.resume_mismatch(saved) == []
    del saved["group_by_length"]  # a run saved before the setting existed trained ungrouped
    assert config.resume_mismatch(saved) == ["group_by_length: False -> True"]
    assert TrainConfig(steps=3).resume_mismatch(saved) == []


def test_split_is_seeded_and_keeps_multirc_questions_whole():
    rows = [{"idx": i, "group": i // 3, "passage_idx": 0, "label": 0} for i in range(30)]
    train, held = split_train_eval(rows, get_task("multirc"), seed=1)
    assert len(held) == 3 and {r["group"] for r in held}.isdisjoint({r["group"] for r in train})
    rte = bundled_examples("rte")
    t1, e1 = split_train_eval(rte, get_task("rte"), seed=0)
    t2, e2 = split_train_eval(rte, get_task("rte"), seed=0)
    assert e1 == e2 and len(e1) == 3 and len(t1) + len(e1) == len(rte)


def _step(opt, params):
    opt.zero_grad()
    sum((p**2).sum() for p in params).backward()
    opt.step()


def test_optimizer_state_round_trips_without_pickle():
    for name in ("adamw", "adafactor"):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
        twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt, opt2 = make_optimizer(name, params, 0.01), make_optimizer(name, twin, 0.01)
        _step(opt, params)
        tensors, facts = optimizer_state(opt)
        load_optimizer_state(opt2, tensors, facts)
        with torch.no_grad():
            for p, q in zip(params, twin):
                q.copy_(p)
        _step(opt, params)
        _step(opt2, twin)
        assert all(torch.equal(p, q) for p, q in zip(params, twin)), name


def test_no_pickle_in_training_code():
    root = Path(__file__).resolve().parents[2] / "anchorlens"
    for folder in ("training", "evaluation"):
        for path in (root / folder).glob("*.py"):
            text = path.read_text()
            assert not re.search(r"torch\.(save|load)\(|import pickle", text), path
