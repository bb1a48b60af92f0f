#ifndef SLUICE_CLI_STACK_COMMANDS_H_
#define SLUICE_CLI_STACK_COMMANDS_H_

// `sluice up` and `sluice quickstart`: the flags they share on top of
// LocalStackOptions, and running each (main.cc parses the command line).

#include <cstdint>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/local_stack.h"

namespace sluice::cli {

// Flags of `up` and `quickstart` that are not LocalStackOptions fields as
// they stand: converted by ApplyStackFlags after parsing.
struct StackFlags {
  std::string restart = "on-failure";
  std::string restart_window = "2m";
  std::optional<std::string> buffer_data_dir;
  std::string liveness_period = "5s";
  std::string liveness_timeout = "2s";
};

// Adds the stack's flags (the LocalStackOptions fields and StackFlags) to
// `command`.
void AddStackFlags(CLI::App* command, LocalStackOptions* options, StackFlags* flags);

// `flags` into `options`, after parsing; false (having said why, naming
// `command`) when one does not parse.
bool ApplyStackFlags(const StackFlags& flags, const std::string& command,
                     LocalStackOptions* options);

// `sluice up`: runs and supervises the local stack until Ctrl-C or SIGTERM;
// `ready_fd` >= 0 gets a line once every service is serving. The exit code.
int RunUp(LocalStackOptions options, int ready_fd);

struct QuickstartFlags {
  std::string spec_path;  // empty = the built-in spec
  std::optional<uint64_t> seed;
  std::optional<int> max_staleness;
};

// `sluice quickstart`: the local stack, the built-in run spec (or
// `flags.spec_path`), a live watch of the run, then the stack torn down. The
// exit code.
int RunQuickstart(LocalStackOptions options, const QuickstartFlags& flags);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_STACK_COMMANDS_H_
