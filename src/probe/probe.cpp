#include "probe/probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "eval/value_period.h"
#include "report/report.h"
#include "util/config_file.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/json_read.h"

namespace phasekv {
namespace {

using nlohmann::json;

std::string repeat(const std::string& unit, int k) {
  std::string out;
  out.reserve(unit.size() * static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) out += unit;
  return out;
}

std::vector<int32_t> tokenize_or_throw(Backend& b, const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  try {
    ids = b.tokenize(text);
  } catch (const std::exception& e) {
    throw Error(what + " does not tokenize with " + b.model_id() + ": " + e.what());
  }
  return ids;
}

// The record fields of one scored candidate.
struct CandidateScore {
  double logprob = 0.0;
  bool censored = false;
  std::string error;
};

// A list of T under `key` (json_read reads scalars).
template <typename T>
std::vector<T> list_of(const json& j, const char* key, const std::string& where,
                       const char* what) {
  if (!j.contains(key)) throw Error(where + ": missing key '" + key + "' (" + what + ")");
  const json& v = j[key];
  std::vector<T> out;
  bool ok = v.is_array();
  if (ok)
    for (const auto& x : v) {
      if (!json_read::has_type<T>(x)) {
        ok = false;
        break;
      }
      out.push_back(x.get<T>());
    }
  if (!ok) throw Error(where + ": key '" + key + "' is " + v.dump() + " (allowed: " + what + ")");
  return out;
}

double prob(double logprob) { return std::exp(logprob); }

// Index of the most probable candidate (ties: the first).
size_t winner_of(const std::vector<double>& p) {
  return static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin());
}

}  // namespace

json ProbeSpec::to_json() const {
  return {{"code", code},
          {"candidates", candidates},
          {"correct", candidates.at(static_cast<size_t>(correct))},
          {"lengths", {l_min, l_max}},
          {"family", filler_families_to_json(families)}};
}

std::string ProbeSpec::hash() const { return fnv1a64_hex(to_json().dump()); }

std::vector<FillerFamily> filler_families_from_json(const json& j, const std::string& where) {
  using namespace json_read;
  if (!j.contains("family") || !j["family"].is_array() || j["family"].empty())
    throw Error(where + ": key 'family' must list at least one filler family ([[family]] with "
                        "name, head, unit, tail)");
  std::vector<FillerFamily> out;
  std::set<std::string> names;
  for (size_t i = 0; i < j["family"].size(); ++i) {
    const json& f = j["family"][i];
    const std::string at = where + ": family " + std::to_string(i + 1);
    check_keys(f, {"name", "head", "unit", "tail"}, at);
    FillerFamily fam;
    fam.name = require<std::string>(f, "name", at);
    if (fam.name.empty() || fam.name.find_first_of("/\\ \t\n") != std::string::npos)
      throw Error(at + ": key 'name' is \"" + fam.name +
                  "\" (allowed: a non-empty name without spaces or slashes; it names a chart file)");
    if (!names.insert(fam.name).second) throw Error(at + ": name \"" + fam.name + "\" is repeated");
    fam.head = optional<std::string>(f, "head", at).value_or("");
    fam.unit = require<std::string>(f, "unit", at);
    if (fam.unit.empty()) throw Error(at + ": key 'unit' is empty (allowed: the repeated text)");
    fam.tail = optional<std::string>(f, "tail", at).value_or("");
    out.push_back(std::move(fam));
  }
  return out;
}

json filler_families_to_json(const std::vector<FillerFamily>& families) {
  json fams = json::array();
  for (const auto& f : families)
    fams.push_back({{"name", f.name}, {"head", f.head}, {"unit", f.unit}, {"tail", f.tail}});
  return fams;
}

ProbeSpec probe_spec_from_json(const json& j, const std::string& where) {
  using namespace json_read;
  check_keys(j, {"code", "candidates", "correct", "lengths", "family"}, where);
  ProbeSpec s;
  s.source = where;
  s.code = require<std::string>(j, "code", where);
  if (s.code.empty()) throw Error(where + ": key 'code' is empty (allowed: the code up to the cursor)");
  s.candidates = list_of<std::string>(j, "candidates", where, "a list of strings");
  if (s.candidates.size() < 2)
    throw Error(where + ": key 'candidates' holds " + std::to_string(s.candidates.size()) +
                " continuations (allowed: at least 2, e.g. [\"8\", \"32\"])");
  std::set<std::string> seen;
  for (const auto& c : s.candidates) {
    if (c.empty()) throw Error(where + ": key 'candidates' holds an empty string");
    if (!seen.insert(c).second) throw Error(where + ": key 'candidates' repeats \"" + c + "\"");
  }
  const auto correct = require<std::string>(j, "correct", where);
  const auto it = std::find(s.candidates.begin(), s.candidates.end(), correct);
  if (it == s.candidates.end())
    throw Error(where + ": key 'correct' is \"" + correct + "\" (allowed: one of the candidates, " +
                join(s.candidates) + ")");
  s.correct = static_cast<int>(it - s.candidates.begin());
  const auto lengths = list_of<int>(j, "lengths", where, "[l_min, l_max], whole numbers");
  if (lengths.size() != 2 || lengths[0] < 0 || lengths[1] < lengths[0])
    throw Error(where + ": key 'lengths' must be [l_min, l_max] with 0 <= l_min <= l_max "
                        "(filler tokens before the code)");
  s.l_min = lengths[0];
  s.l_max = lengths[1];
  s.families = filler_families_from_json(j, where);
  return s;
}

ProbeSpec probe_spec_from_file(const std::string& path) {
  return probe_spec_from_json(read_config_file(path), path);
}

std::map<int, ProbePrompt> plan_fillers(Backend& b, const FillerFamily& f, int l_min, int l_hi,
                                        const std::string& source, std::vector<int>& unreachable) {
  std::map<int, ProbePrompt> prompts;
  // Stop once the filler is past l_hi for a while (a merge can make L dip by a token) or after
  // far more units than tokens wanted (a unit that tokenizes to nothing).
  const int k_cap = 4 * (l_hi + 1) + 16;
  int past = 0;
  for (int k = 0; k <= k_cap && past < 8; ++k) {
    const std::string text = f.head + repeat(f.unit, k) + f.tail;
    auto ids = text.empty() ? std::vector<int32_t>{}
                            : tokenize_or_throw(b, text, source + ": family " + f.name);
    const int L = static_cast<int>(ids.size());
    if (L > l_hi) ++past;
    if (L >= l_min && L <= l_hi && !prompts.count(L)) prompts[L] = {k, std::move(ids)};
  }
  unreachable.clear();
  for (int L = l_min; L <= l_hi; ++L)
    if (!prompts.count(L)) unreachable.push_back(L);
  if (prompts.empty())
    throw Error(fmt::format("{}: family {} gives no filler of {} to {} tokens with {}", source,
                            f.name, l_min, l_hi, b.model_id()));
  return prompts;
}

ProbePlan plan_probe(Backend& b, const ProbeSpec& s, int l_hi) {
  ProbePlan p;
  p.code_ids = tokenize_or_throw(b, s.code, s.source + ": key 'code'");
  if (p.code_ids.empty()) throw Error(s.source + ": key 'code' tokenizes to no token");
  size_t longest = 0;
  for (const auto& c : s.candidates) {
    p.candidate_ids.push_back(
        tokenize_or_throw(b, c, s.source + ": candidate \"" + c + "\""));
    if (p.candidate_ids.back().empty())
      throw Error(s.source + ": candidate \"" + c + "\" tokenizes to no token with " + b.model_id());
    longest = std::max(longest, p.candidate_ids.back().size());
  }
  // The last scored context: the filler, the code and all but the longest candidate's last token.
  const int64_t need = l_hi + static_cast<int64_t>(p.code_ids.size() + longest) - 1;
  if (need > b.max_context())
    throw Error(fmt::format("{}: the longest probe context is {} tokens (L up to {}, code {}, "
                            "candidate {}), more than {}'s context of {} (allowed: lower "
                            "'lengths' or --retest)",
                            s.source, need, l_hi, p.code_ids.size(), longest, b.model_id(),
                            b.max_context()));
  for (const auto& f : s.families)
    p.prompts[f.name] = plan_fillers(b, f, s.l_min, l_hi, s.source, p.unreachable[f.name]);
  for (auto it = p.unreachable.begin(); it != p.unreachable.end();)
    it = it->second.empty() ? p.unreachable.erase(it) : std::next(it);
  return p;
}

const std::string& TokenTexts::of(Backend& backend, int32_t id) {
  auto known = texts_.find(id);
  if (known == texts_.end()) {
    std::string text;
    try {
      text = backend.detokenize({id});
    } catch (const std::exception&) {
      text = "";
    }
    known = texts_.emplace(id, text).first;
  }
  return known->second;
}

ProbeMode::ProbeMode(ProbeSpec spec, ProbePlan plan, EvalRecord identity)
    : spec_(std::move(spec)), plan_(std::move(plan)), identity_(std::move(identity)) {}

std::vector<EvalItem> ProbeMode::items() const {
  std::vector<EvalItem> out;
  for (const auto& f : spec_.families)
    for (const auto& [L, prompt] : plan_.prompts.at(f.name)) out.push_back({f.name, 0, L});
  return out;
}

std::vector<EvalRecord> ProbeMode::evaluate(Backend& backend, const std::vector<EvalItem>& batch) {
  // Every candidate token of every item in one score() call.
  std::vector<ScoreRequest> requests;
  std::vector<std::vector<int32_t>> contexts;
  for (const EvalItem& it : batch) {
    std::vector<int32_t> ctx = plan_.prompts.at(it.condition).at(it.phase).filler_ids;
    ctx.insert(ctx.end(), plan_.code_ids.begin(), plan_.code_ids.end());
    for (const auto& cand : plan_.candidate_ids) {
      std::vector<int32_t> c = ctx;
      for (int32_t tok : cand) {
        requests.push_back({c, tok});
        c.push_back(tok);
      }
    }
    contexts.push_back(std::move(ctx));
  }
  const std::vector<ScoreResult> scored = backend.score(requests);
  if (scored.size() != requests.size())
    throw Error(fmt::format("{} answered {} of {} probe requests", backend.model_id(),
                            scored.size(), requests.size()));
  std::vector<EvalRecord> out;
  size_t next = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const EvalItem& it = batch[i];
    EvalRecord r = identity_;
    r.condition = it.condition;
    r.example_id = it.example_id;
    r.phase = it.phase;
    r.key_pos = it.phase;
    r.value_pos = static_cast<int>(contexts[i].size());
    r.query_pos = r.value_pos - 1;
    r.target = plan_.candidate_ids[static_cast<size_t>(spec_.correct)].front();
    std::vector<CandidateScore> cs(plan_.candidate_ids.size());
    const ScoreResult& first = scored[next];  // the first token of the first candidate: greedy
    for (size_t c = 0; c < cs.size(); ++c)
      for (size_t t = 0; t < plan_.candidate_ids[c].size(); ++t, ++next) {
        const ScoreResult& s = scored[next];
        if (!s.error.empty() && cs[c].error.empty()) cs[c].error = s.error;
        cs[c].logprob += s.target_logprob;
        cs[c].censored = cs[c].censored || s.censored;
      }
    for (const auto& c : cs)
      if (!c.error.empty() && r.error.empty()) r.error = c.error;
    if (!r.error.empty()) {
      out.push_back(std::move(r));
      continue;
    }
    std::vector<double> p;
    json cands = json::array();
    for (size_t c = 0; c < cs.size(); ++c) {
      p.push_back(prob(cs[c].logprob));
      cands.push_back({{"text", spec_.candidates[c]},
                       {"ids", plan_.candidate_ids[c]},
                       {"logprob", cs[c].logprob},
                       {"prob", p.back()},
                       {"censored", cs[c].censored}});
      r.censored = r.censored || cs[c].censored;
    }
    const size_t win = winner_of(p);
    double best_wrong = 0;
    for (size_t c = 0; c < p.size(); ++c)
      if (static_cast<int>(c) != spec_.correct) best_wrong = std::max(best_wrong, p[c]);
    r.prediction = first.argmax;
    r.correct = static_cast<int>(win) == spec_.correct;
    const double lp = cs[static_cast<size_t>(spec_.correct)].logprob;
    if (std::isfinite(lp) && !cs[static_cast<size_t>(spec_.correct)].censored) r.target_logprob = lp;
    const std::string& top1 = top1_text_.of(backend, first.argmax);
    r.extra = {{"L", it.phase},
               {"k", plan_.prompts.at(it.condition).at(it.phase).k},
               {"candidates", cands},
               {"margin", p[static_cast<size_t>(spec_.correct)] - best_wrong},
               {"winner", spec_.candidates[win]},
               {"top1", top1},
               {"top1_logprob", first.argmax_logprob}};
    out.push_back(std::move(r));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Summary.

namespace {

struct Point {
  int L = 0;
  std::vector<double> p;  // per candidate
  double margin = 0.0;
  int winner = 0;
  bool censored = false;
  bool top1_correct = false;  // the greedy next token is the correct candidate's first token
  int32_t top1 = -1;          // the greedy next token
};

json residue_table(const std::vector<const Point*>& pts, int S, const ProbeSpec& s) {
  json rows = json::array();
  for (int r = 0; r < S; ++r) {
    std::vector<double> mean_p(s.candidates.size(), 0.0);
    std::vector<int> wins(s.candidates.size(), 0);
    double margin = 0;
    int n = 0;
    for (const Point* q : pts) {
      if (q->L % S != r) continue;
      ++n;
      margin += q->margin;
      ++wins[static_cast<size_t>(q->winner)];
      for (size_t c = 0; c < mean_p.size(); ++c) mean_p[c] += q->p[c];
    }
    json mp = json::object(), w = json::object();
    for (size_t c = 0; c < mean_p.size(); ++c) {
      mp[s.candidates[c]] = n ? json(mean_p[c] / n) : json();
      w[s.candidates[c]] = wins[c];
    }
    rows.push_back({{"phase", r},
                    {"n", n},
                    {"mean_margin", n ? json(margin / n) : json()},
                    {"mean_prob", mp},
                    {"wins", w}});
  }
  return rows;
}

}  // namespace

json summarize_probe(const ProbeSpec& s, const RunResult& run, const ProbeSummaryOptions& o) {
  std::map<std::string, std::map<int, Point>> by_family;
  int32_t target = -1;  // the correct candidate's first token (the same in every record)
  int64_t errors = 0;
  std::string first_error;
  for (const auto& [key, rec] : run.latest) {
    if (!rec.ok()) {
      ++errors;
      if (first_error.empty()) first_error = rec.error;
      continue;
    }
    Point q;
    q.L = rec.phase;
    q.margin = rec.extra.at("margin").get<double>();
    for (const auto& c : rec.extra.at("candidates")) {
      q.p.push_back(c.at("prob").get<double>());
      q.censored = q.censored || c.at("censored").get<bool>();
    }
    q.winner = static_cast<int>(winner_of(q.p));
    q.top1 = rec.prediction;
    q.top1_correct = rec.prediction == rec.target;
    target = rec.target;
    by_family[rec.condition][rec.phase] = q;
  }
  if (by_family.empty())
    throw Error(fmt::format("{}: no probe record succeeded ({} failed, first: {}); a rerun retries "
                            "the failed items",
                            run.path, errors, first_error));

  json out;
  out["spec"] = s.to_json();
  out["spec_hash"] = s.hash();
  out["errors"] = errors;
  if (!first_error.empty()) out["first_error"] = first_error;

  // The period of the margin over the main range.
  std::vector<ValueSeries> series;
  std::vector<const Point*> main_points;
  json fams = json::array();
  int censored = 0;
  for (const auto& f : s.families) {
    ValueSeries v;
    json pts = json::array();
    for (const auto& [L, q] : by_family[f.name]) {
      json probs = json::object();
      for (size_t c = 0; c < q.p.size(); ++c) probs[s.candidates[c]] = q.p[c];
      pts.push_back({{"L", L},
                     {"prob", probs},
                     {"margin", q.margin},
                     {"winner", s.candidates[static_cast<size_t>(q.winner)]},
                     {"censored", q.censored}});
      if (L < s.l_min || L > s.l_max) continue;
      v.positions.push_back(L);
      v.values.push_back(q.margin);
      main_points.push_back(&q);
      censored += q.censored;
    }
    series.push_back(std::move(v));
    fams.push_back({{"name", f.name}, {"points", pts}});
  }
  const int span = s.l_max - s.l_min + 1;
  const ValuePeriodDetection period =
      detect_value_period(series, std::max(2, std::min(32, span / 2)), o.permutations, o.seed);
  out["families"] = fams;
  out["period"] = period.to_json();
  out["censored_points"] = censored;

  int S = o.stride;
  std::string stride_source = "given";
  if (S <= 0 && period.detected > 0 && period.p_value < 0.05) {
    S = period.detected;
    stride_source = "the detected period";
  }
  out["stride"] = S > 0 ? json(S) : json();
  out["stride_source"] = S > 0 ? json(stride_source) : json();

  // Rankings: which candidate wins at each (family, L) of the main range.
  json rankings = {{"total", main_points.size()}};
  json wins = json::object();
  for (size_t c = 0; c < s.candidates.size(); ++c) {
    int n = 0;
    for (const Point* q : main_points) n += q->winner == static_cast<int>(c);
    wins[s.candidates[c]] = n;
  }
  rankings["wins"] = wins;
  // The candidates may all be unlikely (both near 0 at a weak phase): the greedy token says
  // whether the model would actually write the right one.
  rankings["top1_correct"] = std::count_if(main_points.begin(), main_points.end(),
                                           [](const Point* q) { return q->top1_correct; });
  if (S > 0) {
    json table = residue_table(main_points, S, s);
    out["by_residue"] = table;
    // The residue's majority winner (pooled over families); a ranking follows the period when its
    // winner is its residue's. A constant pattern (one candidate wins every residue) is no period.
    std::vector<int> majority(static_cast<size_t>(S), -1);
    for (int r = 0; r < S; ++r) {
      int best = -1, best_n = -1;
      for (size_t c = 0; c < s.candidates.size(); ++c) {
        const int n = table[static_cast<size_t>(r)]["wins"][s.candidates[c]].get<int>();
        if (n > best_n) best = static_cast<int>(c), best_n = n;
      }
      majority[static_cast<size_t>(r)] = best;
    }
    int follow = 0;
    for (const Point* q : main_points) follow += q->winner == majority[static_cast<size_t>(q->L % S)];
    json pattern = json::array();
    for (int m : majority) pattern.push_back(s.candidates[static_cast<size_t>(m)]);
    rankings["residue_winner"] = pattern;
    rankings["follow_period"] = follow;
    rankings["constant_pattern"] =
        std::all_of(majority.begin(), majority.end(), [&](int m) { return m == majority[0]; });
    json per_family = json::array();
    for (const auto& f : s.families) {
      std::vector<const Point*> pts;
      for (const auto& [L, q] : by_family[f.name])
        if (L >= s.l_min && L <= s.l_max) pts.push_back(&q);
      per_family.push_back({{"name", f.name}, {"by_residue", residue_table(pts, S, s)}});
    }
    out["by_residue_per_family"] = per_family;
  }
  out["rankings"] = rankings;

  // Retest: the greedy answers (the next token a user would get) at L, L+1, ..., L+K-1 of one
  // family, for every L of the main range whose K answers all exist. The majority is the most
  // frequent answer (ties: the one seen first); right = the correct candidate's first token.
  if (o.retest > 1) {
    int items = 0, all_agree = 0, single_right = 0, majority_right = 0;
    double agreement = 0;
    for (const auto& f : s.families) {
      const auto& pts = by_family[f.name];
      for (int L = s.l_min; L <= s.l_max; ++L) {
        std::vector<int32_t> answers;
        for (int j = 0; j < o.retest; ++j) {
          const auto it = pts.find(L + j);
          if (it == pts.end()) break;
          answers.push_back(it->second.top1);
        }
        if (static_cast<int>(answers.size()) != o.retest) continue;
        ++items;
        int32_t maj = answers.front();
        long maj_n = 0;
        for (int32_t a : answers) {
          const long n = std::count(answers.begin(), answers.end(), a);
          if (n > maj_n) maj = a, maj_n = n;
        }
        all_agree += maj_n == o.retest;
        agreement += double(maj_n) / o.retest;
        single_right += answers.front() == target;
        majority_right += maj == target;
      }
    }
    out["retest"] = {{"k", o.retest},
                     {"items", items},
                     {"all_agree", all_agree},
                     {"mean_agreement", items ? json(agreement / items) : json()},
                     {"single_correct", single_right},
                     {"majority_correct", majority_right},
                     {"shifts", "the greedy answers at filler lengths L, L+1, ..., L+K-1"}};
  }
  return out;
}

std::string probe_verdict(const json& sm) {
  const auto& spec = sm["spec"];
  const std::string correct = spec["correct"].get<std::string>();
  std::string wrong;
  for (const auto& c : spec["candidates"])
    if (c.get<std::string>() != correct) wrong += (wrong.empty() ? "" : "/") + c.get<std::string>();
  const auto& per = sm["period"];
  std::string out;
  const double p = per["p_value"].get<double>();
  if (!per["detected"].is_null() && p < 0.05)
    out = fmt::format("period {} in P({}) - P({}) against the filler length (p = {:.3f})",
                      per["detected"].get<int>(), correct, wrong, p);
  else
    out = fmt::format("no period detected in P({}) - P({}) (p = {:.3f})", correct, wrong, p);
  if (sm.contains("by_residue")) {
    const int S = sm["stride"].get<int>();
    out += fmt::format("; mean margin by L mod {}:", S);
    for (const auto& row : sm["by_residue"]) {
      // L mod S is `phase`; probe.json files before the key followed the glossary say "r".
      const int r = (row.contains("phase") ? row["phase"] : row.at("r")).get<int>();
      out += row["mean_margin"].is_null()
                 ? fmt::format(" {}: -", r)
                 : fmt::format(" {}: {:+.3f}", r, row["mean_margin"].get<double>());
    }
    const auto& rk = sm["rankings"];
    out += fmt::format("; {} of {} rankings follow the residue pattern {}", rk["follow_period"].get<int>(),
                       rk["total"].get<int>(), rk["residue_winner"].dump());
    if (rk["constant_pattern"].get<bool>())
      out += " (the same candidate wins at every residue: no period in the ranking)";
  }
  out += "; wins:";
  for (const auto& [c, n] : sm["rankings"]["wins"].items()) out += fmt::format(" {} {}", c, n.get<int>());
  out += fmt::format("; the greedy token is {}'s first at {} of {}", correct,
                     sm["rankings"]["top1_correct"].get<int>(), sm["rankings"]["total"].get<int>());
  return out;
}

void write_probe_charts(const std::string& dir, const json& sm) {
  std::filesystem::create_directories(dir);
  const auto& spec = sm["spec"];
  const int l_min = spec["lengths"][0].get<int>(), l_max = spec["lengths"][1].get<int>();
  std::vector<double> marks;
  if (!sm["stride"].is_null())
    for (int L = 0, S = sm["stride"].get<int>(); L <= l_max + S; L += S)
      if (L >= l_min) marks.push_back(L);
  const std::string correct = spec["correct"].get<std::string>();
  LineChart margin;
  margin.title = "P(" + correct + ") - P(best wrong) against the filler length";
  margin.caption = sm["stride"].is_null()
                       ? std::string("no stride known: no cycle marks")
                       : fmt::format("dotted: every {} tokens ({})", sm["stride"].get<int>(),
                                     sm["stride_source"].get<std::string>());
  margin.x_label = "filler length L (tokens before the code)";
  margin.y_label = "margin";
  margin.x_integer_ticks = true;
  margin.x_marks = marks;
  margin.y_lo = -1;
  margin.y_hi = 1;
  for (const auto& f : sm["families"]) {
    LineSeries ls;
    ls.label = f["name"].get<std::string>();
    ls.markers = true;
    LineChart probs = margin;
    probs.title = "P(candidate) against the filler length: family " + ls.label;
    probs.y_label = "probability";
    probs.y_lo = 0;
    probs.series.clear();
    std::map<std::string, LineSeries> per_cand;
    for (const auto& pt : f["points"]) {
      const int L = pt["L"].get<int>();
      if (L < l_min || L > l_max) continue;
      ls.x.push_back(L);
      ls.y.push_back(pt["margin"].get<double>());
      for (const auto& [c, v] : pt["prob"].items()) {
        auto& cs = per_cand[c];
        cs.label = "P(" + c + ")";
        cs.markers = true;
        cs.x.push_back(L);
        cs.y.push_back(v.get<double>());
      }
    }
    margin.series.push_back(ls);
    for (const auto& c : spec["candidates"]) probs.series.push_back(per_cand[c.get<std::string>()]);
    write_file_atomic(dir + "/probe-" + ls.label + ".svg", line_svg(probs));
  }
  write_file_atomic(dir + "/probe.svg", line_svg(margin));
}

}  // namespace phasekv
