// Uses the installed CUDA backend: plans a decode batch on the host (with the
// SM count and shared memory of an H100 given, so no GPU is needed) and says
// whether this machine has a device to run it on.
#include <pagedattn/cuda.h>

#include <cstdio>
#include <vector>

int main() {
  // Two sequences of 40 and 17 keys in pages of 16, one new token each.
  const std::vector<std::int32_t> qo_indptr = {0, 1, 2}, kv_indptr = {0, 3, 5},
                                  kv_indices = {4, 0, 2, 1, 3}, last_page_len = {8, 1},
                                  kv_lens = {40, 17};
  pagedattn::AttentionParams host_view;
  host_view.num_qo_heads = 32;
  host_view.q.dtype = host_view.o.dtype = pagedattn::DType::kBF16;
  static char placeholder[1];  // the plan checks data pointers for null, never reads them
  host_view.q.data = host_view.o.data = placeholder;
  host_view.table = {2,
                     16,
                     qo_indptr.data(),
                     kv_indptr.data(),
                     kv_indices.data(),
                     last_page_len.data(),
                     kv_lens.data()};
  host_view.kv = pagedattn::PagedKVStorage::dense(placeholder, placeholder, pagedattn::DType::kBF16,
                                                  pagedattn::KVLayout::kNHD, 16, 8, 128, 128, 5);
  pagedattn::cuda::CudaPlanOptions options;
  options.num_sms = 132;
  options.max_shared_bytes = 227 * 1024;
  const pagedattn::cuda::CudaAttentionPlan plan =
      pagedattn::cuda::plan_cuda_attention(host_view, options);
  const int devices = pagedattn::cuda::device_count();
  std::printf("downstream_cuda: %zu decode items, workspace %zu bytes; %d CUDA device(s)%s%s\n",
              plan.decode_items.size(), plan.workspace_bytes, devices, devices ? "" : ": ",
              devices ? "" : pagedattn::cuda::no_device_reason().c_str());
  return plan.decode_items.size() == 16 ? 0 : 1;
}
