// vLLM's paged_attn ops: their validation and translation into the kernels'
// views, shared by the CPU operators (vllm.cc) and the CUDA ones
// (kernels/cuda/cuda_ops.cc): the CUDA operators run the same rules on host
// copies of the index arrays and the same translation over device pointers.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "op_checks.h"
#include "op_support.h"
#include "pagedattn/attention.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/ops/vllm.h"
#include "pagedattn/paged_kv.h"

namespace pagedattn::ops::vllm::internal {

// A forward (decode or prefix) as the kernels take it, over the caller's
// pointers; its page table is the RaggedBatch the validation fills.
struct ForwardAttention {
  HeadTensor q, o;  // [tokens][num_qo_heads][head_dim]
  std::int32_t num_qo_heads = 0;
  PagedKVStorage kv;
  AttentionOptions options;
};

// Every rule of the op, messages starting with `call`. kFull reads the index
// arrays (host memory) and fills batch.qo_indptr and batch.kv_lens (the
// caller gathers the pages from block_tables); kMetadata reads no index value
// and leaves `batch` alone.
ForwardAttention validate_decode(const char* call, const ForwardDecodeParams& p,
                                 checks::Validation validation, RaggedBatch& batch);
ForwardAttention validate_prefix(const char* call, const ForwardPrefixParams& p,
                                 checks::Validation validation, RaggedBatch& batch);

// write_to_paged_cache's append, slot_mapping left null; kFull copies the
// slots (checked: -1 or inside the caches) to `slots`.
AppendParams validate_write(const char* call, const WriteToPagedCacheParams& p,
                            checks::Validation validation, std::vector<std::int64_t>& slots);

// copy_blocks: each layer's K then V cache as a storage (V empty: a block is
// one run of bytes) with its int8 scales; kFull also checks the mapping's
// blocks (in range, destinations distinct, none also a source).
std::vector<PagedKVStorage> validate_copy_blocks(const char* call, const CopyBlocksParams& p,
                                                 checks::Validation validation);

// swap_blocks: src and dst as storages, as copy_blocks'.
struct SwapStorages {
  PagedKVStorage src, dst;
};
SwapStorages validate_swap_blocks(const char* call, const SwapBlocksParams& p,
                                  checks::Validation validation);

// The (source, destination) pairs of a validated block_mapping (host memory).
std::vector<std::pair<std::int64_t, std::int64_t>> block_pairs(const IndexView& mapping);

}  // namespace pagedattn::ops::vllm::internal
