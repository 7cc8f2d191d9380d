// Every public header in one translation unit, compiled by the other
// compiler (tests/CMakeLists.txt): the headers must stay portable C++20
// (e.g. no _Float16 where clang 14 lacks it) and -Werror clean.
#include "pagedattn/attention.h"
#include "pagedattn/c_api.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/cuda.h"
#include "pagedattn/cuda_ops.h"
#include "pagedattn/dtype.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/llama.h"
#include "pagedattn/model.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/ops/tensor.h"
#include "pagedattn/ops/torch_xla.h"
#include "pagedattn/ops/tvm.h"
#include "pagedattn/ops/vllm.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/pagedattn.h"
#include "pagedattn/rope.h"
#include "pagedattn/token_tree.h"
#include "pagedattn/version.h"

// The inline conversions are instantiated, not only declared.
float public_headers_round_trip(float value) {
  return pagedattn::f16_bits_to_float(pagedattn::float_to_f16_bits(value));
}
