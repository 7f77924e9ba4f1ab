// Each subcommand registers itself on the CLI11 app; main() only dispatches.
#pragma once
#include <CLI/CLI.hpp>

#include "eval/sla_gate.h"

namespace phasekv::cli {

void register_init(CLI::App& app);
void register_info(CLI::App& app);
void register_logits(CLI::App& app);
void register_sweep(CLI::App& app);
void register_compare(CLI::App& app);
void register_train(CLI::App& app);
void register_serve(CLI::App& app);
void register_audit(CLI::App& app);
void register_bench(CLI::App& app);
void register_repro(CLI::App& app);
// knockout, gates, gate-cycle and `explain report` (cmd_explain.cpp).
void register_explain(CLI::App& app);
void register_theory(CLI::App& app);
// `mitigations report` and `mitigations commands` (cmd_mitigations.cpp).
void register_mitigations(CLI::App& app);
void register_probe(CLI::App& app);
void register_tokenizer(CLI::App& app);
void register_calibrate(CLI::App& app);  // cmd_calibrate.cpp, docs/STATISTICS.md
void register_plan(CLI::App& app);       // cmd_plan.cpp, eval/plan.h
void register_conform(CLI::App& app);    // cmd_conform.cpp, eval/conform.h, docs/CONFORM.md

// Threads for libtorch: it defaults to 1 on Debian's build, so every command sets it explicitly.
void set_threads(int n);

// A libtorch thread count: 0 (all cores) up to 8 per core, at most 1024 (util/threads.h).
CLI::Validator compute_threads();
// For unsigned options: CLI11 reads "-1" into a uint64_t as 2^64 - 1; this refuses a minus sign.
CLI::Validator non_negative();
// An integer >= 1 (--chunk), with a message naming what is allowed.
CLI::Validator at_least_one();

// The worst-phase SLA gate (eval/sla_gate.h) of sweep and audit: --max-gap and --min-worst on
// `cmd`, filling `gate`.
// --min-gap PP (sweep, audit): the smallest gap worth detecting; the verdict says whether the
// examples could have found it (eval/plan.h attach_sensitivity).
void add_min_gap_option(CLI::App* cmd, double& min_gap_pp);
void add_sla_options(CLI::App* cmd, SlaGate& gate);
// Thrown by a command whose results are written but whose SLA gate failed; main() returns
// kSlaFailedExit. The command has printed the verdict.
struct SlaGateFailed {};
// Thrown by `audit` when it finished and wrote its files but some items' latest records are errors
// (checked after the SLA gate: a failed gate's 4 wins); main() returns kAuditErrorsExit.
struct AuditHadErrors {};
inline constexpr int kAuditErrorsExit = 5;
// Prints the gate's one-line verdict (nothing when no gate was asked for) and throws
// SlaGateFailed when the model fails it.
void enforce_sla(const SlaGate& gate, const PhaseSummary& summary);

}  // namespace phasekv::cli
