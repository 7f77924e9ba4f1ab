#include "probe/flip_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "eval/stats.h"
#include "util/config_file.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/json_read.h"
#include "util/manifest.h"

namespace phasekv {
namespace {

using nlohmann::json;

bool word_char(unsigned char c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

// A cursor at the start of a word, after code on the same line (not right after indentation: the
// next token there is a statement's first word, which the filler cannot be blamed for).
bool eligible_cursor(const std::string& text, size_t i, int context_chars) {
  if (i < static_cast<size_t>(context_chars) || i >= text.size()) return false;
  const auto c = static_cast<unsigned char>(text[i]),
             prev = static_cast<unsigned char>(text[i - 1]);
  if (!std::isalnum(c) || c >= 0x80 || word_char(prev) || prev == '\n') return false;
  for (size_t j = i; j-- > 0 && text[j] != '\n';)
    if (!std::isspace(static_cast<unsigned char>(text[j]))) return true;
  return false;
}

size_t line_start(const std::string& text, size_t at) {
  const size_t nl = at == 0 ? std::string::npos : text.rfind('\n', at - 1);
  return nl == std::string::npos ? 0 : nl + 1;
}

// splitmix64: the same draws on every platform (std:: distributions differ between libraries).
uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

json wilson_json(int64_t k, int64_t n) {
  if (n == 0) return {{"k", k}, {"n", n}, {"rate", nullptr}, {"lo", nullptr}, {"hi", nullptr}};
  const WilsonInterval w = wilson(k, n);
  return {{"k", k}, {"n", n}, {"rate", double(k) / double(n)}, {"lo", w.lo}, {"hi", w.hi}};
}

}  // namespace

json FlipSearchSpec::to_json() const {
  return {{"manifest", manifest},
          {"sites", sites},
          {"context_chars", context_chars},
          {"lengths", {l_min, l_max}},
          {"seed", seed},
          {"agree", agree},
          {"family", filler_families_to_json(families)}};
}

std::string FlipSearchSpec::hash() const {
  return fnv1a64_hex(to_json().dump());
}

FlipSearchSpec flip_search_spec_from_json(const json& j, const std::string& where,
                                          const std::string& base_dir) {
  using namespace json_read;
  check_keys(j, {"manifest", "sites", "context_chars", "lengths", "seed", "agree", "family"},
             where);
  FlipSearchSpec s;
  s.source = where;
  std::filesystem::path m(require<std::string>(j, "manifest", where));
  if (m.is_relative()) m = std::filesystem::path(base_dir) / m;
  s.manifest = m.lexically_normal().string();
  read(j, "sites", s.sites, where);
  read(j, "context_chars", s.context_chars, where);
  read(j, "seed", s.seed, where);
  read(j, "agree", s.agree, where);
  if (s.sites < 1) throw Error(where + ": key 'sites' must be >= 1");
  if (s.context_chars < 1) throw Error(where + ": key 'context_chars' must be >= 1");
  if (!(s.agree > 0.5 && s.agree <= 1))
    throw Error(where + ": key 'agree' is " + json(s.agree).dump() +
                " (allowed: a share in (0.5, 1] of the lengths that follow a periodic pattern)");
  if (j.contains("lengths")) {
    const json& l = j["lengths"];
    if (!l.is_array() || l.size() != 2 || !l[0].is_number_integer() || !l[1].is_number_integer() ||
        l[0].get<int>() < 0 || l[1].get<int>() < l[0].get<int>())
      throw Error(where + ": key 'lengths' is " + l.dump() +
                  " (allowed: [l_min, l_max] with 0 <= l_min <= l_max, filler tokens)");
    s.l_min = l[0].get<int>();
    s.l_max = l[1].get<int>();
  }
  s.families = filler_families_from_json(j, where);
  return s;
}

FlipSearchSpec flip_search_spec_from_file(const std::string& path) {
  const auto dir = std::filesystem::path(path).parent_path().string();
  return flip_search_spec_from_json(read_config_file(path), path, dir.empty() ? "." : dir);
}

std::vector<FlipSite> pick_flip_sites(const FlipSearchSpec& spec) {
  const auto files = read_manifest_files(
      spec.manifest, "another package version: write a new manifest (scripts/code-corpus.sh)");
  std::vector<std::pair<size_t, size_t>> cursors;  // (file, offset)
  for (size_t f = 0; f < files.size(); ++f) {
    if (!files[f].entry.value("held_out", false)) continue;
    const std::string& text = files[f].text;
    for (size_t i = 0; i < text.size(); ++i)
      if (eligible_cursor(text, i, spec.context_chars)) cursors.emplace_back(f, i);
  }
  if (cursors.size() < static_cast<size_t>(spec.sites))
    throw Error(
        fmt::format("{}: the held-out files of {} hold {} eligible cursors, fewer than "
                    "sites = {} (allowed: fewer sites or a smaller context_chars)",
                    spec.source, spec.manifest, cursors.size(), spec.sites));
  uint64_t state = spec.seed;
  for (size_t i = 0; i < static_cast<size_t>(spec.sites); ++i)  // a partial Fisher-Yates shuffle
    std::swap(cursors[i], cursors[i + splitmix(state) % (cursors.size() - i)]);
  cursors.resize(static_cast<size_t>(spec.sites));
  std::sort(cursors.begin(), cursors.end());
  std::vector<FlipSite> sites;
  for (const auto& [f, i] : cursors) {
    const std::string& text = files[f].text;
    FlipSite s;
    s.id = static_cast<int>(sites.size());
    s.file = files[f].entry.value("path", files[f].path);
    s.offset = static_cast<int64_t>(i);
    s.line = 1 + static_cast<int>(
                     std::count(text.begin(), text.begin() + static_cast<int64_t>(i), '\n'));
    s.code = text.substr(line_start(text, i - static_cast<size_t>(spec.context_chars)),
                         i - line_start(text, i - static_cast<size_t>(spec.context_chars)));
    size_t w = i;
    while (w < text.size() && word_char(static_cast<unsigned char>(text[w]))) ++w;
    s.next_word = text.substr(i, w - i);
    const size_t eol = std::min(text.find('\n', i), text.size());
    s.continuation = text.substr(i, std::min<size_t>(eol - i, 60));
    sites.push_back(std::move(s));
  }
  return sites;
}

namespace {

// The majority token of each residue L mod period (ties: the one seen at the smaller L; -1 where a
// residue has no length) and how many of the measured lengths hold their residue's token.
struct ResiduePattern {
  std::vector<int32_t> majority;
  int follow = 0, present = 0;
};

ResiduePattern residue_pattern(const std::vector<int32_t>& top1, int l_min, int period) {
  ResiduePattern p;
  p.majority.assign(static_cast<size_t>(period), -1);
  std::vector<int> best(static_cast<size_t>(period), 0);
  for (size_t i = 0; i < top1.size(); ++i) {
    if (top1[i] < 0) continue;
    ++p.present;
    const auto r = static_cast<size_t>((l_min + static_cast<int>(i)) % period);
    int n = 0;  // the occurrences of this token at this residue
    for (size_t j = 0; j < top1.size(); ++j)
      n += top1[j] == top1[i] && static_cast<size_t>((l_min + static_cast<int>(j)) % period) == r;
    if (n > best[r]) best[r] = n, p.majority[r] = top1[i];
  }
  for (int b : best) p.follow += b;
  return p;
}

}  // namespace

std::string classify_flips(const std::vector<int32_t>& top1, int l_min, int period, double agree) {
  if (period < 2)
    throw Error("classify_flips: period " + std::to_string(period) + " (allowed: >= 2)");
  const ResiduePattern p = residue_pattern(top1, l_min, period);
  int32_t first = -1;
  bool all_same = true;
  for (int32_t t : top1) {
    if (t < 0) continue;
    if (first < 0) first = t;
    all_same = all_same && t == first;
  }
  if (all_same) return "constant";
  first = -1;
  bool pattern_constant = true;
  for (int32_t m : p.majority) {
    if (m < 0) continue;
    if (first < 0) first = m;
    pattern_constant = pattern_constant && m == first;
  }
  if (pattern_constant) return "flip";
  const auto need = static_cast<int>(std::ceil(agree * static_cast<double>(p.present) - 1e-9));
  return p.follow >= need ? "periodic" : "flip";
}

FlipSearchMode::FlipSearchMode(Backend& b, FlipSearchSpec spec, std::vector<FlipSite> sites,
                               EvalRecord identity)
    : spec_(std::move(spec)), sites_(std::move(sites)), identity_(std::move(identity)) {
  size_t longest = 0;
  for (const auto& s : sites_) {
    const std::string at = fmt::format("{}: site {} ({}:{})", spec_.source, s.id, s.file, s.line);
    try {
      code_ids_.push_back(b.tokenize(s.code));
      const auto word = b.tokenize(s.next_word);
      if (code_ids_.back().empty() || word.empty()) throw Error("tokenizes to no token");
      word_first_.push_back(word.front());
    } catch (const std::exception& e) {
      throw Error(at + ": does not tokenize with " + b.model_id() + ": " + e.what());
    }
    longest = std::max(longest, code_ids_.back().size());
  }
  if (static_cast<int64_t>(spec_.l_max) + static_cast<int64_t>(longest) > b.max_context())
    throw Error(
        fmt::format("{}: the longest context is {} tokens (L up to {}, code {}), more than "
                    "{}'s context of {} (allowed: a smaller context_chars or lengths)",
                    spec_.source, spec_.l_max + static_cast<int64_t>(longest), spec_.l_max, longest,
                    b.model_id(), b.max_context()));
  for (const auto& f : spec_.families) {
    fillers_[f.name] =
        plan_fillers(b, f, spec_.l_min, spec_.l_max, spec_.source, unreachable_[f.name]);
    if (unreachable_[f.name].empty()) unreachable_.erase(f.name);
  }
}

std::vector<EvalItem> FlipSearchMode::items() const {
  // In order of context length within a family: an in-process model runs contexts of one length
  // as one batch (sites differ in code length, so site by site every context would run alone).
  std::vector<std::pair<size_t, EvalItem>> by_length;
  std::vector<EvalItem> out;
  for (const auto& f : spec_.families) {
    by_length.clear();
    for (const auto& s : sites_)
      for (const auto& [L, prompt] : fillers_.at(f.name))
        by_length.push_back({prompt.filler_ids.size() + code_ids_[static_cast<size_t>(s.id)].size(),
                             EvalItem{f.name, s.id, L}});
    std::stable_sort(by_length.begin(), by_length.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [n, item] : by_length) out.push_back(std::move(item));
  }
  return out;
}

std::vector<EvalRecord> FlipSearchMode::evaluate(Backend& backend,
                                                 const std::vector<EvalItem>& batch) {
  std::vector<ScoreRequest> requests;
  for (const EvalItem& it : batch) {
    std::vector<int32_t> ctx = fillers_.at(it.condition).at(it.phase).filler_ids;
    const auto& code = code_ids_.at(static_cast<size_t>(it.example_id));
    ctx.insert(ctx.end(), code.begin(), code.end());
    requests.push_back({std::move(ctx), word_first_.at(static_cast<size_t>(it.example_id))});
  }
  const std::vector<ScoreResult> scored = backend.score(requests);
  if (scored.size() != requests.size())
    throw Error(fmt::format("{} answered {} of {} flip-search requests", backend.model_id(),
                            scored.size(), requests.size()));
  std::vector<EvalRecord> out;
  for (size_t i = 0; i < batch.size(); ++i) {
    const EvalItem& it = batch[i];
    const ScoreResult& s = scored[i];
    EvalRecord r = identity_;
    r.condition = it.condition;
    r.example_id = it.example_id;
    r.phase = it.phase;
    r.key_pos = it.phase;
    r.value_pos = static_cast<int>(requests[i].context.size());
    r.query_pos = r.value_pos - 1;
    r.target = requests[i].target;
    r.error = s.error;
    if (!r.ok()) {
      out.push_back(std::move(r));
      continue;
    }
    r.prediction = s.argmax;
    r.correct = s.argmax == r.target;
    r.censored = s.censored;
    if (std::isfinite(s.target_logprob) && !s.censored) r.target_logprob = s.target_logprob;
    r.extra = {{"L", it.phase},
               {"top1", top1_text_.of(backend, s.argmax)},
               {"top1_logprob", s.argmax_logprob}};
    out.push_back(std::move(r));
  }
  return out;
}

json summarize_flips(const FlipSearchSpec& spec, const std::vector<FlipSite>& sites,
                     const RunResult& run, const FlipSummaryOptions& o) {
  const int S = o.stride, P = o.control_period > 0 ? o.control_period : o.stride + 1;
  const int span = spec.l_max - spec.l_min + 1;
  if (S < 2) throw Error("the flip search needs a stride S >= 2 (--stride)");
  if (P == S)
    throw Error(
        fmt::format("the control period is the stride ({}): it must be another period, "
                    "the chance baseline (--control-period, 0 = S + 1)",
                    S));
  if (span < 2 * std::max(S, P))
    throw Error(
        fmt::format("{}: lengths [{}, {}] hold {} lengths, fewer than two cycles of the "
                    "period {} (allowed: at least {} lengths)",
                    spec.source, spec.l_min, spec.l_max, span, std::max(S, P), 2 * std::max(S, P)));
  // Per (family, site): the greedy token and its text at each L of the range.
  struct Series {
    std::vector<int32_t> top1;
    std::vector<std::string> text;
    int right = 0, wrong = 0;  // lengths at which the greedy token is the file's next word, or not
    bool mixed() const { return right > 0 && wrong > 0; }
  };
  std::map<std::pair<std::string, int64_t>, Series> series;
  std::vector<int64_t> res_n(static_cast<size_t>(S), 0), res_ok(static_cast<size_t>(S), 0);
  int64_t errors = 0;
  std::string first_error;
  for (const auto& [key, rec] : run.latest) {
    if (!rec.ok()) {
      ++errors;
      if (first_error.empty()) first_error = rec.error;
      continue;
    }
    if (rec.phase < spec.l_min || rec.phase > spec.l_max) continue;
    auto& sr = series[{rec.condition, rec.example_id}];
    if (sr.top1.empty()) {
      sr.top1.assign(static_cast<size_t>(span), -1);
      sr.text.assign(static_cast<size_t>(span), "");
    }
    sr.top1[static_cast<size_t>(rec.phase - spec.l_min)] = rec.prediction;
    sr.text[static_cast<size_t>(rec.phase - spec.l_min)] = rec.extra.value("top1", "");
    ++(rec.correct ? sr.right : sr.wrong);
    ++res_n[static_cast<size_t>(rec.phase % S)];
    res_ok[static_cast<size_t>(rec.phase % S)] += rec.correct;
  }
  if (series.empty())
    throw Error(
        fmt::format("{}: no flip-search record succeeded ({} failed, first: {}); a rerun "
                    "retries the failed items",
                    run.path, errors, first_error));
  json out;
  out["spec"] = spec.to_json();
  out["spec_hash"] = spec.hash();
  out["stride"] = S;
  out["control_period"] = P;
  out["errors"] = errors;
  if (!first_error.empty()) out["first_error"] = first_error;

  struct Candidate {
    bool mixed = false;
    double follow = 0, balance = 0;
    std::string family;
    int64_t site = 0;
  };
  std::vector<Candidate> periodic_sites;
  json per_family = json::array();
  int64_t n_all = 0, flips_all = 0, per_s_all = 0, per_p_all = 0, only_s_all = 0, too_few = 0;
  int64_t mixed_all = 0, per_mixed_all = 0;
  json verdicts = json::array();
  for (const auto& f : spec.families) {
    int64_t n = 0, flips = 0, per_s = 0, per_p = 0, only_s = 0, mixed = 0, per_mixed = 0;
    for (const auto& [key, sr] : series) {
      if (key.first != f.name) continue;
      // A verdict needs two cycles of each period: a family whose units the tokenizer merges can
      // reach too few lengths (the run names them), and its sites are left out of the rates.
      if (std::count_if(sr.top1.begin(), sr.top1.end(), [](int32_t t) { return t >= 0; }) <
          2 * std::max(S, P)) {
        ++too_few;
        continue;
      }
      ++n;
      const std::string at_s = classify_flips(sr.top1, spec.l_min, S, spec.agree);
      const std::string at_p = classify_flips(sr.top1, spec.l_min, P, spec.agree);
      flips += at_s != "constant";
      per_s += at_s == "periodic";
      per_p += at_p == "periodic";
      only_s += at_s == "periodic" && at_p != "periodic";
      mixed += sr.mixed();
      per_mixed += sr.mixed() && at_s == "periodic";
      verdicts.push_back({{"family", f.name},
                          {"site", key.second},
                          {"at_stride", at_s},
                          {"at_control", at_p},
                          {"right", sr.right},
                          {"wrong", sr.wrong},
                          {"top1", sr.text},
                          {"top1_ids", sr.top1}});
      if (at_s == "periodic") {
        // How clean the period is (the share of lengths at their residue's token) and how evenly
        // the two most frequent tokens share the lengths: examples should alternate clearly.
        std::map<int32_t, int> count;
        int present = 0;
        for (int32_t t : sr.top1)
          if (t >= 0) ++count[t], ++present;
        std::vector<int> c;
        for (const auto& [t, k] : count) c.push_back(k);
        std::sort(c.rbegin(), c.rend());
        Candidate cand;
        cand.family = f.name;
        cand.site = key.second;
        cand.mixed = sr.mixed();
        cand.balance = c.size() > 1 ? double(c[1]) / present : 0.0;
        cand.follow = double(residue_pattern(sr.top1, spec.l_min, S).follow) / present;
        periodic_sites.push_back(cand);
      }
    }
    per_family.push_back({{"name", f.name},
                          {"site_families", n},
                          {"flip", wilson_json(flips, n)},
                          {"periodic_at_stride", wilson_json(per_s, n)},
                          {"periodic_at_control", wilson_json(per_p, n)},
                          {"periodic_at_stride_only", wilson_json(only_s, n)},
                          {"right_and_wrong", wilson_json(mixed, n)},
                          {"periodic_right_and_wrong", wilson_json(per_mixed, n)}});
    n_all += n;
    flips_all += flips;
    per_s_all += per_s;
    per_p_all += per_p;
    only_s_all += only_s;
    mixed_all += mixed;
    per_mixed_all += per_mixed;
  }
  out["families"] = per_family;
  out["too_few_lengths"] = too_few;
  out["rates"] = {{"site_families", n_all},
                  {"flip", wilson_json(flips_all, n_all)},
                  {"periodic_at_stride", wilson_json(per_s_all, n_all)},
                  {"periodic_at_control", wilson_json(per_p_all, n_all)},
                  {"periodic_at_stride_only", wilson_json(only_s_all, n_all)},
                  {"right_and_wrong", wilson_json(mixed_all, n_all)},
                  {"periodic_right_and_wrong", wilson_json(per_mixed_all, n_all)}};
  json by_residue = json::array();
  double best = -1, worst = 2;
  for (int r = 0; r < S; ++r) {
    json row = wilson_json(res_ok[static_cast<size_t>(r)], res_n[static_cast<size_t>(r)]);
    row["phase"] = r;  // L mod S
    if (!row["rate"].is_null()) {
      best = std::max(best, row["rate"].get<double>());
      worst = std::min(worst, row["rate"].get<double>());
    }
    by_residue.push_back(row);
  }
  out["next_word_by_residue"] = by_residue;
  out["next_word_gap"] = best >= 0 ? json(best - worst) : json();
  out["sites"] = verdicts;

  // Examples: first the sites whose greedy token is right at some phases and wrong at others (the
  // study's `8` against `32`), then the cleanest periods.
  std::sort(periodic_sites.begin(), periodic_sites.end(),
            [](const Candidate& a, const Candidate& b) {
              if (a.mixed != b.mixed) return a.mixed;
              if (a.follow != b.follow) return a.follow > b.follow;
              if (a.balance != b.balance) return a.balance > b.balance;
              return std::tie(a.site, a.family) < std::tie(b.site, b.family);
            });
  json examples = json::array();
  for (const Candidate& c : periodic_sites) {
    if (static_cast<int>(examples.size()) >= o.examples) break;
    const FlipSite& site = sites.at(static_cast<size_t>(c.site));
    const Series& sr = series.at({c.family, c.site});
    // The two most frequent greedy tokens, as text; both must be printable candidates.
    std::map<std::string, int> count;
    for (size_t i = 0; i < sr.top1.size(); ++i)
      if (sr.top1[i] >= 0) ++count[sr.text[i]];
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [t, k] : count) ranked.push_back({-k, t});
    std::sort(ranked.begin(), ranked.end());
    if (ranked.size() < 2 || ranked[0].second.empty() || ranked[1].second.empty() ||
        ranked[0].second.find("\xEF\xBF\xBD") != std::string::npos ||
        ranked[1].second.find("\xEF\xBF\xBD") != std::string::npos)
      continue;
    examples.push_back({{"site", c.site},
                        {"family", c.family},
                        {"file", site.file},
                        {"line", site.line},
                        {"next_word", site.next_word},
                        {"continuation", site.continuation},
                        {"code", site.code},
                        {"alternatives", {ranked[0].second, ranked[1].second}},
                        {"right_and_wrong", c.mixed},
                        {"follow", c.follow},
                        {"top1", sr.text}});
  }
  out["examples"] = examples;
  return out;
}

json flip_example_probe_spec(const json& ex, const FlipSearchSpec& spec) {
  std::vector<std::string> cands = ex.at("alternatives").get<std::vector<std::string>>();
  const std::string word = ex.at("next_word").get<std::string>();
  // The candidate the file continues with goes first (and is `correct`) when there is one.
  if (!cands[0].empty() && word.rfind(cands[1], 0) == 0 && word.rfind(cands[0], 0) != 0)
    std::swap(cands[0], cands[1]);
  json fam = json::array();
  for (const auto& f : spec.families)
    if (f.name == ex.at("family").get<std::string>()) fam = filler_families_to_json({f});
  return {{"code", ex.at("code")},
          {"candidates", cands},
          {"correct", cands[0]},
          {"lengths", {spec.l_min, spec.l_max}},
          {"family", fam}};
}

std::string flips_verdict(const json& sm) {
  const auto& r = sm["rates"];
  auto pct = [](const json& w) {
    return w["rate"].is_null()
               ? std::string("-")
               : fmt::format("{} of {} ({:.1f} %, 95 % CI {:.1f} to {:.1f})", w["k"].get<int64_t>(),
                             w["n"].get<int64_t>(), 100 * w["rate"].get<double>(),
                             100 * w["lo"].get<double>(), 100 * w["hi"].get<double>());
  };
  std::string out = fmt::format(
      "greedy token flips with L at {}; periodic with the stride {} at {}; with the control period "
      "{} at {}",
      pct(r["flip"]), sm["stride"].get<int>(), pct(r["periodic_at_stride"]),
      sm["control_period"].get<int>(), pct(r["periodic_at_control"]));
  out += fmt::format("; right at some lengths and wrong at others: {} (periodic: {})",
                     pct(r["right_and_wrong"]), pct(r["periodic_right_and_wrong"]));
  out += fmt::format("; the greedy token is the file's next word by L mod {}:",
                     sm["stride"].get<int>());
  for (const auto& row : sm["next_word_by_residue"])
    out += row["rate"].is_null() ? std::string(" -")
                                 : fmt::format(" {:.3f}", row["rate"].get<double>());
  return out;
}

}  // namespace phasekv
