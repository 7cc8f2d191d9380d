// guarded(): the only place where C++ exceptions stop.
#pragma once

#include <exception>
#include <new>

#include "pagedattn/errors.h"

namespace pagedattn::capi {

template <typename Body>
pagedattn_status guarded(Body&& body) noexcept {
  try {
    body();
    return PAGEDATTN_OK;
  } catch (const Error& e) {
    return fail(static_cast<pagedattn_status>(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(PAGEDATTN_OUT_OF_MEMORY, "pagedattn: out of host memory");
  } catch (const std::exception& e) {
    return fail(PAGEDATTN_INTERNAL, e.what());
  } catch (...) {
    return fail(PAGEDATTN_INTERNAL, "pagedattn: unknown exception");
  }
}

}  // namespace pagedattn::capi
