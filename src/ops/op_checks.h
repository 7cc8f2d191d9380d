// The validation rules shared by every peer operator (src/ops), one function
// per rule. Each throws InvalidArgument whose message starts with the
// operator (`call`) and names the input, the index and the offending value.
// Nothing here writes anything: operators run all checks before their first write.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "pagedattn/ops/tensor.h"

namespace pagedattn::ops::checks {

// How far an operator's validation goes. kMetadata: every rule that reads no
// index value (ranks, extents, dtypes, strides, null pointers, scalars), for
// callers whose index arrays are not readable yet (device memory: the CUDA
// operators run it before their first CUDA call); kFull: every rule, in the
// operator's one order, index values included (host memory).
enum class Validation : std::uint8_t { kMetadata, kFull };

// `data` is non-null whenever the tensor has elements.
void check_present(const char* call, const char* name, const void* data, std::int64_t elements);

// Exact rank and extents (a float or an index tensor).
void check_shape(const char* call, const char* name, const TensorView& t,
                 std::initializer_list<std::int64_t> expected);
void check_shape(const char* call, const char* name, const IndexView& v,
                 std::initializer_list<std::int64_t> expected);
// Rank only, before the extents are known.
void check_rank(const char* call, const char* name, std::int32_t rank, std::int32_t expected);

// Element types.
void check_dtype(const char* call, const char* name, DType actual, DType expected);
void check_activation_dtype(const char* call, const char* name, const TensorView& t);
void check_index_type(const char* call, const char* name, const IndexView& v, IndexType expected);

// Memory layout: dense row-major, or (for strided peers) innermost axis
// contiguous and no two elements sharing an address.
void check_contiguous(const char* call, const char* name, const TensorView& t);
void check_rows_contiguous(const char* call, const char* name, const TensorView& t);

// a * b as int32, or an error naming `what` when it does not fit.
std::int32_t checked_int32_product(const char* call, const char* what, std::int64_t a,
                                   std::int64_t b);
// A value that must fit int32 (shapes of index arrays, lengths).
std::int32_t checked_int32(const char* call, const char* what, std::int64_t value);

// CSR offsets v[0..count]: v[0] == 0, non-decreasing, v[count] == total
// (or <= total when the tokens past the last offset are padding).
enum class OffsetsEnd : std::uint8_t { kExact, kPadded };
void check_offsets(const char* call, const char* name, const IndexView& v, std::int64_t count,
                   std::int64_t total, OffsetsEnd end = OffsetsEnd::kExact);

// A length: 0 <= name[index] = value <= capacity (`capacity_what` explains it).
void check_length(const char* call, const char* name, std::int64_t index, std::int64_t value,
                  std::int64_t capacity, const char* capacity_what);

// Page table rows [batch][max_pages]: the pages row b actually uses
// (ceil(kv_lens[b] / page_size)) hold ids in [0, num_pages).
void check_page_table(const char* call, const char* name, const IndexView& table,
                      std::span<const std::int32_t> kv_lens, std::int32_t page_size,
                      std::int64_t num_pages);

// Slots v[0..count): -1 (skip) or inside [0, num_slots).
void check_slots(const char* call, const char* name, const IndexView& v, std::int64_t count,
                 std::int64_t num_slots);

// Slots other than -1 appear at most once (append_paged_kv's rule, for
// callers whose append kernel cannot check it).
void check_unique_slots(const char* call, const char* name, std::span<const std::int64_t> slots);

// Pairs v[n][2] (source, destination): sources in [0, src_limit),
// destinations in [0, dst_limit).
void check_pairs(const char* call, const char* name, const IndexView& v, std::int64_t src_limit,
                 std::int64_t dst_limit);

// A per-position table (cos/sin caches) has a row for every position < needed.
void check_position_rows(const char* call, const char* name, std::int64_t rows,
                         std::int64_t needed);

// Scalars: finite, and > 0 where asked.
void check_finite(const char* call, const char* name, float value);
void check_positive(const char* call, const char* name, float value);

}  // namespace pagedattn::ops::checks
