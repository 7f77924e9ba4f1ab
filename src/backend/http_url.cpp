#include "backend/http_url.h"

#include <cctype>

#include "util/error.h"

namespace phasekv {
namespace {

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw Error("endpoint '" + text + "': " + why +
              " (expected http[s]://HOST[:PORT][/PATH], e.g. http://127.0.0.1:8000)");
}

int parse_port(const std::string& text, const std::string& digits) {
  if (digits.empty() || digits.size() > 5) bad(text, "port '" + digits + "' is not a number");
  for (char c : digits)
    if (!std::isdigit(static_cast<unsigned char>(c)))
      bad(text, "port '" + digits + "' is not a number");
  const int port = std::stoi(digits);
  if (port < 1 || port > 65535) bad(text, "port " + digits + " is outside 1..65535");
  return port;
}

// Splits "host:port", "[::1]:port", "host" into host and port (0 when absent).
void split_authority(const std::string& text, const std::string& authority, EndpointUrl& u) {
  std::string port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) bad(text, "unterminated IPv6 address");
    u.host = authority.substr(1, close - 1);
    const std::string rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') bad(text, "unexpected '" + rest + "' after the IPv6 address");
      port = rest.substr(1);
      if (port.empty()) bad(text, "empty port");
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) bad(text, "empty port");
    }
  }
  if (u.host.empty()) bad(text, "no host");
  u.port = port.empty() ? (u.scheme == "https" ? 443 : 80) : parse_port(text, port);
}

}  // namespace

std::string EndpointUrl::origin() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return scheme + "://" + h + ":" + std::to_string(port);
}

std::string EndpointUrl::path(const std::string& route) const {
  return base_path + route;
}

std::string EndpointUrl::url(const std::string& route) const {
  return origin() + path(route);
}

EndpointUrl parse_endpoint(const std::string& text) {
  EndpointUrl u;
  const size_t sep = text.find("://");
  if (sep == std::string::npos) bad(text, "no scheme");
  u.scheme = text.substr(0, sep);
  for (auto& c : u.scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (u.scheme != "http" && u.scheme != "https")
    bad(text, "scheme '" + u.scheme + "' is not supported (allowed: http, https)");
  std::string rest = text.substr(sep + 3);
  if (rest.find_first_of("?#") != std::string::npos)
    bad(text, "query strings and fragments are not allowed");
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  if (authority.find('@') != std::string::npos)
    bad(text,
        "credentials in the URL are not allowed (they would be logged; pass the key with "
        "--api-key-env VAR)");
  split_authority(text, authority, u);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0)
    path.resize(path.size() - 3);
  u.base_path = path;
  return u;
}

}  // namespace phasekv
