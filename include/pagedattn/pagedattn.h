// Umbrella header: everything public in pagedattn.
#pragma once

#include "pagedattn/attention.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/ops/torch_xla.h"
#include "pagedattn/ops/tvm.h"
#include "pagedattn/ops/vllm.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"
#include "pagedattn/token_tree.h"
#include "pagedattn/version.h"
