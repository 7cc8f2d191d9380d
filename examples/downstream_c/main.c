/* Uses the installed C ABI from C: a cache, one sequence, a step of 40
 * tokens, a fork, and a failing call that reports its error. */
#include <pagedattn/c_api.h>
#include <stdio.h>

int main(void) {
  pagedattn_kv_cache_config config;
  pagedattn_kv_cache_config_init(&config);
  config.num_layers = 2;
  config.num_qo_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.num_pages = 64;
  pagedattn_kv_cache* cache = NULL;
  if (pagedattn_kv_cache_create(&config, &cache) != PAGEDATTN_OK) {
    fprintf(stderr, "create: %s\n", pagedattn_last_error_message());
    return 1;
  }
  const int64_t ids[1] = {1};
  const int64_t lengths[1] = {40};
  int64_t free_before = 0, free_after = 0, length = 0;
  int ok = pagedattn_kv_cache_add_sequence(cache, 1) == PAGEDATTN_OK &&
           pagedattn_kv_cache_num_free_pages(cache, &free_before) == PAGEDATTN_OK &&
           pagedattn_kv_cache_begin_forward(cache, ids, lengths, 1) == PAGEDATTN_OK &&
           pagedattn_kv_cache_end_forward(cache) == PAGEDATTN_OK &&
           pagedattn_kv_cache_fork_sequence(cache, 1, 2, -1) == PAGEDATTN_OK &&
           pagedattn_kv_cache_sequence_length(cache, 2, &length) == PAGEDATTN_OK &&
           pagedattn_kv_cache_num_free_pages(cache, &free_after) == PAGEDATTN_OK;
  /* Adding an existing sequence fails with a typed status and a message. */
  const pagedattn_status duplicate = pagedattn_kv_cache_add_sequence(cache, 1);
  printf("downstream_c: 40 tokens and a fork use %lld pages, fork length %lld; duplicate add: %s (%s)\n",
         (long long)(free_before - free_after), (long long)length, pagedattn_status_name(duplicate),
         pagedattn_last_error_message());
  pagedattn_kv_cache_destroy(cache);
  return ok && length == 40 && duplicate == PAGEDATTN_INVALID_ARGUMENT ? 0 : 1;
}
