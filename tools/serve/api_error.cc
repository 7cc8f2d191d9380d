#include "api_error.h"

#include <nlohmann/json.hpp>

namespace pagedattn::serve {

const char* ApiError::type() const {
  switch (status_) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string ApiError::to_json() const {
  nlohmann::json e = {{"message", what()}, {"type", type()}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) e["param"] = param_;
  if (!code_.empty()) e["code"] = code_;
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false,
                                           nlohmann::json::error_handler_t::replace);
}

}  // namespace pagedattn::serve
