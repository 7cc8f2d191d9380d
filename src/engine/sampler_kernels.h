// The sampler's pass over a whole row, vectorised (Highway, dispatched once
// per call): a vocabulary of 128K tokens took a scalar std::exp each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace pagedattn::engine {

// weights[t] = exp((logits[t] - max) / temperature), 0 where that is below
// min_p (the min_p rule: relative to the most likely token's 1) or logits[t]
// is -inf; returns their sum. temperature > 0, max >= every logit. Within a
// few ulp of std::exp; the sum runs over vector lanes, then across them.
double softmax_weights(std::span<const double> logits, double max, double temperature, double min_p,
                       double* weights);

// bins[t] = min(floor((max - logits[t]) * inverse_t * per_unit), rest):
// how far below the most likely token each one is, in 1 / per_unit units of
// logit / temperature; rest for the tokens at per_unit x rest / per_unit
// units or more (and -inf).
void distance_bins(std::span<const double> logits, double max, double inverse_t, int per_unit,
                   int rest, std::int32_t* bins);

// The largest logit's first index (the lowest token id on ties) and whether
// every logit is finite (index 0 when not), in one pass for the maximum and
// the check and a second that stops at the first token holding it.
struct RowMax {
  std::int32_t token = 0;
  bool finite = true;
};
RowMax row_max(std::span<const float> logits);

// The first index of the row's largest value (the lowest token id on ties)
// of a processed row (-inf where masked, never NaN), as row_max finds it.
std::int32_t first_max(std::span<const double> row);

}  // namespace pagedattn::engine
