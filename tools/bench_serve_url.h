// The --url of bench-serve: where the OpenAI-compatible server listens.
#pragma once

#include <string>

namespace pagedattn::tools {

struct ServerUrl {
  std::string host;
  int port = 80;
};

// "http://HOST[:PORT]" with an optional trailing "/": HOST a name or an IPv4
// address (letters, digits, '.', '-'), PORT an integer in [1, 65535].
// InvalidArgument naming the URL and what is wrong with it.
ServerUrl parse_server_url(const std::string& url);

}  // namespace pagedattn::tools
