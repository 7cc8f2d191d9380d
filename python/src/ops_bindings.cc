// pagedattn.ops: the peer-compatible operators (include/pagedattn/ops/*.h)
// and merge_states, with the peers' Python signatures. Each function turns
// its arguments into views of the caller's arrays (no copies), allocates the
// output, and calls the C++ adapter, which does all checking; caches are
// written in place.
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "array_conversion.h"
#include "bindings.h"
#include "pagedattn/attention.h"
#include "pagedattn/errors.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/ops/torch_xla.h"
#include "pagedattn/ops/vllm.h"
#include "type_hints.h"

namespace pagedattn::python {
namespace {

using OptionalArray = std::optional<py::object>;

std::vector<py::ssize_t> shape_of(const ops::TensorView& t) {
  return {t.shape.begin(), t.shape.begin() + t.rank};
}

// An output of `like`'s shape and dtype.
py::array output_like(const ops::TensorView& like, const py::array& like_array) {
  return new_array(shape_of(like), like.dtype, like_array);
}

ops::vllm::CacheLayout vllm_layout(const std::string& layout) {
  if (layout == "NHD") return ops::vllm::CacheLayout::kFlash;
  if (layout == "HND") return ops::vllm::CacheLayout::kCpu;
  throw InvalidArgument("layout = \"" + layout +
                        "\" must be \"NHD\" [num_blocks, block_size, Hkv, D] or \"HND\" "
                        "[num_blocks, Hkv, block_size, D]");
}

// How raw uint8 cache bytes are read for a vLLM kv_cache_dtype; "auto" (and
// a string the adapter will reject) leave the array's own dtype.
std::optional<std::string> vllm_raw_cache_dtype(const std::string& kv_cache_dtype) {
  if (kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3") return "float8_e4m3fn";
  if (kv_cache_dtype == "fp8_e5m2") return "float8_e5m2";
  return std::nullopt;
}

// Block copies move bytes: raw arrays of any storage type are accepted as
// the storage type of their item size.
std::optional<std::string> raw_dtype_by_size(py::handle obj, const char* name) {
  const py::array a = as_array(obj, name);
  if (dtype_tag(a)) return std::nullopt;  // DLPack bfloat16 / float8: its own dtype
  const std::string dname = a.dtype().attr("name").cast<std::string>();
  if (dname == "uint16") return "bfloat16";
  if (dname == "uint8") return "float8_e4m3fn";
  if (dname == "int8") return "int8";
  return std::nullopt;
}

py::array ort_paged_attention(const ArrayLike& query, const OptionalArrayLike& key,
                              const OptionalArrayLike& value, const ArrayLike& key_cache,
                              const ArrayLike& value_cache,
                              const ArrayLike& cumulative_sequence_length,
                              const ArrayLike& past_seqlens, const ArrayLike& block_table,
                              const OptionalArrayLike& cos_cache,
                              const OptionalArrayLike& sin_cache, const Index& num_heads,
                              const Index& kv_num_heads, float scale, float softcap,
                              const Index& local_window_size, bool do_rotary,
                              bool rotary_interleaved, const OptionalArrayLike& slot_mapping,
                              const OptionalArrayLike& head_sink) {
  std::vector<py::array> keep;
  ops::ort::PagedAttentionParams p;
  p.query = tensor_arg(query, "query", keep);
  const py::array query_array = keep.back();
  if (!key.is_none()) p.key = tensor_arg(key, "key", keep);
  if (!value.is_none()) p.value = tensor_arg(value, "value", keep);
  p.key_cache = tensor_arg(key_cache, "key_cache", keep, std::nullopt, /*writable=*/true);
  p.value_cache = tensor_arg(value_cache, "value_cache", keep, std::nullopt, /*writable=*/true);
  p.cumulative_sequence_length = index_arg(cumulative_sequence_length, "cumulative_sequence_length",
                                           keep, ops::IndexType::kInt32);
  p.past_seqlens = index_arg(past_seqlens, "past_seqlens", keep, ops::IndexType::kInt32);
  p.block_table = index_arg(block_table, "block_table", keep, ops::IndexType::kInt32);
  if (!cos_cache.is_none()) p.cos_cache = tensor_arg(cos_cache, "cos_cache", keep);
  if (!sin_cache.is_none()) p.sin_cache = tensor_arg(sin_cache, "sin_cache", keep);
  if (!slot_mapping.is_none())
    p.slot_mapping = index_arg(slot_mapping, "slot_mapping", keep, ops::IndexType::kInt64);
  if (!head_sink.is_none()) p.head_sink = tensor_arg(head_sink, "head_sink", keep);
  constexpr const char* kCall = "ort_paged_attention";
  p.num_heads = int32_arg(num_heads, kCall, "num_heads");
  p.kv_num_heads = int32_arg(kv_num_heads, kCall, "kv_num_heads");
  p.scale = scale;
  p.softcap = softcap;
  p.local_window_size = int32_arg(local_window_size, kCall, "local_window_size");
  p.do_rotary = do_rotary;
  p.rotary_interleaved = rotary_interleaved;

  // Output (T, Hq * D): the query's width, or its Hq share of a packed row.
  // A shape the adapter rejects gets a 0-wide output; the adapter names it.
  const std::int64_t tokens = p.query.rank >= 1 ? p.query.dim(0) : 0;
  std::int64_t width = p.query.rank == 2 ? p.query.dim(1) : 0;
  if (!p.key) {
    const std::int64_t heads_per_row = std::int64_t{p.num_heads} + 2 * std::int64_t{p.kv_num_heads};
    width = heads_per_row > 0 && p.num_heads > 0 && width % heads_per_row == 0
                ? width / heads_per_row * p.num_heads
                : 0;
  }
  py::array out = new_array({tokens, width}, p.query.dtype, query_array);
  p.output = output_view(out, p.query.dtype);
  {
    py::gil_scoped_release release;
    ops::ort::paged_attention(p);
  }
  return out;
}

py::array ragged_paged_attention(const ArrayLike& q, const ArrayLike& kv_pages,
                                 const ArrayLike& kv_lens, const ArrayLike& page_indices,
                                 const ArrayLike& cu_q_lens, ArrayLike num_seqs, float sm_scale,
                                 const OptionalIndex& sliding_window, std::optional<float> soft_cap,
                                 std::optional<float> k_scale, std::optional<float> v_scale,
                                 std::optional<std::string> kv_dtype) {
  std::vector<py::array> keep;
  ops::torch_xla::RaggedPagedAttentionParams p;
  p.q = tensor_arg(q, "q", keep);
  const py::array q_array = keep.back();
  p.kv_pages = tensor_arg(kv_pages, "kv_pages", keep, kv_dtype);
  p.kv_lens = index_arg(kv_lens, "kv_lens", keep, ops::IndexType::kInt32);
  p.page_indices = index_arg(page_indices, "page_indices", keep, ops::IndexType::kInt32);
  p.cu_q_lens = index_arg(cu_q_lens, "cu_q_lens", keep, ops::IndexType::kInt32);
  if (py::isinstance<py::int_>(num_seqs))  // a plain int, as int32[1] (torch_xla's tensor form)
    num_seqs = py::module_::import("numpy").attr("array")(py::make_tuple(num_seqs), "int32");
  p.num_seqs = index_arg(num_seqs, "num_seqs", keep, ops::IndexType::kInt32);
  p.sm_scale = sm_scale;
  if (!sliding_window.is_none())
    p.sliding_window = int32_arg(sliding_window, "ragged_paged_attention", "sliding_window");
  p.soft_cap = soft_cap;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  py::array out = output_like(p.q, q_array);
  p.output = output_view(out, p.q.dtype);
  {
    py::gil_scoped_release release;
    ops::torch_xla::ragged_paged_attention(p);
  }
  return out;
}

ops::vllm::KVCaches vllm_caches(py::handle key_cache, py::handle value_cache,
                                const std::string& kv_cache_dtype, float k_scale, float v_scale,
                                const std::string& layout, bool writable,
                                std::vector<py::array>& keep) {
  ops::vllm::KVCaches kv;
  const std::optional<std::string> raw = vllm_raw_cache_dtype(kv_cache_dtype);
  kv.key_cache = tensor_arg(key_cache, "key_cache", keep, raw, writable);
  kv.value_cache = tensor_arg(value_cache, "value_cache", keep, raw, writable);
  kv.layout = vllm_layout(layout);
  kv.kv_cache_dtype = kv_cache_dtype;  // a view of the caller's string, alive for the call
  kv.k_scale = k_scale;
  kv.v_scale = v_scale;
  return kv;
}

py::array paged_attention_decode(const ArrayLike& query, const ArrayLike& key_cache,
                                 const ArrayLike& value_cache, const ArrayLike& block_tables,
                                 const ArrayLike& seq_lens, const Index& num_kv_heads, float scale,
                                 const OptionalArrayLike& alibi_slopes,
                                 const std::string& kv_cache_dtype, float k_scale, float v_scale,
                                 const std::string& layout) {
  std::vector<py::array> keep;
  ops::vllm::ForwardDecodeParams p;
  p.query = tensor_arg(query, "query", keep);
  const py::array query_array = keep.back();
  p.kv = vllm_caches(key_cache, value_cache, kv_cache_dtype, k_scale, v_scale, layout, false, keep);
  p.block_tables = index_arg(block_tables, "block_tables", keep, ops::IndexType::kInt32);
  p.seq_lens = index_arg(seq_lens, "seq_lens", keep, ops::IndexType::kInt32);
  // vLLM passes max_seq_len separately; here it is simply the longest sequence.
  for (std::int64_t b = 0; p.seq_lens.rank == 1 && b < p.seq_lens.dim(0); ++b)
    p.max_seq_len = std::max<std::int32_t>(
        p.max_seq_len,
        static_cast<std::int32_t>(std::clamp<std::int64_t>(p.seq_lens.at(b), 0, INT32_MAX)));
  p.num_kv_heads = int32_arg(num_kv_heads, "paged_attention_decode", "num_kv_heads");
  p.scale = scale;
  if (!alibi_slopes.is_none()) p.alibi_slopes = tensor_arg(alibi_slopes, "alibi_slopes", keep);
  py::array out = output_like(p.query, query_array);
  p.output = output_view(out, p.query.dtype);
  {
    py::gil_scoped_release release;
    ops::vllm::forward_decode(p);
  }
  return out;
}

py::array mla_decode_kvcache(const ArrayLike& query, const ArrayLike& kv_cache,
                             const ArrayLike& block_tables, const ArrayLike& seq_lens,
                             const Index& v_head_dim, float scale,
                             const std::string& kv_cache_dtype, float k_scale) {
  constexpr const char* kCall = "mla_decode_kvcache";
  std::vector<py::array> keep;
  ops::vllm::MlaDecodeParams p;
  p.query = tensor_arg(query, "query", keep);
  const py::array query_array = keep.back();
  p.kv_cache = tensor_arg(kv_cache, "kv_cache", keep, vllm_raw_cache_dtype(kv_cache_dtype));
  p.kv_cache_dtype = kv_cache_dtype;  // a view of the caller's string, alive for the call
  p.k_scale = k_scale;
  p.block_tables = index_arg(block_tables, "block_tables", keep, ops::IndexType::kInt32);
  p.seq_lens = index_arg(seq_lens, "seq_lens", keep, ops::IndexType::kInt32);
  p.scale = scale;
  const std::int32_t v_dim = int32_arg(v_head_dim, kCall, "v_head_dim");
  require(p.query.rank == 3 && v_dim >= 1, kCall,
          ": query must be [S, Hq, D] and v_head_dim = ", v_dim, " >= 1");
  py::array out = new_array({p.query.dim(0), p.query.dim(1), v_dim}, p.query.dtype, query_array);
  p.output = output_view(out, p.query.dtype);
  {
    py::gil_scoped_release release;
    ops::vllm::mla_decode_kvcache(p);
  }
  return out;
}

// The longest query of `query_start_loc` (rank 1; a bad one is left to the
// adapter, which names it): vLLM passes max_query_len separately.
std::int32_t longest_query(const ops::IndexView& query_start_loc) {
  std::int64_t longest = 0;
  for (std::int64_t b = 0; query_start_loc.rank == 1 && b + 1 < query_start_loc.dim(0); ++b)
    longest = std::max(longest, query_start_loc.at(b + 1) - query_start_loc.at(b));
  return static_cast<std::int32_t>(std::min<std::int64_t>(longest, INT32_MAX));
}

py::array paged_attention_prefix(const ArrayLike& query, const ArrayLike& key_cache,
                                 const ArrayLike& value_cache, const ArrayLike& block_tables,
                                 const ArrayLike& query_start_loc, const ArrayLike& seq_lens,
                                 const OptionalIndex& max_query_len, std::optional<float> scale,
                                 const OptionalArrayLike& alibi_slopes,
                                 const OptionalIndex& sliding_window,
                                 const std::string& kv_cache_dtype, float k_scale, float v_scale,
                                 const std::string& layout) {
  constexpr const char* kCall = "paged_attention_prefix";
  std::vector<py::array> keep;
  ops::vllm::ForwardPrefixParams p;
  p.query = tensor_arg(query, "query", keep);
  const py::array query_array = keep.back();
  p.kv = vllm_caches(key_cache, value_cache, kv_cache_dtype, k_scale, v_scale, layout, false, keep);
  p.block_tables = index_arg(block_tables, "block_tables", keep, ops::IndexType::kInt32);
  p.query_start_loc = index_arg(query_start_loc, "query_start_loc", keep, ops::IndexType::kInt32);
  p.seq_lens = index_arg(seq_lens, "seq_lens", keep, ops::IndexType::kInt32);
  p.max_query_len = max_query_len.is_none() ? longest_query(p.query_start_loc)
                                            : int32_arg(max_query_len, kCall, "max_query_len");
  p.scale = scale;
  if (!alibi_slopes.is_none()) p.alibi_slopes = tensor_arg(alibi_slopes, "alibi_slopes", keep);
  if (!sliding_window.is_none())
    p.sliding_window = int32_arg(sliding_window, kCall, "sliding_window");
  py::array out = output_like(p.query, query_array);
  p.output = output_view(out, p.query.dtype);
  {
    py::gil_scoped_release release;
    ops::vllm::forward_prefix(p);
  }
  return out;
}

void reshape_and_cache(const ArrayLike& key, const ArrayLike& value, const ArrayLike& key_cache,
                       const ArrayLike& value_cache, const ArrayLike& slot_mapping,
                       const std::string& kv_cache_dtype, float k_scale, float v_scale,
                       const std::string& layout) {
  std::vector<py::array> keep;
  ops::vllm::WriteToPagedCacheParams p;
  p.key = tensor_arg(key, "key", keep);
  p.value = tensor_arg(value, "value", keep);
  p.kv = vllm_caches(key_cache, value_cache, kv_cache_dtype, k_scale, v_scale, layout, true, keep);
  p.slot_mapping = index_arg(slot_mapping, "slot_mapping", keep, ops::IndexType::kInt64);
  py::gil_scoped_release release;
  ops::vllm::reshape_and_cache(p);
}

// Per-layer arrays name[i] (caches raw by item size; scales float32, with
// None for a layer that has none: an empty view).
// Arrays (ArrayLike) or arrays and None (OptionalArrayLike).
template <typename Array>
std::vector<ops::TensorView> layer_views(const std::vector<Array>& arrays, const char* name,
                                         bool raw, std::vector<py::array>& keep) {
  std::vector<ops::TensorView> views;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const std::string indexed = detail::concat(name, "[", i, "]");
    if (arrays[i].is_none()) {
      views.emplace_back();
      continue;
    }
    views.push_back(tensor_arg(arrays[i], indexed.c_str(), keep,
                               raw ? raw_dtype_by_size(arrays[i], indexed.c_str()) : std::nullopt,
                               /*writable=*/true));
  }
  return views;
}

void copy_blocks(const std::vector<ArrayLike>& key_caches,
                 const std::vector<ArrayLike>& value_caches, const ArrayLike& block_mapping,
                 const std::optional<std::vector<OptionalArrayLike>>& key_scales,
                 const std::optional<std::vector<OptionalArrayLike>>& value_scales,
                 const std::string& layout) {
  std::vector<py::array> keep;
  const std::vector<ops::TensorView> keys = layer_views(key_caches, "key_caches", true, keep);
  const std::vector<ops::TensorView> values = layer_views(value_caches, "value_caches", true, keep);
  const std::vector<ops::TensorView> k_scales =
      key_scales ? layer_views(*key_scales, "key_scales", false, keep)
                 : std::vector<ops::TensorView>{};
  const std::vector<ops::TensorView> v_scales =
      value_scales ? layer_views(*value_scales, "value_scales", false, keep)
                   : std::vector<ops::TensorView>{};
  ops::vllm::CopyBlocksParams p;
  p.key_caches = keys;
  p.value_caches = values;
  p.key_scales = k_scales;
  p.value_scales = v_scales;
  p.layout = vllm_layout(layout);
  p.block_mapping = index_arg(block_mapping, "block_mapping", keep, ops::IndexType::kInt64);
  py::gil_scoped_release release;
  ops::vllm::copy_blocks(p);
}

void swap_blocks(const ArrayLike& src, const ArrayLike& dst, const ArrayLike& block_mapping,
                 const OptionalArrayLike& src_scales, const OptionalArrayLike& dst_scales,
                 const std::string& layout) {
  std::vector<py::array> keep;
  ops::vllm::SwapBlocksParams p;
  p.src = tensor_arg(src, "src", keep, raw_dtype_by_size(src, "src"));
  p.dst = tensor_arg(dst, "dst", keep, raw_dtype_by_size(dst, "dst"), true);
  p.block_mapping = index_arg(block_mapping, "block_mapping", keep, ops::IndexType::kInt64);
  p.layout = vllm_layout(layout);
  if (!src_scales.is_none()) p.src_scales = tensor_arg(src_scales, "src_scales", keep);
  if (!dst_scales.is_none())
    p.dst_scales = tensor_arg(dst_scales, "dst_scales", keep, std::nullopt, /*writable=*/true);
  py::gil_scoped_release release;
  ops::vllm::swap_blocks(p);
}

// A C-contiguous float32 array for merge_states.
py::array_t<float> float32_state(py::handle obj, const char* name) {
  py::array a = as_array(obj, name);
  if (a.dtype().attr("name").cast<std::string>() != "float32")
    throw py::type_error(detail::concat("merge_states: ", name, " has dtype ",
                                        py::str(a.dtype()).cast<std::string>(),
                                        ", expected float32"));
  if (!(a.flags() & py::array::c_style))
    throw InvalidArgument(detail::concat("merge_states: ", name, " must be C-contiguous"));
  return py::reinterpret_borrow<py::array_t<float>>(a);
}

std::pair<py::array_t<float>, py::array_t<float>> merge_states(const ArrayLike& v_a,
                                                               const ArrayLike& s_a,
                                                               const ArrayLike& v_b,
                                                               const ArrayLike& s_b) {
  const py::array_t<float> va = float32_state(v_a, "v_a"), sa = float32_state(s_a, "s_a");
  const py::array_t<float> vb = float32_state(v_b, "v_b"), sb = float32_state(s_b, "s_b");
  if (va.ndim() < 1) throw InvalidArgument("merge_states: v_a must have at least one axis");
  // s has v's shape without the last axis; the C++ call checks the sizes.
  std::vector<py::ssize_t> v_shape(va.shape(), va.shape() + va.ndim());
  const std::vector<py::ssize_t> s_shape(v_shape.begin(), v_shape.end() - 1);
  for (const auto& [a, name] : {std::pair{&sa, "s_a"}, std::pair{&sb, "s_b"}})
    if (std::vector<py::ssize_t>(a->shape(), a->shape() + a->ndim()) != s_shape)
      throw InvalidArgument(
          detail::concat("merge_states: ", name, " must have v_a's shape without its last axis"));
  py::array_t<float> v_out(v_shape), s_out(s_shape);
  auto span_of = [](const py::array_t<float>& a) {
    return std::span<const float>(a.data(), static_cast<std::size_t>(a.size()));
  };
  pagedattn::merge_states(span_of(va), span_of(sa), span_of(vb), span_of(sb),
                          {v_out.mutable_data(), static_cast<std::size_t>(v_out.size())},
                          {s_out.mutable_data(), static_cast<std::size_t>(s_out.size())},
                          static_cast<std::int32_t>(v_shape.back()));
  return {v_out, s_out};
}

}  // namespace

void register_ops(py::module_& m) {
  py::module_ ops_module = m.def_submodule("ops", "Peer-compatible operators.");
  using py::arg;
  ops_module.def("ort_paged_attention", &ort_paged_attention, arg("query"), arg("key"),
                 arg("value"), arg("key_cache"), arg("value_cache"),
                 arg("cumulative_sequence_length"), arg("past_seqlens"), arg("block_table"),
                 arg("cos_cache") = py::none(), arg("sin_cache") = py::none(), py::kw_only(),
                 arg("num_heads"), arg("kv_num_heads"), arg("scale") = 0.0f, arg("softcap") = 0.0f,
                 arg("local_window_size") = -1, arg("do_rotary") = false,
                 arg("rotary_interleaved") = false, arg("slot_mapping") = py::none(),
                 arg("head_sink") = py::none(),
                 R"doc(ONNX Runtime com.microsoft.PagedAttention. Returns output (T, Hq*D).

query (T, Hq*D), or packed QKV (T, (Hq + 2 Hkv)*D) with key = value = None;
key, value (T, Hkv*D); key_cache, value_cache (num_blocks, block_size, Hkv*D)
or (num_blocks, block_size, Hkv, D), C-contiguous, written in place;
cumulative_sequence_length (B+1) int32; past_seqlens (B) int32 (tokens
already cached); block_table (B, max_blocks) int32; cos_cache, sin_cache
(max_position, R/2) with do_rotary (R = rotary_dim = 2 * cos_cache.shape[1]);
slot_mapping (T) int32/int64 (-1 skips); head_sink (Hq). Float inputs share
the query's dtype (float32, float16, ml_dtypes.bfloat16); output too.
scale 0: 1/sqrt(D); softcap 0: off; local_window_size L >= 1: the last L
keys, the query's own included (current ORT; -1: off; 0 is refused).
T = 0 gives a (0, Hq*D) output.)doc");
  ops_module.def("ragged_paged_attention", &ragged_paged_attention, arg("q"), arg("kv_pages"),
                 arg("kv_lens"), arg("page_indices"), arg("cu_q_lens"), arg("num_seqs"),
                 py::kw_only(), arg("sm_scale") = 1.0f, arg("sliding_window") = py::none(),
                 arg("soft_cap") = py::none(), arg("k_scale") = py::none(),
                 arg("v_scale") = py::none(), arg("kv_dtype") = py::none(),
                 R"doc(torch_xla ragged_paged_attention. Returns out [T, Hq, D] in q's dtype.

q [T, Hq, D] (rows past cu_q_lens[num_seqs] are padding; their output is 0);
kv_pages [P, page_size, 2 Hkv, D] with K heads at even, V heads at odd
indices; kv_lens [S] int32; page_indices [S, pages_per_seq] int32;
cu_q_lens [S+1] int32; num_seqs: int32[1] (or an int). Entries past num_seqs
are padding and ignored. kv_dtype: "bfloat16", "float8_e4m3fn", "float8_e5m2"
for uint16 / uint8 pages; omit for float32/float16 (or ml_dtypes) pages.
sm_scale defaults to 1.0; sliding_window W shows W keys; soft_cap != 0;
k_scale, v_scale for float8 pages (value = stored * scale).)doc");
  ops_module.def("paged_attention_decode", &paged_attention_decode, arg("query"), arg("key_cache"),
                 arg("value_cache"), arg("block_tables"), arg("seq_lens"), py::kw_only(),
                 arg("num_kv_heads"), arg("scale"), arg("alibi_slopes") = py::none(),
                 arg("kv_cache_dtype") = "auto", arg("k_scale") = 1.0f, arg("v_scale") = 1.0f,
                 arg("layout") = "NHD",
                 R"doc(vLLM PagedAttention.forward_decode. Returns out [S, Hq, D] in query's dtype.

query [S, Hq, D] (one new token per sequence, already in the caches);
key_cache, value_cache [num_blocks, block_size, Hkv, D] (layout "NHD") or
[num_blocks, Hkv, block_size, D] ("HND"); block_tables [S, max_blocks] int32;
seq_lens [S] int32 (keys per sequence); alibi_slopes [Hq] float32 (bias
slope * (j - p)). scale is used as given. kv_cache_dtype "auto" (the query's
dtype), "fp8" / "fp8_e4m3" (e4m3fn) or "fp8_e5m2" with uint8 (or ml_dtypes)
caches, value = stored * k_scale / v_scale.)doc");
  ops_module.def("mla_decode_kvcache", &mla_decode_kvcache, arg("query"), arg("kv_cache"),
                 arg("block_tables"), arg("seq_lens"), py::kw_only(), arg("v_head_dim"),
                 arg("scale"), arg("kv_cache_dtype") = "auto", arg("k_scale") = 1.0f,
                 R"doc(Multi-head latent attention decode (DeepSeek-V2/V3; vLLM's CPU
mla_decode_kvcache). Returns out [S, Hq, v_head_dim] in query's dtype: each
head's output in the latent space (apply W_UV after).

query [S, Hq, D]: absorbed queries [W_UK^T q_nope | q_pe] (one new token per
sequence, already in the cache); kv_cache [num_blocks, block_size, D]: one
row per token, [latent | rope key], whose first v_head_dim (= kv_lora_rank)
elements are V; block_tables [S, max_blocks] int32; seq_lens [S] int32.
scale is used as given (DeepSeek: 1/sqrt(qk_nope_head_dim +
qk_rope_head_dim), times YaRN's mscale squared). kv_cache_dtype "auto" (the
query's dtype), "fp8" / "fp8_e4m3" or "fp8_e5m2" with a uint8 (or ml_dtypes)
cache, value = stored * k_scale.)doc");
  ops_module.def("paged_attention_prefix", &paged_attention_prefix, arg("query"), arg("key_cache"),
                 arg("value_cache"), arg("block_tables"), arg("query_start_loc"), arg("seq_lens"),
                 py::kw_only(), arg("max_query_len") = py::none(), arg("scale") = py::none(),
                 arg("alibi_slopes") = py::none(), arg("sliding_window") = py::none(),
                 arg("kv_cache_dtype") = "auto", arg("k_scale") = 1.0f, arg("v_scale") = 1.0f,
                 arg("layout") = "NHD",
                 R"doc(vLLM PagedAttention.forward_prefix. Returns out [T, Hq, D] in query's dtype.

Prefill with a cached prefix: sequence b's queries query[query_start_loc[b]:
query_start_loc[b+1]] are its last positions of seq_lens[b] keys, causal.
Every key, the new ones included, is read from the caches, so write the
step's keys with reshape_and_cache first (as vLLM's backends do).
query [T, Hq, D]; key_cache, value_cache as in paged_attention_decode
(layout "NHD" or "HND"); block_tables [S, max_blocks] int32;
query_start_loc [S+1] int32 offsets from 0 to T; seq_lens [S] int32 (keys per
sequence, at least its query length). max_query_len: None is the longest
query (else it must bound them); scale None: 1/sqrt(D); alibi_slopes [Hq]
float32; sliding_window W >= 1: each query sees its last W keys;
kv_cache_dtype, k_scale, v_scale as in paged_attention_decode.)doc");
  ops_module.def("reshape_and_cache", &reshape_and_cache, arg("key"), arg("value"),
                 arg("key_cache"), arg("value_cache"), arg("slot_mapping"), py::kw_only(),
                 arg("kv_cache_dtype") = "auto", arg("k_scale") = 1.0f, arg("v_scale") = 1.0f,
                 arg("layout") = "NHD",
                 R"doc(vLLM reshape_and_cache: writes key/value into the caches in place.

key, value [N, Hkv, D]; key_cache, value_cache as in paged_attention_decode
(layout "NHD" or "HND"); slot_mapping [n <= N] int64, token i goes to slot
block * block_size + offset, -1 skips. With kv_cache_dtype "fp8*" values
are stored as round(x / k_scale) (saturating).)doc");
  ops_module.def("copy_blocks", &copy_blocks, arg("key_caches"), arg("value_caches"),
                 arg("block_mapping"), py::kw_only(), arg("key_scales") = py::none(),
                 arg("value_scales") = py::none(), arg("layout") = "NHD",
                 R"doc(vLLM copy_blocks: copies blocks src -> dst in every layer's caches, in place.

key_caches, value_caches: lists of per-layer arrays [num_blocks, ...] (rank 4,
blocks contiguous, any dtype); block_mapping (N, 2) int64 rows (src, dst).
int8 caches need their scales: key_scales, value_scales lists (one entry
per layer, None for a layer that is not int8) of [num_blocks, Hkv,
block_size] float32 arrays, copied with the blocks; layout "NHD" [num_blocks,
block_size, Hkv, D] or "HND" [num_blocks, Hkv, block_size, D] says which
axis is which. Every layer is checked before any block moves.)doc");
  ops_module.def("swap_blocks", &swap_blocks, arg("src"), arg("dst"), arg("block_mapping"),
                 py::kw_only(), arg("src_scales") = py::none(), arg("dst_scales") = py::none(),
                 arg("layout") = "NHD",
                 R"doc(vLLM swap_blocks: copies blocks of src into dst (written in place).

src [num_src_blocks, ...], dst [num_dst_blocks, ...] (rank 4, same block
shape and dtype); block_mapping (N, 2) int64 rows (src block, dst block).
int8 caches need src_scales [num_src_blocks, Hkv, block_size] and
dst_scales [num_dst_blocks, Hkv, block_size] float32 (dst_scales written);
layout "NHD" or "HND" as in copy_blocks.)doc");
  ops_module.def("merge_states", &merge_states, arg("v_a"), arg("s_a"), arg("v_b"), arg("s_b"),
                 R"doc(Merges two partial attention states. Returns (v, s).

v_a, v_b [..., D] float32 normalised outputs; s_a, s_b [...] float32
natural-log LSE (-inf marks an empty state), v's shape without its last
axis. v = (e^s_a v_a + e^s_b v_b) / (e^s_a + e^s_b), s = log(e^s_a + e^s_b).)doc");
}

}  // namespace pagedattn::python
