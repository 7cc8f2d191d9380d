// The built-in model through the cache: in deterministic mode a token's
// logits are bitwise the same whatever else is in the batch, however its
// prompt was chunked, with any number of OpenMP threads and whatever
// OpenBLAS's own thread count was set to.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "engine/counter_random.h"
#include "engine/gemm.h"
#include "pagedattn/llama.h"
#include "support/omp_threads.h"

namespace pagedattn {
namespace {
namespace llama_model_test {  // this file's own names in a unity batch

struct Runner {
  std::shared_ptr<Model> model;
  PagedKVCache cache;
  explicit Runner(std::shared_ptr<Model> m, DType kv_dtype = DType::kF16)
      : model(std::move(m)), cache([&] {
          KVCacheConfig c = kv_cache_config(model->spec());
          c.page_size = 16;
          c.num_pages = 256;
          c.attention_plan.fixed_kv_chunk = 64;
          c.kv_dtype = kv_dtype;
          return c;
        }()) {}

  // One step: seq ids with their new tokens; returns the logits of each
  // sequence's last new token.
  std::vector<std::vector<float>> step(const std::vector<SeqId>& ids,
                                       const std::vector<std::vector<std::int32_t>>& tokens) {
    std::vector<std::int64_t> lens;
    std::vector<std::int32_t> flat, rows;
    for (const auto& t : tokens) {
      lens.push_back(std::ssize(t));
      flat.insert(flat.end(), t.begin(), t.end());
      rows.push_back(static_cast<std::int32_t>(flat.size()) - 1);
    }
    const std::size_t vocab = std::size_t(model->spec().vocab_size);
    std::vector<float> logits(rows.size() * vocab);
    cache.begin_forward(ids, lens);
    model->forward({flat, rows, true}, cache, logits);
    cache.end_forward();
    std::vector<std::vector<float>> out;
    for (std::size_t r = 0; r < rows.size(); ++r)
      out.emplace_back(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    return out;
  }
};

std::vector<std::int32_t> tokens(std::int32_t begin, std::int32_t end, std::int32_t salt) {
  std::vector<std::int32_t> t;
  for (std::int32_t i = begin; i < end; ++i) t.push_back((i * 53 + salt) % 200);
  return t;
}

constexpr std::int32_t kPrompt = 150;

LlamaConfig test_config() {
  LlamaConfig c = llama_preset("tiny");
  c.num_layers = 2;
  c.vocab_size = 200;
  return c;
}

std::shared_ptr<Model> test_model() {
  static std::shared_ptr<Model> model = make_llama_model(test_config());
  return model;
}

// Alone: the prompt in one chunk, then one decode; the decode's logits.
std::vector<float> solo_logits() {
  Runner solo(test_model());
  solo.cache.add_sequence(0);
  solo.step({0}, {tokens(0, kPrompt, 1)});
  return solo.step({0}, {tokens(kPrompt, kPrompt + 1, 1)})[0];
}

// Batched: the same prompt in chunks of 37 beside another sequence's
// 90-token prefill and then its decodes (so the tokens sit at other places
// in the row blocks), then the decode beside more.
std::vector<float> batched_logits() {
  Runner mixed(test_model());
  mixed.cache.add_sequence(0);
  mixed.cache.add_sequence(1);
  std::int32_t done = 0, other = 0;
  while (done < kPrompt) {
    const std::int32_t n = std::min(37, kPrompt - done);
    const std::int32_t m = other == 0 ? 90 : 1;
    mixed.step({1, 0}, {tokens(other, other + m, 2), tokens(done, done + n, 1)});
    done += n;
    other += m;
  }
  return mixed.step({1, 0}, {tokens(other, other + 1, 2), tokens(kPrompt, kPrompt + 1, 1)})[1];
}

void expect_bitwise_equal(const std::vector<float>& got, const std::vector<float>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
  bool finite = true;
  for (float v : got) finite &= std::isfinite(v);
  EXPECT_TRUE(finite);
}

using test::OmpThreads;

TEST(LlamaModel, LogitsAreBitwiseIndependentOfBatchAndChunking) {
  expect_bitwise_equal(batched_logits(), solo_logits());
}

TEST(LlamaModel, LogitsAreBitwiseIndependentOfTheOpenMPThreadCount) {
  std::vector<float> one_thread;
  {
    OmpThreads threads(1);
    one_thread = solo_logits();
  }
  OmpThreads threads(2);  // more threads than the machine may have is fine
  expect_bitwise_equal(solo_logits(), one_thread);
  expect_bitwise_equal(batched_logits(), one_thread);
}

TEST(LlamaModel, OpenBLASThreadsChangedByTheUserAreResetAndDoNotMatter) {
  const std::vector<float> expected = solo_logits();
  if (engine::blas_threads() == 0) GTEST_SKIP() << "not OpenBLAS";
  EXPECT_EQ(engine::blas_threads(), 1);  // set by the model
  engine::set_blas_threads(2);           // as OPENBLAS_NUM_THREADS=2 would
  expect_bitwise_equal(batched_logits(), expected);
  EXPECT_EQ(engine::blas_threads(), 1);  // reset by forward
}

// The Llama forward pass written out plainly: one sequence at a time, every
// token against every earlier one, sums in double. The weights are drawn the
// way llama.h documents (uniform, bound sqrt(3 / fan_in), output projections
// scaled by 1 / sqrt(2 layers), streams in order, embedding tied).
class NaiveLlama {
 public:
  explicit NaiveLlama(const LlamaConfig& c) : c_(c) {
    const std::int64_t h = c.hidden_size, d = c.head_dim, q = std::int64_t{c.num_qo_heads} * d;
    const std::int64_t qkv = q + 2 * std::int64_t{c.num_kv_heads} * d, inter = c.intermediate_size;
    const double residual = 1.0 / std::sqrt(2.0 * c.num_layers);
    embedding_ = draw(c.vocab_size * h, h, 1.0);
    for (std::int32_t l = 0; l < c.num_layers; ++l)
      layers_.push_back({draw(qkv * h, h, 1.0), draw(h * q, q, residual),
                         draw(2 * inter * h, h, 1.0), draw(h * inter, inter, residual)});
  }

  // Logits of the last token of `tokens` (positions 0..n-1).
  std::vector<double> last_logits(const std::vector<std::int32_t>& tokens) const {
    const std::int32_t n = static_cast<std::int32_t>(tokens.size()), h = c_.hidden_size;
    const std::int32_t d = c_.head_dim, hq = c_.num_qo_heads, hkv = c_.num_kv_heads;
    const std::int32_t inter = c_.intermediate_size, qkv_dim = (hq + 2 * hkv) * d;
    std::vector<std::vector<double>> x(static_cast<std::size_t>(n));
    for (std::int32_t t = 0; t < n; ++t)
      x[std::size_t(t)].assign(embedding_.begin() + std::int64_t{tokens[std::size_t(t)]} * h,
                               embedding_.begin() + std::int64_t{tokens[std::size_t(t)] + 1} * h);
    for (const Layer& w : layers_) {
      std::vector<std::vector<double>> qkv(static_cast<std::size_t>(n));
      for (std::int32_t t = 0; t < n; ++t) {
        qkv[std::size_t(t)] = matvec(w.qkv, rms_norm(x[std::size_t(t)]), qkv_dim);
        for (std::int32_t head = 0; head < hq + hkv; ++head)  // q and k heads
          rotate(qkv[std::size_t(t)].data() + std::size_t(head) * d, t);
      }
      for (std::int32_t t = 0; t < n; ++t) {
        std::vector<double> attn(std::size_t(hq) * d, 0.0);
        for (std::int32_t head = 0; head < hq; ++head) {
          const std::int32_t kv = head / (hq / hkv);
          const double* q = qkv[std::size_t(t)].data() + std::size_t(head) * d;
          std::vector<double> score(std::size_t(t) + 1);
          double max = -INFINITY, sum = 0.0;
          for (std::int32_t j = 0; j <= t; ++j) {
            const double* k = qkv[std::size_t(j)].data() + std::size_t(hq + kv) * d;
            double dot = 0.0;
            for (std::int32_t i = 0; i < d; ++i) dot += q[i] * k[i];
            max = std::max(max, score[std::size_t(j)] = dot / std::sqrt(double(d)));
          }
          for (double& s : score) sum += s = std::exp(s - max);
          for (std::int32_t j = 0; j <= t; ++j) {
            const double* v = qkv[std::size_t(j)].data() + std::size_t(hq + hkv + kv) * d;
            for (std::int32_t i = 0; i < d; ++i)
              attn[std::size_t(head) * d + i] += score[std::size_t(j)] / sum * v[i];
          }
        }
        add(x[std::size_t(t)], matvec(w.o, attn, h));
      }
      for (std::int32_t t = 0; t < n; ++t) {
        const std::vector<double> gate_up =
            matvec(w.gate_up, rms_norm(x[std::size_t(t)]), 2 * inter);
        std::vector<double> act(static_cast<std::size_t>(inter));
        for (std::int32_t i = 0; i < inter; ++i) {
          const double g = gate_up[std::size_t(i)];
          act[std::size_t(i)] = g / (1.0 + std::exp(-g)) * gate_up[std::size_t(inter + i)];
        }
        add(x[std::size_t(t)], matvec(w.down, act, h));
      }
    }
    return matvec(embedding_, rms_norm(x.back()), c_.vocab_size);
  }

 private:
  struct Layer {
    std::vector<float> qkv, o, gate_up, down;
  };

  std::vector<float> draw(std::int64_t count, std::int64_t fan_in, double scale) {
    const auto bound = static_cast<float>(std::sqrt(3.0 / double(fan_in)) * scale);
    std::vector<float> w(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
      w[std::size_t(i)] = static_cast<float>(
          (2.0 * engine::counter_uniform(c_.weight_seed, stream_, std::uint64_t(i)) - 1.0) * bound);
    ++stream_;
    return w;
  }
  // out[r] = sum_i w[r][i] x[i] for w [rows][x.size()].
  static std::vector<double> matvec(const std::vector<float>& w, const std::vector<double>& x,
                                    std::int32_t rows) {
    std::vector<double> out(std::size_t(rows), 0.0);
    for (std::size_t r = 0; r < out.size(); ++r)
      for (std::size_t i = 0; i < x.size(); ++i) out[r] += double(w[r * x.size() + i]) * x[i];
    return out;
  }
  std::vector<double> rms_norm(const std::vector<double>& x) const {
    double sum = 0.0;
    for (double v : x) sum += v * v;
    const double inv = 1.0 / std::sqrt(sum / double(x.size()) + c_.rms_norm_eps);
    std::vector<double> out(x);
    for (double& v : out) v *= inv;
    return out;
  }
  static void add(std::vector<double>& x, const std::vector<double>& y) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  // NeoX rotation of one head at position `pos`: pairs (i, i + d/2).
  void rotate(double* head, std::int32_t pos) const {
    const std::int32_t half = c_.head_dim / 2;
    for (std::int32_t i = 0; i < half; ++i) {
      const double angle = pos * std::pow(double(c_.rope_theta), -2.0 * i / c_.head_dim);
      const double a = head[i], b = head[i + half];
      head[i] = a * std::cos(angle) - b * std::sin(angle);
      head[i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  }

  LlamaConfig c_;
  std::uint64_t stream_ = 0;
  std::vector<float> embedding_;
  std::vector<Layer> layers_;
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LT(worst, 5e-5);  // f32 products over 688 terms: ~3e-6 seen
}

TEST(LlamaModel, ForwardMatchesANaiveDoubleImplementation) {
  const LlamaConfig config = test_config();
  ASSERT_TRUE(config.tie_embeddings && config.llama3_rope_factor == 0.0f);
  const NaiveLlama naive(config);
  const std::vector<std::int32_t> a = tokens(0, 6, 3), b = tokens(0, 4, 7);
  for (const bool deterministic : {false, true}) {
    // Both prompts in one step, then one decode each (f32 cache: no rounding of K/V).
    Runner run(test_model(), DType::kF32);
    run.cache.add_sequence(0);
    run.cache.add_sequence(1);
    std::vector<std::int64_t> lens = {std::ssize(a) - 1, std::ssize(b) - 1};
    std::vector<std::int32_t> flat(a.begin(), a.end() - 1), rows;
    flat.insert(flat.end(), b.begin(), b.end() - 1);
    rows = {static_cast<std::int32_t>(a.size()) - 2, static_cast<std::int32_t>(flat.size()) - 1};
    const std::size_t vocab = std::size_t(config.vocab_size);
    std::vector<float> logits(2 * vocab);
    run.cache.begin_forward(std::vector<SeqId>{0, 1}, lens);
    run.model->forward({flat, rows, deterministic}, run.cache, logits);
    run.cache.end_forward();
    expect_close({logits.begin(), logits.begin() + std::ptrdiff_t(vocab)},
                 naive.last_logits({a.begin(), a.end() - 1}));
    expect_close({logits.begin() + std::ptrdiff_t(vocab), logits.end()},
                 naive.last_logits({b.begin(), b.end() - 1}));
    const auto decoded = run.step({0, 1}, {{a.back()}, {b.back()}});
    expect_close(decoded[0], naive.last_logits(a));
    expect_close(decoded[1], naive.last_logits(b));
  }
}

}  // namespace llama_model_test
}  // namespace
}  // namespace pagedattn
