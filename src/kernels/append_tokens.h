// append_paged_kv in two parts, for callers that split the tokens over
// threads they already run (the model's layer teams, core/team.h): the
// checks once, before any thread starts, then each thread its range.
#pragma once

#include <cstdint>

#include "pagedattn/kv_ops.h"

namespace pagedattn::kernels {

// append_paged_kv's checks of `p` (InvalidArgument naming the field), and
// nothing else.
void validate_append(const AppendParams& p);

// Tokens [begin, end) of `p`, checked by validate_append, on the calling
// thread: what append_paged_kv writes for them. Never throws.
void append_tokens(const AppendParams& p, std::int32_t begin, std::int32_t end);

}  // namespace pagedattn::kernels
