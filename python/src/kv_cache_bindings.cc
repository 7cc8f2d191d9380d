// pagedattn.KVCache: PagedKVCache with Python arguments. Every rule about
// sequences, pages and steps is the C++ cache's; this file only turns arrays
// into views (checking the shapes a HeadTensor cannot carry) and strings
// into enums.
//
// Threads: the C++ cache locks itself, so every call into it runs with the
// GIL released (arguments are converted first, with the GIL held, and the
// arrays stay referenced until the call returns): a thread waiting for the
// cache never stops the other Python threads.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "array_conversion.h"
#include "bindings.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::python {
namespace {

KVLayout parse_layout(const std::string& layout) {
  if (layout == "HND") return KVLayout::kHND;
  if (layout == "NHD") return KVLayout::kNHD;
  throw InvalidArgument("KVCache: layout = \"" + layout + "\" must be \"HND\" or \"NHD\"");
}

RopeMode parse_rope_mode(const std::string& mode) {
  if (mode == "none") return RopeMode::kNone;
  if (mode == "normal") return RopeMode::kNormal;
  if (mode == "inline") return RopeMode::kInline;
  throw InvalidArgument("KVCache: rope_mode = \"" + mode +
                        "\" must be \"none\", \"normal\" or \"inline\"");
}

// "(2, 3)" for a shape given by its extents.
template <typename Extents>
std::string shape_str(const Extents& extents) {
  std::ostringstream os;
  os << '(';
  for (std::size_t d = 0; d < extents.size(); ++d) os << (d ? ", " : "") << extents[d];
  os << (extents.size() == 1 ? ",)" : ")");
  return os.str();
}

// Checks that `a` has exactly `shape`, naming the argument.
void check_shape(const char* call, const char* name, const py::array& a,
                 const std::vector<py::ssize_t>& shape) {
  bool same = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (std::size_t d = 0; same && d < shape.size(); ++d) same = a.shape(d) == shape[d];
  if (same) return;
  const std::vector<py::ssize_t> actual(a.shape(), a.shape() + a.ndim());
  throw InvalidArgument(detail::concat(call, ": ", name, " has shape ", shape_str(actual),
                                       ", expected ", shape_str(shape)));
}

// A [tokens][heads][dim] array as a HeadTensor (any token and head strides,
// innermost axis contiguous).
HeadTensor head_tensor(const char* call, const char* name, py::handle obj,
                       const std::vector<py::ssize_t>& shape, std::vector<py::array>& keep,
                       bool writable = false) {
  py::array a = as_array(obj, name);
  const DType dtype = dtype_of(a, name);
  check_shape(call, name, a, shape);
  const ops::TensorView t = tensor_view(a, dtype, name, writable);
  if (t.dim(2) > 1 && t.stride(2) != 1)
    throw InvalidArgument(detail::concat(call, ": ", name,
                                         " must have a contiguous last axis (stride ",
                                         t.stride(2), " elements)"));
  keep.push_back(a);
  return HeadTensor{t.data, dtype, t.stride(0), t.stride(1)};
}

// A C-contiguous float32 array of `shape` for get_kv/set_kv.
const float* float_block(const char* name, const py::array& a, const std::vector<py::ssize_t>& shape) {
  if (a.dtype().attr("name").cast<std::string>() != "float32")
    throw py::type_error(detail::concat("KVCache.set_kv: ", name, " has dtype ",
                                        py::str(a.dtype()).cast<std::string>(), ", expected float32"));
  check_shape("KVCache.set_kv", name, a, shape);
  if (!(a.flags() & py::array::c_style))
    throw InvalidArgument(detail::concat("KVCache.set_kv: ", name, " must be C-contiguous"));
  return static_cast<const float*>(a.data());
}

// The [tokens][qo_heads][v_head_dim] output of a cache attention call: a new
// array of the queries' dtype (placed like `like`) and its view.
struct Output {
  py::array array;
  HeadTensor view;
  Output(const KVCacheConfig& c, py::ssize_t tokens, DType dtype, const py::array& like)
      : array(new_array({tokens, c.num_qo_heads, c.v_head_dim}, dtype, like)),
        view{array.mutable_data(), dtype, std::int64_t{c.num_qo_heads} * c.v_head_dim, c.v_head_dim} {}
};

AttentionOptions options_with(std::optional<float> sm_scale) {
  AttentionOptions options;
  options.scale = sm_scale;
  return options;
}

class KVCache {
 public:
  explicit KVCache(const KVCacheConfig& config) : cache_(config) {}

  PagedKVCache& cache() { return cache_; }
  const KVCacheConfig& config() const { return cache_.config(); }

  void begin_forward(const std::vector<SeqId>& seq_ids, const std::vector<std::int64_t>& lengths,
                     const py::object& token_tree_parents) {
    if (token_tree_parents.is_none()) {
      py::gil_scoped_release release;
      cache_.begin_forward(seq_ids, lengths);
      return;
    }
    const auto parents =
        int_list_arg(token_tree_parents, "KVCache.begin_forward", "token_tree_parents");
    py::gil_scoped_release release;
    cache_.begin_forward(seq_ids, lengths, parents);
  }

  // The current step's token count (InvalidStateError outside a step).
  py::ssize_t step_tokens() const {
    py::gil_scoped_release release;
    return static_cast<py::ssize_t>(cache_.num_step_tokens());
  }

  py::array attention(std::int32_t layer, py::handle q, py::handle k, py::handle v,
                      std::optional<float> sm_scale) {
    const KVCacheConfig& c = config();
    const py::ssize_t tokens = step_tokens();
    std::vector<py::array> keep;
    const char* call = "KVCache.attention";
    const HeadTensor qt = head_tensor(call, "q", q, {tokens, c.num_qo_heads, c.head_dim}, keep);
    const HeadTensor kt = head_tensor(call, "k", k, {tokens, c.num_kv_heads, c.head_dim}, keep);
    const HeadTensor vt = head_tensor(call, "v", v, {tokens, c.num_kv_heads, c.v_head_dim}, keep);
    const Output out(c, tokens, qt.dtype, keep.front());
    {
      // `tokens` makes the call refuse a step another thread started since.
      py::gil_scoped_release release;
      cache_.attention(layer, qt, kt, vt, out.view, options_with(sm_scale), nullptr, tokens);
    }
    return out.array;
  }

  py::array attention_with_fused_qkv(std::int32_t layer, py::handle qkv, std::optional<float> sm_scale) {
    const KVCacheConfig& c = config();
    const py::ssize_t tokens = step_tokens();
    std::vector<py::array> keep;
    const HeadTensor t = head_tensor("KVCache.attention_with_fused_qkv", "qkv", qkv,
                                     {tokens, c.num_qo_heads + 2 * c.num_kv_heads, c.head_dim}, keep);
    const Output out(c, tokens, t.dtype, keep.front());
    {
      py::gil_scoped_release release;
      cache_.attention_with_fused_qkv(layer, t, out.view, options_with(sm_scale), nullptr, tokens);
    }
    return out.array;
  }

  py::tuple get_kv(py::handle seq_id_arg, py::handle start_arg, py::handle end_arg) {
    const KVCacheConfig& c = config();
    constexpr const char* kCall = "KVCache.get_kv";
    const SeqId seq_id = int_arg(seq_id_arg, kCall, "seq_id");
    const std::int64_t start = int_arg(start_arg, kCall, "start"),
                       end = int_arg(end_arg, kCall, "end");
    const py::ssize_t count = checked_token_count(kCall, seq_id, start, end);
    py::array_t<float> k({py::ssize_t{c.num_layers}, count, py::ssize_t{c.num_kv_heads},
                          py::ssize_t{c.head_dim}});
    py::array_t<float> v({py::ssize_t{c.num_layers}, count, py::ssize_t{c.num_kv_heads},
                          py::ssize_t{c.v_head_dim}});
    const std::span<float> ks(k.mutable_data(), static_cast<std::size_t>(k.size()));
    const std::span<float> vs(v.mutable_data(), static_cast<std::size_t>(v.size()));
    {
      py::gil_scoped_release release;
      cache_.debug_get_kv(seq_id, start, end, ks, vs);
    }
    return py::make_tuple(k, v);
  }

  void set_kv(py::handle seq_id_arg, py::handle start_arg, py::handle end_arg, py::handle k,
              py::handle v) {
    const KVCacheConfig& c = config();
    constexpr const char* kCall = "KVCache.set_kv";
    const SeqId seq_id = int_arg(seq_id_arg, kCall, "seq_id");
    const std::int64_t start = int_arg(start_arg, kCall, "start"),
                       end = int_arg(end_arg, kCall, "end");
    const py::ssize_t count = checked_token_count(kCall, seq_id, start, end);
    py::array ka = as_array(k, "k"), va = as_array(v, "v");
    const float* kd = float_block("k", ka, {c.num_layers, count, c.num_kv_heads, c.head_dim});
    const float* vd = float_block("v", va, {c.num_layers, count, c.num_kv_heads, c.v_head_dim});
    const std::span<const float> ks(kd, static_cast<std::size_t>(ka.size()));
    const std::span<const float> vs(vd, static_cast<std::size_t>(va.size()));
    py::gil_scoped_release release;
    cache_.debug_set_kv(seq_id, start, end, ks, vs);
  }

 private:
  // end - start for a range inside sequence seq_id, checked before any
  // arithmetic or allocation (a wild end must not overflow or allocate).
  py::ssize_t checked_token_count(const char* call, SeqId seq_id, std::int64_t start,
                                  std::int64_t end) const {
    if (!cache_.has_sequence(seq_id))
      throw InvalidArgument(detail::concat(call, ": seq_id = ", seq_id, " is not in the cache"));
    const std::int64_t length = cache_.sequence_length(seq_id);
    if (start < 0 || start > length)
      throw InvalidArgument(detail::concat(call, ": start = ", start, " is not inside [0, ", length,
                                           "] (the tokens of seq_id = ", seq_id, ")"));
    if (end < start || end > length)
      throw InvalidArgument(detail::concat(call, ": end = ", end, " is not inside [start = ", start,
                                           ", ", length, "] (the tokens of seq_id = ", seq_id,
                                           ")"));
    return static_cast<py::ssize_t>(end - start);
  }

  PagedKVCache cache_;
};

constexpr const char* kClassDoc = R"doc(Paged KV cache: pages of K/V for many sequences, with attention.

KVCache(num_layers, num_qo_heads, num_kv_heads, head_dim, page_size, num_pages,
        dtype="float16", layout="HND", rope_mode="none", rope_theta=10000.0,
        rope_scale=1.0, support_sliding_window=False, v_head_dim=None)

dtype: storage type, "float32", "float16", "bfloat16", "float8_e4m3fn",
  "float8_e5m2" or "int8". layout: "HND" (page = [Hkv, page_size, D]) or
  "NHD" (page = [page_size, Hkv, D]). rope_mode: "none" (q, k arrive
  rotated), "normal" (q and new k rotated at their positions, K stored
  rotated), "inline" (K stored raw, rotated at its cache index inside
  attention). rope_scale multiplies the rotary frequency. v_head_dim: None
  means head_dim.

A step (the TVM protocol):
    cache.add_sequence(0)
    cache.begin_forward([0], [T])            # reserve pages for T new tokens
    out = cache.attention(layer, q, k, v)    # per layer: append k/v, attend
    cache.end_forward()                      # sliding windows trim here

Shapes (T = tokens of the step, in seq_ids order; Hq = num_qo_heads,
Hkv = num_kv_heads, D = head_dim, Dv = v_head_dim):
    q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, Hq, Dv]
    qkv [T, Hq + 2 Hkv, D]                       -> out [T, Hq, D]
q, k, v are float32 or float16 (or ml_dtypes.bfloat16) arrays of one dtype;
use the cache dtype for float32/float16 caches and float32 for the others
(stored rounded to nearest even). out has q's dtype. Only the last axis needs
to be contiguous.

Errors: pagedattn.InvalidArgumentError (a ValueError) naming the argument,
pagedattn.OutOfPagesError (a RuntimeError) when the pool is short (the cache
is then unchanged), pagedattn.InvalidStateError for calls out of order.
Every call validates first and changes nothing when it fails.

end_forward refuses a step in which some layer's K/V was not written
(attention for every layer, or set_kv of every new token); cancel_forward
abandons a step, restoring the cache exactly.

Threads: a KVCache may be shared by threads. Every call is safe from any
thread; calls on one cache take turns (the GIL is released while a call
waits or works, so attention of one thread runs beside other Python code).
The thread that began a step should be the one to end it.)doc";

}  // namespace

// Runs a binding's C++ call with the GIL released (its arguments are plain
// C++ values by then).
using ReleaseGil = py::call_guard<py::gil_scoped_release>;

void register_kv_cache(py::module_& m) {
  py::class_<KVCache>(m, "KVCache", kClassDoc)
      .def(py::init([](std::int32_t num_layers, std::int32_t num_qo_heads, std::int32_t num_kv_heads,
                       std::int32_t head_dim, std::int32_t page_size, std::int64_t num_pages,
                       const std::string& dtype, const std::string& layout,
                       const std::string& rope_mode, float rope_theta, float rope_scale,
                       bool support_sliding_window, std::optional<std::int32_t> v_head_dim) {
             KVCacheConfig c;
             c.num_layers = num_layers;
             c.num_qo_heads = num_qo_heads;
             c.num_kv_heads = num_kv_heads;
             c.head_dim = head_dim;
             c.v_head_dim = v_head_dim.value_or(0);
             c.page_size = page_size;
             c.num_pages = num_pages;
             c.kv_dtype = parse_dtype(dtype);
             c.layout = parse_layout(layout);
             c.rope_mode = parse_rope_mode(rope_mode);
             c.rope.theta = rope_theta;
             c.rope.scale = rope_scale;
             c.support_sliding_window = support_sliding_window;
             return std::make_unique<KVCache>(c);
           }),
           py::arg("num_layers"), py::arg("num_qo_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("page_size"), py::arg("num_pages"),
           py::arg("dtype") = "float16", py::arg("layout") = "HND", py::arg("rope_mode") = "none",
           py::arg("rope_theta") = 10000.0f, py::arg("rope_scale") = 1.0f,
           py::arg("support_sliding_window") = false, py::arg("v_head_dim") = py::none(),
           "Creates the cache with num_pages free pages of page_size tokens (see the class doc).")
      .def("add_sequence", [](KVCache& s, SeqId id) { s.cache().add_sequence(id); }, ReleaseGil(),
           py::arg("id"),
           "Adds an empty sequence `id` (InvalidArgumentError if it exists).")
      .def("remove_sequence", [](KVCache& s, SeqId id) { s.cache().remove_sequence(id); },
           ReleaseGil(), py::arg("id"),
           "Removes sequence `id` and frees its pages (shared pages lose a reference).")
      .def("fork_sequence",
           [](KVCache& s, SeqId parent, SeqId child, std::int64_t fork_pos) {
             s.cache().fork_sequence(parent, child, fork_pos);
           },
           ReleaseGil(), py::arg("parent"), py::arg("child"), py::arg("fork_pos") = -1,
           "Creates `child` holding the first `fork_pos` tokens of `parent` (-1: all).\n"
           "Full pages are shared (copy on write); a partial page at the fork point is\n"
           "copied. The child inherits no sliding window.")
      .def("pop_n", [](KVCache& s, SeqId id, std::int64_t n) { s.cache().pop_n(id, n); },
           ReleaseGil(), py::arg("id"), py::arg("n"),
           "Removes the last `n` tokens of sequence `id`.")
      .def("enable_sliding_window",
           [](KVCache& s, SeqId id, std::int64_t window_size, std::int64_t attn_sink_size) {
             s.cache().enable_sliding_window(id, window_size, attn_sink_size);
           },
           ReleaseGil(), py::arg("id"), py::arg("window_size"), py::arg("attn_sink_size"),
           "After every step sequence `id` keeps its first `attn_sink_size` tokens plus\n"
           "the most recent ones, `window_size` in all (trimmed at end_forward). Needs\n"
           "support_sliding_window=True; 0 <= attn_sink_size < window_size.")
      .def("begin_forward", &KVCache::begin_forward, py::arg("seq_ids"), py::arg("append_lengths"),
           py::arg("token_tree_parents") = py::none(),
           "begin_forward(seq_ids, append_lengths, token_tree_parents=None)\n\n"
           "Starts a step: reserves pages for append_lengths[i] new tokens of seq_ids[i]\n"
           "(lists or 1-D integer arrays of length B; lengths may be 0). The step's\n"
           "T = sum(append_lengths) tokens are ordered as seq_ids. OutOfPagesError if\n"
           "the pool cannot hold them (nothing changes).\n\n"
           "token_tree_parents (speculative decoding): one flat list over all T\n"
           "tokens, sequence after sequence: the parent of each appended node as an\n"
           "index into that sequence's uncommitted tree (-1: a child of the committed\n"
           "prefix; parent < node). Each node attends to the committed prefix, its\n"
           "ancestors and itself; positions are committed length + depth. The tree\n"
           "may grow over several forwards; until commit_accepted_token_tree_nodes\n"
           "the sequence refuses plain forwards, forks, pop_n (InvalidStateError).")
      .def("commit_accepted_token_tree_nodes",
           [](KVCache& s, const std::vector<SeqId>& seq_ids,
              const std::vector<std::int64_t>& leaves) {
             s.cache().commit_accepted_token_tree_nodes(seq_ids, leaves);
           },
           ReleaseGil(), py::arg("seq_ids"), py::arg("leaf_indices"),
           "commit_accepted_token_tree_nodes(seq_ids, leaf_indices)\n\n"
           "Keeps, per sequence, the root-to-leaf path ending at leaf_indices[i] (a node\n"
           "of its open tree; -1 rejects all): the path's K/V move right after the\n"
           "committed prefix, the other nodes are dropped, and the tree closes.")
      .def("token_tree_size", [](KVCache& s, SeqId id) { return s.cache().token_tree_size(id); },
           ReleaseGil(), py::arg("id"),
           "Uncommitted token-tree nodes of sequence `id` (0 when none is open).")
      .def("attention", &KVCache::attention, py::arg("layer"), py::arg("q"), py::arg("k"),
           py::arg("v"), py::arg("sm_scale") = py::none(),
           "attention(layer, q, k, v, sm_scale=None) -> out\n\n"
           "For `layer` of the current step: applies RoPE per rope_mode (to copies),\n"
           "appends k/v to the cache and attends causally over each sequence.\n"
           "q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, Hq, Dv] (q's dtype).\n"
           "sm_scale None: 1/sqrt(D). A failed call changes nothing; the step goes on.")
      .def("attention_with_fused_qkv", &KVCache::attention_with_fused_qkv, py::arg("layer"),
           py::arg("qkv"), py::arg("sm_scale") = py::none(),
           "attention_with_fused_qkv(layer, qkv, sm_scale=None) -> out\n\n"
           "attention() with q, k, v packed per token: qkv [T, Hq + 2 Hkv, D] (heads\n"
           "q..., k..., v...) -> out [T, Hq, D]. Needs v_head_dim == head_dim.")
      .def("end_forward", [](KVCache& s) { s.cache().end_forward(); }, ReleaseGil(),
           "Ends the step; sliding windows drop the tokens that fell out.\n"
           "InvalidStateError (the step stays open) if some layer's K/V of the\n"
           "step's new tokens was not written (attention of that layer, or set_kv of\n"
           "every new token): the pages may still hold another sequence's K/V.")
      .def("cancel_forward", [](KVCache& s) { s.cache().cancel_forward(); },
           ReleaseGil(),
           "Abandons the open step (e.g. the model raised half way): the cache\n"
           "returns to exactly its state before begin_forward. InvalidStateError\n"
           "outside a step.")
      .def("get_kv", &KVCache::get_kv, py::arg("seq_id"), py::arg("start"), py::arg("end"),
           "get_kv(seq_id, start, end) -> (k, v)\n\n"
           "Tokens [start, end) of a sequence (retained tokens, with a sliding window)\n"
           "as float32 copies: k [num_layers, end-start, Hkv, D], v [num_layers,\n"
           "end-start, Hkv, Dv]. K is as stored (rotated with rope_mode=\"normal\").")
      .def("set_kv", &KVCache::set_kv, py::arg("seq_id"), py::arg("start"), py::arg("end"),
           py::arg("k"), py::arg("v"),
           "set_kv(seq_id, start, end, k, v)\n\n"
           "Overwrites tokens [start, end) of a sequence: k [num_layers, end-start, Hkv, D],\n"
           "v [num_layers, end-start, Hkv, Dv], float32, C-contiguous, rounded to the\n"
           "cache dtype. Tokens in pages shared with another sequence are refused.")
      .def_property_readonly("num_free_pages",
                             py::cpp_function([](KVCache& s) { return s.cache().num_free_pages(); },
                                              ReleaseGil()),
                             "Pages in the pool not held by any sequence.")
      .def_property_readonly("total_sequence_length",
                             py::cpp_function(
                                 [](KVCache& s) { return s.cache().total_sequence_length(); },
                                 ReleaseGil()),
                             "Sum of sequence_length over all sequences.")
      .def_property_readonly("num_pages", [](KVCache& s) { return s.cache().num_pages(); },
                             "Pages in the pool (the constructor's num_pages).")
      .def("empty", [](KVCache& s) { return s.cache().empty(); }, ReleaseGil(),
           
           "True when there are no sequences and every page is free.")
      .def("sequence_length", [](KVCache& s, SeqId id) { return s.cache().sequence_length(id); },
           ReleaseGil(), py::arg("id"),
           "Tokens sequence `id` holds (retained ones, with a sliding window).")
      .def("check_invariants", [](KVCache& s) { s.cache().check_invariants(); },
           ReleaseGil(),
           "Raises pagedattn.InternalError describing the first broken invariant (a bug).")
      .def("__repr__", [](KVCache& s) {
        const KVCacheConfig& c = s.config();
        std::int64_t sequences = 0, free_pages = 0;
        {
          py::gil_scoped_release release;
          sequences = s.cache().num_sequences();
          free_pages = s.cache().num_free_pages();
        }
        return detail::concat("KVCache(num_layers=", c.num_layers, ", num_qo_heads=", c.num_qo_heads,
                              ", num_kv_heads=", c.num_kv_heads, ", head_dim=", c.head_dim,
                              ", page_size=", c.page_size, ", num_pages=", c.num_pages, ", dtype=\"",
                              dtype_name(c.kv_dtype), "\", sequences=", sequences,
                              ", free_pages=", free_pages, ")");
      });
}

}  // namespace pagedattn::python
