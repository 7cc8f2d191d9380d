// Uses the installed library: one sequence, a prefill step, a fork; and the
// engine library's model presets.
#include <pagedattn/llama.h>
#include <pagedattn/pagedattn.h>

#include <cstdio>
#include <vector>

int main() {
  pagedattn::KVCacheConfig config;
  config.num_layers = 2;
  config.num_qo_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.num_pages = 64;
  pagedattn::PagedKVCache kv(config);
  kv.add_sequence(1);
  const std::vector<pagedattn::SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {40};
  const pagedattn::BatchPlan& plan = kv.begin_forward(ids, lens);
  const int pages = plan.kv_indptr.back();
  // No model here: a real caller appends every layer's K/V (attention());
  // end_forward refuses a step with a layer left unwritten.
  for (std::int32_t l = 0; l < config.num_layers; ++l) kv.mark_layer_appended(l);
  kv.end_forward();
  kv.fork_sequence(1, 2);
  kv.check_invariants();
  const pagedattn::LlamaConfig tiny = pagedattn::llama_preset("tiny");
  std::printf(
      "downstream: pagedattn %s, 40 tokens in %d pages, fork shares %d of them; "
      "tiny Llama: %lld parameters\n",
      pagedattn::kVersion, pages, pages - 1,
      static_cast<long long>(pagedattn::llama_parameter_count(tiny)));
  return pages == 3 ? 0 : 1;
}
