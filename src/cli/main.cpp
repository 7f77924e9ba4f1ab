#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/usage.h"
#include "eval/runner.h"
#include "util/allocator.h"
#include "util/error.h"

int main(int argc, char** argv) {
  phasekv::keep_freed_memory_in_heap();
  CLI::App app{
      "phasekv: find, measure, explain and remove periodic weak spots of chunked KV-cache "
      "compression"};
  app.require_subcommand(1);
  // --help shows every option's default from the variable it binds: written once, never stale.
  app.option_defaults()->always_capture_default();
  phasekv::cli::register_init(app);
  phasekv::cli::register_info(app);
  phasekv::cli::register_logits(app);
  phasekv::cli::register_sweep(app);
  phasekv::cli::register_compare(app);
  phasekv::cli::register_train(app);
  phasekv::cli::register_serve(app);
  phasekv::cli::register_audit(app);
  phasekv::cli::register_bench(app);
  phasekv::cli::register_repro(app);
  phasekv::cli::register_explain(app);
  phasekv::cli::register_theory(app);
  phasekv::cli::register_mitigations(app);
  phasekv::cli::register_probe(app);
  phasekv::cli::register_tokenizer(app);
  phasekv::cli::register_calibrate(app);
  phasekv::cli::register_plan(app);
  phasekv::cli::register_conform(app);
  phasekv::cli::finish_app(app);
  if (const auto status = phasekv::cli::reject_unknown_command(app, argc, argv)) return *status;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const phasekv::cli::SlaGateFailed&) {
    return phasekv::kSlaFailedExit;  // the verdict line is printed
  } catch (const phasekv::cli::AuditHadErrors&) {
    return phasekv::cli::kAuditErrorsExit;  // the count is printed
  } catch (const phasekv::RunStopped& e) {  // what was scored is kept; a rerun resumes
    std::cerr << "phasekv: " << e.what() << "\n";
    return phasekv::kRunStoppedExit;
  } catch (const phasekv::Error& e) {
    std::cerr << "phasekv: error: " << e.what() << "\n";
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // a path no flag check foresaw
    std::string what = e.what();  // "filesystem error: cannot create directories: ... [PATH]"
    if (what.rfind("filesystem error: ", 0) == 0) what.erase(0, 18);
    std::cerr << "phasekv: error: " << what << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "phasekv: internal tensor error: " << e.what_without_backtrace() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "phasekv: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
