#ifndef SLUICE_COMMON_FUZZ_FUZZ_FILES_H_
#define SLUICE_COMMON_FUZZ_FUZZ_FILES_H_

#include <string>

#include "absl/strings/string_view.h"

// Files for fuzz targets whose parser reads a path (a dataset, a safetensors
// file, a model directory): the fuzz input is written to a scratch file and
// the parser reads it the way a service does. Writing a few KB costs
// microseconds, far less than the parsers themselves.
namespace sluice::fuzz {

// A directory private to this process (under $TMPDIR, else /tmp), made on
// first use and removed at a normal exit. Aborts when it cannot be made: a
// broken machine, not a finding.
const std::string& ScratchDir();

// Writes `data` to ScratchDir()/`name`, replacing what was there, and returns
// the path. Aborts on an I/O error.
std::string WriteScratchFile(absl::string_view name, absl::string_view data);

}  // namespace sluice::fuzz

#endif  // SLUICE_COMMON_FUZZ_FUZZ_FILES_H_
