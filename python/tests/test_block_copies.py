"""pagedattn.ops.copy_blocks / swap_blocks: every layer is checked before
the first block moves (a bad layer leaves all of them unchanged), and int8
caches move with their per-(block, head, slot) float32 scales."""

import numpy as np
import pytest

import pagedattn
from pagedattn import ops

rng = np.random.default_rng(5)
BLOCKS, BS, HKV, D = 6, 4, 3, 8


def int8_cache(blocks=BLOCKS, layout="NHD"):
    shape = (blocks, BS, HKV, D) if layout == "NHD" else (blocks, HKV, BS, D)
    return rng.integers(-127, 128, shape, dtype=np.int8)


def scales(blocks=BLOCKS):
    return rng.uniform(0.01, 1.0, (blocks, HKV, BS)).astype(np.float32)


def copied(array, mapping):
    out = array.copy()
    for src, dst in mapping:
        out[dst] = array[src]
    return out


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_int8_copy_blocks_moves_values_and_scales(layout):
    keys = [int8_cache(layout=layout) for _ in range(2)]
    values = [int8_cache(layout=layout) for _ in range(2)]
    k_scales, v_scales = [scales(), scales()], [scales(), scales()]
    mapping = np.array([[1, 4], [3, 0]], np.int64)
    expected = [copied(a, mapping) for a in keys + values + k_scales + v_scales]
    ops.copy_blocks(keys, values, mapping, key_scales=k_scales, value_scales=v_scales,
                    layout=layout)
    for actual, want in zip(keys + values + k_scales + v_scales, expected):
        np.testing.assert_array_equal(actual, want)


def test_int8_swap_blocks_round_trip():
    device, device_scales = int8_cache(), scales()
    host, host_scales = np.zeros_like(device[:2]), np.zeros((2, HKV, BS), np.float32)
    ops.swap_blocks(device, host, np.array([[5, 0], [2, 1]], np.int64),
                    src_scales=device_scales, dst_scales=host_scales)
    np.testing.assert_array_equal(host, device[[5, 2]])
    np.testing.assert_array_equal(host_scales, device_scales[[5, 2]])
    back, back_scales = np.zeros_like(device), np.zeros_like(device_scales)
    ops.swap_blocks(host, back, np.array([[0, 3], [1, 4]], np.int64),
                    src_scales=host_scales, dst_scales=back_scales)
    np.testing.assert_array_equal(back[[3, 4]], device[[5, 2]])
    np.testing.assert_array_equal(back_scales[[3, 4]], device_scales[[5, 2]])


def test_a_bad_later_layer_leaves_every_layer_unchanged():
    # Layer 0 float32 (valid), layer 1 int8 without its scales: formerly
    # layer 0 was copied before layer 1 failed.
    keys = [rng.standard_normal((BLOCKS, BS, HKV, D)).astype(np.float32), int8_cache()]
    values = [rng.standard_normal((BLOCKS, BS, HKV, D)).astype(np.float32), int8_cache()]
    before = [a.copy() for a in keys + values]
    mapping = np.array([[0, 1]], np.int64)
    with pytest.raises(ValueError, match=r"key_caches\[1\] is int8: its scales key_scales\[1\]"):
        ops.copy_blocks(keys, values, mapping)
    k_scales = [None, scales()]
    v_scales = [None, scales(BLOCKS - 1)]
    with pytest.raises(pagedattn.InvalidArgumentError,
                       match=r"value_scales\[1\] has shape \[5, 3, 4\], expected \[6, 3, 4\]"):
        ops.copy_blocks(keys, values, mapping, key_scales=k_scales, value_scales=v_scales)
    with pytest.raises(ValueError, match=r"key_scales\[0\] is given but key_caches\[0\] has dtype"):
        ops.copy_blocks(keys, values, mapping, key_scales=[scales(), scales()],
                        value_scales=[None, scales()])
    for actual, want in zip(keys + values, before):
        np.testing.assert_array_equal(actual, want)


def test_swap_blocks_needs_both_scales_for_int8():
    device, host = int8_cache(), int8_cache(2)
    host_before = host.copy()
    with pytest.raises(ValueError, match="dst is int8: its scales dst_scales"):
        ops.swap_blocks(device, host, np.array([[5, 0]], np.int64), src_scales=scales())
    np.testing.assert_array_equal(host, host_before)
