"""The GGUF reader and dequantisation against the `gguf` package (PyPI, the
llama.cpp project's own Python reader): dequantisation bit for bit on random
blocks of every supported type, and, when the test model is present
(scripts/get_test_model.sh; PAGEDATTN_TEST_MODEL or the default cache), every
tensor of SmolLM2-135M plus the metadata and tensor infos."""

import os
import pathlib

import numpy as np
import pytest

import pagedattn

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

SUPPORTED = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
# Byte offsets of the f16 scales inside one block (kept finite: random bits
# elsewhere are always a valid block).
SCALE_OFFSETS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
                 "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(type_name, blocks, rng):
    block_size, type_size = gguf.GGML_QUANT_SIZES[Q[type_name]]
    data = rng.integers(0, 256, size=(blocks, type_size), dtype=np.uint8)
    for offset in SCALE_OFFSETS.get(type_name, []):
        sign = rng.integers(0, 2, size=blocks, dtype=np.uint16) << 15
        exponent = rng.integers(1, 31, size=blocks, dtype=np.uint16) << 10  # finite, not subnormal
        mantissa = rng.integers(0, 1024, size=blocks, dtype=np.uint16)
        half = (sign | exponent | mantissa).astype("<u2")
        data[:, offset : offset + 2] = half.view(np.uint8).reshape(blocks, 2)
    # Some subnormal and zero scales too.
    if SCALE_OFFSETS.get(type_name) and blocks > 2:
        data[0, SCALE_OFFSETS[type_name][0] : SCALE_OFFSETS[type_name][0] + 2] = [3, 0]
        data[1, SCALE_OFFSETS[type_name][0] : SCALE_OFFSETS[type_name][0] + 2] = [0, 0x80]
    return data, blocks * block_size


def assert_bitwise_equal(ours, theirs, what):
    ours = np.ascontiguousarray(ours, dtype=np.float32).ravel()
    theirs = np.ascontiguousarray(theirs, dtype=np.float32).ravel()
    assert ours.shape == theirs.shape, what
    same_bits = ours.view(np.uint32) == theirs.view(np.uint32)
    # NaN payloads may be quieted by NumPy's f16 cast; any NaN matches any NaN.
    both_nan = np.isnan(ours) & np.isnan(theirs)
    bad = ~(same_bits | both_nan)
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} differ, first at {np.argmax(bad)}"


@pytest.mark.parametrize("type_name", SUPPORTED)
def test_dequantize_random_blocks_bit_for_bit(type_name):
    rng = np.random.default_rng(sum(map(ord, type_name)))
    for blocks in (1, 3, 64, 1000):
        data, n = random_blocks(type_name, blocks, rng)
        theirs = gguf.quants.dequantize(data.reshape(1, -1), Q[type_name])
        ours = pagedattn.gguf_dequantize(type_name, data.tobytes(), n)
        assert_bitwise_equal(ours, theirs, f"{type_name} x {blocks} blocks")


def test_dequantize_rejects_bad_sizes_and_types():
    with pytest.raises(pagedattn.InvalidArgumentError, match="block size 32"):
        pagedattn.gguf_dequantize("Q4_0", bytes(18), 31)
    with pytest.raises(pagedattn.InvalidArgumentError, match="data has 17 bytes"):
        pagedattn.gguf_dequantize("Q4_0", bytes(17), 32)
    with pytest.raises(pagedattn.UnsupportedError, match="IQ4_NL"):
        pagedattn.gguf_dequantize("IQ4_NL", bytes(18), 32)
    with pytest.raises(pagedattn.InvalidArgumentError, match="not a ggml type name"):
        pagedattn.gguf_dequantize("Q9", b"", 0)
    strided = np.zeros((4, 8), dtype=np.float32)[:, ::2]
    with pytest.raises(pagedattn.InvalidArgumentError, match="C-contiguous"):
        pagedattn.gguf_dequantize("F32", strided, 16)
    assert pagedattn.gguf_dequantize("F32", np.arange(6, dtype=np.float32).reshape(2, 3), 6).tolist() == list(range(6))


def test_reads_a_file_written_by_the_gguf_package(tmp_path):
    path = tmp_path / "written.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.u32", 7)
    writer.add_int64("test.i64", -5)
    writer.add_float32("test.f32", 0.25)
    writer.add_bool("test.bool", True)
    writer.add_string("test.str", "héllo")
    writer.add_array("test.strings", ["a", "bc", ""])
    writer.add_array("test.ints", [1, 2, 3])
    rng = np.random.default_rng(3)
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((2, 7)).astype(np.float16),
    }
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), Q.Q8_0)
    writer.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    f = pagedattn.GgufFile(str(path))
    assert f.get("general.architecture") == "llama"
    assert f.get("test.u32") == 7 and f.get("test.i64") == -5
    assert f.get("test.f32") == 0.25 and f.get("test.bool") is True
    assert f.get("test.str") == "héllo"
    assert f.get("test.strings") == ["a", "bc", ""]
    assert f.get("test.ints") == [1, 2, 3]
    for name, array in tensors.items():
        assert_bitwise_equal(f.dequantize(name), array.astype(np.float32), name)
    assert_bitwise_equal(f.dequantize("q8"), gguf.quants.dequantize(q8, Q.Q8_0), "q8")
    assert f.dequantize("q8").shape == (4, 64)


def model_path():
    env = os.environ.get("PAGEDATTN_TEST_MODEL")
    if env:
        return pathlib.Path(env)
    cache = os.environ.get("PAGEDATTN_MODEL_CACHE", str(pathlib.Path.home() / ".cache/pagedattn/models"))
    return pathlib.Path(cache) / "SmolLM2-135M-Instruct.Q4_1.gguf"


MODEL = model_path()
needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"no {MODEL} (scripts/get_test_model.sh)")


def comparable(value):
    """A GGUFReader field's contents in the types GgufFile.get returns."""
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


@needs_model
def test_real_model_metadata_and_tensor_infos_match_gguf_reader():
    reader = gguf.GGUFReader(str(MODEL))
    ours = pagedattn.GgufFile(str(MODEL))
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert ours.keys() == keys
    for key in keys:
        assert ours.get(key) == comparable(reader.fields[key].contents()), key
    assert ours.data_offset == reader.data_offset
    assert ours.alignment == reader.alignment
    infos = ours.tensors()
    assert [t["name"] for t in infos] == [t.name for t in reader.tensors]
    for info, t in zip(infos, reader.tensors):
        assert info["type"] == t.tensor_type.name, t.name
        assert info["dims"] == [int(d) for d in t.shape], t.name
        assert info["nbytes"] == int(t.n_bytes), t.name
        assert ours.data_offset + info["offset"] == int(t.data_offset), t.name
    config = ours.model_config()
    assert config["num_layers"] == 30 and config["num_qo_heads"] == 9 and config["num_kv_heads"] == 3
    assert config["tie_embeddings"] and config["rope_layout"] == "interleaved"


@needs_model
def test_real_model_every_tensor_dequantises_bit_for_bit():
    reader = gguf.GGUFReader(str(MODEL))
    ours = pagedattn.GgufFile(str(MODEL))
    for t in reader.tensors:
        theirs = gguf.quants.dequantize(t.data, t.tensor_type)
        mine = ours.dequantize(t.name)
        assert mine.shape == theirs.shape, t.name
        assert_bitwise_equal(mine, theirs, t.name)
