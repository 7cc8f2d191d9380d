/* The C ABI from C (compiled as C11, not C++): cache lifecycle, fused-QKV
 * attention, the ORT-style operator, error codes, thread-local messages, and
 * that failed calls change nothing. Exits non-zero on the first failure. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagedattn/c_api.h"

static int g_failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              pagedattn_last_error_message());                                                \
      ++g_failures;                                                                           \
    }                                                                                         \
  } while (0)

/* The call must fail with `status` and a message containing `part`. */
#define CHECK_FAILS(call, status, part)                                           \
  do {                                                                            \
    pagedattn_status s_ = (call);                                                 \
    CHECK(s_ == (status));                                                        \
    if (strstr(pagedattn_last_error_message(), (part)) == NULL) {                 \
      fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, \
              pagedattn_last_error_message(), (part));                            \
      ++g_failures;                                                               \
    }                                                                             \
  } while (0)

static pagedattn_tensor dense(void* data, pagedattn_dtype dtype, int rank, const int64_t* shape) {
  pagedattn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  for (int d = 0; d < rank; ++d) t.shape[d] = shape[d];
  return t; /* strides all 0: dense */
}

static float value_at(int i) {
  return (float)sin(0.37 * i) * 2.0f;
}

enum { kHq = 4, kHkv = 2, kD = 8, kTokens = 5 };

static void test_cache(void) {
  pagedattn_kv_cache_config config;
  pagedattn_kv_cache_config_init(&config);
  CHECK(config.page_size == 16 && config.kv_dtype == PAGEDATTN_FLOAT16);
  config.num_layers = 2;
  config.num_qo_heads = kHq;
  config.num_kv_heads = kHkv;
  config.head_dim = kD;
  config.page_size = 4;
  config.num_pages = 32;
  config.kv_dtype = PAGEDATTN_FLOAT32;
  pagedattn_kv_cache* cache = NULL;
  CHECK(pagedattn_kv_cache_create(&config, &cache) == PAGEDATTN_OK);
  CHECK(cache != NULL);

  config.num_kv_heads = 3;
  pagedattn_kv_cache* bad = NULL;
  CHECK_FAILS(pagedattn_kv_cache_create(&config, &bad), PAGEDATTN_INVALID_ARGUMENT, "num_kv_heads");
  CHECK(bad == NULL);
  config.num_kv_heads = kHkv;
  config.kv_dtype = (pagedattn_dtype)12; /* no such enumerator: refused by value */
  CHECK_FAILS(pagedattn_kv_cache_create(&config, &bad), PAGEDATTN_INVALID_ARGUMENT,
              "config.kv_dtype = 12 is not a KV storage type");
  config.kv_dtype = (pagedattn_dtype)8;
  CHECK_FAILS(pagedattn_kv_cache_create(&config, &bad), PAGEDATTN_INVALID_ARGUMENT, "kv_dtype = 8");
  config.kv_dtype = (pagedattn_dtype)-3;
  CHECK_FAILS(pagedattn_kv_cache_create(&config, &bad), PAGEDATTN_INVALID_ARGUMENT,
              "kv_dtype = -3");
  CHECK(bad == NULL);
  config.kv_dtype = PAGEDATTN_FLOAT32;

  CHECK(pagedattn_kv_cache_add_sequence(cache, 7) == PAGEDATTN_OK);
  uint64_t before = 0, after = 0;
  CHECK(pagedattn_kv_cache_state_digest(cache, &before) == PAGEDATTN_OK);
  CHECK_FAILS(pagedattn_kv_cache_add_sequence(cache, 7), PAGEDATTN_INVALID_ARGUMENT, "7");
  CHECK_FAILS(pagedattn_kv_cache_pop_n(cache, 7, 3), PAGEDATTN_INVALID_ARGUMENT, "3");
  CHECK_FAILS(pagedattn_kv_cache_end_forward(cache), PAGEDATTN_INVALID_STATE, "forward");
  CHECK(pagedattn_kv_cache_state_digest(cache, &after) == PAGEDATTN_OK);
  CHECK(before == after);

  const int64_t ids[] = {7}, lens[] = {kTokens};
  CHECK(pagedattn_kv_cache_begin_forward(cache, ids, lens, 1) == PAGEDATTN_OK);
  float qkv[kTokens * (kHq + 2 * kHkv) * kD];
  float out[kTokens * kHq * kD];
  for (int i = 0; i < (int)(sizeof qkv / sizeof qkv[0]); ++i) qkv[i] = value_at(i);
  const int64_t qkv_shape[] = {kTokens, kHq + 2 * kHkv, kD}, out_shape[] = {kTokens, kHq, kD};
  pagedattn_tensor qkv_t = dense(qkv, PAGEDATTN_FLOAT32, 3, qkv_shape);
  pagedattn_tensor out_t = dense(out, PAGEDATTN_FLOAT32, 3, out_shape);
  pagedattn_tensor short_t = out_t;
  short_t.shape[0] = kTokens - 1;
  CHECK_FAILS(pagedattn_kv_cache_attention_with_fused_qkv(cache, 0, &qkv_t, &short_t, 0.35f),
              PAGEDATTN_INVALID_ARGUMENT, "o has shape [4, 4, 8], expected [5, 4, 8]");
  CHECK_FAILS(pagedattn_kv_cache_attention_with_fused_qkv(cache, 2, &qkv_t, &out_t, 0.35f),
              PAGEDATTN_INVALID_ARGUMENT, "layer = 2");
  CHECK(pagedattn_kv_cache_attention_with_fused_qkv(cache, 0, &qkv_t, &out_t, 0.35f) ==
        PAGEDATTN_OK);
  /* Token 0 sees only key 0: its output is value 0 of its KV head. */
  for (int h = 0; h < kHq; ++h)
    for (int d = 0; d < kD; ++d) {
      const float v0 = qkv[(kHq + kHkv + h / (kHq / kHkv)) * kD + d];
      CHECK(fabsf(out[h * kD + d] - v0) < 1e-6f);
    }
  /* Layer 1 was not appended: its slots may hold another sequence's K/V. */
  CHECK_FAILS(pagedattn_kv_cache_end_forward(cache), PAGEDATTN_INVALID_STATE, "layer 1");
  CHECK(pagedattn_kv_cache_attention_with_fused_qkv(cache, 1, &qkv_t, &out_t, 0.35f) ==
        PAGEDATTN_OK);
  CHECK(pagedattn_kv_cache_end_forward(cache) == PAGEDATTN_OK);

  /* A step that cannot finish is cancelled back to the state before it. */
  CHECK(pagedattn_kv_cache_state_digest(cache, &before) == PAGEDATTN_OK);
  CHECK(pagedattn_kv_cache_begin_forward(cache, ids, lens, 1) == PAGEDATTN_OK);
  CHECK(pagedattn_kv_cache_attention_with_fused_qkv(cache, 0, &qkv_t, &out_t, 0.35f) ==
        PAGEDATTN_OK);
  CHECK(pagedattn_kv_cache_cancel_forward(cache) == PAGEDATTN_OK);
  CHECK(pagedattn_kv_cache_state_digest(cache, &after) == PAGEDATTN_OK);
  CHECK(before == after);
  CHECK_FAILS(pagedattn_kv_cache_cancel_forward(cache), PAGEDATTN_INVALID_STATE, "no forward");

  int64_t length = 0, free_pages = 0;
  CHECK(pagedattn_kv_cache_sequence_length(cache, 7, &length) == PAGEDATTN_OK && length == kTokens);
  CHECK(pagedattn_kv_cache_num_free_pages(cache, &free_pages) == PAGEDATTN_OK && free_pages == 30);
  CHECK_FAILS(pagedattn_kv_cache_sequence_length(cache, 8, &length), PAGEDATTN_INVALID_ARGUMENT,
              "8");
  CHECK_FAILS(pagedattn_kv_cache_num_free_pages(cache, NULL), PAGEDATTN_INVALID_ARGUMENT,
              "out is null");

  float k[2 * kTokens * kHkv * kD], v[2 * kTokens * kHkv * kD];
  CHECK(pagedattn_kv_cache_debug_get_kv(cache, 7, 0, kTokens, k, 2 * kTokens * kHkv * kD, v,
                                        2 * kTokens * kHkv * kD) == PAGEDATTN_OK);
  for (int t = 0; t < kTokens; ++t)
    for (int i = 0; i < kHkv * kD; ++i)
      CHECK(k[t * kHkv * kD + i] == qkv[(t * (kHq + 2 * kHkv) + kHq) * kD + i]);

  CHECK(pagedattn_kv_cache_fork_sequence(cache, 7, 9, 3) == PAGEDATTN_OK);
  CHECK(pagedattn_kv_cache_remove_sequence(cache, 9) == PAGEDATTN_OK);
  CHECK(pagedattn_kv_cache_remove_sequence(cache, 7) == PAGEDATTN_OK);
  CHECK_FAILS(pagedattn_kv_cache_remove_sequence(NULL, 7), PAGEDATTN_INVALID_ARGUMENT,
              "cache is null");
  pagedattn_kv_cache_destroy(cache);
  pagedattn_kv_cache_destroy(NULL);
}

static void test_ort(void) {
  enum { kBlocks = 3, kBlockSize = 4 };
  float query[kTokens * kHq * kD], key[kTokens * kHkv * kD], value[kTokens * kHkv * kD];
  float output[kTokens * kHq * kD];
  float key_cache[kBlocks * kBlockSize * kHkv * kD], value_cache[kBlocks * kBlockSize * kHkv * kD];
  for (int i = 0; i < kTokens * kHq * kD; ++i) query[i] = value_at(i);
  for (int i = 0; i < kTokens * kHkv * kD; ++i)
    key[i] = value_at(3 * i), value[i] = value_at(5 * i + 1);
  memset(key_cache, 0, sizeof key_cache);
  memset(value_cache, 0, sizeof value_cache);
  int32_t cu[] = {0, kTokens}, past[] = {0}, block_table[] = {2, 0};

  pagedattn_ort_paged_attention_params p;
  pagedattn_ort_paged_attention_params_init(&p);
  CHECK(p.local_window_size == -1 && p.key.rank == 0);
  const int64_t q_shape[] = {kTokens, kHq * kD}, kv_shape[] = {kTokens, kHkv * kD};
  const int64_t cache_shape[] = {kBlocks, kBlockSize, kHkv * kD};
  const int64_t cu_shape[] = {2}, past_shape[] = {1}, table_shape[] = {1, 2};
  p.query = dense(query, PAGEDATTN_FLOAT32, 2, q_shape);
  p.key = dense(key, PAGEDATTN_FLOAT32, 2, kv_shape);
  p.value = dense(value, PAGEDATTN_FLOAT32, 2, kv_shape);
  p.key_cache = dense(key_cache, PAGEDATTN_FLOAT32, 3, cache_shape);
  p.value_cache = dense(value_cache, PAGEDATTN_FLOAT32, 3, cache_shape);
  p.cumulative_sequence_length = dense(cu, PAGEDATTN_INT32, 1, cu_shape);
  p.past_seqlens = dense(past, PAGEDATTN_INT32, 1, past_shape);
  p.block_table = dense(block_table, PAGEDATTN_INT32, 2, table_shape);
  p.output = dense(output, PAGEDATTN_FLOAT32, 2, q_shape);
  p.num_heads = kHq;
  p.kv_num_heads = kHkv;

  /* A block id outside the cache: rejected, caches untouched. */
  block_table[1] = 9;
  float k_before[sizeof key_cache / sizeof(float)];
  memcpy(k_before, key_cache, sizeof key_cache);
  CHECK_FAILS(pagedattn_ort_paged_attention(&p), PAGEDATTN_INVALID_ARGUMENT,
              "block_table[0][1] = 9 is outside [0, 3)");
  CHECK(memcmp(k_before, key_cache, sizeof key_cache) == 0);
  block_table[1] = 0;
  p.cumulative_sequence_length.dtype = PAGEDATTN_FLOAT32;
  CHECK_FAILS(pagedattn_ort_paged_attention(&p), PAGEDATTN_INVALID_ARGUMENT,
              "cumulative_sequence_length.dtype");
  p.cumulative_sequence_length.dtype = PAGEDATTN_INT32;
  /* dtype values no enumerator names (legal to store from C): refused by
   * value, never loaded as the C++ enum (undefined behaviour, UBSan). */
  p.query.dtype = (pagedattn_dtype)99;
  CHECK_FAILS(pagedattn_ort_paged_attention(&p), PAGEDATTN_INVALID_ARGUMENT,
              "query.dtype = 99 is not a float or KV storage type");
  p.query.dtype = PAGEDATTN_FLOAT32;
  p.block_table.dtype = (pagedattn_dtype)8;
  CHECK_FAILS(pagedattn_ort_paged_attention(&p), PAGEDATTN_INVALID_ARGUMENT,
              "block_table.dtype = 8 must be PAGEDATTN_INT32 or PAGEDATTN_INT64");
  p.block_table.dtype = PAGEDATTN_INT32;
  CHECK(memcmp(k_before, key_cache, sizeof key_cache) == 0);
  CHECK_FAILS(pagedattn_ort_paged_attention(NULL), PAGEDATTN_INVALID_ARGUMENT, "params is null");

  CHECK(pagedattn_ort_paged_attention(&p) == PAGEDATTN_OK);
  /* Token 4 went to block 0 slot 0; token 0 sees only key 0. */
  for (int i = 0; i < kHkv * kD; ++i) CHECK(key_cache[i] == key[4 * kHkv * kD + i]);
  for (int h = 0; h < kHq; ++h)
    for (int d = 0; d < kD; ++d)
      CHECK(fabsf(output[h * kD + d] - value[(h / (kHq / kHkv)) * kD + d]) < 1e-6f);
}

static void* other_thread(void* arg) {
  (void)arg;
  return (void*)(strlen(pagedattn_last_error_message()) == 0 ? (void*)1 : NULL);
}

static void test_messages_are_per_thread(void) {
  CHECK(pagedattn_kv_cache_end_forward(NULL) == PAGEDATTN_INVALID_ARGUMENT);
  pthread_t thread;
  void* clean = NULL;
  CHECK(pthread_create(&thread, NULL, other_thread, NULL) == 0);
  CHECK(pthread_join(thread, &clean) == 0);
  CHECK(clean != NULL);
  CHECK(strcmp(pagedattn_status_name(PAGEDATTN_OUT_OF_PAGES), "out_of_pages") == 0);
}

int main(void) {
  test_cache();
  test_ort();
  test_messages_are_per_thread();
  if (g_failures)
    fprintf(stderr, "%d checks failed\n", g_failures);
  else
    printf("c_api_test: all checks passed\n");
  return g_failures ? 1 : 0;
}
