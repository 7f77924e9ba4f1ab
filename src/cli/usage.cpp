#include "cli/usage.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

namespace phasekv::cli {
namespace {

// "phasekv sweep": the command whose options the error is about, for its --help hint.
std::string command_path(const CLI::App* app) {
  std::string path = "phasekv";
  for (const CLI::App* level = app; !level->get_subcommands().empty();) {
    level = level->get_subcommands().front();
    path += " " + level->get_name();
  }
  return path;
}

std::string usage_error(const CLI::App* app, const CLI::Error& e) {
  return fmt::format("phasekv: error: {}\nRun '{} --help' for more information.\n", e.what(),
                     command_path(app));
}

// Every option of `app` and of its subcommands, recursively.
void for_each_option(CLI::App& app, const std::function<void(CLI::Option*)>& f) {
  for (CLI::Option* o : app.get_options()) f(o);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    for_each_option(*sub, f);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string command_list(const CLI::App& app) {
  std::string out = "commands:\n";
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    out += fmt::format("  {:<12} {}\n", sub->get_name(), sub->get_description());
  return out;
}

// The known name nearest `typed` by edit distance, when it is close enough to be a typo ("sweep"
// for "swep"); "" otherwise.
std::string closest_name(const std::string& typed, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const auto& n : names) {
    const size_t d = edit_distance(typed, n);
    if (d < best_distance) best = n, best_distance = d;
  }
  // Two edits, or a third of a long name: "swep", "sweeep", "knokcout"; not "x" for "init".
  const size_t allowed = std::max<size_t>(2, typed.size() / 3);
  return best_distance <= allowed && best_distance < typed.size() ? best : "";
}

}  // namespace

void finish_app(CLI::App& app) {
  app.set_version_flag("--version", std::string("phasekv ") + version(),
                       "print the version (git describe of the build's checkout) and exit");
  app.failure_message(usage_error);
  // always_capture_default() shows "--examples INT=0 REQUIRED": a value the user must give has
  // no default worth showing.
  for_each_option(app, [](CLI::Option* o) {
    if (o->get_required()) o->default_str("");
  });
}

std::optional<int> reject_unknown_command(const CLI::App& app, int argc, const char* const* argv) {
  // Walk the leading command words: `phasekv repro reprot` is as wrong as `phasekv swep`. A level
  // that takes positional arguments (`compare DIR...`) decides for itself.
  const CLI::App* level = &app;
  std::string path = "phasekv";
  for (int i = 1;; ++i) {
    const auto subs = level->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty() ||
        !level->get_options([](const CLI::Option* o) { return o->get_positional(); }).empty())
      return std::nullopt;
    if (i >= argc) {
      if (level != &app) return std::nullopt;  // `phasekv repro` alone runs repro's checks
      std::cerr << "phasekv: error: no command given\n" << command_list(app);
      std::cerr << "Run 'phasekv --help' for more information.\n";
      return static_cast<int>(CLI::ExitCodes::RequiredError);
    }
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return std::nullopt;
    const auto it = std::find_if(subs.begin(), subs.end(),
                                 [&](const CLI::App* s) { return s->check_name(word); });
    if (it != subs.end()) {
      level = *it;
      path += " " + word;
      continue;
    }
    std::vector<std::string> names;
    for (const CLI::App* s : subs) names.push_back(s->get_name());
    const std::string near = closest_name(word, names);
    std::cerr << fmt::format("{}: error: unknown command '{}'{}\n", path, word,
                             near.empty() ? "" : " (did you mean '" + near + "'?)");
    std::cerr << command_list(*level)
              << fmt::format("Run '{} --help' for more information.\n", path);
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
}

}  // namespace phasekv::cli
