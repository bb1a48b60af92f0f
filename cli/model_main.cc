// sluice-model: `sluice logits`, `generate` and `init-model`, in a binary of their
// own so that LibTorch (about a second to load and 170 MB resident) is paid
// only by the commands that run a model; `sluice logits ...`,
// `sluice generate ...` and `sluice init-model ...` exec this binary from the
// same directory.
#include <iostream>

#include "CLI/CLI.hpp"
#include "common/build_info.h"
#include "cli/model_command.h"

int main(int argc, char** argv) {
  CLI::App app{"sluice logits / generate / init-model: Hugging Face model directories on CPU"};
  app.name("sluice");
  app.set_version_flag("--version", std::string("sluice ") + sluice::kVersion);
  app.require_subcommand(1);
  sluice::cli::ModelFlags flags;
  sluice::cli::InitModelFlags init_flags;
  const sluice::cli::ModelCommands commands =
      sluice::cli::AddModelCommands(app, &flags, &init_flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (*commands.logits) return sluice::cli::RunLogits(flags, std::cout, std::cerr);
  if (*commands.generate) return sluice::cli::RunGenerate(flags, std::cout, std::cerr);
  if (*commands.init_model) return sluice::cli::RunInitModel(init_flags, std::cout, std::cerr);
  return 2;
}
