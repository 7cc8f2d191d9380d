// Umbrella header: everything public in pagedattn.
#pragma once

#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"
#include "pagedattn/attention.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"
#include "pagedattn/token_tree.h"
#include "pagedattn/version.h"
