/* docs/ops.md#1, the C ABI from C (called by doc_snippets_test.cc). */
#include <stdio.h>

#include "pagedattn/c_api.h"

int doc_snippet_ops_md_1(void);

int doc_snippet_ops_md_1(void) {
  // clang-format off
  // doc-snippet: docs/ops.md#1
  pagedattn_kv_cache_config config;
  pagedattn_kv_cache_config_init(&config);
  config.num_qo_heads = 32; config.num_kv_heads = 8; config.num_pages = 4096;
  pagedattn_kv_cache* cache = NULL;
  if (pagedattn_kv_cache_create(&config, &cache) != PAGEDATTN_OK)
    fprintf(stderr, "%s\n", pagedattn_last_error_message());
  // end doc-snippet
  // clang-format on
  if (cache == NULL) return 1;
  pagedattn_kv_cache_destroy(cache);
  return 0;
}
