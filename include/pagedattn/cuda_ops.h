// The peer operators (ops/ort.h, ops/vllm.h) on device memory, over the CUDA
// backend (libpagedattn_cuda, pagedattn/cuda.h). Each takes the CPU
// operator's own Params struct and keeps its conventions, its validation
// (the same code, the same InvalidArgument messages, prefixed "cuda::") and
// its order of work, so an integration swaps one namespace:
//
//   pagedattn::ops::vllm::forward_decode(params);                 // host memory
//   pagedattn::cuda::ops::vllm::forward_decode(params, stream);   // device memory
//
// Memory: every TensorView and IndexView is device memory (ORT's and vLLM's
// CUDA tensors are), except vLLM swap_blocks' block_mapping, a CPU tensor
// in vLLM too; swap_blocks' src and dst are one host and one device tensor
// (or both device), as vLLM's.
//
// Synchronisation: an op whose index arrays are device memory (ORT
// paged_attention; vLLM forward_decode, forward_prefix,
// write_to_paged_cache, copy_blocks) reads them once: it copies them to the
// host on `stream` and synchronises the stream once, as FlashInfer's plan
// reads its page table, validates them there (bad values throw before any
// write) and plans. Everything after that is enqueued on `stream` and the
// call returns without waiting. swap_blocks does not synchronise.
//
// Allocation: each call takes its device scratch (the uploaded page table
// and slots, rotated copies, the attention workspace) with cudaMallocAsync
// on `stream` and releases it with cudaFreeAsync there. An engine that wants
// neither the synchronisation nor the allocations uses plan_cuda_attention /
// cuda_paged_attention with host copies of its table (pagedattn/cuda.h).
//
// Errors: every rule that reads no index value (ranks, shapes, dtypes,
// strides, null pointers, scalars) is checked before the first CUDA call.
// Unsupported: float32 K/V in the attention ops (store them as float16,
// bfloat16 or fp8), and what plan_cuda_attention refuses. CUDA failures
// throw pagedattn::Error (kInternal) naming the call.
//
// This header needs no CUDA headers.
#pragma once

#include "pagedattn/cuda.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/ops/vllm.h"

namespace pagedattn::cuda::ops::ort {

using PagedAttentionParams = ::pagedattn::ops::ort::PagedAttentionParams;

// ops::ort::paged_attention on the device: validate, rotate q and the new k
// (do_rotary: f32 copies rotated by cuda_apply_rope, as the CPU operator's
// private f32 copies), append to the caches (cuda_append_paged_kv), attend
// (cuda_paged_attention). The output is written in query's dtype; K/V are
// float16 or bfloat16 (the caches have the query's dtype).
void paged_attention(const PagedAttentionParams& params, Stream stream = nullptr);

}  // namespace pagedattn::cuda::ops::ort

namespace pagedattn::cuda::ops::vllm {

using CacheLayout = ::pagedattn::ops::vllm::CacheLayout;
using KVCaches = ::pagedattn::ops::vllm::KVCaches;
using ForwardDecodeParams = ::pagedattn::ops::vllm::ForwardDecodeParams;
using ForwardPrefixParams = ::pagedattn::ops::vllm::ForwardPrefixParams;
using WriteToPagedCacheParams = ::pagedattn::ops::vllm::WriteToPagedCacheParams;
using CopyBlocksParams = ::pagedattn::ops::vllm::CopyBlocksParams;
using SwapBlocksParams = ::pagedattn::ops::vllm::SwapBlocksParams;

// Attention over the caches: K/V float16, bfloat16 or fp8 ("auto" with
// float32 activations is Unsupported). alibi_slopes is device memory.
void forward_decode(const ForwardDecodeParams& params, Stream stream = nullptr);
void forward_prefix(const ForwardPrefixParams& params, Stream stream = nullptr);

// reshape_and_cache: quantises on write bit for bit as the CPU operator.
void write_to_paged_cache(const WriteToPagedCacheParams& params, Stream stream = nullptr);
inline void reshape_and_cache(const WriteToPagedCacheParams& params, Stream stream = nullptr) {
  write_to_paged_cache(params, stream);
}

// Caches, int8 scales and block_mapping are device memory (vLLM's
// blocks_to_copy is a GPU tensor).
void copy_blocks(const CopyBlocksParams& params, Stream stream = nullptr);

// block_mapping is host memory (vLLM's blocks_to_swap_in / _out are CPU
// tensors); the direction comes from where src and dst live
// (cudaPointerGetAttributes): device to host, host to device, or device to
// device; host to host is refused. Host sides should be pinned for the
// copies to overlap; the copies may still be in flight when the call
// returns, so synchronise `stream` before the host side is read or freed.
void swap_blocks(const SwapBlocksParams& params, Stream stream = nullptr);

}  // namespace pagedattn::cuda::ops::vllm
