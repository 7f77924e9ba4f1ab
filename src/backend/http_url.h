// Endpoint URLs of OpenAI-compatible servers. Users paste what their server printed
// ("http://gpu7:8000", "http://gpu7:8000/v1", "https://api.example.com/llm/v1/"), so parsing
// accepts all of those and normalises to scheme + host + port + a base path without "/v1": the
// native routes (/tokenize, /generate, /completion) live at the root, the OpenAI ones under /v1.
#pragma once
#include <string>

namespace phasekv {

struct EndpointUrl {
  std::string scheme;     // "http" | "https"
  std::string host;       // "gpu7", "127.0.0.1", "::1" (brackets removed)
  int port = 0;           // explicit, or 80 / 443 from the scheme
  std::string base_path;  // "" or "/llm" (no trailing slash, "/v1" removed)

  // "http://gpu7:8000" (what httplib::Client takes; IPv6 hosts in brackets).
  std::string origin() const;
  // origin() + base_path + route, for messages: "http://gpu7:8000/v1/completions".
  std::string url(const std::string& route) const;
  // base_path + route: the path of a request.
  std::string path(const std::string& route) const;
};

// Throws phasekv::Error naming the endpoint and what is allowed: a missing or unknown scheme, an
// empty host, a port outside 1..65535, a query string or fragment, user:password@ credentials
// (they would end up in logs; use --api-key-env).
EndpointUrl parse_endpoint(const std::string& text);

}  // namespace phasekv
