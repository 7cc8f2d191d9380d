// The library side of PAGEDATTN_MAX_TARGET (see pagedattn/cpu_features.h).
#pragma once

namespace pagedattn::core {

// Throws InvalidArgument, naming `call`, PAGEDATTN_MAX_TARGET and its value,
// when the environment asked for a target this build does not know. Every
// attention entry point calls it first (through validate_attention_params),
// which also guarantees that the object file applying the cap at load time is
// linked into every program that runs a kernel.
void require_valid_max_target(const char* call);

}  // namespace pagedattn::core
