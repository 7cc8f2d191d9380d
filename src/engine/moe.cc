#include "engine/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string>

#include "core/team.h"
#include "engine/activation.h"
#include "engine/counter_random.h"
#include "pagedattn/errors.h"

namespace pagedattn::engine {
namespace {

void project(const float* x, std::int32_t rows, const WeightMatrix& w, float* y, bool deterministic,
             LinearScratch& scratch) {
  linear({x, rows, w.in(), w.data(), w.out(), y, false, deterministic, w.format()}, scratch);
}

template <typename Matrix>  // WeightMatrix or StackedMatrix
void require_shape(const Matrix& m, const std::string& name, std::int64_t layer, std::int32_t out,
                   std::int32_t in) {
  require(m.out() == out && m.in() == in, "LlamaModel: ", name, " of layer ", layer, " is ",
          m.out(), " x ", m.in(), ", the config needs ", out, " x ", in);
}

void require_expert(const ExpertWeights& e, const std::string& name, std::int64_t layer,
                    std::int32_t hidden, std::int32_t width) {
  require_shape(e.gate_up, name + " gate_up", layer, 2 * width, hidden);
  require_shape(e.down, name + " down", layer, hidden, width);
}

// Expert e's rows are [first_row[e], first_row[e + 1]) of the grouped
// buffers, in token order; row_of_slot maps each (token, j) to its row;
// active lists the experts with rows.
void group_by_expert(const MoeShape& s, std::int32_t tokens, MoeScratch& m) {
  const std::int32_t k = s.num_experts_used, slots = tokens * k;
  m.first_row.assign(std::size_t(s.num_experts) + 1, 0);
  for (std::int32_t i = 0; i < slots; ++i) ++m.first_row[std::size_t(m.experts[i]) + 1];
  for (std::int32_t e = 0; e < s.num_experts; ++e)
    m.first_row[std::size_t(e) + 1] += m.first_row[std::size_t(e)];
  std::vector<std::int32_t> next(m.first_row.begin(), m.first_row.end() - 1);
  m.row_of_slot.resize(std::size_t(slots));
  for (std::int32_t i = 0; i < slots; ++i)
    m.row_of_slot[std::size_t(i)] = next[std::size_t(m.experts[i])]++;
  m.active.clear();
  for (std::int32_t e = 0; e < s.num_experts; ++e)
    if (m.first_row[std::size_t(e) + 1] > m.first_row[std::size_t(e)]) m.active.push_back(e);
}

std::int32_t rows_of(const MoeScratch& m, std::int32_t expert) {
  return m.first_row[std::size_t(expert) + 1] - m.first_row[std::size_t(expert)];
}

// The routing, grouping and splits of a batch, on one thread of the team.
void plan_experts(const MoeShape& s, const MoeLayerWeights& w, std::int32_t tokens,
                  bool deterministic, std::int32_t threads, MoeScratch& m) {
  group_by_expert(s, tokens, m);
  const std::int32_t granule = product_split_granule(deterministic);
  const auto rows = [&](std::int32_t e) { return rows_of(m, e); };
  split_products(
      m.active, rows,
      [&](std::int32_t e) { return std::span(w.experts[std::size_t(e)].gate_up.parts()); }, granule,
      threads, m.gate_up_split);
  split_products(
      m.active, rows, [&](std::int32_t e) { return std::span(&w.experts[std::size_t(e)].down, 1); },
      granule, threads, m.down_split);
}

// grouped_y = each expert's MLP of its gathered rows of x, every thread
// taking its pieces of all experts' gate|up columns, then of their down
// columns. A column's result does not depend on the piece it is in, except
// outside deterministic mode on the BLAS paths of large batches.
void run_experts(const MoeShape& s, const MoeLayerWeights& w, const float* x, std::int32_t tokens,
                 bool deterministic, MoeScratch& m) {
  const std::size_t h = std::size_t(s.hidden), inter = std::size_t(s.expert_intermediate);
  const std::int32_t k = s.num_experts_used, slots = tokens * k;
  core::for_row_ranges(slots, std::int64_t(h), [&](std::int32_t begin, std::int32_t end) {
    for (std::int32_t i = begin; i < end; ++i)
      std::memcpy(m.grouped_x.data() + std::size_t(m.row_of_slot[std::size_t(i)]) * h,
                  x + std::size_t(i / k) * h, h * sizeof(float));
  });
  run_pieces(m.gate_up_split, m.thread_scratch, [&](const ProductPiece& p, LinearScratch& ls) {
    const std::int32_t row = m.first_row[std::size_t(p.product)];
    w.experts[std::size_t(p.product)].gate_up.project_columns(
        m.grouped_x.data() + std::size_t(row) * h, rows_of(m, p.product),
        m.gate_up.data() + std::size_t(row) * 2 * inter, p.columns, false, deterministic, ls);
  });
  core::for_row_ranges(slots, std::int64_t(inter), [&](std::int32_t begin, std::int32_t end) {
    gated_activation(m.gate_up.data() + std::size_t(begin) * 2 * inter, end - begin,
                     s.expert_intermediate, s.activation,
                     m.act.data() + std::size_t(begin) * inter);
  });
  run_pieces(m.down_split, m.thread_scratch, [&](const ProductPiece& p, LinearScratch& ls) {
    const std::int32_t row = m.first_row[std::size_t(p.product)];
    const WeightMatrix& down = w.experts[std::size_t(p.product)].down;
    const LinearArgs whole{m.act.data() + std::size_t(row) * inter,
                           rows_of(m, p.product),
                           down.in(),
                           down.data(),
                           down.out(),
                           m.grouped_y.data() + std::size_t(row) * h,
                           false,
                           deterministic,
                           down.format()};
    linear(column_range(whole, p.columns), ls);
  });
}

// y[t] = each token's experts' outputs weighted, summed in its top-k order
// (fixed per token).
void combine_experts(const MoeShape& s, std::int32_t tokens, float* y, const MoeScratch& m) {
  const std::size_t h = std::size_t(s.hidden);
  const std::int32_t k = s.num_experts_used;
  core::for_row_ranges(tokens, std::int64_t(h) * k, [&](std::int32_t begin, std::int32_t end) {
    for (std::int32_t t = begin; t < end; ++t) {
      float* out = y + std::size_t(t) * h;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::size_t slot = std::size_t(t) * k + j;
        const float weight = m.weights[slot];
        const float* expert = m.grouped_y.data() + std::size_t(m.row_of_slot[slot]) * h;
        if (j == 0)
          for (std::size_t i = 0; i < h; ++i) out[i] = weight * expert[i];
        else
          for (std::size_t i = 0; i < h; ++i) out[i] += weight * expert[i];
      }
    }
  });
}

// y[t] += sigmoid(x[t] . shared_gate) * shared(x[t]) (without the gate
// when !shared_gated), each product split over the team.
void add_shared_expert(const MoeShape& s, const MoeLayerWeights& w, const float* x,
                       std::int32_t tokens, float* y, bool deterministic, MoeScratch& m,
                       LinearScratch& ls) {
  const std::size_t h = std::size_t(s.hidden), inter = std::size_t(s.shared_intermediate);
  w.shared.gate_up.project(x, tokens, m.shared_gate_up.data(), false, deterministic, ls);
  core::for_row_ranges(tokens, std::int64_t(inter), [&](std::int32_t begin, std::int32_t end) {
    gated_activation(m.shared_gate_up.data() + std::size_t(begin) * 2 * inter, end - begin,
                     s.shared_intermediate, s.activation,
                     m.shared_act.data() + std::size_t(begin) * inter);
  });
  project(m.shared_act.data(), tokens, w.shared.down, m.shared_y.data(), deterministic, ls);
  if (s.shared_gated) project(x, tokens, w.shared_gate, m.shared_logit.data(), deterministic, ls);
  core::for_row_ranges(tokens, std::int64_t(h), [&](std::int32_t begin, std::int32_t end) {
    for (std::int32_t t = begin; t < end; ++t) {
      const float gate =
          s.shared_gated ? 1.0f / (1.0f + std::exp(-m.shared_logit[std::size_t(t)])) : 1.0f;
      const float* shared = m.shared_y.data() + std::size_t(t) * h;
      float* out = y + std::size_t(t) * h;
      for (std::size_t i = 0; i < h; ++i) out[i] += gate * shared[i];
    }
  });
}

// Every buffer of a batch of `tokens`, sized before the team's threads use
// them.
void size_buffers(const MoeShape& s, std::int32_t tokens, std::int32_t threads, MoeScratch& m) {
  const std::size_t t = std::size_t(tokens), slots = t * std::size_t(s.num_experts_used);
  const std::size_t h = std::size_t(s.hidden), inter = std::size_t(s.expert_intermediate),
                    shared = std::size_t(s.shared_intermediate);
  m.logits.resize(t * std::size_t(s.num_experts));
  m.experts.resize(slots);
  m.weights.resize(slots);
  m.grouped_x.resize(slots * h);
  m.gate_up.resize(slots * 2 * inter);
  m.act.resize(slots * inter);
  m.grouped_y.resize(slots * h);
  m.shared_gate_up.resize(t * 2 * shared);
  m.shared_act.resize(t * shared);
  m.shared_y.resize(shared > 0 ? t * h : 0);
  m.shared_logit.resize(t);
  m.thread_scratch.resize(std::size_t(threads));
}

// moe_forward inside a team, the arguments checked.
void moe_in_team(const MoeShape& s, const MoeLayerWeights& w, const float* x, std::int32_t tokens,
                 float* y, bool deterministic, MoeScratch& m, LinearScratch& ls) {
  if (tokens == 0) return;
  const std::int32_t threads = core::available_threads();
  core::on_one_thread([&] { size_buffers(s, tokens, threads, m); });
  project(x, tokens, w.router, m.logits.data(), deterministic, ls);
  const std::int32_t k = s.num_experts_used, experts = s.num_experts;
  // Routing sorts each token's experts: weigh a token as a few passes over them.
  core::for_row_ranges(tokens, std::int64_t{experts} * 8,
                       [&](std::int32_t begin, std::int32_t end) {
                         route_tokens(s, m.logits.data() + std::size_t(begin) * experts,
                                      end - begin, m.experts.data() + std::size_t(begin) * k,
                                      m.weights.data() + std::size_t(begin) * k,
                                      w.selection_bias.empty() ? nullptr : w.selection_bias.data());
                       });
  core::on_one_thread([&] { plan_experts(s, w, tokens, deterministic, threads, m); });
  run_experts(s, w, x, tokens, deterministic, m);
  combine_experts(s, tokens, y, m);
  if (s.shared_intermediate > 0) add_shared_expert(s, w, x, tokens, y, deterministic, m, ls);
}

// Groups (when expert_groups > 1) split the experts evenly, sigmoid groups
// hold two experts at least (their score sums the best two), and the groups
// used hold the experts used.
void validate_expert_groups(const LlamaConfig& c) {
  if (c.expert_groups <= 1) return;
  const std::int32_t per_group = c.num_experts / c.expert_groups;
  require(c.num_experts % c.expert_groups == 0 &&
              (c.expert_gating == ExpertGating::kSoftmax || per_group >= 2),
          "LlamaConfig.expert_groups = ", c.expert_groups,
          " must divide num_experts = ", c.num_experts, " into groups of ",
          c.expert_gating == ExpertGating::kSigmoid ? "two or more" : "one or more");
  require(c.expert_groups_used >= 1 && c.expert_groups_used <= c.expert_groups &&
              std::int64_t{c.expert_groups_used} * per_group >= c.num_experts_used,
          "LlamaConfig.expert_groups_used = ", c.expert_groups_used, " must be in [1, ",
          c.expert_groups, "] and hold num_experts_used = ", c.num_experts_used, " experts (",
          per_group, " per group)");
}

}  // namespace

MoeShape moe_shape(const LlamaConfig& c) {
  // A tensor-parallel shard holds a slice of every expert's intermediate
  // features (shard_llama_weights).
  return {c.hidden_size,
          c.num_experts,
          c.num_experts_used,
          c.expert_intermediate_size / c.shard.size,
          c.shared_expert_intermediate_size / c.shard.size,
          c.normalize_expert_weights,
          c.activation,
          c.expert_gating,
          c.expert_weights_scale,
          c.expert_groups,
          c.expert_groups_used,
          c.shared_expert_gated};
}

void validate_moe_config(const LlamaConfig& c) {
  require(c.num_experts >= 0, "LlamaConfig.num_experts = ", c.num_experts, " must be >= 0");
  if (c.num_experts == 0) {
    require(c.num_experts_used == 0 && c.expert_intermediate_size == 0 &&
                c.shared_expert_intermediate_size == 0,
            "LlamaConfig.num_experts = 0 (a dense model) but num_experts_used = ",
            c.num_experts_used, ", expert_intermediate_size = ", c.expert_intermediate_size,
            ", shared_expert_intermediate_size = ", c.shared_expert_intermediate_size,
            " (must all be 0)");
    return;
  }
  require(c.num_experts_used >= 1 && c.num_experts_used <= c.num_experts,
          "LlamaConfig.num_experts_used = ", c.num_experts_used,
          " must be in [1, num_experts = ", c.num_experts, "]");
  require(c.expert_intermediate_size >= 1,
          "LlamaConfig.expert_intermediate_size = ", c.expert_intermediate_size, " must be >= 1");
  require(c.shared_expert_intermediate_size >= 0,
          "LlamaConfig.shared_expert_intermediate_size = ", c.shared_expert_intermediate_size,
          " must be >= 0");
  require(std::isfinite(c.expert_weights_scale) && c.expert_weights_scale > 0.0f,
          "LlamaConfig.expert_weights_scale = ", c.expert_weights_scale, " must be finite and > 0");
  require(c.leading_dense_layers >= 0 && c.leading_dense_layers <= c.num_layers,
          "LlamaConfig.leading_dense_layers = ", c.leading_dense_layers,
          " must be in [0, num_layers = ", c.num_layers, "]");
  validate_expert_groups(c);
}

void validate_moe_weights(const MoeShape& s, const MoeLayerWeights& w, std::int64_t layer) {
  require(std::ssize(w.experts) == s.num_experts, "LlamaModel: layer ", layer, " has ",
          w.experts.size(), " experts, the config has ", s.num_experts);
  require_shape(w.router, "ffn_gate_inp (router)", layer, s.num_experts, s.hidden);
  require(w.selection_bias.empty() || std::ssize(w.selection_bias) == s.num_experts,
          "LlamaModel: exp_probs_b (selection bias) of layer ", layer, " has ",
          w.selection_bias.size(), " values, the config has ", s.num_experts, " experts");
  for (std::size_t e = 0; e < w.experts.size(); ++e)
    require_expert(w.experts[e], "expert " + std::to_string(e), layer, s.hidden,
                   s.expert_intermediate);
  if (s.shared_intermediate == 0) {
    require(w.shared.gate_up.out() == 0 && w.shared.down.empty() && w.shared_gate.empty(),
            "LlamaModel: layer ", layer, " has a shared expert, the config has none");
    return;
  }
  require_expert(w.shared, "shared expert", layer, s.hidden, s.shared_intermediate);
  if (s.shared_gated)
    require_shape(w.shared_gate, "ffn_gate_inp_shexp (shared expert gate)", layer, 1, s.hidden);
  else
    require(w.shared_gate.empty(), "LlamaModel: layer ", layer,
            " has a shared expert gate, the config's shared expert is ungated");
}

MoeLayerWeights draw_moe_weights(const LlamaConfig& c, std::int32_t layer) {
  const std::int32_t h = c.hidden_size;
  const double residual = 1.0 / std::sqrt(2.0 * c.num_layers);
  const std::uint64_t seed = splitmix64(c.weight_seed ^ 0x6d6f652d6c617965ull);  // "moe-laye"
  std::uint64_t stream = std::uint64_t(layer) << 32;
  auto draw = [&](std::int32_t out, std::int32_t in, double scale) {
    const double bound = std::sqrt(3.0 / double(in)) * scale;
    std::vector<float> v(std::size_t(out) * std::size_t(in));
    const std::uint64_t s = stream++;
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>((2.0 * counter_uniform(seed, s, i) - 1.0) * bound);
    return WeightMatrix::f32(std::move(v), out, in);
  };
  auto expert = [&](std::int32_t width) {
    ExpertWeights e;
    e.gate_up = StackedMatrix(draw(2 * width, h, 1.0));
    e.down = draw(h, width, residual);
    return e;
  };
  MoeLayerWeights w;
  w.router = draw(c.num_experts, h, 1.0);
  for (std::int32_t e = 0; e < c.num_experts; ++e)
    w.experts.push_back(expert(c.expert_intermediate_size));
  if (c.shared_expert_intermediate_size > 0) {
    w.shared = expert(c.shared_expert_intermediate_size);
    if (c.shared_expert_gated) w.shared_gate = draw(1, h, 1.0);
  }
  return w;
}

namespace {

// scores[e] of one token's router logits: softmax or sigmoid, in double.
void expert_scores(const MoeShape& s, const float* row, std::vector<double>& scores) {
  const std::int32_t n = s.num_experts;
  if (s.gating == ExpertGating::kSigmoid) {
    for (std::int32_t e = 0; e < n; ++e)
      scores[std::size_t(e)] = 1.0 / (1.0 + std::exp(-double(row[e])));
    return;
  }
  const float top = *std::max_element(row, row + n);
  double sum = 0.0;
  for (std::int32_t e = 0; e < n; ++e)
    sum += scores[std::size_t(e)] = std::exp(double(row[e]) - top);
  for (std::int32_t e = 0; e < n; ++e) scores[std::size_t(e)] /= sum;
}

// Sets choice[e] to -infinity for the experts outside the groups_used best
// groups (ties: the lower group first).
void keep_best_groups(const MoeShape& s, std::vector<double>& choice) {
  const std::int32_t groups = s.groups, per_group = s.num_experts / groups;
  std::vector<double> group_score(std::size_t(groups), 0.0);
  for (std::int32_t g = 0; g < groups; ++g) {
    const auto first = choice.begin() + std::ptrdiff_t(g) * per_group;
    std::vector<double> members(first, first + per_group);
    std::partial_sort(members.begin(), members.begin() + (per_group > 1 ? 2 : 1), members.end(),
                      std::greater<>());
    group_score[std::size_t(g)] =
        s.gating == ExpertGating::kSigmoid ? members[0] + members[1] : members[0];
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(groups));
  for (std::int32_t g = 0; g < groups; ++g) order[std::size_t(g)] = g;
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return group_score[std::size_t(a)] > group_score[std::size_t(b)];
  });
  for (std::int32_t j = s.groups_used; j < groups; ++j)
    for (std::int32_t i = 0; i < per_group; ++i)
      choice[std::size_t(order[std::size_t(j)] * per_group + i)] =
          -std::numeric_limits<double>::infinity();
}

}  // namespace

void route_tokens(const MoeShape& s, const float* logits, std::int32_t tokens,
                  std::int32_t* experts, float* weights, const float* selection_bias) {
  const std::int32_t n = s.num_experts, k = s.num_experts_used;
  std::vector<double> p(std::size_t(n), 0.0), choice(std::size_t(n), 0.0);
  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  for (std::int32_t t = 0; t < tokens; ++t) {
    expert_scores(s, logits + std::size_t(t) * n, p);
    for (std::int32_t e = 0; e < n; ++e)
      choice[std::size_t(e)] = p[std::size_t(e)] + (selection_bias ? selection_bias[e] : 0.0);
    if (s.groups > 1 && s.groups_used < s.groups) keep_best_groups(s, choice);
    for (std::int32_t e = 0; e < n; ++e) order[std::size_t(e)] = e;
    // Descending choice; equal values: the lower index first (stable on the index order).
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return choice[std::size_t(a)] > choice[std::size_t(b)];
    });
    double chosen = 0.0;
    for (std::int32_t j = 0; j < k; ++j) chosen += p[std::size_t(order[std::size_t(j)])];
    const double scale = (s.normalize_weights ? 1.0 / chosen : 1.0) * double(s.weights_scale);
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t e = order[std::size_t(j)];
      experts[std::size_t(t) * k + j] = e;
      weights[std::size_t(t) * k + j] = static_cast<float>(p[std::size_t(e)] * scale);
    }
  }
}

void moe_forward(const MoeShape& s, const MoeLayerWeights& w, const float* x, std::int32_t tokens,
                 float* y, bool deterministic, MoeScratch& m, LinearScratch& ls) {
  if (core::in_team()) return moe_in_team(s, w, x, tokens, y, deterministic, m, ls);
  require(tokens >= 0, "moe_forward: tokens = ", tokens, " must be >= 0");
  require(s.num_experts >= 1 && s.num_experts_used >= 1 && s.num_experts_used <= s.num_experts,
          "moe_forward: num_experts_used = ", s.num_experts_used,
          " must be in [1, num_experts = ", s.num_experts, "]");
  validate_moe_weights(s, w, -1);
  if (tokens == 0) return;
  size_for_team(ls);
  core::run_in_team(true, with_callers_activations(
                              [&] { moe_in_team(s, w, x, tokens, y, deterministic, m, ls); }));
}

}  // namespace pagedattn::engine
