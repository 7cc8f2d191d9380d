/* libFuzzer harness for the C ABI, compiled as C: a fuzzed cache
 * configuration, then fuzzed calls with fuzzed arguments (NULL pointers,
 * unknown sequences, wrong counts, bad tensors). Every call returns a status;
 * a failure has a message and leaves the state digest unchanged. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagedattn/c_api.h"

typedef struct {
  const uint8_t* data;
  size_t size;
} bytes_in;

static uint32_t take(bytes_in* in, uint32_t range) { /* [0, range) */
  uint32_t v = 0;
  for (int i = 0; i < 2 && in->size > 0; ++i, ++in->data, --in->size) v = (v << 8) | in->data[0];
  return range == 0 ? 0 : v % range;
}

static int64_t take_small(bytes_in* in, int64_t lo, int64_t hi) {
  return lo + (int64_t)take(in, (uint32_t)(hi - lo + 1));
}

static void die(const char* what) {
  fprintf(stderr, "fuzz_c_api: %s (last error: %s)\n", what, pagedattn_last_error_message());
  abort();
}

static uint64_t digest_of(const pagedattn_kv_cache* cache) {
  uint64_t digest = 0;
  if (pagedattn_kv_cache_state_digest(cache, &digest) != PAGEDATTN_OK) die("state_digest failed");
  return digest;
}

/* A failed call must name a known status, leave a message, and change nothing. */
static void check(pagedattn_status status, const pagedattn_kv_cache* cache, uint64_t before) {
  if (status == PAGEDATTN_OK) return;
  if (status < PAGEDATTN_INVALID_ARGUMENT || status > PAGEDATTN_OUT_OF_MEMORY)
    die("unknown status");
  if (status == PAGEDATTN_INTERNAL) die("internal error");
  if (pagedattn_last_error_message()[0] == '\0') die("failure without a message");
  if (cache != NULL && digest_of(cache) != before) die("failed call changed the cache");
}

static pagedattn_tensor dense(void* data, pagedattn_dtype dtype, int64_t d0, int64_t d1,
                              int64_t d2) {
  pagedattn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.rank = 3;
  t.shape[0] = d0;
  t.shape[1] = d1;
  t.shape[2] = d2;
  return t;
}

static void attention(bytes_in* in, pagedattn_kv_cache* cache, const pagedattn_kv_cache_config* c) {
  /* Buffers sized for up to 16 tokens; the declared token count is fuzzed. */
  enum { kMaxTokens = 16 };
  const int64_t tokens = take_small(in, 0, kMaxTokens);
  const int64_t fused_heads = c->num_qo_heads + 2 * c->num_kv_heads;
  /* Room for one head more than the layout needs: the declared head count is fuzzed too. */
  float* qkv = calloc((size_t)(kMaxTokens * (fused_heads + 1) * c->head_dim) + 1, sizeof(float));
  float* out = calloc((size_t)(kMaxTokens * c->num_qo_heads * c->head_dim) + 1, sizeof(float));
  if (qkv == NULL || out == NULL) die("out of memory");
  const pagedattn_dtype dtype = take(in, 4) == 0 ? (pagedattn_dtype)take(in, 8) : PAGEDATTN_FLOAT32;
  pagedattn_tensor qkv_t = dense(
      qkv, dtype, tokens, fused_heads + take_small(in, 0, 1) * take_small(in, -1, 1), c->head_dim);
  pagedattn_tensor out_t = dense(out, PAGEDATTN_FLOAT32, tokens, c->num_qo_heads, c->head_dim);
  if (dtype != PAGEDATTN_FLOAT32 && dtype != PAGEDATTN_INT32 && dtype != PAGEDATTN_INT64 &&
      dtype != PAGEDATTN_FLOAT16 && dtype != PAGEDATTN_BFLOAT16) {
    qkv_t.dtype = PAGEDATTN_FLOAT32; /* the buffer is float-sized: keep element sizes <= 4 bytes */
  }
  if (dtype == PAGEDATTN_INT64) qkv_t.dtype = PAGEDATTN_INT32;
  const uint64_t before = digest_of(cache);
  const int32_t layer = (int32_t)take_small(in, -1, c->num_layers);
  check(pagedattn_kv_cache_attention_with_fused_qkv(cache, layer, take(in, 16) == 0 ? NULL : &qkv_t,
                                                    &out_t, 0.5f),
        cache, before);
  free(qkv);
  free(out);
}

static void one_call(bytes_in* in, pagedattn_kv_cache* cache, const pagedattn_kv_cache_config* c) {
  const uint64_t before = digest_of(cache);
  const int64_t seq = take_small(in, -1, 3);
  switch (take(in, 10)) {
    case 0:
      check(pagedattn_kv_cache_add_sequence(cache, seq), cache, before);
      break;
    case 1:
      check(pagedattn_kv_cache_remove_sequence(cache, seq), cache, before);
      break;
    case 2:
      check(pagedattn_kv_cache_fork_sequence(cache, seq, take_small(in, -1, 3),
                                             take_small(in, -2, 20)),
            cache, before);
      break;
    case 3:
      check(pagedattn_kv_cache_pop_n(cache, seq, take_small(in, -1, 10)), cache, before);
      break;
    case 4:
      check(pagedattn_kv_cache_enable_sliding_window(cache, seq, take_small(in, -1, 10),
                                                     take_small(in, -1, 4)),
            cache, before);
      break;
    case 5: {
      int64_t ids[4], lengths[4];
      const size_t count = (size_t)take(in, 5);
      for (size_t i = 0; i < count; ++i)
        ids[i] = take_small(in, -1, 3), lengths[i] = take_small(in, -1, 12);
      const int null_ids = take(in, 16) == 0;
      check(pagedattn_kv_cache_begin_forward(cache, null_ids ? NULL : ids, lengths, count), cache,
            before);
      break;
    }
    case 6:
      check(pagedattn_kv_cache_end_forward(cache), cache, before);
      break;
    case 7:
      attention(in, cache, c);
      break;
    case 8: {
      const int64_t start = take_small(in, -1, 12), end = take_small(in, -1, 12);
      const int64_t span = end > start ? end - start : 0;
      size_t count = (size_t)(c->num_layers * span * c->num_kv_heads * c->head_dim);
      if (take(in, 8) == 0) count = (size_t)take(in, 64);
      float* k = calloc(count + 1, sizeof(float));
      float* v = calloc(count + 1, sizeof(float));
      if (k == NULL || v == NULL) die("out of memory");
      check(pagedattn_kv_cache_debug_get_kv(cache, seq, start, end, k, count, v, count), cache,
            before);
      free(k);
      free(v);
      break;
    }
    default: {
      int64_t value = 0;
      check(pagedattn_kv_cache_sequence_length(cache, seq, take(in, 16) == 0 ? NULL : &value),
            cache, before);
      check(pagedattn_kv_cache_num_free_pages(cache, &value), cache, before);
      break;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bytes_in in = {data, size};
  pagedattn_kv_cache_config config;
  pagedattn_kv_cache_config_init(&config);
  config.num_layers = (int32_t)take_small(&in, 0, 2);
  config.num_kv_heads = (int32_t)take_small(&in, 1, 2);
  config.num_qo_heads = config.num_kv_heads * (int32_t)take_small(&in, 1, 2);
  config.head_dim = 4 << take(&in, 3);
  config.page_size = (int32_t)take_small(&in, 0, 6);
  config.num_pages = take_small(&in, 0, 16);
  config.kv_dtype = (pagedattn_dtype)take(&in, 9);
  config.layout = (int32_t)take_small(&in, 0, 2);
  config.support_sliding_window = (int32_t)take(&in, 2);
  config.rope_mode = (int32_t)take_small(&in, 0, 3);
  pagedattn_kv_cache* cache = NULL;
  const pagedattn_status created = pagedattn_kv_cache_create(&config, &cache);
  check(created, NULL, 0);
  if (created != PAGEDATTN_OK) {
    if (cache != NULL) die("failed create wrote its output");
    return 0;
  }
  for (int calls = 0; calls < 64 && in.size > 0; ++calls) one_call(&in, cache, &config);
  pagedattn_kv_cache_destroy(cache);
  return 0;
}
