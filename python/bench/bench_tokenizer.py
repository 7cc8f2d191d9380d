"""Encode throughput of pagedattn.Tokenizer on SmolLM2's vocabulary, beside
Hugging Face `tokenizers` built from the same vocabulary (single thread).

    python python/bench/bench_tokenizer.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

The sample text is the test suite's generated strings (scripts, whitespace,
numbers, code, emoji) plus English-like prose, ~1 MB each; the figure is the best of
3 runs of one encode call over the whole text (MB = 10^6 bytes of UTF-8).
"""

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_tokenizer as t  # noqa: E402  (vocabulary loading and text generators)


def best_seconds(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    if len(sys.argv) > 1:
        path = Path(sys.argv[1])
    else:
        path, reason = t.fetch_smollm2_gguf()
        if path is None:
            sys.exit(reason)
    meta = t.read_tokenizer_metadata(path)
    ours = t.ours_from_meta(meta)
    hf = t.hf_byte_level(meta, "smollm", with_specials=True)
    prose = ("The quick brown fox jumps over the lazy dog. It's 10:45 and we've got 3,141 "
             "lines of code to review before the 2nd release.\n") * 8000
    mixed = "\n".join(t.generated_strings(99, 20000))
    for name, text in [("prose", prose), ("mixed", mixed)]:
        size_mb = len(text.encode("utf-8")) / 1e6
        ours_s = best_seconds(lambda: ours.encode(text, add_special=False, parse_special=True))
        hf_s = best_seconds(lambda: hf.encode(text, add_special_tokens=False))
        print(f"{name}: {size_mb:.2f} MB  pagedattn {size_mb / ours_s:.1f} MB/s  "
              f"HF tokenizers {size_mb / hf_s:.1f} MB/s")


if __name__ == "__main__":
    main()
