// The library side of PAGEDATTN_MAX_TARGET and PAGEDATTN_DISABLE_FEATURES
// (see pagedattn/cpu_features.h).
#pragma once

namespace pagedattn::core {

// Throws InvalidArgument, naming `call`, the variable and its value, when the
// environment asked for a target this build does not know
// (PAGEDATTN_MAX_TARGET) or named an extension that cannot be switched off
// (PAGEDATTN_DISABLE_FEATURES). Every attention entry point calls it first
// (through validate_attention_params), which also guarantees that the object
// file applying both at load time is linked into every program that runs a
// kernel.
void require_valid_dispatch_environment(const char* call);

}  // namespace pagedattn::core
