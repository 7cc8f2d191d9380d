#include "bench_serve_url.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string_view>

#include "pagedattn/errors.h"

namespace pagedattn::tools {

ServerUrl parse_server_url(const std::string& url) {
  const std::string_view scheme = "http://";
  const std::string expected = "; expected http://HOST[:PORT] (the server's root, no path)";
  require(url.starts_with(scheme), "bench-serve: --url = '", url, "' does not start with http://",
          expected);
  std::string_view rest = std::string_view(url).substr(scheme.size());
  if (rest.ends_with('/')) rest.remove_suffix(1);
  require(rest.find('/') == std::string_view::npos, "bench-serve: --url = '", url, "' has a path",
          expected);
  const std::size_t colon = rest.find(':');
  ServerUrl out;
  out.host = std::string(rest.substr(0, colon));
  const bool host_ok =
      !out.host.empty() && std::all_of(out.host.begin(), out.host.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '.' || c == '-';
      });
  require(host_ok, "bench-serve: --url = '", url, "' has no valid host", expected);
  if (colon != std::string_view::npos) {
    const std::string_view port = rest.substr(colon + 1);
    const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), out.port);
    require(!port.empty() && error == std::errc() && end == port.data() + port.size() &&
                out.port >= 1 && out.port <= 65535,
            "bench-serve: --url = '", url, "': port '", port, "' is not an integer in [1, 65535]");
  }
  return out;
}

}  // namespace pagedattn::tools
