"""A PyTorch decode loop on pagedattn's CUDA kernels, checked against torch SDPA.

One attention layer with random weights (q/k/v/o projections in torch, RoPE
with pagedattn.cuda.apply_rope) decodes a batch of sequences greedily. Each
step appends the new tokens' K/V to a paged bfloat16 cache with
pagedattn.cuda.reshape_and_cache (the page table is plain Python: a free
list and each sequence's pages), plans the step's batch on the host,
runs pagedattn.cuda.BatchAttention on torch.cuda.current_stream(), and
compares the output with torch's scaled_dot_product_attention over the
same K/V gathered from the pages into contiguous tensors, printing the
largest difference. The first step is the prompts' prefill.

    python examples/python/cuda_decode_loop.py [--steps N]

Needs torch with CUDA and pagedattn built with its CUDA backend; without a
CUDA device it says so and exits with status 0 (nothing to run).
"""

import argparse
import math
import sys

NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 8, 2, 128
HIDDEN, VOCAB, PAGE_SIZE, NUM_PAGES = 512, 1000, 16, 64
PROMPT_LENS = [5, 17, 30]
TOLERANCE = 5e-2  # bf16 K/V, queries and outputs: 8 significant bits


def cuda_or_exit():
    """pagedattn.cuda and torch, or exits saying what is missing."""
    try:
        import torch
    except ImportError:
        sys.exit("cuda_decode_loop: needs torch (pip install torch)")
    try:
        import pagedattn.cuda as pa_cuda
    except ImportError as error:
        sys.exit(f"cuda_decode_loop: {error}")
    if pa_cuda.device_count() == 0 or not torch.cuda.is_available():
        reason = pa_cuda.no_device_reason() or "torch sees no CUDA device"
        print(f"cuda_decode_loop: no CUDA device ({reason}); nothing to run")
        sys.exit(0)
    return torch, pa_cuda


class PagedCache:
    """K/V pages of one layer and each sequence's page list (allocated as it grows)."""

    def __init__(self, torch, num_sequences):
        shape = (NUM_PAGES, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)  # NHD
        # NaN in every slot not yet written: attention must never read one.
        self.k = torch.full(shape, math.nan, dtype=torch.bfloat16, device="cuda")
        self.v = torch.full(shape, math.nan, dtype=torch.bfloat16, device="cuda")
        self.free = list(reversed(range(NUM_PAGES)))
        self.pages = [[] for _ in range(num_sequences)]
        self.lens = [0] * num_sequences

    def append_slots(self, seq, count):
        """Slots (page * PAGE_SIZE + offset) for `count` new tokens of `seq`."""
        slots = []
        for position in range(self.lens[seq], self.lens[seq] + count):
            if position % PAGE_SIZE == 0:
                self.pages[seq].append(self.free.pop())
            slots.append(self.pages[seq][position // PAGE_SIZE] * PAGE_SIZE + position % PAGE_SIZE)
        self.lens[seq] += count
        return slots

    def table(self, q_lens):
        """qo_indptr, kv_indptr, kv_indices, kv_last_page_len (FlashInfer's CSR form)."""
        qo_indptr, kv_indptr, kv_indices, last_page_len = [0], [0], [], []
        for seq, q_len in enumerate(q_lens):
            qo_indptr.append(qo_indptr[-1] + q_len)
            kv_indices += self.pages[seq]
            kv_indptr.append(len(kv_indices))
            last_page_len.append(self.lens[seq] - (len(self.pages[seq]) - 1) * PAGE_SIZE)
        return qo_indptr, kv_indptr, kv_indices, last_page_len

    def gathered(self, torch, seq):
        """Sequence seq's K and V [len, NUM_KV_HEADS, HEAD_DIM], contiguous."""
        pages = torch.tensor(self.pages[seq], dtype=torch.int64, device="cuda")
        k = self.k[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:self.lens[seq]]
        v = self.v[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:self.lens[seq]]
        return k, v


def reference(torch, q, cache, q_lens, qo_indptr):
    """torch SDPA per sequence over the gathered K/V (GQA by repeating KV heads,
    causal aligned to the last key), in float32."""
    group = NUM_QO_HEADS // NUM_KV_HEADS
    outs = []
    for seq, q_len in enumerate(q_lens):
        k, v = cache.gathered(torch, seq)
        kv_len = k.shape[0]
        qs = q[qo_indptr[seq]:qo_indptr[seq + 1]].float().transpose(0, 1)  # [Hq, q_len, D]
        ks = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
        rows = torch.arange(q_len, device="cuda")[:, None] + (kv_len - q_len)
        mask = torch.arange(kv_len, device="cuda")[None, :] <= rows
        out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="decode steps after the prefill")
    args = parser.parse_args()
    torch, pa_cuda = cuda_or_exit()
    torch.manual_seed(0)

    def weight(rows, cols):
        return (torch.randn(rows, cols, device="cuda") / math.sqrt(rows)).bfloat16()

    embed = weight(VOCAB, HIDDEN) * math.sqrt(VOCAB)
    wq, wk, wv = (weight(HIDDEN, h * HEAD_DIM) for h in (NUM_QO_HEADS, NUM_KV_HEADS, NUM_KV_HEADS))
    wo = weight(NUM_QO_HEADS * HEAD_DIM, HIDDEN)

    batch = len(PROMPT_LENS)
    cache = PagedCache(torch, batch)
    attn = pa_cuda.BatchAttention(NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE,
                                  layout="NHD", kv_dtype="bfloat16")
    stream = torch.cuda.current_stream()
    tokens = [torch.randint(0, VOCAB, (n,)).tolist() for n in PROMPT_LENS]
    new_tokens = tokens  # the prefill step feeds the prompts
    worst = 0.0
    with torch.inference_mode():
        for step in range(args.steps + 1):
            q_lens = [len(t) for t in new_tokens]
            positions = [p for s, n in enumerate(q_lens)
                         for p in range(cache.lens[s], cache.lens[s] + n)]
            slots = [slot for s, n in enumerate(q_lens) for slot in cache.append_slots(s, n)]
            x = embed[torch.tensor(sum(new_tokens, []), device="cuda")]  # [T, HIDDEN]
            q = (x @ wq).view(-1, NUM_QO_HEADS, HEAD_DIM)
            k = (x @ wk).view(-1, NUM_KV_HEADS, HEAD_DIM)
            v = (x @ wv).view(-1, NUM_KV_HEADS, HEAD_DIM)
            pos = torch.tensor(positions, dtype=torch.int32, device="cuda")
            pa_cuda.apply_rope(q, pos, stream=stream.cuda_stream)
            pa_cuda.apply_rope(k, pos, stream=stream.cuda_stream)
            slot_mapping = torch.tensor(slots, dtype=torch.int64, device="cuda")
            pa_cuda.reshape_and_cache(k, v, cache.k, cache.v, slot_mapping,
                                      stream=stream.cuda_stream)

            qo_indptr, kv_indptr, kv_indices, last_page_len = cache.table(q_lens)
            attn.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, stream=stream.cuda_stream)
            out = attn.run(q, cache.k, cache.v, stream=stream.cuda_stream)  # [T, Hq, D]

            expected = reference(torch, q, cache, q_lens, qo_indptr)
            error = (out.float() - expected).abs().max().item()
            worst = max(worst, error)
            kind = "prefill" if step == 0 else "decode "
            print(f"step {step:3d} {kind} tokens {sum(q_lens):3d} keys {sum(cache.lens):4d} "
                  f"max |pagedattn - sdpa| = {error:.3e}")
            if not error <= TOLERANCE:  # NaN fails too
                sys.exit(f"cuda_decode_loop: step {step} differs from SDPA by {error}")

            # Greedy next token of each sequence from its last row.
            logits = (out.reshape(out.shape[0], -1) @ wo) @ embed.t()
            last_rows = torch.tensor(qo_indptr[1:], device="cuda") - 1
            new_tokens = [[t] for t in logits[last_rows].argmax(dim=-1).tolist()]
            for seq, t in enumerate(new_tokens):
                tokens[seq] += t
    print(f"cuda_decode_loop: {args.steps} decode steps, worst difference {worst:.3e} "
          f"(tolerance {TOLERANCE})")


if __name__ == "__main__":
    main()
