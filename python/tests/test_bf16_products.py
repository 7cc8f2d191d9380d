"""bf16 batch products (ForwardBatch.bf16_products: `--bf16-products`,
Engine / LLM(bf16_products=True)) against the exact path on the real
SmolLM2-135M file (GGUF, Q4_1; PAGEDATTN_TEST_MODEL or
scripts/get_test_model.sh).

With bf16_products a batch of more than 8 rows (here each 30-token prompt,
teacher-forced) rounds the activations and the dequantised weights of every
quantised product to bf16 (8 significant bits) and multiplies them on
AVX512-BF16 dot products, where the CPU has them; the kernel tests bound a
product against a double product of the rounded inputs. Measured on the two
prompts on the Zen 5 VM (docs/models.md, "bf16 batch products"): top-1
agreement 1.0, max |logit difference| 0.32 / 0.39, mean 0.051 / 0.040
(logits up to ~32), against 0.92, 2.5 and 0.35-0.59 for int8 activations
in the same run. The bound checked leaves room for other CPUs' summation
orders: top-1 >= 0.9 over all positions, max < 2, mean < 0.25.
"""
import numpy as np
import pytest

from test_gguf_model import model_path  # noqa: E402  (the test model, fetched once)
from test_int8_activations import PROMPTS

MIN_TOP1, MAX_DIFF, MEAN_DIFF = 0.9, 2.0, 0.25


def cpu_has_avx512_bf16():
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_bf16" in f.read().split()
    except OSError:
        return False


def test_bf16_products_stay_within_their_bound_of_the_exact_logits():
    import pagedattn._core as core
    model = core.GgufModel(model_path())
    top1 = []
    for tokens in PROMPTS:
        exact = model.logits(tokens).astype(np.float64)
        fast = model.logits(tokens, exact=False, bf16_products=True).astype(np.float64)
        serving = model.logits(tokens, exact=False).astype(np.float64)
        diff = np.abs(fast - exact)
        if diff.max() == np.abs(serving - exact).max():
            assert not cpu_has_avx512_bf16(), "bf16_products gave the f32 path's logits"
            pytest.skip("no AVX512-BF16 on this CPU: the f32 path ran")
        top1.append(float(np.mean(np.argmax(fast, -1) == np.argmax(exact, -1))))
        print(f"{len(tokens)} positions: top-1 agreement {top1[-1]:.3f}, max |logit difference| "
              f"{diff.max():.3f}, mean {diff.mean():.3f} (logits up to {np.abs(exact).max():.1f})")
        assert diff.max() < MAX_DIFF
        assert diff.mean() < MEAN_DIFF
    print(f"top-1 agreement over every position: {np.mean(top1):.3f}")
    assert np.mean(top1) >= MIN_TOP1


def test_deterministic_mode_keeps_f32_products():
    import pagedattn._core as core
    model = core.GgufModel(model_path())
    tokens = PROMPTS[0]
    np.testing.assert_array_equal(model.logits(tokens, bf16_products=True), model.logits(tokens))
