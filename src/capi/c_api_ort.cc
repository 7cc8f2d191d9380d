// C ABI of the ORT-style PagedAttention operator.
#include "c_api_support.h"
#include "pagedattn/ops/ort.h"

extern "C" {

void pagedattn_ort_paged_attention_params_init(pagedattn_ort_paged_attention_params* params) {
  if (params == nullptr) return;
  *params = {};
  params->local_window_size = -1;
}

pagedattn_status pagedattn_ort_paged_attention(const pagedattn_ort_paged_attention_params* params) {
  using namespace pagedattn::capi;
  constexpr const char* kCall = "pagedattn_ort_paged_attention";
  return guarded([&] {
    require_pointer(params, kCall, "params");
    const pagedattn_ort_paged_attention_params& c = *params;
    pagedattn::ops::ort::PagedAttentionParams p;
    p.query = to_tensor(c.query, kCall, "query");
    p.key = to_optional_tensor(c.key, kCall, "key");
    p.value = to_optional_tensor(c.value, kCall, "value");
    p.key_cache = to_tensor(c.key_cache, kCall, "key_cache");
    p.value_cache = to_tensor(c.value_cache, kCall, "value_cache");
    p.cumulative_sequence_length =
        to_index(c.cumulative_sequence_length, kCall, "cumulative_sequence_length");
    p.past_seqlens = to_index(c.past_seqlens, kCall, "past_seqlens");
    p.block_table = to_index(c.block_table, kCall, "block_table");
    p.cos_cache = to_optional_tensor(c.cos_cache, kCall, "cos_cache");
    p.sin_cache = to_optional_tensor(c.sin_cache, kCall, "sin_cache");
    p.slot_mapping = to_optional_index(c.slot_mapping, kCall, "slot_mapping");
    p.head_sink = to_optional_tensor(c.head_sink, kCall, "head_sink");
    p.output = to_tensor(c.output, kCall, "output");
    p.num_heads = c.num_heads;
    p.kv_num_heads = c.kv_num_heads;
    p.scale = c.scale;
    p.softcap = c.softcap;
    p.local_window_size = c.local_window_size;
    p.do_rotary = c.do_rotary != 0;
    p.rotary_interleaved = c.rotary_interleaved != 0;
    pagedattn::ops::ort::paged_attention(p);
  });
}

}  // extern "C"
