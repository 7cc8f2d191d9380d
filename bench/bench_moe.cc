// A mixture-of-experts decode step against the dense model with the same
// active parameters: synthetic f32 weights, 8 layers of hidden 1024; dense
// MLP width 1536 against 32 experts of 384, top 4. The two models' steps
// alternate, so that a change of load hits both; medians of 40 steps.
//
//   pagedattn_bench_moe [batch]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"

namespace {

using namespace pagedattn;

constexpr int kSteps = 40, kContext = 64, kPageSize = 16;

// `batch` sequences with kContext tokens of prefill, then timed decode steps.
class DecodeRunner {
 public:
  DecodeRunner(const LlamaConfig& c, int batch)
      : model_(make_llama_model(c)), vocab_(c.vocab_size), batch_(batch) {
    KVCacheConfig kc = kv_cache_config(model_->spec());
    kc.page_size = kPageSize;
    kc.num_pages = batch * ((kContext + kSteps) / kPageSize + 2);
    kc.kv_dtype = DType::kF32;
    cache_ = std::make_unique<PagedKVCache>(kc);
    for (SeqId b = 0; b < batch; ++b) {
      seqs_.push_back(b);
      cache_->add_sequence(b);
    }
    std::vector<std::int32_t> tokens(std::size_t(batch) * kContext), rows;
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = int(i * 7919 % vocab_);
    for (int b = 0; b < batch; ++b) rows.push_back((b + 1) * kContext - 1);
    forward(tokens, rows, std::vector<std::int64_t>(std::size_t(batch), kContext));
  }

  void step(int s) {
    const auto n = static_cast<std::size_t>(batch_);
    std::vector<std::int32_t> tokens(n), rows(n);
    for (int b = 0; b < batch_; ++b) {
      tokens[std::size_t(b)] = (s * 31 + b * 17) % vocab_;
      rows[std::size_t(b)] = b;
    }
    const auto start = std::chrono::steady_clock::now();
    forward(tokens, rows, std::vector<std::int64_t>(n, 1));
    times_.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }

  double median_ms() {
    std::sort(times_.begin(), times_.end());
    return times_[times_.size() / 2];
  }

 private:
  void forward(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& rows,
               const std::vector<std::int64_t>& lengths) {
    logits_.resize(rows.size() * std::size_t(vocab_));
    cache_->begin_forward(seqs_, lengths);
    model_->forward({tokens, rows, false}, *cache_, logits_);
    cache_->end_forward();
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<PagedKVCache> cache_;
  int vocab_, batch_;
  std::vector<SeqId> seqs_;
  std::vector<float> logits_;
  std::vector<double> times_;
};

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 1;
  if (batch < 1 || batch > 256) {
    std::fprintf(stderr, "pagedattn_bench_moe: batch = %s must be in [1, 256]\n", argv[1]);
    return 2;
  }
  LlamaConfig dense;
  dense.name = "dense";
  dense.vocab_size = 32000;
  dense.hidden_size = 1024;
  dense.num_layers = 8;
  dense.num_qo_heads = 16;
  dense.num_kv_heads = 4;
  dense.head_dim = 64;
  dense.intermediate_size = 4 * 384;  // the MoE's active width: 4 experts of 384
  LlamaConfig moe = dense;
  moe.name = "moe";
  moe.num_experts = 32;
  moe.num_experts_used = 4;
  moe.expert_intermediate_size = 384;
  moe.normalize_expert_weights = true;
  DecodeRunner d(dense, batch), m(moe, batch);
  for (int s = 0; s < kSteps; ++s) {
    d.step(s);
    m.step(s);
  }
  const double dense_ms = d.median_ms(), moe_ms = m.median_ms();
  std::printf(
      "batch %d: dense (MLP 1536, %.0fM parameters) %.2f ms/step, MoE (32 experts x 384, top 4, "
      "%.0fM parameters) %.2f ms/step, MoE / dense %.2f\n",
      batch, double(llama_parameter_count(dense)) / 1e6, dense_ms,
      double(llama_parameter_count(moe)) / 1e6, moe_ms, moe_ms / dense_ms);
}
