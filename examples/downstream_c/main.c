/* Uses the installed C ABI from C: a cache, one sequence, a step of 40
 * tokens whose K/V every layer appends through attention, a fork, and a
 * failing call that reports its error. */
#include <pagedattn/c_api.h>
#include <stdio.h>

enum { kTokens = 40, kHq = 8, kHkv = 2, kD = 64, kLayers = 2 };
static float qkv[kTokens * (kHq + 2 * kHkv) * kD], out[kTokens * kHq * kD];

/* A dense float tensor (zero strides: the library derives them). */
static pagedattn_tensor dense(float* data, int64_t heads) {
  pagedattn_tensor t = {data, PAGEDATTN_FLOAT32, 3, {kTokens, heads, kD, 0}, {0, 0, 0, 0}};
  return t;
}

/* The step's attention for every layer: each appends its K/V. */
static int attend_every_layer(pagedattn_kv_cache* cache) {
  const pagedattn_tensor qkv_t = dense(qkv, kHq + 2 * kHkv), out_t = dense(out, kHq);
  for (int i = 0; i < kTokens * (kHq + 2 * kHkv) * kD; ++i) qkv[i] = (float)(i % 7) * 0.125f;
  for (int32_t layer = 0; layer < kLayers; ++layer)
    if (pagedattn_kv_cache_attention_with_fused_qkv(cache, layer, &qkv_t, &out_t, 0.125f) !=
        PAGEDATTN_OK)
      return 0;
  return 1;
}

int main(void) {
  pagedattn_kv_cache_config config;
  pagedattn_kv_cache_config_init(&config);
  config.num_layers = kLayers;
  config.num_qo_heads = kHq;
  config.num_kv_heads = kHkv;
  config.head_dim = kD;
  config.num_pages = 64;
  pagedattn_kv_cache* cache = NULL;
  if (pagedattn_kv_cache_create(&config, &cache) != PAGEDATTN_OK) {
    fprintf(stderr, "create: %s\n", pagedattn_last_error_message());
    return 1;
  }
  const int64_t ids[1] = {1};
  const int64_t lengths[1] = {kTokens};
  int64_t free_before = 0, free_after = 0, length = 0;
  int ok = pagedattn_kv_cache_add_sequence(cache, 1) == PAGEDATTN_OK &&
           pagedattn_kv_cache_num_free_pages(cache, &free_before) == PAGEDATTN_OK &&
           pagedattn_kv_cache_begin_forward(cache, ids, lengths, 1) == PAGEDATTN_OK &&
           attend_every_layer(cache) && pagedattn_kv_cache_end_forward(cache) == PAGEDATTN_OK &&
           pagedattn_kv_cache_fork_sequence(cache, 1, 2, -1) == PAGEDATTN_OK &&
           pagedattn_kv_cache_sequence_length(cache, 2, &length) == PAGEDATTN_OK &&
           pagedattn_kv_cache_num_free_pages(cache, &free_after) == PAGEDATTN_OK;
  /* Adding an existing sequence fails with a typed status and a message. */
  const pagedattn_status duplicate = pagedattn_kv_cache_add_sequence(cache, 1);
  printf(
      "downstream_c: 40 tokens and a fork use %lld pages, fork length %lld; duplicate add: %s "
      "(%s)\n",
      (long long)(free_before - free_after), (long long)length, pagedattn_status_name(duplicate),
      pagedattn_last_error_message());
  pagedattn_kv_cache_destroy(cache);
  if (!ok) fprintf(stderr, "downstream_c: %s\n", pagedattn_last_error_message());
  return ok && length == kTokens && duplicate == PAGEDATTN_INVALID_ARGUMENT ? 0 : 1;
}
