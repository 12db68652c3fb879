"""Primes, offsets and multipliers against MODEL.md Appendix A and B."""

from __future__ import annotations

import pytest

from sglang_ds41.config import V41Config
from sglang_ds41.engram.layout import EngramLayout, build_layout
from sglang_ds41.errors import Ds41Error

LAYER1_PRIMES = [
    16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,
    16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,
    16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463,
]  # fmt: skip
LAYER1_OFFSETS = [
    0, 16000057, 32000136, 48000217, 64000314, 80000435, 96000564, 112000697, 128000880, 144001069,
    160001276, 176001487, 192001740, 208002017, 224002306, 240002613, 256002934, 272003273,
    288003654, 304004047, 320004446, 336004849, 352005258, 368005705,
]  # fmt: skip
LAYER14_PRIMES = [
    16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,
    16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
    16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889,
]  # fmt: skip
LAYER14_OFFSETS = [
    0, 16000477, 32000964, 48001463, 64001970, 80002481, 96003054, 112003663, 128004290, 144004957,
    160005626, 176006319, 192007016, 208007727, 224008456, 240009215, 256009984, 272010765,
    288011564, 304012377, 320013196, 336014037, 352014914, 368015793,
]  # fmt: skip


def test_official_layout_reproduces_appendix_a(official_config: V41Config) -> None:
    layout = EngramLayout.from_config(official_config.text)
    one, fourteen = layout.layers
    assert (one.layer_id, fourteen.layer_id) == (1, 14)
    assert list(one.primes) == LAYER1_PRIMES
    assert list(one.offsets) == LAYER1_OFFSETS
    assert list(fourteen.primes) == LAYER14_PRIMES
    assert list(fourteen.offsets) == LAYER14_OFFSETS
    assert one.num_rows == 384_006_168
    assert fourteen.num_rows == 384_016_682
    assert list(one.multipliers) == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
    assert list(fourteen.multipliers) == [67716810739261, 51510806800915, 30921347202721, 82619226485591]


def test_tiny_layout_reproduces_appendix_b(tiny_config: V41Config) -> None:
    one, two = EngramLayout.from_config(tiny_config.text).layers
    assert list(one.primes) == [61, 67, 71, 73, 79, 83]
    assert list(one.offsets) == [0, 61, 128, 199, 272, 351]
    assert list(two.primes) == [89, 97, 101, 103, 107, 109]
    assert list(two.offsets) == [0, 89, 186, 287, 390, 497]
    assert list(one.multipliers) == [
        29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817,
    ]  # fmt: skip
    assert list(two.multipliers) == [
        29614367931768699, 14359748903426231, 8766307535087495, 27646881644150121,
    ]  # fmt: skip


def test_multipliers_are_odd_and_keep_products_below_2_pow_63(official_config: V41Config) -> None:
    layout = EngramLayout.from_config(official_config.text)
    for layer in layout.layers:
        for mu in layer.multipliers:
            assert mu % 2 == 1
            assert (99_092 - 1) * mu < 2**63


def test_column_order_is_ngram_major_then_head() -> None:
    layer = build_layout([1], 61, 4, 2, 256).layers[0]
    assert [layer.column(n, h) for n in (2, 3, 4) for h in (0, 1)] == [0, 1, 2, 3, 4, 5]
    assert layer.column_starts() == (0, 61, 128, 199, 272, 351, 434)
    with pytest.raises(Ds41Error, match="n-gram size 5"):
        layer.column(5, 0)


def test_layout_is_deterministic() -> None:
    assert build_layout([1, 14], 16_000_000, 4, 8, 99_092) == build_layout([1, 14], 16_000_000, 4, 8, 99_092)


def test_row_totals_disagreeing_with_config_are_refused(official_config: V41Config) -> None:
    import dataclasses

    bad = dataclasses.replace(official_config.text, engram_num_embeddings=(384_006_168, 384_016_681))
    with pytest.raises(Ds41Error, match="engram_num_embeddings"):
        EngramLayout.from_config(bad)


def test_layout_tensors_have_documented_shapes(official_config: V41Config) -> None:
    layout = EngramLayout.from_config(official_config.text)
    assert tuple(layout.primes_tensor().shape) == (2, 24)
    assert tuple(layout.offsets_tensor().shape) == (2, 24)
    assert tuple(layout.multipliers_tensor().shape) == (2, 4)
    assert layout.index_of(14) == 1
    with pytest.raises(Ds41Error, match="not an Engram layer"):
        layout.index_of(2)
