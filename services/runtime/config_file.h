#ifndef SLUICE_SERVICES_RUNTIME_CONFIG_FILE_H_
#define SLUICE_SERVICES_RUNTIME_CONFIG_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace CLI {
class App;
}

namespace sluice::runtime {

// YAML configuration files for every Sluice binary.
//
// A config file is a flat YAML mapping whose keys are the binary's long flags
// with underscores (`listen_address: 0.0.0.0:50051` is `--listen-address`).
// Rather than a second parser with its own defaults, each key becomes the flag
// it names, placed before the command line's own arguments; every option takes
// its last value, so a flag on the command line overrides the file.
//
// Errors name the file, the key and, for unknown keys, the known ones, so a
// typo ("listen_adress") is caught instead of silently ignored.

// Reads `path` and returns the equivalent "--flag=value" arguments. A sequence
// value repeats the flag; a nested mapping is an error.
absl::StatusOr<std::vector<std::string>> ConfigFileToArgs(const std::string& path,
                                                          const CLI::App& app);

// Finds "--config PATH" / "--config=PATH" in argv (without parsing anything
// else); empty when absent.
std::string FindConfigFlag(int argc, const char* const* argv);

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_CONFIG_FILE_H_
