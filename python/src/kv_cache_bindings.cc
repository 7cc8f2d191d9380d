// pagedattn.KVCache: PagedKVCache with Python arguments. Every rule about
// sequences, pages and steps is the C++ cache's; this file only turns arrays
// into views (checking the shapes a HeadTensor cannot carry) and strings
// into enums.
//
// Threads: the C++ cache locks itself, so every call into it runs with the
// GIL released (arguments are converted first, with the GIL held, and the
// arrays stay referenced until the call returns): a thread waiting for the
// cache never stops the other Python threads. Per-step calls name their step
// (the BatchPlan begin_forward returned, by default the one this thread
// began), so a thread whose step another thread replaced is refused.
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "array_conversion.h"
#include "bindings.h"
#include "pagedattn/kv_cache.h"
#include "plan_views.h"
#include "type_hints.h"

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
    throw InvalidArgument(detail::concat(
        call, ": ", name, " must have a contiguous last axis (stride ", t.stride(2), " elements)"));
  keep.push_back(a);
  return HeadTensor{t.data, dtype, t.stride(0), t.stride(1)};
}

// A C-contiguous float32 array of `shape` for get_kv/set_kv.
const float* float_block(const char* name, const py::array& a,
                         const std::vector<py::ssize_t>& shape) {
  if (a.dtype().attr("name").cast<std::string>() != "float32")
    throw py::type_error(detail::concat("KVCache.set_kv: ", name, " has dtype ",
                                        py::str(a.dtype()).cast<std::string>(),
                                        ", expected float32"));
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
        view{array.mutable_data(), dtype, std::int64_t{c.num_qo_heads} * c.v_head_dim,
             c.v_head_dim} {}
};

// attention()'s result: out, or (out, lse) with return_lse.
struct AttentionResultHint {
  static constexpr auto name = py::detail::const_name(
      "numpy.ndarray | tuple[numpy.ndarray, numpy.typing.NDArray[numpy.float32]]");
};
using AttentionResult = Typed<AttentionResultHint>;

// A per-step call's step= (a BatchPlan, or None: typed `BatchPlan | None`).
using OptionalPlan = std::optional<PlanSnapshot>;

// attention()'s keyword options, converted once (the arrays are copied:
// they are [num_qo_heads] floats).
struct AttentionArgs {
  std::optional<float> sm_scale;
  bool causal = true;
  std::int32_t window_left = -1;
  float softcap = 0.0f;
  py::object alibi_slopes = py::none(), sinks = py::none();
  bool return_lse = false;
  PlanSnapshot step;  // null: the step this thread began (see KVCache::step_for)
};

std::vector<float> per_head(const char* name, const py::object& values, std::int32_t heads) {
  if (values.is_none()) return {};
  const py::array_t<float, py::array::c_style | py::array::forcecast> a =
      py::module_::import("numpy").attr("asarray")(values, "float32");
  if (a.ndim() != 1 || a.shape(0) != heads)
    throw InvalidArgument(detail::concat("KVCache.attention: ", name, " has ", a.size(),
                                         " values in ", a.ndim(), " dimension(s), expected [",
                                         heads, "] (one per query head)"));
  return {a.data(), a.data() + heads};
}

// The options and the per-head arrays they point into.
struct ConvertedOptions {
  AttentionOptions options;
  std::vector<float> alibi_slopes, sinks;
  ConvertedOptions(const AttentionArgs& a, std::int32_t heads)
      : alibi_slopes(per_head("alibi_slopes", a.alibi_slopes, heads)),
        sinks(per_head("sinks", a.sinks, heads)) {
    options.scale = a.sm_scale;
    options.causal = a.causal;
    options.window_left = a.window_left;
    options.softcap = a.softcap;
    if (!alibi_slopes.empty()) options.alibi_slopes = alibi_slopes.data();
    if (!sinks.empty()) options.sinks = sinks.data();
  }
};

class KVCache {
 public:
  // Constructed without the GIL; track_thread_steps (with it) completes it.
  explicit KVCache(const KVCacheConfig& config) : cache_(config) {}
  void track_thread_steps() { thread_steps_ = py::module_::import("threading").attr("local")(); }

  PagedKVCache& cache() { return cache_; }
  const KVCacheConfig& config() const { return cache_.config(); }

  PlanSnapshot begin_forward(const std::vector<SeqId>& seq_ids,
                             const std::vector<std::int64_t>& lengths,
                             const OptionalIndexSequence& token_tree_parents) {
    std::vector<std::int64_t> parents;
    if (!token_tree_parents.is_none())
      parents = int_list_arg(token_tree_parents, "KVCache.begin_forward", "token_tree_parents");
    PlanSnapshot plan;
    {
      py::gil_scoped_release release;
      // Copied under the cache's lock: a thread ending this step and
      // beginning another at once cannot swap its plan (and step_id) in.
      plan = std::make_shared<BatchPlan>(
          token_tree_parents.is_none() ? cache_.begin_forward_copy(seq_ids, lengths)
                                       : cache_.begin_forward_copy(seq_ids, lengths, parents));
    }
    thread_steps_.attr(kThreadStep) = plan;
    return plan;
  }

  // The step a per-step call acts for: `step` if given, else the one this
  // thread began (null when it began none, or ended it: then the call takes
  // whichever step is open, as a thread helping another's step must).
  PlanSnapshot step_for(const PlanSnapshot& step) const {
    if (step) return step;
    const py::object mine = py::getattr(thread_steps_, kThreadStep, py::none());
    return mine.is_none() ? nullptr : mine.cast<PlanSnapshot>();
  }
  static StepId id_of(const PlanSnapshot& step) { return step ? step->step_id : kAnyStep; }

  // After `step` ended or was cancelled: this thread no longer drives it.
  void forget_step(const PlanSnapshot& step) {
    const PlanSnapshot mine = step_for(nullptr);
    if (step && mine && mine->step_id == step->step_id)
      thread_steps_.attr(kThreadStep) = py::none();
  }

  void end_forward(const OptionalPlan& step_arg) {
    const PlanSnapshot step = step_for(step_arg.value_or(nullptr));
    {
      py::gil_scoped_release release;
      cache_.end_forward(id_of(step));
    }
    forget_step(step);
  }

  void cancel_forward(const OptionalPlan& step_arg) {
    const PlanSnapshot step = step_for(step_arg.value_or(nullptr));
    {
      py::gil_scoped_release release;
      cache_.cancel_forward(id_of(step));
    }
    forget_step(step);
  }

  void mark_layer_appended(std::int32_t layer, const OptionalPlan& step_arg) {
    const StepId step = id_of(step_for(step_arg.value_or(nullptr)));
    py::gil_scoped_release release;
    cache_.mark_layer_appended(layer, step);
  }

  PlanSnapshot plan() {
    py::gil_scoped_release release;
    return std::make_shared<BatchPlan>(cache_.plan());
  }

  // The current step's token count (InvalidStateError outside a step).
  py::ssize_t step_tokens() const {
    py::gil_scoped_release release;
    return static_cast<py::ssize_t>(cache_.num_step_tokens());
  }

  // Rows of the tensors of a call for `step`: its own token count (a stale
  // step is refused by the call itself), else the open step's.
  py::ssize_t tokens_of(const PlanSnapshot& step) const {
    return step ? static_cast<py::ssize_t>(step->num_tokens()) : step_tokens();
  }

  AttentionResult attention(std::int32_t layer, py::handle q, py::handle k, py::handle v,
                            const AttentionArgs& args) {
    const KVCacheConfig& c = config();
    const PlanSnapshot step = step_for(args.step);
    const py::ssize_t tokens = tokens_of(step);
    std::vector<py::array> keep;
    const char* call = "KVCache.attention";
    const HeadTensor qt = head_tensor(call, "q", q, {tokens, c.num_qo_heads, c.head_dim}, keep);
    const HeadTensor kt = head_tensor(call, "k", k, {tokens, c.num_kv_heads, c.head_dim}, keep);
    const HeadTensor vt =
        takes_v(call, v) ? head_tensor(call, "v", v, {tokens, c.num_kv_heads, c.v_head_dim}, keep)
                         : HeadTensor{};
    const ConvertedOptions options(args, c.num_qo_heads);
    const Output out(c, tokens, qt.dtype, keep.front());
    py::array_t<float> lse = lse_array(args.return_lse, tokens);
    {
      // `tokens` and the step id make the call refuse a step another thread
      // began since (the id even when it has as many tokens).
      py::gil_scoped_release release;
      cache_.attention(layer, qt, kt, vt, out.view, options.options, lse_data(lse, args), tokens,
                       id_of(step));
    }
    return with_lse(out.array, lse, args);
  }

  AttentionResult attention_with_fused_qkv(std::int32_t layer, py::handle qkv,
                                           const AttentionArgs& args) {
    const KVCacheConfig& c = config();
    const PlanSnapshot step = step_for(args.step);
    const py::ssize_t tokens = tokens_of(step);
    std::vector<py::array> keep;
    const HeadTensor t =
        head_tensor("KVCache.attention_with_fused_qkv", "qkv", qkv,
                    {tokens, c.num_qo_heads + 2 * c.num_kv_heads, c.head_dim}, keep);
    const ConvertedOptions options(args, c.num_qo_heads);
    const Output out(c, tokens, t.dtype, keep.front());
    py::array_t<float> lse = lse_array(args.return_lse, tokens);
    {
      py::gil_scoped_release release;
      cache_.attention_with_fused_qkv(layer, t, out.view, options.options, lse_data(lse, args),
                                      tokens, id_of(step));
    }
    return with_lse(out.array, lse, args);
  }

  std::pair<py::array_t<float>, py::array_t<float>> get_kv(const Index& seq_id_arg,
                                                           const Index& start_arg,
                                                           const Index& end_arg) {
    const KVCacheConfig& c = config();
    constexpr const char* kCall = "KVCache.get_kv";
    const SeqId seq_id = int_arg(seq_id_arg, kCall, "seq_id");
    const std::int64_t start = int_arg(start_arg, kCall, "start"),
                       end = int_arg(end_arg, kCall, "end");
    const py::ssize_t count = checked_token_count(kCall, seq_id, start, end);
    py::array_t<float> k(
        {py::ssize_t{c.num_layers}, count, py::ssize_t{c.num_kv_heads}, py::ssize_t{c.head_dim}});
    py::array_t<float> v(
        {py::ssize_t{c.num_layers}, count, py::ssize_t{c.num_kv_heads}, py::ssize_t{c.v_head_dim}});
    const std::span<float> ks(k.mutable_data(), static_cast<std::size_t>(k.size()));
    const std::span<float> vs(v.mutable_data(), static_cast<std::size_t>(v.size()));
    {
      py::gil_scoped_release release;
      cache_.debug_get_kv(seq_id, start, end, ks, vs);
    }
    return {k, v};
  }

  void set_kv(const Index& seq_id_arg, const Index& start_arg, const Index& end_arg,
              const ArrayLike& k, const OptionalArrayLike& v) {
    const KVCacheConfig& c = config();
    constexpr const char* kCall = "KVCache.set_kv";
    const SeqId seq_id = int_arg(seq_id_arg, kCall, "seq_id");
    const std::int64_t start = int_arg(start_arg, kCall, "start"),
                       end = int_arg(end_arg, kCall, "end");
    const py::ssize_t count = checked_token_count(kCall, seq_id, start, end);
    const bool mla = !takes_v(kCall, v);
    py::array ka = as_array(k, "k");
    const float* kd = float_block("k", ka, {c.num_layers, count, c.num_kv_heads, c.head_dim});
    const std::span<const float> ks(kd, static_cast<std::size_t>(ka.size()));
    py::array va;
    std::span<const float> vs;
    if (!mla) {
      va = as_array(v, "v");
      const float* vd = float_block("v", va, {c.num_layers, count, c.num_kv_heads, c.v_head_dim});
      vs = {vd, static_cast<std::size_t>(va.size())};
    }
    py::gil_scoped_release release;
    cache_.debug_set_kv(seq_id, start, end, ks, vs);
  }

 private:
  // Whether `call` takes a v: not for attention_kind "mla", whose V is the
  // head of each k row (v must be None), else always (v must be given).
  bool takes_v(const char* call, py::handle v) const {
    const bool mla = config().attention_kind == AttentionKind::kMLA;
    if (mla != v.is_none())
      throw InvalidArgument(detail::concat(
          call, mla ? ": v must be None for attention_kind=\"mla\" (V is the latent, the first "
                      "v_head_dim elements of each k row)"
                    : ": v is required (attention_kind=\"mha\")"));
    return !mla;
  }

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

  // [T, Hq] float32 for return_lse (else an empty array).
  py::array_t<float> lse_array(bool wanted, py::ssize_t tokens) const {
    if (!wanted) return py::array_t<float>(0);
    return py::array_t<float>({tokens, py::ssize_t{config().num_qo_heads}});
  }
  static float* lse_data(py::array_t<float>& lse, const AttentionArgs& args) {
    return args.return_lse ? lse.mutable_data() : nullptr;
  }
  static AttentionResult with_lse(const py::array& out, const py::array_t<float>& lse,
                                  const AttentionArgs& args) {
    if (!args.return_lse) return out;
    return py::make_tuple(out, lse);
  }

  // threading.local attribute holding the BatchPlan of the step the thread began.
  static constexpr const char* kThreadStep = "step";

  PagedKVCache cache_;
  py::object thread_steps_;  // threading.local(): per thread, kThreadStep
};

// A float (one scale for the tensor) or [num_kv_heads] floats (per head).
struct Fp8ScaleHint {
  static constexpr auto name = py::detail::const_name(
      "float | collections.abc.Sequence[float] | numpy.typing.NDArray[numpy.floating]");
};
using Fp8Scale = Typed<Fp8ScaleHint>;

void parse_fp8_scale(const py::object& value, float& scale, std::vector<float>& head_scales) {
  if (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr())) {
    scale = value.cast<float>();
    return;
  }
  const py::array_t<float, py::array::c_style | py::array::forcecast> a =
      py::module_::import("numpy").attr("asarray")(value, "float32");
  if (a.ndim() != 1)
    throw InvalidArgument(
        detail::concat("KVCache: an fp8 scale must be a float or a 1-D list "
                       "of per-head floats, got ",
                       a.ndim(), " dimensions"));
  head_scales.assign(a.data(), a.data() + a.size());
}

// Llama-3 rope scaling as in a Hugging Face config, or None.
struct RopeScalingHint {
  static constexpr auto name = py::detail::const_name("dict[str, float | str] | None");
};
using RopeScaling = Typed<RopeScalingHint>;

RopeLlama3Scaling parse_rope_scaling(const py::object& value) {
  RopeLlama3Scaling s;
  if (value.is_none()) return s;
  const py::dict d = value.cast<py::dict>();
  for (const auto& [key, item] : d) {
    const std::string k = key.cast<std::string>();
    if (k == "rope_type" || k == "type") {
      const std::string type = item.cast<std::string>();
      if (type != "llama3")
        throw InvalidArgument("KVCache: rope_scaling[\"" + k + "\"] = \"" + type +
                              "\" is not supported (only \"llama3\")");
    } else if (k == "factor") {
      s.factor = item.cast<float>();
    } else if (k == "low_freq_factor") {
      s.low_freq_factor = item.cast<float>();
    } else if (k == "high_freq_factor") {
      s.high_freq_factor = item.cast<float>();
    } else if (k == "original_max_position_embeddings") {
      s.original_max_position = item.cast<std::int32_t>();
    } else {
      throw InvalidArgument("KVCache: rope_scaling has an unknown key \"" + k + "\"");
    }
  }
  return s;
}

std::unique_ptr<KVCache> make_cache(
    std::int32_t num_layers, std::int32_t num_qo_heads, std::int32_t num_kv_heads,
    std::int32_t head_dim, std::int32_t page_size, std::int64_t num_pages, const std::string& dtype,
    const std::string& layout, const std::string& rope_mode, float rope_theta, float rope_scale,
    bool support_sliding_window, std::optional<std::int32_t> v_head_dim,
    std::int64_t memory_budget_bytes, const Fp8Scale& k_scale, const Fp8Scale& v_scale,
    std::int32_t rotary_dim, bool rope_interleaved, const RopeScaling& rope_scaling,
    std::int32_t num_threads, std::int32_t fixed_kv_chunk, bool enable_prefix_caching,
    std::int64_t host_num_pages, std::int64_t host_memory_budget_bytes,
    const std::string& attention_kind, bool exact_products) {
  KVCacheConfig c;
  if (attention_kind != "mha" && attention_kind != "mla")
    throw InvalidArgument("KVCache: attention_kind = \"" + attention_kind +
                          "\" must be \"mha\" or \"mla\"");
  c.attention_kind = attention_kind == "mla" ? AttentionKind::kMLA : AttentionKind::kMHA;
  c.num_layers = num_layers;
  c.num_qo_heads = num_qo_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.v_head_dim = v_head_dim.value_or(0);
  c.page_size = page_size;
  c.num_pages = num_pages;
  c.memory_budget_bytes = memory_budget_bytes;
  c.kv_dtype = parse_dtype(dtype);
  parse_fp8_scale(k_scale, c.k_scale, c.k_head_scales);
  parse_fp8_scale(v_scale, c.v_scale, c.v_head_scales);
  c.layout = parse_layout(layout);
  c.rope_mode = parse_rope_mode(rope_mode);
  c.rope.theta = rope_theta;
  c.rope.scale = rope_scale;
  c.rope.rotary_dim = rotary_dim;
  c.rope.style = rope_interleaved ? RopeStyle::kGptJ : RopeStyle::kNeox;
  c.rope.llama3 = parse_rope_scaling(rope_scaling);
  c.support_sliding_window = support_sliding_window;
  c.attention_plan.num_threads = num_threads;
  c.attention_plan.fixed_kv_chunk = fixed_kv_chunk;
  c.attention_plan.fp8_fast_products = !exact_products;
  c.attention_plan.fast_prefill_products = !exact_products;
  c.enable_prefix_caching = enable_prefix_caching;
  c.host_num_pages = host_num_pages;
  c.host_memory_budget_bytes = host_memory_budget_bytes;
  std::unique_ptr<KVCache> cache;
  {
    py::gil_scoped_release release;  // allocating the pages may take a while
    cache = std::make_unique<KVCache>(c);
  }
  cache->track_thread_steps();
  return cache;
}

// Values of several types (int, float, str, bool, list[float]): typed Any.
py::typing::Dict<py::str, py::object> config_dict(KVCache& s) {
  const KVCacheConfig& c = s.config();
  py::typing::Dict<py::str, py::object> d;
  d["num_layers"] = c.num_layers;
  d["num_qo_heads"] = c.num_qo_heads;
  d["num_kv_heads"] = c.num_kv_heads;
  d["head_dim"] = c.head_dim;
  d["v_head_dim"] = c.v_head_dim;
  d["page_size"] = c.page_size;
  d["num_pages"] = c.num_pages;
  d["memory_budget_bytes"] = c.memory_budget_bytes;
  d["dtype"] = std::string(dtype_name(c.kv_dtype));
  d["layout"] = c.layout == KVLayout::kHND ? "HND" : "NHD";
  d["k_scale"] = c.k_scale;
  d["v_scale"] = c.v_scale;
  d["k_head_scales"] = c.k_head_scales;
  d["v_head_scales"] = c.v_head_scales;
  d["rope_mode"] = c.rope_mode == RopeMode::kNone     ? "none"
                   : c.rope_mode == RopeMode::kNormal ? "normal"
                                                      : "inline";
  d["rope_theta"] = c.rope.theta;
  d["rope_scale"] = c.rope.scale;
  d["rotary_dim"] = c.rope.rotary_dim;
  d["rope_interleaved"] = c.rope.style == RopeStyle::kGptJ;
  d["support_sliding_window"] = c.support_sliding_window;
  d["num_threads"] = c.attention_plan.num_threads;
  d["fixed_kv_chunk"] = c.attention_plan.fixed_kv_chunk;
  d["exact_products"] =
      !c.attention_plan.fp8_fast_products && !c.attention_plan.fast_prefill_products;
  d["enable_prefix_caching"] = c.enable_prefix_caching;
  d["host_num_pages"] = c.host_num_pages;
  d["host_memory_budget_bytes"] = c.host_memory_budget_bytes;
  d["attention_kind"] = c.attention_kind == AttentionKind::kMLA ? "mla" : "mha";
  return d;
}

// Token ids (a sequence of ints) as int32, naming the call and index of a
// value that is no token id.
std::vector<std::int32_t> token_ids_arg(const IndexSequence& obj, const char* call) {
  const std::vector<std::int64_t> ids = int_list_arg(obj, call, "token_ids");
  std::vector<std::int32_t> tokens;
  tokens.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < INT32_MIN || ids[i] > INT32_MAX)
      throw InvalidArgument(
          detail::concat(call, ": token_ids[", i, "] = ", ids[i], " is not a token id"));
    tokens.push_back(static_cast<std::int32_t>(ids[i]));
  }
  return tokens;
}

py::typing::Dict<py::str, py::int_> match_dict(const PrefixMatch& m) {
  py::typing::Dict<py::str, py::int_> d;
  d["num_tokens"] = m.num_tokens;
  d["device_pages"] = m.device_pages;
  d["host_pages"] = m.host_pages;
  d["pages_taken"] = m.pages_taken;
  return d;
}

py::typing::Dict<py::str, py::int_> stats_dict(const PrefixCacheStats& s) {
  py::typing::Dict<py::str, py::int_> d;
  d["queries"] = s.queries;
  d["query_tokens"] = s.query_tokens;
  d["hit_tokens"] = s.hit_tokens;
  d["device_hit_tokens"] = s.device_hit_tokens;
  d["host_hit_tokens"] = s.host_hit_tokens;
  d["evictions"] = s.evictions;
  d["demotions"] = s.demotions;
  d["host_evictions"] = s.host_evictions;
  d["swapped_out_pages"] = s.swapped_out_pages;
  d["swapped_in_pages"] = s.swapped_in_pages;
  return d;
}

// Prefix caching and the host tier (docs/prefix_caching.md).
template <typename Class>
void register_prefix_cache(Class& cls) {
  using ReleaseGil = py::call_guard<py::gil_scoped_release>;
  cls.def(
         "match_prefix",
         [](KVCache& s, const IndexSequence& token_ids, std::uint64_t cache_salt) {
           const std::vector<std::int32_t> t = token_ids_arg(token_ids, "KVCache.match_prefix");
           PrefixMatch m;
           {
             py::gil_scoped_release release;
             m = s.cache().match_prefix(t, cache_salt);
           }
           return match_dict(m);
         },
         py::arg("token_ids"), py::arg("cache_salt") = 0,
         "Dry run: the longest cached prefix of token_ids under cache_salt, as a dict\n"
         "{num_tokens, device_pages, host_pages, pages_taken}: whole pages, never all of\n"
         "token_ids; pages_taken = free pages add_sequence_with_prefix would consume.")
      .def(
          "add_sequence_with_prefix",
          [](KVCache& s, SeqId id, const IndexSequence& token_ids, std::uint64_t cache_salt) {
            const std::vector<std::int32_t> t =
                token_ids_arg(token_ids, "KVCache.add_sequence_with_prefix");
            py::gil_scoped_release release;
            return s.cache().add_sequence_with_prefix(id, t, cache_salt);
          },
          py::arg("id"), py::arg("token_ids"), py::arg("cache_salt") = 0,
          "Adds sequence `id` holding the cached prefix of token_ids (device pages shared,\n"
          "host pages copied back) and returns its length; compute the rest with\n"
          "begin_forward. OutOfPagesError (nothing changed) when pages are short; without\n"
          "enable_prefix_caching it is add_sequence and returns 0.")
      .def(
          "set_sequence_tokens",
          [](KVCache& s, SeqId id, const IndexSequence& token_ids) {
            const std::vector<std::int32_t> t =
                token_ids_arg(token_ids, "KVCache.set_sequence_tokens");
            py::gil_scoped_release release;
            s.cache().set_sequence_tokens(id, t);
          },
          py::arg("id"), py::arg("token_ids"),
          "Tells the token ids of the first len(token_ids) tokens of sequence `id` (call\n"
          "after every step; what was told before must not change). Their full pages are\n"
          "published for later prompts.")
      .def_property_readonly(
          "num_cached_pages",
          py::cpp_function([](KVCache& s) { return s.cache().num_cached_pages(); }, ReleaseGil()),
          "Cached pages nobody holds (evictable; counted in num_free_pages).")
      .def(
          "prefix_cache_stats",
          [](KVCache& s) {
            PrefixCacheStats st;
            {
              py::gil_scoped_release release;
              st = s.cache().prefix_cache_stats();
            }
            return stats_dict(st);
          },
          "Counters since construction as a dict: queries, query_tokens, hit_tokens,\n"
          "device_hit_tokens, host_hit_tokens, evictions, demotions, host_evictions,\n"
          "swapped_out_pages, swapped_in_pages.")
      .def(
          "reset_prefix_cache", [](KVCache& s) { s.cache().reset_prefix_cache(); }, ReleaseGil(),
          "Drops every cached page nobody holds (device and host tier).")
      .def(
          "swap_out", [](KVCache& s, const std::vector<SeqId>& ids) { s.cache().swap_out(ids); },
          ReleaseGil(), py::arg("seq_ids"),
          "Moves the listed sequences' pages to the host tier (shared pages stay shared);\n"
          "they are refused by steps until swap_in. OutOfPagesError if the host lacks room.")
      .def(
          "swap_in", [](KVCache& s, const std::vector<SeqId>& ids) { s.cache().swap_in(ids); },
          ReleaseGil(), py::arg("seq_ids"),
          "Copies swapped sequences back into device pages (OutOfPagesError if short).")
      .def(
          "swap_in_pages_needed",
          [](KVCache& s, const std::vector<SeqId>& ids) {
            return s.cache().swap_in_pages_needed(ids);
          },
          ReleaseGil(), py::arg("seq_ids"), "Device pages swap_in(seq_ids) would take.")
      .def(
          "is_swapped", [](KVCache& s, SeqId id) { return s.cache().is_swapped(id); }, ReleaseGil(),
          py::arg("id"), "Whether sequence `id` is swapped out to the host tier.")
      .def_property_readonly(
          "num_free_host_pages",
          py::cpp_function([](KVCache& s) { return s.cache().num_free_host_pages(); },
                           ReleaseGil()),
          "Host-tier pages free or held only by the cache.")
      .def_property_readonly(
          "num_host_pages", [](KVCache& s) { return s.cache().num_host_pages(); },
          "Pages of the host tier (0: none).");
}

constexpr const char* kClassDoc =
    R"doc(Paged KV cache: pages of K/V for many sequences, with attention.

KVCache(num_layers, num_qo_heads, num_kv_heads, head_dim, page_size, num_pages=0,
        dtype="float16", layout="HND", rope_mode="none", rope_theta=10000.0,
        rope_scale=1.0, support_sliding_window=False, v_head_dim=None, *,
        memory_budget_bytes=0, k_scale=1.0, v_scale=1.0, rotary_dim=0,
        rope_interleaved=False, rope_scaling=None, num_threads=0,
        fixed_kv_chunk=0, enable_prefix_caching=False, host_num_pages=0,
        host_memory_budget_bytes=0, attention_kind="mha", exact_products=False)

dtype: storage type, "float32", "float16", "bfloat16", "float8_e4m3fn",
  "float8_e5m2" or "int8". layout: "HND" (page = [Hkv, page_size, D]) or
  "NHD" (page = [page_size, Hkv, D]). rope_mode: "none" (q, k arrive
  rotated), "normal" (q and new k rotated at their positions, K stored
  rotated), "inline" (K stored raw, rotated at its cache index inside
  attention). rope_scale multiplies the rotary frequency. v_head_dim: None
  means head_dim. num_pages = 0: the largest page count whose K+V storage
  (all layers) fits memory_budget_bytes. k_scale / v_scale (fp8 storage):
  value = stored * scale, a float (per tensor) or [num_kv_heads] floats (per
  head). rotary_dim: rotated dimensions (0: head_dim); rope_interleaved:
  pairs (2t, 2t + 1) (GPT-J, GGUF llama) instead of (t, t + R/2) (NeoX);
  rope_scaling: Llama-3 scaling as in a Hugging Face config, {"rope_type":
  "llama3", "factor", "low_freq_factor", "high_freq_factor",
  "original_max_position_embeddings"}. num_threads: attention threads (0:
  OpenMP's maximum); fixed_kv_chunk > 0 splits keys in chunks of exactly
  that size, so a row's result does not depend on its batch (determinism;
  f32 products). exact_products: f32 products in attention; by default
  prefill (and fp8 K/V) take bf16 products where a one-time timing finds
  them faster on this CPU (queries, softmax weights and float16 K/V
  rounded to bf16; the error bound is in docs/design.md, "Product paths").
enable_prefix_caching: full pages of told token ids stay cached and are
  shared with later prompts (match_prefix, add_sequence_with_prefix,
  set_sequence_tokens). host_num_pages / host_memory_budget_bytes: a host
  tier for swap_out / swap_in and for cached pages evicted from the device.
attention_kind: "mha" (K and V rows per KV head) or "mla" (multi-head
  latent attention, DeepSeek-V2/V3: num_kv_heads 1, one [latent | rope key]
  row of head_dim per token whose first v_head_dim elements are V; nothing
  is stored for V; attention and set_kv take v=None; rope_mode "none").

A step (the TVM protocol):
    cache.add_sequence(0)
    plan = cache.begin_forward([0], [T])     # reserve pages for T new tokens (BatchPlan)
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
The thread that began a step should be the one to end it. Every step has an
id (BatchPlan.step_id); attention, attention_with_fused_qkv,
mark_layer_appended, end_forward and cancel_forward act for the step given
as step= (a BatchPlan), by default the one the calling thread began, and
raise InvalidStateError, changing nothing, when another thread ended it and
began another - even one with as many tokens.)doc";

}  // namespace

// Runs a binding's C++ call with the GIL released (its arguments are plain
// C++ values by then).
using ReleaseGil = py::call_guard<py::gil_scoped_release>;

void register_kv_cache(py::module_& m) {
  py::class_<KVCache> cls(m, "KVCache", kClassDoc);
  cls.def(py::init(&make_cache), py::arg("num_layers"), py::arg("num_qo_heads"),
          py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("page_size"),
          py::arg("num_pages") = 0, py::arg("dtype") = "float16", py::arg("layout") = "HND",
          py::arg("rope_mode") = "none", py::arg("rope_theta") = 10000.0f,
          py::arg("rope_scale") = 1.0f, py::arg("support_sliding_window") = false,
          py::arg("v_head_dim") = py::none(), py::kw_only(), py::arg("memory_budget_bytes") = 0,
          py::arg("k_scale") = 1.0f, py::arg("v_scale") = 1.0f, py::arg("rotary_dim") = 0,
          py::arg("rope_interleaved") = false, py::arg("rope_scaling") = py::none(),
          py::arg("num_threads") = 0, py::arg("fixed_kv_chunk") = 0,
          py::arg("enable_prefix_caching") = false, py::arg("host_num_pages") = 0,
          py::arg("host_memory_budget_bytes") = 0, py::arg("attention_kind") = "mha",
          py::arg("exact_products") = false, "Creates the cache (see the class doc).")
      .def(
          "add_sequence", [](KVCache& s, SeqId id) { s.cache().add_sequence(id); }, ReleaseGil(),
          py::arg("id"), "Adds an empty sequence `id` (InvalidArgumentError if it exists).")
      .def(
          "remove_sequence", [](KVCache& s, SeqId id) { s.cache().remove_sequence(id); },
          ReleaseGil(), py::arg("id"),
          "Removes sequence `id` and frees its pages (shared pages lose a reference).")
      .def(
          "fork_sequence",
          [](KVCache& s, SeqId parent, SeqId child, std::int64_t fork_pos) {
            s.cache().fork_sequence(parent, child, fork_pos);
          },
          ReleaseGil(), py::arg("parent"), py::arg("child"), py::arg("fork_pos") = -1,
          "Creates `child` holding the first `fork_pos` tokens of `parent` (-1: all).\n"
          "Full pages are shared (copy on write); a partial page at the fork point is\n"
          "copied. The child inherits no sliding window.")
      .def(
          "pop_n", [](KVCache& s, SeqId id, std::int64_t n) { s.cache().pop_n(id, n); },
          ReleaseGil(), py::arg("id"), py::arg("n"),
          "Removes the last `n` tokens of sequence `id`.")
      .def(
          "enable_sliding_window",
          [](KVCache& s, SeqId id, std::int64_t window_size, std::int64_t attn_sink_size) {
            s.cache().enable_sliding_window(id, window_size, attn_sink_size);
          },
          ReleaseGil(), py::arg("id"), py::arg("window_size"), py::arg("attn_sink_size"),
          "After every step sequence `id` keeps its first `attn_sink_size` tokens plus\n"
          "the most recent ones, `window_size` in all (trimmed at end_forward). Needs\n"
          "support_sliding_window=True; 0 <= attn_sink_size < window_size.")
      .def("begin_forward", &KVCache::begin_forward, py::arg("seq_ids"), py::arg("append_lengths"),
           py::arg("token_tree_parents") = py::none(),
           "begin_forward(seq_ids, append_lengths, token_tree_parents=None) -> BatchPlan\n\n"
           "Starts a step: reserves pages for append_lengths[i] new tokens of seq_ids[i]\n"
           "(lists or 1-D integer arrays of length B; lengths may be 0). The step's\n"
           "T = sum(append_lengths) tokens are ordered as seq_ids. OutOfPagesError if\n"
           "the pool cannot hold them (nothing changes). Returns the step's plan\n"
           "(help(pagedattn.BatchPlan)).\n\n"
           "token_tree_parents (speculative decoding): one flat list over all T\n"
           "tokens, sequence after sequence: the parent of each appended node as an\n"
           "index into that sequence's uncommitted tree (-1: a child of the committed\n"
           "prefix; parent < node). Each node attends to the committed prefix, its\n"
           "ancestors and itself; positions are committed length + depth. The tree\n"
           "may grow over several forwards; until commit_accepted_token_tree_nodes\n"
           "the sequence refuses plain forwards, forks, pop_n (InvalidStateError).")
      .def(
          "commit_accepted_token_tree_nodes",
          [](KVCache& s, const std::vector<SeqId>& seq_ids,
             const std::vector<std::int64_t>& leaves) {
            s.cache().commit_accepted_token_tree_nodes(seq_ids, leaves);
          },
          ReleaseGil(), py::arg("seq_ids"), py::arg("leaf_indices"),
          "commit_accepted_token_tree_nodes(seq_ids, leaf_indices)\n\n"
          "Keeps, per sequence, the root-to-leaf path ending at leaf_indices[i] (a node\n"
          "of its open tree; -1 rejects all): the path's K/V move right after the\n"
          "committed prefix, the other nodes are dropped, and the tree closes.")
      .def(
          "token_tree_size", [](KVCache& s, SeqId id) { return s.cache().token_tree_size(id); },
          ReleaseGil(), py::arg("id"),
          "Uncommitted token-tree nodes of sequence `id` (0 when none is open).")
      .def(
          "attention",
          [](KVCache& s, std::int32_t layer, const ArrayLike& q, const ArrayLike& k,
             const OptionalArrayLike& v, std::optional<float> sm_scale, bool causal,
             std::int32_t window_left, float softcap, OptionalArrayLike alibi_slopes,
             OptionalArrayLike sinks, bool return_lse, const OptionalPlan& step) {
            return s.attention(layer, q, k, v,
                               {sm_scale, causal, window_left, softcap, std::move(alibi_slopes),
                                std::move(sinks), return_lse, step.value_or(nullptr)});
          },
          py::arg("layer"), py::arg("q"), py::arg("k"), py::arg("v") = py::none(),
          py::arg("sm_scale") = py::none(), py::kw_only(), py::arg("causal") = true,
          py::arg("window_left") = -1, py::arg("softcap") = 0.0f,
          py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
          py::arg("return_lse") = false, py::arg("step") = py::none(),
          "attention(layer, q, k, v=None, sm_scale=None, *, causal=True, window_left=-1,\n"
          "          softcap=0.0, alibi_slopes=None, sinks=None, return_lse=False,\n"
          "          step=None) -> out, or (out, lse) with return_lse\n\n"
          "For `layer` of the current step: applies RoPE per rope_mode (to copies),\n"
          "appends k/v to the cache and attends over each sequence.\n"
          "q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, Hq, Dv] (q's dtype);\n"
          "attention_kind=\"mla\": v None (V is each k row's first Dv elements).\n"
          "sm_scale None: 1/sqrt(D). causal False: every key of the sequence is\n"
          "visible; window_left W >= 0: a query at position p sees keys [p - W, p];\n"
          "softcap > 0: s = softcap * tanh(s / softcap); alibi_slopes [Hq]: s +=\n"
          "slope * (j - p); sinks [Hq]: a learned sink logit per head joins the\n"
          "softmax; lse [T, Hq] float32: natural-log log-sum-exp of each row\n"
          "(docs/semantics.md). step: the BatchPlan of the step this call is for\n"
          "(None: the one this thread began, else whichever is open);\n"
          "InvalidStateError if another step replaced it. A failed call changes\n"
          "nothing; the step goes on.")
      .def(
          "attention_with_fused_qkv",
          [](KVCache& s, std::int32_t layer, const ArrayLike& qkv, std::optional<float> sm_scale,
             bool causal, std::int32_t window_left, float softcap, OptionalArrayLike alibi_slopes,
             OptionalArrayLike sinks, bool return_lse, const OptionalPlan& step) {
            return s.attention_with_fused_qkv(
                layer, qkv,
                {sm_scale, causal, window_left, softcap, std::move(alibi_slopes), std::move(sinks),
                 return_lse, step.value_or(nullptr)});
          },
          py::arg("layer"), py::arg("qkv"), py::arg("sm_scale") = py::none(), py::kw_only(),
          py::arg("causal") = true, py::arg("window_left") = -1, py::arg("softcap") = 0.0f,
          py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
          py::arg("return_lse") = false, py::arg("step") = py::none(),
          "attention_with_fused_qkv(layer, qkv, sm_scale=None, **options) -> out\n\n"
          "attention() with q, k, v packed per token: qkv [T, Hq + 2 Hkv, D] (heads\n"
          "q..., k..., v...) -> out [T, Hq, D]. Needs v_head_dim == head_dim. The\n"
          "keyword options are attention()'s.")
      .def("plan", &KVCache::plan,
           "plan() -> BatchPlan: the current step's plan (a new snapshot; InvalidStateError\n"
           "outside a step).")
      .def("mark_layer_appended", &KVCache::mark_layer_appended, py::arg("layer"), py::kw_only(),
           py::arg("step") = py::none(),
           "mark_layer_appended(layer, *, step=None)\n\n"
           "Declares that you wrote every new token's K/V of `layer` yourself (through\n"
           "layer_storage(layer) and plan.slot_mapping), so end_forward accepts the\n"
           "step. Marking a layer you did not write exposes what its pages held.\n"
           "step: as for attention().")
      .def(
          "layer_storage",
          [](const py::object& self, std::int32_t layer) {
            PagedKVStorage storage;
            {
              KVCache& s = self.cast<KVCache&>();
              py::gil_scoped_release release;
              storage = s.cache().layer_storage(layer);
            }
            return layer_storage_views(storage, self);
          },
          py::arg("layer"),
          "layer_storage(layer) -> LayerStorage: writable zero-copy views of the layer's\n"
          "K/V pages (help(pagedattn.LayerStorage) for shapes and rules).")
      .def("end_forward", &KVCache::end_forward, py::kw_only(), py::arg("step") = py::none(),
           "end_forward(*, step=None)\n\n"
           "Ends the step; sliding windows drop the tokens that fell out.\n"
           "InvalidStateError (the step stays open) if some layer's K/V of the\n"
           "step's new tokens was not written (attention of that layer, or set_kv of\n"
           "every new token): the pages may still hold another sequence's K/V.\n"
           "step: as for attention().")
      .def("cancel_forward", &KVCache::cancel_forward, py::kw_only(), py::arg("step") = py::none(),
           "cancel_forward(*, step=None)\n\n"
           "Abandons the open step (e.g. the model raised half way): the cache\n"
           "returns to exactly its state before begin_forward. InvalidStateError\n"
           "outside a step. step: as for attention().")
      .def("get_kv", &KVCache::get_kv, py::arg("seq_id"), py::arg("start"), py::arg("end"),
           "get_kv(seq_id, start, end) -> (k, v)\n\n"
           "Tokens [start, end) of a sequence (retained tokens, with a sliding window)\n"
           "as float32 copies: k [num_layers, end-start, Hkv, D], v [num_layers,\n"
           "end-start, Hkv, Dv]. K is as stored (rotated with rope_mode=\"normal\").")
      .def("set_kv", &KVCache::set_kv, py::arg("seq_id"), py::arg("start"), py::arg("end"),
           py::arg("k"), py::arg("v") = py::none(),
           "set_kv(seq_id, start, end, k, v=None)\n\n"
           "Overwrites tokens [start, end) of a sequence: k [num_layers, end-start, Hkv, D],\n"
           "v [num_layers, end-start, Hkv, Dv], float32, C-contiguous, rounded to the\n"
           "cache dtype (attention_kind=\"mla\": v None). Tokens in pages shared with\n"
           "another sequence are refused.")
      .def_property_readonly(
          "num_free_pages",
          py::cpp_function([](KVCache& s) { return s.cache().num_free_pages(); }, ReleaseGil()),
          "Pages in the pool not held by any sequence (cached ones included: evictable).")
      .def_property_readonly(
          "total_sequence_length",
          py::cpp_function([](KVCache& s) { return s.cache().total_sequence_length(); },
                           ReleaseGil()),
          "Sum of sequence_length over all sequences.")
      .def_property_readonly(
          "num_pages", [](KVCache& s) { return s.cache().num_pages(); },
          "Pages in the pool (the constructor's num_pages).")
      .def(
          "empty", [](KVCache& s) { return s.cache().empty(); }, ReleaseGil(),

          "True when there are no sequences and every page is free.")
      .def(
          "sequence_length", [](KVCache& s, SeqId id) { return s.cache().sequence_length(id); },
          ReleaseGil(), py::arg("id"),
          "Tokens sequence `id` holds (retained ones, with a sliding window).")
      .def(
          "has_sequence", [](KVCache& s, SeqId id) { return s.cache().has_sequence(id); },
          ReleaseGil(), py::arg("id"), "Whether sequence `id` exists.")
      .def(
          "sequence_ids", [](KVCache& s) { return s.cache().sequence_ids(); }, ReleaseGil(),
          "The ids of every sequence, ascending.")
      .def_property_readonly(
          "num_sequences",
          py::cpp_function([](KVCache& s) { return s.cache().num_sequences(); }, ReleaseGil()),
          "Sequences in the cache.")
      .def(
          "pages_needed",
          [](KVCache& s, const std::vector<SeqId>& seq_ids,
             const std::vector<std::int64_t>& lengths) {
            return s.cache().pages_needed(seq_ids, lengths);
          },
          ReleaseGil(), py::arg("seq_ids"), py::arg("append_lengths"),
          "Pages begin_forward(seq_ids, append_lengths) would take from the pool (a dry\n"
          "run; raises what begin_forward would raise for bad arguments).")
      .def(
          "can_append",
          [](KVCache& s, const std::vector<SeqId>& seq_ids,
             const std::vector<std::int64_t>& lengths) {
            return s.cache().can_append(seq_ids, lengths);
          },
          ReleaseGil(), py::arg("seq_ids"), py::arg("append_lengths"),
          "Whether begin_forward(seq_ids, append_lengths) would succeed now.")
      .def_property_readonly(
          "in_forward",
          py::cpp_function([](KVCache& s) { return s.cache().in_forward(); }, ReleaseGil()),
          "True between begin_forward and end_forward / cancel_forward.")
      .def(
          "sequence_pages", [](KVCache& s, SeqId id) { return s.cache().sequence_pages(id); },
          ReleaseGil(), py::arg("id"), "Page ids of sequence `id` in logical order (list of int).")
      .def(
          "page_refcount",
          [](KVCache& s, std::int32_t page) { return s.cache().page_refcount(page); }, ReleaseGil(),
          py::arg("page"), "Sequences holding `page` (forks share pages).")
      .def(
          "state_digest", [](KVCache& s) { return s.cache().state_digest(); }, ReleaseGil(),
          "64-bit hash of the metadata and of the K/V every sequence holds: equal\n"
          "before and after a call that failed or was cancelled.")
      .def(
          "has_open_token_tree",
          [](KVCache& s, SeqId id) { return s.cache().has_open_token_tree(id); }, ReleaseGil(),
          py::arg("id"),
          "Whether sequence `id` has an uncommitted token tree (plain forwards refused).")
      .def_property_readonly(
          "num_step_tokens",
          py::cpp_function([](KVCache& s) { return s.cache().num_step_tokens(); }, ReleaseGil()),
          "Tokens of the open step (InvalidStateError outside a step).")
      .def_property_readonly(
          "storage_bytes", [](KVCache& s) { return s.cache().storage_bytes(); },
          "K+V (and int8 scale) bytes of the page storage, all layers.")
      .def_property_readonly(
          "bytes_per_page", [](KVCache& s) { return s.cache().bytes_per_page(); },
          "K+V bytes of one page over all layers.")
      .def_property_readonly("config", &config_dict,
                             "The resolved configuration as a dict (num_pages and v_head_dim\n"
                             "resolved).")
      .def(
          "check_invariants", [](KVCache& s) { s.cache().check_invariants(); }, ReleaseGil(),
          "Raises pagedattn.InternalError describing the first broken invariant (a bug).")
      .def("__repr__", [](KVCache& s) {
        const KVCacheConfig& c = s.config();
        std::int64_t sequences = 0, free_pages = 0;
        {
          py::gil_scoped_release release;
          sequences = s.cache().num_sequences();
          free_pages = s.cache().num_free_pages();
        }
        return detail::concat("KVCache(num_layers=", c.num_layers,
                              ", num_qo_heads=", c.num_qo_heads, ", num_kv_heads=", c.num_kv_heads,
                              ", head_dim=", c.head_dim, ", page_size=", c.page_size,
                              ", num_pages=", c.num_pages, ", dtype=\"", dtype_name(c.kv_dtype),
                              "\", sequences=", sequences, ", free_pages=", free_pages, ")");
      });
  register_prefix_cache(cls);
}

}  // namespace pagedattn::python
