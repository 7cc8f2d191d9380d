#include "step_attention.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace pagedattn::cache {

const AttentionPlan& StepAttention::plan_for(const PagedKVTable& table, const AttentionShape& shape,
                                             const AttentionOptions& options,
                                             const AttentionPlanOptions& plan_options) {
  if (!plan_valid || plan_causal != options.causal || plan_window_left != options.window_left) {
    plan = plan_attention(table, shape, options, plan_options);
    plan_valid = true;
    plan_causal = options.causal;
    plan_window_left = options.window_left;
  }
  return plan;
}

}  // namespace pagedattn::cache

namespace pagedattn::cache {

std::byte* DeviceBuffer::reserve(std::size_t bytes) {
  constexpr std::size_t kMinimum = 256;
  bytes = std::max(bytes, kMinimum);
  if (bytes <= bytes_) return data_;
  reset();
  const std::size_t grown = std::max(bytes, bytes_ + bytes_ / 2);  // amortised growth
  data_ = static_cast<std::byte*>(backend_.allocate_zeroed(grown));
  bytes_ = grown;
  return data_;
}

void DeviceBuffer::reset() {
  if (data_ != nullptr) backend_.release(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

DeviceStep::DeviceStep(std::shared_ptr<KVDeviceBackend> backend)
    : backend_(std::move(backend)),
      arrays_buffer_(*backend_),
      workspace_(*backend_),
      q_rotated_(*backend_),
      k_rotated_(*backend_) {}

namespace {

// Lays arrays out one after another in a host image, each 8-byte aligned,
// and remembers where each went.
class ImageBuilder {
 public:
  explicit ImageBuilder(std::vector<std::byte>& image) : image_(image) { image_.clear(); }
  template <class T>
  std::size_t place(const std::vector<T>& values) {
    const std::size_t at = (image_.size() + 7) / 8 * 8;
    image_.resize(at + values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(image_.data() + at, values.data(), values.size() * sizeof(T));
    return at;
  }

 private:
  std::vector<std::byte>& image_;
};

}  // namespace

const DeviceStep::Arrays& DeviceStep::upload(const BatchPlan& plan) {
  if (plan.step_id == uploaded_step_ && plan.step_id != kAnyStep) return arrays_;
  uploaded_step_ = kAnyStep;  // until the copy below succeeds
  ImageBuilder image(staging_);
  const std::size_t qo = image.place(plan.qo_indptr), kv = image.place(plan.kv_indptr);
  const std::size_t indices = image.place(plan.kv_indices);
  const std::size_t last = image.place(plan.kv_last_page_len), lens = image.place(plan.kv_lens);
  const std::size_t sinks = image.place(plan.kv_sink_lens), gaps = image.place(plan.kv_gap_lens);
  const std::size_t positions = image.place(plan.positions);
  const std::size_t slots = image.place(plan.slot_mapping);
  const std::size_t begin = image.place(plan.tree_begin);
  const std::size_t nodes = image.place(plan.tree_node_indptr);
  const std::size_t enter = image.place(plan.tree_enter), exit = image.place(plan.tree_exit);
  const std::size_t tree_positions = image.place(plan.tree_positions);
  std::byte* base = arrays_buffer_.reserve(staging_.size());
  if (!staging_.empty()) backend_->from_host(base, staging_.data(), staging_.size());

  const auto i32 = [base](std::size_t at) {
    return reinterpret_cast<const std::int32_t*>(base + at);
  };
  Arrays a;
  a.table.batch_size = plan.batch_size();
  a.table.page_size = plan.page_size;
  a.table.qo_indptr = i32(qo);
  a.table.kv_indptr = i32(kv);
  a.table.kv_indices = i32(indices);
  a.table.kv_last_page_len = i32(last);
  a.table.kv_lens = i32(lens);
  a.table.kv_sink_lens = plan.has_gaps ? i32(sinks) : nullptr;
  a.table.kv_gap_lens = plan.has_gaps ? i32(gaps) : nullptr;
  if (plan.has_tree) {
    a.tree.tree_begin = i32(begin);
    a.tree.node_indptr = i32(nodes);
    a.tree.enter = i32(enter);
    a.tree.exit = i32(exit);
    a.tree.positions = i32(tree_positions);
  }
  a.positions = i32(positions);
  a.slot_mapping = reinterpret_cast<const std::int64_t*>(base + slots);
  arrays_ = a;
  uploaded_step_ = plan.step_id;
  return arrays_;
}

const KVAttentionPlan& DeviceStep::plan_for(StepId step, const AttentionParams& host_view,
                                            const AttentionPlanOptions& options) {
  const AttentionOptions& o = host_view.options;
  if (plan_ == nullptr || step == kAnyStep || step != plan_step_ || o.causal != plan_causal_ ||
      o.window_left != plan_window_left_ || host_view.q.dtype != plan_q_dtype_) {
    plan_.reset();  // a refused plan leaves none behind
    plan_ = backend_->plan_attention(host_view, options);
    plan_step_ = step;
    plan_causal_ = o.causal;
    plan_window_left_ = o.window_left;
    plan_q_dtype_ = host_view.q.dtype;
  }
  return *plan_;
}

HeadTensor DeviceStep::rotated_copy(Copy which, const HeadTensor& x, std::int32_t tokens,
                                    std::int32_t heads, std::int32_t dim,
                                    const std::int32_t* positions, const RopeConfig& rope) {
  const auto es = static_cast<std::size_t>(dtype_size(x.dtype));
  const std::size_t row = static_cast<std::size_t>(dim) * es;  // one head of one token
  const std::size_t token_bytes = row * static_cast<std::size_t>(heads);
  DeviceBuffer& buffer = which == Copy::kQ ? q_rotated_ : k_rotated_;
  std::byte* out = buffer.reserve(token_bytes * static_cast<std::size_t>(tokens));
  const HeadTensor dense{out, x.dtype, std::int64_t{heads} * dim, dim};
  if (tokens == 0) return dense;
  // A token's heads side by side move as one run per token; else a run per
  // head and token.
  const bool heads_packed = heads == 1 || x.head_stride == dim;
  for (std::int32_t h = 0; h < (heads_packed ? 1 : heads); ++h) {
    DeviceCopy c;
    c.dst = out + static_cast<std::size_t>(h) * row;
    c.src =
        static_cast<const std::byte*>(x.data) + std::int64_t{h} * x.head_stride * std::int64_t(es);
    c.row_bytes = heads_packed ? token_bytes : row;
    c.rows = static_cast<std::size_t>(tokens);
    c.dst_pitch = token_bytes;
    c.src_pitch = static_cast<std::size_t>(x.token_stride) * es;
    backend_->copy(c);
  }
  backend_->apply_rope(dense, tokens, heads, dim, positions, rope);
  return dense;
}

}  // namespace pagedattn::cache
