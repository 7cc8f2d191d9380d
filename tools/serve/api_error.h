// An error the server answers with, in OpenAI's shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
#pragma once

#include <stdexcept>
#include <string>

namespace pagedattn::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "")
      : std::runtime_error(std::move(message)),
        status_(status),
        param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }  // "" when no field is to blame
  const std::string& code() const { return code_; }
  // "invalid_request_error", "authentication_error", ... from the status.
  const char* type() const;
  std::string to_json() const;

 private:
  int status_;
  std::string param_;
  std::string code_;
};

}  // namespace pagedattn::serve
