"""Notebook 10's views and notebook 07's Figure 2 in the papers' settings (issue 16)."""

import json

import pytest

import flashsim
from flashsim import masks, measured
from flashsim.views import backward, masks as views
from flashsim.views import widgets as w


def test_mask_view_is_the_plans_counts():
    v = views.mask_view("sliding", seq_len=8192, window=512, head_dim=64)
    p = flashsim.plan("flash2", 8192, 64, dtype="fp16", heads=32, mask="sliding:512")
    rep = p.count()
    assert v["flash2"]["hbm_bytes"] == rep.hbm_bytes and v["flash2"]["flops"] == rep.flops
    assert v["heads"] == 2048 // 64
    c = p.mask.classify(p.block_rows, p.block_cols)
    assert v["skipped"] == int((c == masks.SKIP).sum()) and v["tiles"] == c.size
    assert v["standard"]["per_tensor"]["mask"]["read_bytes"] == 32 * 8192**2
    # the roofline time falls with the computed fraction, down to where the bytes of Q and
    # O (which every Q block still moves) bound it
    flops_ratio = v["flash2"]["flops"] / v["unmasked"]["flops"]
    assert flops_ratio == pytest.approx(v["fraction"], rel=0.05)
    assert flops_ratio <= v["time_ratio"] < 2 * v["fraction"]
    assert v["picture"].shape == (views.PICTURE, views.PICTURE)
    assert v["picture"][100, 100] and not v["picture"][100, 200]


@pytest.mark.parametrize("family", views.FAMILIES)
def test_every_family_draws_and_describes(family):
    v = views.mask_view(family, seq_len=4096, head_dim=128)
    assert v["spec"] == views.spec(family, 4096)
    assert v["flash2"]["hbm_bytes"] <= v["unmasked"]["hbm_bytes"] < v["standard"]["hbm_bytes"]
    assert v["spec"][:20] in views.describe(v)
    from flashsim.views import pictures
    pictures.draw(views.MaskPicture, v)


def test_documents_split_n_evenly_and_refuse_too_many():
    assert masks.documents(10, 3) == [4, 3, 3]
    with pytest.raises(flashsim.FlashsimError):
        masks.documents(4, 5)
    with pytest.raises(flashsim.FlashsimError):
        views.spec("gaussian", 1024)


def test_panel_values_are_on_their_grids_and_the_caption_follows():
    pytest.importorskip("ipywidgets")
    panel = views.mask_panel(family="document", seq_len=8192, documents=2)
    for name, c in panel.controls.items():
        assert w.on_grid(c, c.value), name
    for k in (8192, 16384, 4096):
        assert w.on_grid(panel.controls["seq_len"], k)
    panel.controls["documents"].value = 8
    assert panel.view["spec"].count(",") == 7
    assert "documents = 8" in panel.caption and "mask = document" in panel.caption
    panel.controls["family"].value = "blocksparse"
    panel.controls["density"].value = 0.5
    assert panel.view["spec"] == "blocksparse:0.5:0" and "block density = 0.5" in panel.caption
    assert panel.view["fraction"] == pytest.approx(0.5, abs=1e-3)


def test_measured_points_only_from_the_data_file(tmp_path, monkeypatch):
    assert views.measurements() == [] or measured.path(views.MEASUREMENTS).is_file()
    monkeypatch.setattr(measured, "DATA_DIR", tmp_path)
    assert views.measurements() == [] and "not measured yet" in views.measured_note()
    points = [{"impl": "cupy_flash3_mask", "mask": "sliding:1024", "N": 4096, "d": 128,
               "time_ms": 0.5, "non_skipped_fraction": 0.3},
              {"impl": "torch_flex", "mask": "sliding:1024", "N": 4096, "d": 128,
               "time_ms": 0.6, "non_skipped_fraction": 0.3},
              {"impl": "cupy_flash3", "mask": "none", "N": 4096, "d": 128, "time_ms": 2.0}]
    (tmp_path / views.MEASUREMENTS).write_text(json.dumps({"provenance": {}, "points": points}))
    v = views.mask_view("sliding", seq_len=4096, window=1024)
    assert v["measured"] == points
    from flashsim.views import pictures
    pic = pictures.figure()
    mp = views.MaskPicture(pic)
    mp.update(v)
    assert list(mp.meas.get_ydata()) == [0.25]


def test_carry_and_padding_tables():
    rows = views.carry_table((1024, 16384))
    assert [r["ratio"] for r in rows] == [64, 1024]
    text = views.format_padding(masks.padding_waste([100, 300]))
    assert "cu_seqlens [0, 100, 400]" in text


def test_figure2_runs_each_paper_version_in_its_own_setting():
    runs = backward.figure2_paper()
    by = {r["paper"]["version"]: r for r in runs}
    assert set(by) == {"arXiv v2", "NeurIPS 2022"}
    assert by["NeurIPS 2022"]["paper"]["mask_dropout"] == "key-padding mask and no dropout"
    assert by["NeurIPS 2022"]["setting"] == {"mask": "padding:1024", "dropout": 0.0}
    assert by["arXiv v2"]["setting"]["dropout"] == 0.1
    heads, n, b = 64 * 16, 1024, 2
    for r in runs:
        std, eager, fa1, fa2 = r["rows"]
        drop = r["setting"]["dropout"] > 0
        # the dense mask: read by the masked softmax; by the pass and its backward in eager
        assert std["saved"].get("Z", 0) == drop * heads * n * n
        assert eager["hbm_bytes"] > std["hbm_bytes"] > 3 * fa2["hbm_bytes"]
    a, nips = by["arXiv v2"]["rows"], by["NeurIPS 2022"]["rows"]
    # dropout's pass, both directions: N^2 (2b + 1) bytes a head in each pass
    assert a[0]["hbm_bytes"] - nips[0]["hbm_bytes"] == 2 * heads * n * n * (2 * b + 1)
    assert a[3]["hbm_bytes"] == nips[3]["hbm_bytes"]          # fused: nothing moves
    text = backward.format_figure2_paper(runs)
    assert "arXiv v2" in text and "NeurIPS 2022" in text and "40.3" in text and "35.3" in text


def test_each_slider_selects_its_family_and_redraws():
    """A slider of another family (documents on a sliding-window panel) selects its own
    family, so every slider changes the picture; one refresh per move, caption from the
    controls."""
    panel = views.mask_panel(family="sliding", seq_len=4096, window=1024)
    for name, family, value in (("documents", "document", 5), ("density", "blocksparse", 0.3),
                                ("window", "sliding", 512)):
        before, calls = panel.image.value, []
        compute = panel.compute
        panel.compute = lambda **kw: calls.append(kw) or compute(**kw)
        panel.controls[name].value = value
        panel.compute = compute
        assert panel.controls["family"].value == family and len(calls) == 1
        assert panel.view["spec"] == views.spec(family, 4096, **{name: value})
        assert panel.image.value != before and f"mask = {family}" in panel.caption



def test_kernel_model_ratio_is_the_time_models_at_a_measured_point():
    """The plus in the picture is masked_time's predicted ratio; at a measured point it is
    the one its table sets beside the measurement."""
    from flashsim.measured import masked_time as mt

    v = views.mask_view("sliding", seq_len=8192, window=1024, head_dim=64)
    row = next(r for r in mt.rows() if (r["d"], r["N"], r["mask"]) == (64, 8192, "sliding:1024"))
    assert v["kernel_ratio"] == pytest.approx(row["predicted_ratio"], rel=1e-12)
    assert views.mask_view("sliding", seq_len=8192, head_dim=256)["kernel_ratio"] is None
    from flashsim.views import pictures
    mp = views.MaskPicture(pictures.figure())
    mp.update(v)
    assert list(mp.model.get_ydata()) == [v["kernel_ratio"]]
    assert "sliding:1024" in views.kernel_model_table()
