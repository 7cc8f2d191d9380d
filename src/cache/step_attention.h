// Buffers cache-level attention keeps across layers of one step and across
// steps: the kernel plan (made once per step and options), its workspace,
// RoPE copies of q/k, and the cos/sin table for the cache's RoPE. A device
// cache keeps their device counterparts in a DeviceStep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/rope_table.h"
#include "pagedattn/attention.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_device.h"
#include "pagedattn/rope.h"

namespace pagedattn::cache {

// Device memory from a backend, released on destruction. It grows on
// demand; its contents are lost when it does.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(KVDeviceBackend& backend) : backend_(backend) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` (and never less than 256, so that views of empty
  // arrays are not null).
  std::byte* reserve(std::size_t bytes);
  void reset();

 private:
  KVDeviceBackend& backend_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// What a device cache's attention keeps across the layers of a step: the
// step's plan arrays uploaded once, the backend's attention plan, its
// workspace and the RoPE copies.
class DeviceStep {
 public:
  explicit DeviceStep(std::shared_ptr<KVDeviceBackend> backend);

  KVDeviceBackend& backend() const { return *backend_; }

  // The device copies of a step's arrays.
  struct Arrays {
    PagedKVTable table;  // as BatchPlan::table(), device pointers
    TokenTreeMask tree;  // as BatchPlan::tree_mask(), device pointers
    const std::int64_t* slot_mapping = nullptr;
    const std::int32_t* positions = nullptr;
  };
  // The arrays of `plan`, uploaded in one copy on the first call of its step.
  const Arrays& upload(const BatchPlan& plan);

  // The backend's plan for the step of `host_view` (made on the first call
  // for the step and these options and query dtype).
  const KVAttentionPlan& plan_for(StepId step, const AttentionParams& host_view,
                                  const AttentionPlanOptions& options);
  // Device workspace of `bytes` (256-byte aligned).
  void* workspace(std::size_t bytes) { return workspace_.reserve(bytes); }

  enum class Copy { kQ = 0, kK = 1 };
  // A dense copy of x [tokens][heads][dim] (device memory) in x's dtype,
  // rotated by `rope` at `positions` (device memory); `which` names the
  // buffer it lives in until the next call for it.
  HeadTensor rotated_copy(Copy which, const HeadTensor& x, std::int32_t tokens, std::int32_t heads,
                          std::int32_t dim, const std::int32_t* positions, const RopeConfig& rope);

 private:
  std::shared_ptr<KVDeviceBackend> backend_;
  DeviceBuffer arrays_buffer_;
  StepId uploaded_step_ = kAnyStep;
  Arrays arrays_;
  std::vector<std::byte> staging_;  // the host image of the arrays

  std::unique_ptr<KVAttentionPlan> plan_;
  StepId plan_step_ = kAnyStep;
  bool plan_causal_ = true;
  std::int32_t plan_window_left_ = -1;
  DType plan_q_dtype_ = DType::kF32;

  DeviceBuffer workspace_;
  DeviceBuffer q_rotated_, k_rotated_;
};

struct StepAttention {
  // Kernel plan of the current step, valid for (causal, window_left).
  AttentionPlan plan;
  bool plan_valid = false;
  bool plan_causal = true;
  std::int32_t plan_window_left = -1;
  std::vector<std::byte> workspace;  // kernels::aligned_workspace's buffer

  std::vector<float> q_rotated;  // [num_tokens][num_qo_heads][head_dim]
  std::vector<float> k_rotated;  // [num_tokens][num_kv_heads][head_dim]

  kernels::RopeTable rope;  // the cache's RoPE and its cos/sin rows

  std::unique_ptr<DeviceStep> device;  // device caches only

  void invalidate_plan() { plan_valid = false; }
  // The plan for this step and options (made on the first call).
  const AttentionPlan& plan_for(const PagedKVTable& table, const AttentionShape& shape,
                                const AttentionOptions& options,
                                const AttentionPlanOptions& plan_options);
};

}  // namespace pagedattn::cache
