#!/usr/bin/env python3
"""Write a qwen3moe GGUF file of seeded random F16 weights, for timing
mixture-of-experts steps against peers on the same file.

    random_moe_gguf.py TOKENIZER.gguf DST.gguf [--layers 4] [--hidden 2048]
        [--experts 128] [--used 8] [--expert-ff 768] [--heads 32]
        [--kv-heads 4] [--head-dim 128]

The defaults are Qwen3-30B-A3B's layer shapes (48 layers there); the
tokenizer (every tokenizer.* key) comes from TOKENIZER.gguf, the vocabulary
size from its token list. Quantise the result with llama.cpp's
llama-quantize (e.g. Q4_K_M) for the layouts users download. The weights
are normal with standard deviation 0.02 (norms 1), as Hugging Face
initialises them: the text is noise, each product reads and computes what
the real model's does. Needs the `gguf` and `numpy` packages (PyPI).
"""
import argparse

import gguf
import numpy as np


def copy_tokenizer(reader, writer):
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if field.types[1] == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(key, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            writer.add_key_value(key, field.parts[field.data[0]].tolist()[0], kind)
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tokenizer")
    parser.add_argument("dst")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--used", type=int, default=8)
    parser.add_argument("--expert-ff", type=int, default=768)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    a = parser.parse_args()
    rng = np.random.default_rng(0)

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n):
        return np.ones(n, np.float32)

    arch = "qwen3moe"
    writer = gguf.GGUFWriter(a.dst, arch)
    vocab = copy_tokenizer(gguf.GGUFReader(a.tokenizer), writer)
    writer.add_name("random qwen3moe")
    writer.add_block_count(a.layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(a.hidden)
    writer.add_feed_forward_length(4 * a.hidden)
    writer.add_head_count(a.heads)
    writer.add_head_count_kv(a.kv_heads)
    writer.add_key_length(a.head_dim)
    writer.add_value_length(a.head_dim)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(a.experts)
    writer.add_expert_used_count(a.used)
    writer.add_expert_feed_forward_length(a.expert_ff)
    h, q, kv = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim
    writer.add_tensor("token_embd.weight", normal(vocab, h))
    writer.add_tensor("output_norm.weight", ones(h))
    writer.add_tensor("output.weight", normal(vocab, h))
    for layer in range(a.layers):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", ones(h))
        writer.add_tensor(p + "attn_q.weight", normal(q, h))
        writer.add_tensor(p + "attn_k.weight", normal(kv, h))
        writer.add_tensor(p + "attn_v.weight", normal(kv, h))
        writer.add_tensor(p + "attn_output.weight", normal(h, q))
        writer.add_tensor(p + "attn_q_norm.weight", ones(a.head_dim))
        writer.add_tensor(p + "attn_k_norm.weight", ones(a.head_dim))
        writer.add_tensor(p + "ffn_norm.weight", ones(h))
        writer.add_tensor(p + "ffn_gate_inp.weight", normal(a.experts, h).astype(np.float32))
        writer.add_tensor(p + "ffn_gate_exps.weight", normal(a.experts, a.expert_ff, h))
        writer.add_tensor(p + "ffn_up_exps.weight", normal(a.experts, a.expert_ff, h))
        writer.add_tensor(p + "ffn_down_exps.weight", normal(a.experts, h, a.expert_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
