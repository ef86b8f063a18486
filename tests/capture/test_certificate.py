"""The certificate: every verified family's capture (base and instance) checks out against eager; a wrong capture
is caught, named by its layer and refused; runs record the certificate in their manifest."""

from __future__ import annotations

import json

import pytest
import torch

from anchorlens.capture.certificate import (
    Certificate,
    CertifyOptions,
    InexactCaptureError,
    LayerDiff,
    certify,
    require_exact,
    threshold_for,
)
from anchorlens.capture.selection import Selection
from anchorlens.capture.session import CaptureSession
from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.models.verified import VERIFIED, verified_bases
from tests.methods.helpers import rte_batch

GUIDED = [v.tiny for v in VERIFIED if v.guidance != "capture only"]


@pytest.mark.parametrize("name", GUIDED)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_instance_token_capture_is_certified_exact_on_every_guided_family(tiny_base, name, padding_side):
    """The instance token (inserted at position 0) changes every map; they still equal eager's (<= 1e-5)."""
    model = load_guided("instance", base=tiny_base(name))
    certificate = certify(model, rte_batch(model.base, padding_side))
    sites = {(s.stack, s.layer) for s, _ in model.sites()}
    assert {(d.stack, d.layer) for d in certificate.per_layer} == sites  # every softmax layer was checked
    assert certificate.max_abs_diff is not None and certificate.max_abs_diff <= 1e-5, certificate.summary()
    assert certificate.exact and certificate.unavailable is None


@pytest.mark.parametrize("name", verified_bases(guidance="capture only"))
def test_encoders_are_certified_exact(tiny_base, name):
    certificate = certify(tiny_base(name), rte_batch(tiny_base(name), "right"))
    assert certificate.exact and certificate.max_abs_diff is not None and certificate.max_abs_diff <= 1e-5


def _wrong_capture(monkeypatch, layer: int) -> None:
    """Make the captured probabilities wrong at one layer (a bug in the recompute, as a test can force one)."""
    original = CaptureSession.emit

    def skewed(self, site, probs, *args, **kwargs):
        if site.layer == layer and probs is not None:  # the kernel plan's events carry no probabilities
            probs = probs.clone()
            probs[..., 0] += 0.01
        return original(self, site, probs, *args, **kwargs)

    monkeypatch.setattr(CaptureSession, "emit", skewed)


def test_a_wrong_capture_is_found_at_its_layer_and_refused(tiny_base, monkeypatch):
    base = tiny_base("tiny-llama")
    _wrong_capture(monkeypatch, layer=2)
    certificate = certify(base, rte_batch(base, "left"))
    by_layer = {d.layer: d.max_abs_diff for d in certificate.per_layer}
    assert by_layer[2] is not None and by_layer[2] >= 0.01 - 1e-6
    assert not certificate.exact and certificate.worst == LayerDiff("decoder", 2, by_layer[2])
    with pytest.raises(InexactCaptureError, match=r"decoder layer 2 \(threshold 1e-04 for float32\)") as err:
        require_exact(certificate, "tiny-llama")
    message = str(err.value)
    assert "\n" not in message and "--allow-inexact" in message and isinstance(err.value, UsageError)
    require_exact(certificate, "tiny-llama", allow_inexact=True)  # allowed: no error, the record says inexact
    assert certificate.to_json()["exact"] is False


def test_the_certificate_follows_the_selection_and_query_chunks(tiny_base):
    """Only the selected layers are checked, and chunked queries (a tiny memory budget) are compared slice by slice."""
    from anchorlens.capture.options import CaptureOptions

    base = tiny_base("tiny-qwen2")
    batch = rte_batch(base, "left")
    certificate = certify(base, batch, Selection(layers=(1, 3)), CaptureOptions(memory_budget=4096))
    assert [d.layer for d in certificate.per_layer] == [1, 3]
    assert certificate.exact and certificate.max_abs_diff is not None and certificate.max_abs_diff <= 1e-5


def test_half_precision_has_its_own_threshold(tiny_base):
    from anchorlens.models.loading import load_base

    base = load_base("tiny-llama", dtype="bfloat16")
    certificate = certify(base, rte_batch(base, "right"))
    assert certificate.dtype == "bfloat16" and certificate.threshold == threshold_for(torch.bfloat16) > 1e-4
    assert certificate.exact, certificate.summary()


def test_the_record_says_what_was_checked():
    certificate = Certificate(
        per_layer=(LayerDiff("decoder", 0, 1e-8), LayerDiff("decoder", 1, 3e-7)),
        examples=2,
        threshold=1e-4,
        dtype="float32",
        seconds=0.5,
    )
    record = certificate.to_json()
    assert record["reference"] == "eager" and record["max_abs_diff"] == 3e-7 and record["examples"] == 2
    assert record["per_layer"][1] == {"stack": "decoder", "layer": 1, "max_abs_diff": 3e-7}
    assert "3.0e-07" in certificate.summary() and "2 layers" in certificate.summary()
    with pytest.raises(UsageError):
        CertifyOptions(examples=0)


def test_capture_runs_record_the_certificate_and_refuse_a_wrong_capture(tiny_base, tmp_path, monkeypatch):
    from anchorlens.workflows.capture_run import run_capture

    out = run_capture("instance", "tiny-llama", "rte", None, 4, Selection(), 2, tmp_path / "run", False, progress=False)
    record = json.loads((out / "manifest.json").read_text())["exactness"]
    assert record["reference"] == "eager" and record["exact"] and record["examples"] == 2
    assert record["max_abs_diff"] <= 1e-5 and len(record["per_layer"]) == 4

    _wrong_capture(monkeypatch, layer=1)
    with pytest.raises(InexactCaptureError, match="layer 1"):
        run_capture("base", "tiny-llama", "rte", None, 4, Selection(), 2, tmp_path / "wrong", False, progress=False)
    assert not (tmp_path / "wrong").exists()  # refused before anything was written
    skipped = run_capture(
        "base",
        "tiny-llama",
        "rte",
        None,
        4,
        Selection(),
        2,
        tmp_path / "skipped",
        False,
        progress=False,
        certificate=CertifyOptions(enabled=False),
    )
    assert "exactness" not in json.loads((skipped / "manifest.json").read_text())


def test_compare_certifies_every_checkpoint_and_reports_it(tmp_path):
    from anchorlens.reports.comparison import write_comparison
    from anchorlens.workflows.compare import compare

    result = compare(["base", "instance"], base="tiny-llama", n=4, batch_size=2, n_boot=50)
    records = result.facts["exactness"]
    assert set(records) == {"base", "instance"} and all(
        r["exact"] and r["max_abs_diff"] <= 1e-5 for r in records.values()
    )
    out = write_comparison(result, tmp_path / "cmp")
    summary = (out / "summary.md").read_text()
    assert "Exactness of instance: max |Δ|" in summary and "against eager attention over 4 layers" in summary
    assert json.loads((out / "manifest.json").read_text())["exactness"]["instance"]["per_layer"][0]["layer"] == 0
    assert "Exactness of base" in (out / "report.html").read_text()
    skipped = compare(
        ["base", "instance"], base="tiny-llama", n=4, batch_size=2, n_boot=50, certificate=CertifyOptions(enabled=False)
    )
    assert "exactness" not in skipped.facts


def test_a_capture_eager_cannot_check_is_refused_unless_allowed():
    """A certificate with no eager reference (eager returned no weights, or not one map per captured site) is not
    exact: a run says it cannot be certified, in one line, unless --allow-inexact."""
    from anchorlens.capture.certificate import Certificate

    certificate = Certificate((), examples=2, threshold=1e-4, dtype="float32", seconds=0.1, unavailable="eager "
                              "attention returned 4 maps for the encoder stack but the capture found 1 attention site")  # fmt: skip
    assert certificate.max_abs_diff is None and certificate.to_json()["unavailable"] and not certificate.exact
    with pytest.raises(InexactCaptureError, match="cannot be certified .*returned 4 maps.*--allow-inexact") as err:
        require_exact(certificate, "tiny-albert")
    assert "\n" not in str(err.value)
    require_exact(certificate, "tiny-albert", allow_inexact=True)


def test_granite_swa_learned_sink_is_certified_in_its_own_weights_convention():
    """Granite SWA's eager weights exclude the sink (it scales the output instead); gpt-oss's include it. Both
    certify exact: the captured rows (1 - sink over real keys) renormalized equal Granite's."""
    from anchorlens.workflows.survey import EXACT, survey

    rows = {row.model_type: row for row in survey(["granite_swa", "gpt_oss"])}
    assert all(row.status == EXACT for row in rows.values()), rows


def test_position_sweeps_certify_each_position(tmp_path):
    from anchorlens.reports.positions import write_positions
    from anchorlens.workflows.positions import sweep_positions

    sweep = sweep_positions("instance", ["first", "last"], base="tiny-llama", n=4, batch_size=2)
    records = sweep.facts["exactness"]
    assert set(records) == {"first", "last"} and all(r["exact"] and r["max_abs_diff"] <= 1e-5 for r in records.values())
    out = write_positions(sweep, tmp_path / "positions", figures=False)
    assert "Exactness of last: max |Δ|" in (out / "summary.md").read_text()
    assert set(json.loads((out / "manifest.json").read_text())["exactness"]) == {"first", "last"}


# --- the kernel plan ---------------------------------------------------------------------------------------------


class _MapReader:
    """A reducer that reads the maps themselves (the kernel plan computes none)."""

    name = "map_reader"
    reads = frozenset({"probs", "visible"})

    def update(self, event) -> None:
        pass


def _unpadded_batch(base):
    """Two copies of one RTE example: a batch without padding."""
    from anchorlens.tasks import bundled_examples, get_task

    text = get_task("rte").template.render(bundled_examples("rte")[0])
    batch = base.encode([text, text])
    assert batch.attention_mask.min() == 1, "the batch must have no padding"
    return batch


@pytest.mark.parametrize("padding", ["left", "right", "none"])
def test_the_kernel_plan_is_certified_with_the_runs_reducers(tiny_base, padding):
    """Given the run's reducers, a second capture under the kernel plan checks their key sums and p log p sums
    against eager's maps at every site: within 1e-5 on tiny-llama, padded or not."""
    from anchorlens.analyses import default_reducers

    base = tiny_base("tiny-llama")
    batch = _unpadded_batch(base) if padding == "none" else rte_batch(base, padding)
    certificate = certify(base, batch, reducers=default_reducers())
    kernel = certificate.kernel
    assert kernel.unavailable is None and kernel.not_applicable is None
    assert kernel.compared == ("key_sums", "score_sums")
    assert [(d.stack, d.layer) for d in kernel.per_layer] == [(s.stack, s.layer) for s, _ in base.sites()]
    assert kernel.max_abs_diff is not None and kernel.max_abs_diff <= 1e-5, certificate.summary()
    assert certificate.exact and "kernel plan max |Δ|" in certificate.summary()
    record = certificate.to_json()
    assert record["plans"]["kernel"]["max_abs_diff"] == kernel.max_abs_diff
    assert len(record["plans"]["kernel"]["per_layer"]) == 4 and record["plans"]["kernel"]["compared"] == [
        "key_sums",
        "score_sums",
    ]
    # the top-level record is still the materialised plan's probabilities
    assert record["max_abs_diff"] == certificate.max_abs_diff == record["plans"]["materialised"]["max_abs_diff"]
    assert record["per_layer"] == record["plans"]["materialised"]["per_layer"] and record["exact"] is True


@pytest.mark.parametrize("padding", ["left", "none"])
def test_the_evidence_reducers_are_certified_under_the_kernel_plan(tiny_base, padding, monkeypatch):
    """With the sink battery and value mass among the run's reducers the kernel capture computes the mass each key
    receives (one transposed pass) and the value-weighted key sums, and the certificate compares them with eager's
    column sums (per valid query) and P @ (n * C): within 1e-5; an error of 1e-2 per query injected into the received
    mass at one layer is found there."""
    from anchorlens.analyses import default_reducers

    base = tiny_base("tiny-llama")
    batch = _unpadded_batch(base) if padding == "none" else rte_batch(base, padding)
    reducers = default_reducers(extra=["sink_battery", "value_mass"])
    kernel = certify(base, batch, reducers=reducers).kernel
    assert kernel.compared == ("key_sums", "received", "score_sums", "value_sums")
    assert kernel.max_abs_diff is not None and kernel.max_abs_diff <= 1e-5
    original = CaptureSession.emit

    def skewed(self, site, *args, **kwargs):
        received = kwargs.get("received")
        if received is not None and site.layer == 2:
            valid = self.layout.layout(site.stack, site.layer).q.valid  # the call's queries: one chunk here
            kwargs["received"] = received + 1e-2 * valid.sum(1).float()[:, None, None]
        return original(self, site, *args, **kwargs)

    monkeypatch.setattr(CaptureSession, "emit", skewed)
    by_layer = {d.layer: d.max_abs_diff for d in certify(base, batch, reducers=reducers).kernel.per_layer}
    assert by_layer[2] is not None and abs(by_layer[2] - 1e-2) < 1e-4, by_layer
    assert all(d is not None and d <= 1e-5 for layer, d in by_layer.items() if layer != 2), by_layer


def test_a_model_the_kernel_plan_refuses_records_why(tiny_base):
    """Gemma 2 soft-caps its scores: the forced kernel plan is refused, the record says so in the engine's one line,
    and the certificate stands on the materialised plan."""
    from anchorlens.analyses import default_reducers

    base = tiny_base("tiny-gemma2")
    certificate = certify(base, rte_batch(base, "left"), reducers=default_reducers())
    assert certificate.kernel.unavailable is not None and "soft-caps its scores" in certificate.kernel.unavailable
    assert "\n" not in certificate.kernel.unavailable and certificate.kernel.per_layer == ()
    assert certificate.exact and certificate.kernel.max_abs_diff is None
    kernel = certificate.to_json()["plans"]["kernel"]
    assert kernel["max_abs_diff"] is None and "soft-caps" in kernel["unavailable"] and kernel["per_layer"] == []
    require_exact(certificate, "tiny-gemma2")  # no error: the run never takes the kernel plan there


def test_the_kernel_plan_is_not_checked_where_it_does_not_apply(tiny_base):
    """Reducers that read the maps, a run that asks for the materialised plan, or no reducers at all: no kernel
    capture, and the record says why."""
    from anchorlens.analyses import default_reducers
    from anchorlens.capture.options import CaptureOptions

    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "right")
    maps = certify(base, batch, reducers=[*default_reducers(), _MapReader()]).kernel
    assert (
        maps.per_layer == () and maps.not_applicable == "map_reader reads probs, which the kernel plan does not compute"
    )
    materialised = certify(base, batch, options=CaptureOptions(plan="materialised"), reducers=default_reducers())
    assert materialised.kernel.per_layer == () and "materialised plan" in str(materialised.kernel.not_applicable)
    bare = certify(base, batch)
    assert bare.kernel.per_layer == () and bare.to_json()["plans"]["kernel"]["not_applicable"]


def _wrong_kernel_sums(monkeypatch, layer: int, by: float = 1e-2) -> None:
    """Make the kernel plan's key sums wrong by ``by`` at one layer (the materialised plan's events are untouched)."""
    original = CaptureSession.emit

    def skewed(self, site, *args, **kwargs):
        if kwargs.get("plan") == "kernel" and site.layer == layer and kwargs.get("key_sums") is not None:
            kwargs["key_sums"] = kwargs["key_sums"] + by
        return original(self, site, *args, **kwargs)

    monkeypatch.setattr(CaptureSession, "emit", skewed)


def test_a_wrong_kernel_plan_is_found_at_its_layer_and_refused_naming_the_plan(tiny_base, monkeypatch):
    from anchorlens.analyses import default_reducers

    base = tiny_base("tiny-llama")
    _wrong_kernel_sums(monkeypatch, layer=1)
    certificate = certify(base, rte_batch(base, "left"), reducers=default_reducers())
    by_layer = {d.layer: d.max_abs_diff for d in certificate.kernel.per_layer}
    assert by_layer[1] is not None and abs(by_layer[1] - 1e-2) < 1e-4  # the injected error, found where it is
    assert all(d is not None and d <= 1e-5 for layer, d in by_layer.items() if layer != 1), by_layer
    assert certificate.max_abs_diff is not None and certificate.max_abs_diff <= 1e-5  # the materialised plan is exact
    assert not certificate.exact and certificate.to_json()["exact"] is False
    with pytest.raises(
        InexactCaptureError, match=r"under the kernel plan .* at decoder layer 1 \(threshold 1e-04"
    ) as err:
        require_exact(certificate, "tiny-llama")
    assert "\n" not in str(err.value) and "--allow-inexact" in str(err.value)
    require_exact(certificate, "tiny-llama", allow_inexact=True)


def test_a_wrong_materialised_plan_is_named_as_such(tiny_base, monkeypatch):
    base = tiny_base("tiny-llama")
    _wrong_capture(monkeypatch, layer=2)
    with pytest.raises(InexactCaptureError, match="under the materialised plan the captured attention differs"):
        require_exact(certify(base, rte_batch(base, "left")), "tiny-llama")


def test_capture_runs_record_both_plans_and_refuse_a_forced_kernel_plan_early(tmp_path):
    """A run's exactness record checks the kernel plan with the run's reducers; a forced kernel plan the model rules
    out stops the run in the engine's one line before anything is written."""
    from anchorlens.capture.options import CaptureOptions
    from anchorlens.workflows.capture_run import run_capture

    out = run_capture("base", "tiny-llama", "rte", None, 4, Selection(), 2, tmp_path / "run", False, progress=False)
    plans = json.loads((out / "manifest.json").read_text())["exactness"]["plans"]
    assert plans["kernel"]["compared"] == ["key_sums", "score_sums"] and len(plans["kernel"]["per_layer"]) == 4
    assert 0 < plans["kernel"]["max_abs_diff"] <= 1e-5 and plans["materialised"]["max_abs_diff"] <= 1e-5
    with pytest.raises(UsageError, match="soft-caps its scores") as err:
        run_capture(
            "base", "tiny-gemma2", "rte", None, 4, Selection(), 2, tmp_path / "gemma", False, progress=False,
            capture=CaptureOptions(plan="kernel"),
        )  # fmt: skip
    assert "\n" not in str(err.value) and not (tmp_path / "gemma").exists()
