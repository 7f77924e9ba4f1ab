#include "report/calibration_page.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "report/report.h"
#include "util/fs.h"

namespace phasekv::calibrate {
namespace {

// The target for a test at alpha = 0.05: a false-positive rate in 5 % +- 1.5 %.
constexpr double kAlpha = 0.05, kTolerance = 0.015;

using Pick = std::function<const Rate&(const Result&)>;

std::string rate_cell(const Rate& r) {
  if (r.n == 0) return "-";
  return fmt::format("{:.1f} ± {:.1f}", 100 * r.value(), 100 * r.se());
}

std::string profile_text(Profile p) {
  return p == Profile::flat ? "flat" : p == Profile::boundary ? "boundary dip" : "interior dip";
}

std::string stride_given_text(const Setting& s) {
  return s.stride_given == 0 ? "unknown (0)" : std::to_string(s.stride_given);
}

std::string corr_text(const Setting& s) {
  return s.replica > 0 ? fmt::format("replica {:.2f}", s.replica) : "independent";
}

std::vector<const Result*> group(const PageInputs& in, const std::string& g) {
  std::vector<const Result*> out;
  for (const auto& r : in.results)
    if (r.setting.group == g) out.push_back(&r);
  return out;
}

// How a test's false-positive rates over some null settings compare with 5 % +- 1.5 %, allowing
// for Monte-Carlo error (2 SE): "holds", "conservative" or "anti-conservative".
struct Calibration {
  double lo = INFINITY, hi = -INFINITY, worst_se = 0.0;
  int n = 0, above = 0, below = 0;
  std::string verdict() const {
    if (n == 0) return "not measured";
    if (above > 0) return "anti-conservative";
    if (below > 0) return "conservative";
    return "holds its nominal rate";
  }
};

Calibration calibration(const std::vector<const Result*>& rs, const Pick& pick) {
  Calibration c;
  for (const auto* r : rs) {
    const Rate& x = pick(*r);
    if (x.n == 0) continue;
    ++c.n;
    c.lo = std::min(c.lo, x.value());
    c.hi = std::max(c.hi, x.value());
    c.worst_se = std::max(c.worst_se, x.se());
    const double slack = kTolerance + 2 * x.se();
    c.above += x.value() > kAlpha + slack;
    c.below += x.value() < kAlpha - slack;
  }
  return c;
}

std::string calibration_sentence(const std::string& test, const Calibration& c,
                                 const std::string& data) {
  if (c.n == 0) return fmt::format("- **{}** on {}: not applicable.\n", test, data);
  return fmt::format(
      "- **{}** on {}: rejects a true null {:.1f} %–{:.1f} % of the time at alpha 0.05 over {} "
      "settings (MC SE ≤ {:.1f} pp): **{}**{}.\n",
      test, data, 100 * c.lo, 100 * c.hi, c.n, 100 * c.worst_se, c.verdict(),
      c.above   ? fmt::format(" ({} of {} settings above 6.5 %)", c.above, c.n)
      : c.below ? fmt::format(" ({} of {} settings below 3.5 %)", c.below, c.n)
                : "");
}

std::vector<const Result*> only(const std::vector<const Result*>& rs,
                                const std::function<bool(const Result&)>& keep) {
  std::vector<const Result*> out;
  for (const auto* r : rs)
    if (keep(*r)) out.push_back(r);
  return out;
}

std::string null_table(const PageInputs& in) {
  std::string s =
      "| M | S | stride given | outcomes | accuracy | n | datasets | period test | chi-square "
      "(all phases) | interior test | mean observed gap pp | ";
  for (double g : in.options.sla_max_gap_pp) s += fmt::format("SLA fails --max-gap {:g} | ", g);
  s += "gap CI excludes its own estimate |\n|";
  for (size_t i = 0; i < 12 + in.options.sla_max_gap_pp.size(); ++i) s += " --- |";
  s += "\n";
  for (const auto* r : group(in, "null")) {
    const auto& t = r->setting;
    s += fmt::format("| {} | {} | {} | {} | {:.2f} | {} | {} | {} | {} | {} | {:.1f} ± {:.1f} | ",
                     t.modulus, t.stride, stride_given_text(t), corr_text(t), t.top, t.examples,
                     t.datasets, rate_cell(r->period_reject), rate_cell(r->chi_reject),
                     rate_cell(r->interior_reject), r->gap_mean_pp, r->gap_se_pp);
    for (const auto& f : r->sla_fail) s += rate_cell(f) + " | ";
    s += rate_cell(r->gap_ci_excludes_point) + " |\n";
  }
  return s;
}

// The flat model at M = 24, S = 8, accuracy 0.5, independent outcomes, by examples per phase.
std::vector<const Result*> flat_by_examples(const PageInputs& in) {
  std::vector<const Result*> rs = group(in, "null-n");
  for (const auto* r : group(in, "null"))
    if (r->setting.modulus == 24 && r->setting.replica == 0 && r->setting.top == 0.5 &&
        r->setting.stride_given == r->setting.stride)
      rs.push_back(r);
  std::sort(rs.begin(), rs.end(), [](const Result* a, const Result* b) {
    return a->setting.examples < b->setting.examples;
  });
  return rs;
}

std::string null_n_table(const PageInputs& in) {
  const auto rs = flat_by_examples(in);
  std::string s =
      "| examples per phase | datasets | mean observed gap pp (true 0) | mean bias-corrected gap "
      "pp "
      "| mean null gap pp (the summary's no-effect level) | gap CI excludes its own estimate | ";
  for (double g : in.options.sla_max_gap_pp) s += fmt::format("SLA fails --max-gap {:g} | ", g);
  s += "\n| --- | --- | --- | --- | --- | --- |";
  for (size_t i = 0; i < in.options.sla_max_gap_pp.size(); ++i) s += " --- |";
  s += "\n";
  for (const auto* r : rs) {
    s += fmt::format("| {} | {} | {:.1f} ± {:.1f} | {:.1f} | {:.1f} | {} | ", r->setting.examples,
                     r->setting.datasets, r->gap_mean_pp, r->gap_se_pp, r->gap_bc_mean_pp,
                     r->null_gap_mean_pp, rate_cell(r->gap_ci_excludes_point));
    for (const auto& f : r->sla_fail) s += rate_cell(f) + " | ";
    s += "\n";
  }
  return s;
}

std::string power_table(const std::vector<const Result*>& rs) {
  std::string s =
      "| profile | outcomes | true gap pp | n | datasets | period test p < 0.05 | ... and period = "
      "S | \"period = S\" supported | chi-square | interior test | mean observed gap pp (bias) | "
      "mean bias-corrected gap pp | gap CI covers the true gap | gap CI excludes its own "
      "estimate |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "| --- |\n";
  for (const auto* r : rs) {
    const auto& t = r->setting;
    s += fmt::format(
        "| {} | {} | {:.0f} | {} | {} | {} | {} | {} | {} | {} | {:.1f} ({:+.1f} ± {:.1f}) | "
        "{:.1f} ({:+.1f}) | {} | {} |\n",
        profile_text(t.profile), corr_text(t), r->true_gap_pp, t.examples, t.datasets,
        rate_cell(r->period_reject), rate_cell(r->period_is_stride), rate_cell(r->stride_supported),
        rate_cell(r->chi_reject), rate_cell(r->interior_reject), r->gap_mean_pp,
        r->gap_mean_pp - r->true_gap_pp, r->gap_se_pp, r->gap_bc_mean_pp,
        r->gap_bc_mean_pp - r->true_gap_pp, rate_cell(r->gap_covered),
        rate_cell(r->gap_ci_excludes_point));
  }
  return s;
}

std::string stride_table(const PageInputs& in) {
  std::string s =
      "| true S | M | S divides M | n | datasets | significant (p < 0.05) | detected period = S | "
      "detected periods among significant datasets | mean bootstrap support of the detected "
      "period |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto* r : group(in, "stride")) {
    const auto& t = r->setting;
    std::string det;
    for (size_t p = 0; p < r->detected_count.size(); ++p)
      if (r->detected_count[p] > 0)
        det += fmt::format("{}{}: {:.1f} %", det.empty() ? "" : ", ", p,
                           100.0 * r->detected_count[p] / t.datasets);
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {:.0f} % |\n", t.stride, t.modulus,
                     t.modulus % t.stride == 0 ? "yes" : "no", t.examples, t.datasets,
                     rate_cell(r->period_reject), rate_cell(r->period_is_stride),
                     det.empty() ? "-" : det, 100 * r->mean_support);
  }
  return s;
}

// Power (or coverage) against examples per phase, one line per true gap.
std::string curve_svg(const std::vector<const Result*>& rs, Profile profile, const Pick& pick,
                      const std::string& title, const std::string& y_label, double reference) {
  std::map<double, LineSeries> by_gap;
  for (const auto* r : rs) {
    if (r->setting.profile != profile) continue;
    const Rate& x = pick(*r);
    if (x.n == 0) continue;
    auto& ser = by_gap[r->true_gap_pp];
    ser.label = fmt::format("gap {:.0f} pp", r->true_gap_pp);
    ser.markers = true;
    ser.x.push_back(r->setting.examples);
    ser.y.push_back(x.value());
    ser.lo.push_back(std::max(0.0, x.value() - 1.96 * x.se()));
    ser.hi.push_back(std::min(1.0, x.value() + 1.96 * x.se()));
  }
  LineChart c;
  c.title = title;
  c.caption =
      "M = 24, S = 8, accuracy centred on 0.5, latent within-example correlation 0.5; "
      "bars: +- 1.96 Monte-Carlo SE";
  c.x_label = "examples per phase";
  c.y_label = y_label;
  c.y_lo = 0.0, c.y_hi = 1.0;
  for (auto& [gap, ser] : by_gap) c.series.push_back(ser);
  if (!std::isnan(reference) && !c.series.empty()) {
    LineSeries ref;
    ref.label = fmt::format("{:g}", reference);
    ref.dashed = true;
    ref.x = {c.series.front().x.front(), c.series.front().x.back()};
    ref.y = {reference, reference};
    c.series.push_back(ref);
  }
  if (c.series.empty()) return "";
  return line_svg(c);
}

std::string fixes_list(const PageInputs& in) {
  const auto nulls = group(in, "null");
  auto indep = only(nulls, [](const Result& r) { return r.setting.replica == 0; });
  auto repl = only(nulls, [](const Result& r) { return r.setting.replica > 0; });
  std::string s;
  const std::pair<std::string, Pick> tests[] = {
      {"the period sign-flip test", [](const Result& r) -> const Rate& { return r.period_reject; }},
      {"the chi-square homogeneity test",
       [](const Result& r) -> const Rate& { return r.chi_reject; }},
      {"the interior sign-flip test",
       [](const Result& r) -> const Rate& { return r.interior_reject; }}};
  for (const auto& [name, pick] : tests)
    for (const auto& [data, rs] :
         {std::pair{"independent outcomes", &indep}, std::pair{"prefix-padding replicas", &repl}}) {
      const Calibration c = calibration(*rs, pick);
      if (c.n > 0 && (c.above || c.below))
        s += fmt::format("- {} is {} on null data with {}: {:.1f} %–{:.1f} % at alpha 0.05.\n",
                         name, c.verdict(), data, 100 * c.lo, 100 * c.hi);
    }
  double worst_exclude = 0.0, worst_cov = 1.0;
  for (const auto& r : in.results) {
    if (r.gap_ci_excludes_point.n)
      worst_exclude = std::max(worst_exclude, r.gap_ci_excludes_point.value());
    if (r.setting.group == "power" && r.gap_covered.n)
      worst_cov = std::min(worst_cov, r.gap_covered.value());
  }
  if (worst_exclude > 0)
    s += fmt::format(
        "- The gap's interval excludes its own point estimate in up to "
        "{:.1f} % of datasets.\n",
        100 * worst_exclude);
  if (worst_cov < 0.95 - kTolerance)
    s += fmt::format(
        "- The gap's 95 % interval covers the true gap in as few as {:.1f} % of "
        "datasets under the alternatives.\n",
        100 * worst_cov);
  bool stride_wrong = false;
  for (const auto* r : group(in, "stride"))
    stride_wrong =
        stride_wrong || (r->period_reject.value() > 0.5 && r->period_is_stride.value() < 0.9);
  if (stride_wrong)
    s += "- A stride is detected as a significant period that is not the stride in more than 10 % "
         "of datasets (stride table).\n";
  if (s.empty())
    s = "- Nothing: every measured rate is within its target.\n";
  else
    s += "\nA conservative test (a rate below 3.5 %) loses power but raises no false alarms; the "
         "verdicts and the SLA gate depend on the period, interior and gap rows.\n";
  return s;
}

// The gap, its interval, the SLA gate and the stride table, each as one sentence of numbers.
std::string gap_sla_stride_sentences(const PageInputs& in) {
  std::string s;
  const auto flat = flat_by_examples(in);
  if (!flat.empty()) {
    s += "- **The gap** of a flat model (true gap 0, M = 24, accuracy 0.5) averages";
    for (const auto* r : flat)
      s += fmt::format(" {:.1f} pp at n = {}{}", r->gap_mean_pp, r->setting.examples,
                       r == flat.back() ? "" : ",");
    s += ": an observed gap of that size is what no phase effect looks like, not an effect.\n";
    double lo = 1, hi = 0;
    for (const auto* r : group(in, "null")) {
      lo = std::min(lo, r->gap_ci_excludes_point.value());
      hi = std::max(hi, r->gap_ci_excludes_point.value());
    }
    s += fmt::format(
        "- **The gap's interval** (simultaneous bands) excludes its own point estimate in "
        "{:.1f} %–{:.1f} % of null datasets: never, by construction.\n",
        100 * lo, 100 * hi);
    s += "- **The bias-corrected gap** of the same flat model averages";
    for (const auto* r : flat)
      s += fmt::format(" {:.1f} pp at n = {}{}", r->gap_bc_mean_pp, r->setting.examples,
                       r == flat.back() ? "" : ",");
    s += ", and the summary's null gap (what a flat profile shows with the same examples) "
         "averages";
    for (const auto* r : flat)
      s += fmt::format(" {:.1f} pp{}", r->null_gap_mean_pp, r == flat.back() ? "" : ",");
    s += ": the null gap is the level an observed gap has to clear.\n";
    const Result& r = *flat.back();
    for (size_t g = 0; g < r.sla_fail.size(); ++g)
      s += fmt::format(
          "- **The SLA gate** `--max-gap {:g}` fails a flat model (true gap 0) "
          "{:.1f} % of the time with n = {} at M = 24 ({:.1f} % with n = {}).\n",
          in.options.sla_max_gap_pp[g], 100 * r.sla_fail[g].value(), r.setting.examples,
          100 * flat.front()->sla_fail[g].value(), flat.front()->setting.examples);
  }
  double lo = 1, hi = 0;
  for (const auto* r : group(in, "power")) {
    lo = std::min(lo, r->gap_covered.value());
    hi = std::max(hi, r->gap_covered.value());
  }
  if (lo <= hi)
    s += fmt::format(
        "- **Coverage**: under the alternatives the gap's nominal 95 % interval "
        "contains the true gap in {:.1f} %–{:.1f} % of datasets.\n",
        100 * lo, 100 * hi);
  for (const auto* r : group(in, "stride")) {
    if (r->setting.modulus % r->setting.stride == 0) continue;
    s += fmt::format(
        "- **Stride {} at M = {}** (a {:.0f} pp boundary dip, n = {}, {} does not divide {}): "
        "significant in {:.1f} % of datasets, the true stride detected in {:.1f} % (from the "
        "key positions), mean bootstrap support {:.0f} %.\n",
        r->setting.stride, r->setting.modulus, r->true_gap_pp, r->setting.examples,
        r->setting.stride, r->setting.modulus, 100 * r->period_reject.value(),
        100 * r->period_is_stride.value(), 100 * r->mean_support);
  }
  return s;
}

}  // namespace

std::string describe_cpu() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(f, line)) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
  }
  const bool amx = flags.find(" amx_tile") != std::string::npos;
  return fmt::format("{}{}, {} logical CPUs", model.empty() ? "unknown CPU" : model,
                     amx ? " (AMX)" : "", std::thread::hardware_concurrency());
}

nlohmann::json results_json(const PageInputs& in) {
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& r : in.results) rs.push_back(r.to_json(in.options));
  return {{"command", in.command},
          {"cpu", in.cpu},
          {"seconds", in.seconds},
          {"quick", in.quick},
          {"permutations", in.options.permutations},
          {"bootstrap_reps", in.options.bootstrap_reps},
          {"threads", in.options.threads},
          {"seed", in.options.seed},
          {"alpha", kAlpha},
          {"results", rs}};
}

std::string statistics_markdown(const PageInputs& in) {
  const auto& o = in.options;
  const auto nulls = group(in, "null");
  auto indep = only(nulls, [](const Result& r) { return r.setting.replica == 0; });
  auto repl = only(nulls, [](const Result& r) { return r.setting.replica > 0; });
  const Pick period = [](const Result& r) -> const Rate& { return r.period_reject; };
  const Pick chi = [](const Result& r) -> const Rate& { return r.chi_reject; };
  const Pick interior = [](const Result& r) -> const Rate& { return r.interior_reject; };

  // The largest k with (1 + k) / (1 + permutations) < 1/20, in integers.
  const int k_max = (o.permutations + 1 + 19) / 20 - 2;
  std::string md;
  md += "# Statistics: how far phasekv's verdicts can be trusted\n\n";
  md +=
      "<!-- Generated by `phasekv calibrate --docs docs` (src/report/calibration_page.cpp); "
      "do not edit by hand. -->\n\n";
  md += fmt::format(
      "Every test phasekv reports was run on simulated sweeps whose truth is known, and its "
      "error rates were counted. Regenerate this page with\n\n```sh\nnice "
      "build/{}\n```\n\nMeasured on {} in {:.0f} s ({} threads){}. Inside the simulation each "
      "sign-flip test uses a fixed {} flips (p = (1 + k) / (1 + flips) < 0.05 means k <= {} "
      "flipped statistics reach the observed one, so its size is at most {:.2f} %, not 5 %) and "
      "each summary {} bootstrap replicates (a sweep uses at least 1000 flips, more while p is "
      "small, and 2000 replicates); rates are counts over simulated datasets, given as "
      "percent ± one Monte-Carlo standard error sqrt(p (1 - p) / N). Raw results: "
      "`{}/calibration.json`.\n\n",
      in.command, in.cpu, in.seconds, o.threads,
      in.quick ? " (**--quick: a reduced set of small settings, not the study**)" : "",
      o.permutations, k_max, 100.0 * (k_max + 1) / (o.permutations + 1), o.bootstrap_reps, in.out);

  md += "## The simulated sweeps\n\n";
  md +=
      "A sweep scores every example at every phase r in [0, M). The simulation keeps that "
      "structure (src/eval/calibrate.h):\n\n"
      "- **Examples are clusters.** Example i has a latent difficulty u_i ~ N(0, 0.5); its "
      "outcome at phase r is correct when u_i + e_ir < Phi^-1(A(r)), e_ir ~ N(0, 0.5). This "
      "liability-threshold (probit) model makes the population accuracy at phase r exactly "
      "A(r) while outcomes of one example are correlated (latent correlation 0.5: an easy "
      "example is easy everywhere).\n"
      "- **Prefix-padding replicas.** Under prefix padding the W8S8 profile repeats within "
      "0.5 pp every 8 phases: phases r and r + S of one example see nearly the same input. "
      "With `replica 0.95` the outcome at r >= S copies the outcome at r - S with probability "
      "0.95. The population accuracy still does not depend on r, but an example's outcomes "
      "depend on r mod S: each example has its own idiosyncratic phase pattern, with no "
      "pattern on average.\n"
      "- **Profiles.** flat (the null: A(r) = accuracy at every phase), a boundary dip (A "
      "lower by the gap at p mod S = S - 1) and an interior dip (lower at p mod S = 1), where p "
      "is the target key's position: example i's block of M phases starts at a random multiple "
      "of M, as in a sweep, so p mod S is not r mod S when S does not divide M.\n"
      "- **What is measured** is what `phasekv sweep` computes: `summarize()` (the period "
      "sign-flip test `detect_period`, the chi-square homogeneity test over all M phases, the "
      "interior test, the \"period = S\" test, the gap with its simultaneous interval, the "
      "bias-corrected gap and the null gap) and `evaluate_sla()` with `--max-gap G`. The suite "
      "report's interior column is the same interior test (src/suite/runs.cpp).\n\n"
      "Which null is the right one? A user asking \"does this model have a phase effect?\" means "
      "the population profile A(r). Replicas are a real example-by-phase interaction with a "
      "flat population profile, so for the user a rejection on replica data is a false "
      "positive. The sign-flip tests (src/eval/cluster_tests.h) are built for that null: each "
      "example's outcome vector, less its own mean, has expectation 0 under it whatever the "
      "correlation between its phases, and flipping the sign of whole vectors keeps that "
      "correlation (replicas included), which shuffling phases within an example did not. "
      "Both nulls are shown.\n\n";

  md += "## Verdicts: which tests hold their nominal rate\n\n";
  md +=
      "Target (issue 42): a false-positive rate within 5 % ± 1.5 % at alpha = 0.05. A "
      "setting counts as off target when its rate lies more than 2 Monte-Carlo SE outside "
      "[3.5 %, 6.5 %].\n\n";
  md += calibration_sentence("The period sign-flip test (detect_period, p < 0.05)",
                             calibration(indep, period), "independent outcomes");
  md += calibration_sentence("The period sign-flip test", calibration(repl, period),
                             "prefix-padding replicas");
  md += calibration_sentence("The chi-square homogeneity test (all M phases)",
                             calibration(indep, chi), "independent outcomes");
  md += calibration_sentence("The chi-square homogeneity test", calibration(repl, chi),
                             "prefix-padding replicas");
  md += calibration_sentence("The interior sign-flip test (folded mod S, boundary left out)",
                             calibration(indep, interior), "independent outcomes");
  md += calibration_sentence("The interior sign-flip test", calibration(repl, interior),
                             "prefix-padding replicas");
  md += gap_sla_stride_sentences(in);
  md +=
      "\nWhat they mean for a user:\n\n"
      "- A **significant period** (sign-flip p < 0.05) rejects \"the model's accuracy does not "
      "depend on the phase\" at the stated rate, with or without prefix-padding replicas. Its "
      "p-value is not floored at 1/(permutations + 1): a sweep flips on (up to 20,000 times) "
      "while fewer than 10 flipped statistics reach the observed one. The detected period "
      "comes with its bootstrap support (the share of example resamples that detect it).\n"
      "- **\"Period = S\"** (summary.json `stride_test`, when S is known and at most M/2) is two "
      "sign-flip tests: the profile folded mod S is not flat (component), and the profile does "
      "not deviate from its own S-periodic fit (residual). \"Supported\" means the first "
      "rejects and the second does not: the structure repeats with the stride and with nothing "
      "finer.\n"
      "- The **chi-square** p-value in summary.json counts every outcome as independent and is "
      "kept for reference only; nothing decides on it.\n"
      "- The **interior test** (\"interior phases differ\", summary.json `interior.test` and "
      "suite reports) folds each example's outcomes mod S first, so an example's M/S copies "
      "of a folded phase are one value, not M/S independent outcomes.\n"
      "- The **gap** is a maximum minus a minimum and is biased upward: compare it with the "
      "**null gap** printed beside it (the gap a flat profile shows with the same examples) "
      "and read the **bias-corrected gap** as the estimate. Its **interval** comes from "
      "simultaneous bands on the phase profile and always contains the observed gap; it covers "
      "the true gap at least as often as stated (it is conservative near a flat profile). The "
      "SLA gate fails a model when the interval's upper end exceeds `--max-gap`, so passing "
      "the gate needs enough examples to bound the gap: the SLA rows below say how often a "
      "flat model still fails each limit at each n.\n\n";

  md += "## Under the null: every setting\n\n";
  md +=
      "Accuracy is the flat A(r); n examples, each at every phase. `SLA fails --max-gap G`: "
      "how often `evaluate_sla` fails a model whose true gap is 0 (the gate fails when the "
      "gap's 95 % upper bound exceeds G, so on a flat model this is the gate's false-alarm "
      "rate; it is conservative by design, src/eval/sla_gate.h).\n\n";
  md += null_table(in) + "\n";

  md += "## The gap of a flat model\n\n";
  md +=
      "The gap is best minus worst of M noisy phase accuracies: a maximum minus a minimum, so "
      "its expectation is positive when the true gap is 0 and shrinks only like "
      "1/sqrt(n). Flat model, M = 24, S = 8, accuracy 0.5, independent outcomes:\n\n";
  md += null_n_table(in) + "\n";
  md += "![expected gap of a flat model](statistics/null_gap.svg)\n\n";

  const auto power = group(in, "power");
  md += "## Power against examples per phase\n\n";
  md +=
      "M = 24, S = 8, accuracies centred on 0.5 (the dip phases at 0.5 - gap/2, the others at "
      "0.5 + gap/2), independent outcomes given the example. `period = S`: significant and the "
      "detected period is the stride. Bias: mean observed gap minus true gap, ± its MC SE.\n\n";
  md += power_table(power) + "\n";
  md += "![power of the period test, boundary dip](statistics/power_period_boundary.svg)\n\n";
  md += "![power of the period test, interior dip](statistics/power_period_interior.svg)\n\n";
  md += "![power of the interior test, interior dip](statistics/power_interior_test.svg)\n\n";
  md += "![coverage of the gap's 95 % interval](statistics/gap_coverage.svg)\n\n";
  const auto prep = group(in, "power-replica");
  if (!prep.empty()) {
    md +=
        "The interior dip with prefix-padding replicas (n = 100): replicas repeat each example's "
        "own noise at r and r + S, so an example carries less independent evidence per phase "
        "than without them, and power is lower.\n\n";
    md += power_table(prep) + "\n";
  }

  md += "## A stride that does not divide the modulus\n\n";
  md +=
      "A boundary dip of 50 pp (accuracy 0.9, 0.4 at p mod S = S - 1), n = 100, stride "
      "unknown to the analysis (the blind audit). With every outcome's key position known (as "
      "every phasekv sweep and audit records them), detect_period tries every P in [2, M/2]: "
      "a design with modulus M resolves strides up to M/2 (two repetitions inside one "
      "example's phases), whether or not they divide M. Without positions it can only try the "
      "divisors of M.\n\n";
  md += stride_table(in) + "\n";

  md += "## Planning: examples per phase, and verdicts that know their power\n\n";
  md +=
      "`phasekv plan` (and `sweep --plan`, `audit --plan`, which fill in the run's modulus, "
      "stride and tokens per item) answers two questions by simulating the sweeps that would be "
      "run, with the tests above: how many examples per phase make the period test find a "
      "boundary dip of `--min-gap` pp (power 80 % by default), and how many make a flat model "
      "pass the SLA gate `--max-gap` at that size. The second is always larger: certifying "
      "that a gap is absent needs its interval's upper end below the limit, which shrinks like "
      "1/sqrt(n), while finding a dip only needs the dip to stand out of the noise.\n\n"
      "`sweep --min-gap G` and `audit --min-gap G` attach the same simulation to the run's own "
      "summary (`sensitivity` in summary.json): the power of the period test against a G pp "
      "dip at the run's modulus, stride (M/2 when unknown: the period with fewest dipped "
      "phases, so the hardest) and examples per phase, with the strong phases at the observed "
      "mean accuracy. A run whose period test finds nothing then ends in one of three "
      "verdicts: the gap's 95 % interval lies below G (a G pp gap is ruled out: an equivalence "
      "statement, the one the SLA gate makes); the power is at least 80 % (a G pp dip would "
      "most likely have been found); or neither, and the verdict is \"inconclusive at G pp\" "
      "with the examples per phase that would reach 80 %. The power is computed for the "
      "user's G, never for the observed gap: power computed from the observed effect is a "
      "function of the p-value and says nothing new. The simulation assumes the latent "
      "within-example correlation 0.5 and independent phases given the example (in-sequence "
      "padding); with prefix-padding replicas an example carries less independent evidence per "
      "phase (the replica table above), so the plan is optimistic for prefix padding.\n\n";

  md += "## What is still off target (measured here)\n\n";
  md += fixes_list(in) + "\n";

  md +=
      "## Why each test behaves as it does\n\n"
      "- **Sign flips** are a wild cluster bootstrap: the test statistic is recomputed with "
      "each example's centred vector multiplied by +1 or -1. Under the flat null every vector "
      "has mean zero, so the flipped data are as likely as the observed ones to the first two "
      "moments, whatever the correlation inside an example. With skewed outcomes (accuracy "
      "near 0 or 1) and few examples the flips are only approximately exact; the accuracy 0.05 "
      "and 0.95 rows measure how far.\n"
      "- **Chi-square, independent outcomes**: an example's phases share its difficulty, so "
      "the difference between two phases' accuracies varies less than for independent "
      "draws (the example effect cancels); a test that assumes independence then overstates "
      "the noise and rejects too rarely.\n"
      "- **The gap's interval** bounds every phase at once (Sidak level over the phases) on "
      "the profile with each example's level removed, where the example effect cancels. The "
      "true gap is a difference of two phases, both inside their bands with 95 % probability, "
      "so the interval covers it at least that often; near a flat profile it is wider than "
      "needed, which is what the SLA gate's conservative reading asks for.\n"
      "- **The bias-corrected gap** subtracts the bootstrap's estimate of the max-minus-min "
      "bias (the mean resampled gap minus the observed one). It removes most of the bias under "
      "the alternatives and part of it for a flat model, where no estimate of a maximum "
      "difference can be unbiased and non-negative at once.\n\n";
  md +=
      "## How to read these numbers\n\n"
      "- Each rate is a proportion over N simulated datasets; its Monte-Carlo SE is "
      "sqrt(p (1 - p) / N), about 0.7 pp for p = 5 % and N = 1000. A rate that differs from "
      "5 % by less than 2 SE is consistent with a calibrated test.\n"
      "- The simulation is a model, not the bundled models: latent correlation 0.5 and replica "
      "probability 0.95 are choices. Replicas are what prefix padding produces (phases r and "
      "r + S see the same input up to a shift); in-sequence padding is closer to the "
      "independent setting. The sign-flip tests do not assume either.\n"
      "- Fewer flips than a sweep uses change the tests slightly: with 199 flips a test's "
      "rate is at most 4.5 % by construction.\n";
  return md;
}

void write_statistics_page(const std::string& dir, const PageInputs& in) {
  ensure_directory(dir + "/statistics");
  const auto power = group(in, "power");
  const Pick period = [](const Result& r) -> const Rate& { return r.period_reject; };
  const Pick interior = [](const Result& r) -> const Rate& { return r.interior_reject; };
  const Pick covered = [](const Result& r) -> const Rate& { return r.gap_covered; };
  const std::tuple<std::string, Profile, Pick, std::string, std::string, double> charts[] = {
      {"power_period_boundary", Profile::boundary, period, "Period test power, boundary dip",
       "P(p < 0.05)", 0.05},
      {"power_period_interior", Profile::interior, period, "Period test power, interior dip",
       "P(p < 0.05)", 0.05},
      {"power_interior_test", Profile::interior, interior,
       "Interior sign-flip test power, interior dip", "P(p < 0.05)", 0.05},
      {"gap_coverage", Profile::boundary, covered,
       "Coverage of the gap's 95 % interval, boundary dip", "P(CI contains true gap)", 0.95}};
  for (const auto& [name, profile, pick, title, y, ref] : charts) {
    const std::string svg = curve_svg(power, profile, pick, title, y, ref);
    if (!svg.empty()) write_file_atomic(dir + "/statistics/" + name + ".svg", svg);
  }
  {  // the expected gap of a flat model against n
    const auto rs = flat_by_examples(in);
    if (!rs.empty()) {
      LineSeries ser;
      ser.label = "mean observed gap";
      ser.markers = true;
      for (const auto* r : rs) {
        ser.x.push_back(r->setting.examples);
        ser.y.push_back(r->gap_mean_pp);
        ser.lo.push_back(r->gap_mean_pp - 1.96 * r->gap_se_pp);
        ser.hi.push_back(r->gap_mean_pp + 1.96 * r->gap_se_pp);
      }
      LineChart c;
      c.title = "Observed gap of a flat model (true gap 0)";
      c.caption = "M = 24, accuracy 0.5, independent outcomes given the example";
      c.x_label = "examples per phase";
      c.y_label = "mean gap, pp";
      c.y_lo = 0.0;
      c.series.push_back(ser);
      write_file_atomic(dir + "/statistics/null_gap.svg", line_svg(c));
    }
  }
  write_file_atomic(dir + "/STATISTICS.md", statistics_markdown(in));
}

}  // namespace phasekv::calibrate
