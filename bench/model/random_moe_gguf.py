#!/usr/bin/env python3
"""Write a mixture-of-experts GGUF file of seeded random F16 weights, for
timing its steps against peers on the same file.

    random_moe_gguf.py TOKENIZER.gguf DST.gguf [--arch qwen3moe|deepseek2]
        [--layers 4]

qwen3moe: Qwen3-30B-A3B's layer shapes (hidden 2,048, 32 query and 4 KV
heads of 128, 128 experts of 768, top 8; 48 layers there). deepseek2:
DeepSeek-V2-Lite's (hidden 2,048, 16 heads of latent attention: latent
512, nope 128, rope 64, v 128; 64 experts of 1,408, top 6, 2 shared; the
first layer dense, 10,944 wide; 27 layers there) with the query through
a rank-1,536 bottleneck as DeepSeek-V2 and V3 have it (llama.cpp takes
only 27-layer files for the Lite's direct query), in the converter's
split attn_k_b / attn_v_b form. The tokenizer (every tokenizer.* key)
comes from TOKENIZER.gguf, the vocabulary size from its token list.
Quantise the result with llama.cpp's llama-quantize (e.g. Q4_K_M) for the
layouts users download. The weights are normal with standard deviation
0.02 (norms 1), as Hugging Face initialises them: the text is noise, each
product reads and computes what the real model's does. Needs the `gguf`
and `numpy` packages (PyPI).
"""
import argparse

import gguf
import numpy as np
from gguf_fields import copy_fields, write_out


def copy_tokenizer(reader, writer):
    """Every tokenizer.* field; the vocabulary's size."""
    copy_fields(reader, writer, lambda key: key.startswith("tokenizer."))
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def normal_weights(seed):
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    return normal


def ones(n):
    return np.ones(n, np.float32)


def write_experts(writer, p, normal, hidden, experts, width):
    writer.add_tensor(p + "ffn_gate_inp.weight", normal(experts, hidden).astype(np.float32))
    writer.add_tensor(p + "ffn_gate_exps.weight", normal(experts, width, hidden))
    writer.add_tensor(p + "ffn_up_exps.weight", normal(experts, width, hidden))
    writer.add_tensor(p + "ffn_down_exps.weight", normal(experts, hidden, width))


HIDDEN = 2048  # both architectures


def qwen3moe(writer, layers, normal):
    h, heads, kv_heads, d, experts, width = HIDDEN, 32, 4, 128, 128, 768
    writer.add_feed_forward_length(4 * h)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(d)
    writer.add_value_length(d)
    writer.add_rope_freq_base(1000000.0)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(8)
    writer.add_expert_feed_forward_length(width)
    for layer in range(layers):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", ones(h))
        writer.add_tensor(p + "attn_q.weight", normal(heads * d, h))
        writer.add_tensor(p + "attn_k.weight", normal(kv_heads * d, h))
        writer.add_tensor(p + "attn_v.weight", normal(kv_heads * d, h))
        writer.add_tensor(p + "attn_output.weight", normal(h, heads * d))
        writer.add_tensor(p + "attn_q_norm.weight", ones(d))
        writer.add_tensor(p + "attn_k_norm.weight", ones(d))
        writer.add_tensor(p + "ffn_norm.weight", ones(h))
        write_experts(writer, p, normal, h, experts, width)


def deepseek2(writer, layers, normal, vocab):
    h, heads, q_rank, latent, nope, rope, v = HIDDEN, 16, 1536, 512, 128, 64, 128
    experts, width, shared, dense = 64, 1408, 2, 10944
    writer.add_feed_forward_length(dense)
    writer.add_head_count(heads)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_q_lora_rank(q_rank)
    writer.add_kv_lora_rank(latent)
    writer.add_key_length(latent + rope)
    writer.add_value_length(latent)
    writer.add_key_length_mla(nope + rope)
    writer.add_value_length_mla(v)
    writer.add_rope_dimension_count(rope)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(6)
    writer.add_expert_group_count(1)
    writer.add_expert_group_used_count(1)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_leading_dense_block_count(1)
    writer.add_expert_feed_forward_length(width)
    writer.add_expert_shared_count(shared)
    writer.add_expert_weights_scale(1.0)
    for layer in range(layers):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", ones(h))
        writer.add_tensor(p + "attn_q_a.weight", normal(q_rank, h))
        writer.add_tensor(p + "attn_q_a_norm.weight", ones(q_rank))
        writer.add_tensor(p + "attn_q_b.weight", normal(heads * (nope + rope), q_rank))
        writer.add_tensor(p + "attn_kv_a_mqa.weight", normal(latent + rope, h))
        writer.add_tensor(p + "attn_kv_a_norm.weight", ones(latent))
        writer.add_tensor(p + "attn_k_b.weight", normal(heads, latent, nope))
        writer.add_tensor(p + "attn_v_b.weight", normal(heads, v, latent))
        writer.add_tensor(p + "attn_output.weight", normal(h, heads * v))
        writer.add_tensor(p + "ffn_norm.weight", ones(h))
        if layer == 0:
            writer.add_tensor(p + "ffn_gate.weight", normal(dense, h))
            writer.add_tensor(p + "ffn_up.weight", normal(dense, h))
            writer.add_tensor(p + "ffn_down.weight", normal(h, dense))
            continue
        write_experts(writer, p, normal, h, experts, width)
        writer.add_tensor(p + "ffn_gate_shexp.weight", normal(shared * width, h))
        writer.add_tensor(p + "ffn_up_shexp.weight", normal(shared * width, h))
        writer.add_tensor(p + "ffn_down_shexp.weight", normal(h, shared * width))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tokenizer")
    parser.add_argument("dst")
    parser.add_argument("--arch", choices=["qwen3moe", "deepseek2"], default="qwen3moe")
    parser.add_argument("--layers", type=int, default=4)
    a = parser.parse_args()
    normal = normal_weights(0)
    writer = gguf.GGUFWriter(a.dst, a.arch)
    vocab = copy_tokenizer(gguf.GGUFReader(a.tokenizer), writer)
    writer.add_name(f"random {a.arch}")
    writer.add_block_count(a.layers)
    writer.add_context_length(4096)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_embedding_length(HIDDEN)
    writer.add_tensor("token_embd.weight", normal(vocab, HIDDEN))
    writer.add_tensor("output_norm.weight", ones(HIDDEN))
    writer.add_tensor("output.weight", normal(vocab, HIDDEN))
    if a.arch == "qwen3moe":
        qwen3moe(writer, a.layers, normal)
    else:
        deepseek2(writer, a.layers, normal, vocab)
    write_out(writer)


if __name__ == "__main__":
    main()
