/* C ABI of pagedattn: the KV-cache manager and the ONNX Runtime style
 * PagedAttention operator. No C++ exception crosses this boundary: every
 * function returns a pagedattn_status, and on failure the message of the
 * error (naming the argument and value) is kept per thread until the next
 * failing call: pagedattn_last_error_message(). Outputs are written only on
 * success.
 *
 * Threading: a pagedattn_kv_cache is internally synchronized like the C++
 * cache: any function may be called on it from any thread, calls on one
 * cache serialize, and a structural call made while another thread is in
 * attention waits for that layer to finish. Only create and destroy must not
 * race with other calls on the same cache. The error message is per thread:
 * a failure on one thread never changes what another thread reads. */
#ifndef PAGEDATTN_C_API_H_
#define PAGEDATTN_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as pagedattn::ErrorCode, plus host memory exhaustion. */
typedef enum pagedattn_status {
  PAGEDATTN_OK = 0,
  PAGEDATTN_INVALID_ARGUMENT = 1,
  PAGEDATTN_OUT_OF_PAGES = 2,
  PAGEDATTN_INVALID_STATE = 3,
  PAGEDATTN_UNSUPPORTED = 4,
  PAGEDATTN_INTERNAL = 5,
  PAGEDATTN_OUT_OF_MEMORY = 6
} pagedattn_status;

/* "" when no call on this thread has failed yet. */
const char* pagedattn_last_error_message(void);
/* "ok", "invalid_argument", ... */
const char* pagedattn_status_name(pagedattn_status status);

/* Element types: the first six as pagedattn::DType, then index types. */
typedef enum pagedattn_dtype {
  PAGEDATTN_FLOAT32 = 0,
  PAGEDATTN_FLOAT16 = 1,
  PAGEDATTN_BFLOAT16 = 2,
  PAGEDATTN_FLOAT8_E4M3 = 3,
  PAGEDATTN_FLOAT8_E5M2 = 4,
  PAGEDATTN_INT8 = 5,
  PAGEDATTN_INT32 = 6,
  PAGEDATTN_INT64 = 7
} pagedattn_dtype;

/* A strided tensor view. rank 0 means "absent" for optional inputs;
 * strides (in elements) all 0 means dense row-major. */
typedef struct pagedattn_tensor {
  void* data;
  pagedattn_dtype dtype;
  int32_t rank;
  int64_t shape[4];
  int64_t strides[4];
} pagedattn_tensor;

/* --- KV-cache manager (pagedattn::PagedKVCache) ------------------------------ */

typedef struct pagedattn_kv_cache pagedattn_kv_cache;

typedef struct pagedattn_kv_cache_config {
  int32_t num_layers;
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t v_head_dim; /* 0: head_dim */
  int32_t page_size;
  int64_t num_pages; /* or 0 with memory_budget_bytes */
  int64_t memory_budget_bytes;
  pagedattn_dtype kv_dtype; /* float32 .. int8 */
  float k_scale, v_scale;   /* fp8 dequantisation scales */
  int32_t layout;           /* 0: HND, 1: NHD */
  int32_t support_sliding_window;
  int32_t rope_mode;        /* 0: none, 1: normal, 2: inline */
  int32_t rope_interleaved; /* 0: half split (neox), 1: pairs (2t, 2t+1) */
  int32_t rotary_dim;       /* 0: head_dim */
  float rope_theta;
  float rope_scale;
} pagedattn_kv_cache_config;

/* The C++ defaults (one layer, 16-token pages, float16, HND, no RoPE). */
void pagedattn_kv_cache_config_init(pagedattn_kv_cache_config* config);

pagedattn_status pagedattn_kv_cache_create(const pagedattn_kv_cache_config* config,
                                           pagedattn_kv_cache** out);
void pagedattn_kv_cache_destroy(pagedattn_kv_cache* cache); /* NULL is fine */

pagedattn_status pagedattn_kv_cache_add_sequence(pagedattn_kv_cache* cache, int64_t seq_id);
pagedattn_status pagedattn_kv_cache_remove_sequence(pagedattn_kv_cache* cache, int64_t seq_id);
/* fork_pos -1: the whole parent. */
pagedattn_status pagedattn_kv_cache_fork_sequence(pagedattn_kv_cache* cache, int64_t parent_id,
                                                  int64_t child_id, int64_t fork_pos);
pagedattn_status pagedattn_kv_cache_pop_n(pagedattn_kv_cache* cache, int64_t seq_id, int64_t n);
pagedattn_status pagedattn_kv_cache_enable_sliding_window(pagedattn_kv_cache* cache, int64_t seq_id,
                                                          int64_t window_size,
                                                          int64_t attn_sink_size);
/* seq_ids[count], append_lengths[count]; the step's plan stays inside the cache.
 * There is no step handle: end_forward, cancel_forward and attention act on
 * whichever step is open, so with threads the one that began a step must be
 * the one to end it (C++ PagedKVCache's step ids catch a replaced step). */
pagedattn_status pagedattn_kv_cache_begin_forward(pagedattn_kv_cache* cache, const int64_t* seq_ids,
                                                  const int64_t* append_lengths, size_t count);
/* INVALID_STATE (the step stays open) if some layer's K/V of the step's new
 * tokens was not appended: call attention for every layer first. */
pagedattn_status pagedattn_kv_cache_end_forward(pagedattn_kv_cache* cache);
/* Abandons the open step: the cache returns to exactly its state before
 * begin_forward (for a model that failed half way). */
pagedattn_status pagedattn_kv_cache_cancel_forward(pagedattn_kv_cache* cache);
/* qkv [T][Hq + 2 Hkv][D], out [T][Hq][D] (T = tokens of the step); sm_scale
 * is the full logit scale. RoPE per config.rope_mode. */
pagedattn_status pagedattn_kv_cache_attention_with_fused_qkv(pagedattn_kv_cache* cache,
                                                             int32_t layer,
                                                             const pagedattn_tensor* qkv,
                                                             const pagedattn_tensor* out,
                                                             float sm_scale);
pagedattn_status pagedattn_kv_cache_num_free_pages(const pagedattn_kv_cache* cache, int64_t* out);
pagedattn_status pagedattn_kv_cache_sequence_length(const pagedattn_kv_cache* cache, int64_t seq_id,
                                                    int64_t* out);
/* Tokens [start, end) of every layer as float32:
 * k_out [num_layers][end - start][num_kv_heads][head_dim] (k_count elements), v_out likewise. */
pagedattn_status pagedattn_kv_cache_debug_get_kv(const pagedattn_kv_cache* cache, int64_t seq_id,
                                                 int64_t start, int64_t end, float* k_out,
                                                 size_t k_count, float* v_out, size_t v_count);
/* 64-bit digest of metadata and page contents (unchanged by a failed call). */
pagedattn_status pagedattn_kv_cache_state_digest(const pagedattn_kv_cache* cache, uint64_t* out);

/* --- ONNX Runtime com.microsoft.PagedAttention ------------------------------- */

/* Shapes and conventions as pagedattn::ops::ort::PagedAttentionParams
 * (include/pagedattn/ops/ort.h); optional inputs have rank 0. */
typedef struct pagedattn_ort_paged_attention_params {
  pagedattn_tensor query, key, value;
  pagedattn_tensor key_cache, value_cache;
  pagedattn_tensor cumulative_sequence_length, past_seqlens, block_table;
  pagedattn_tensor cos_cache, sin_cache, slot_mapping, head_sink;
  pagedattn_tensor output;
  int32_t num_heads;
  int32_t kv_num_heads;
  float scale;               /* 0: 1/sqrt(head_size) */
  float softcap;             /* 0: off */
  int32_t local_window_size; /* -1: off; L >= 1: the last L keys, own included */
  int32_t do_rotary;
  int32_t rotary_interleaved;
} pagedattn_ort_paged_attention_params;

/* Zero tensors and ORT's attribute defaults (local_window_size -1). */
void pagedattn_ort_paged_attention_params_init(pagedattn_ort_paged_attention_params* params);
pagedattn_status pagedattn_ort_paged_attention(const pagedattn_ort_paged_attention_params* params);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_C_API_H_ */
