/* The C ABI header compiled as C11 by the other compiler (tests/CMakeLists.txt). */
#include "pagedattn/c_api.h"

pagedattn_status c_api_header_ok(void) {
  return PAGEDATTN_OK;
}
