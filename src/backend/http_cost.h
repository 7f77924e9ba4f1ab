// Money: a served model's token usage priced per million tokens (`phasekv audit --price-per-mtok
// IN,OUT[,CACHED]`), for the plan before a run and for audit.json after it. Prices are the
// caller's (providers publish them per million input and output tokens, some with a lower price
// for prompt tokens served from their prefix cache); nothing here knows a provider.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace phasekv {

struct TokenPrices {
  double input_per_mtok = 0, output_per_mtok = 0;
  std::optional<double> cached_per_mtok;  // absent: cached prompt tokens cost the input price
};

// "IN,OUT" or "IN,OUT,CACHED", each a non-negative number; throws phasekv::Error naming `flag`.
TokenPrices parse_token_prices(const std::string& text, const std::string& flag);

// The cost of `prompt` prompt tokens (of which `cached` came from the server's prefix cache)
// and `completion` generated tokens.
double token_cost(const TokenPrices& p, int64_t prompt, int64_t cached, int64_t completion);

// {"input_per_mtok", "output_per_mtok", "cached_per_mtok" (null: input price)}.
nlohmann::json prices_json(const TokenPrices& p);

}  // namespace phasekv
