#ifndef SLUICE_COMMON_PATH_POLICY_H_
#define SLUICE_COMMON_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice {

// Which files a request may make a service open: those under one of the
// directories ("roots") the service was configured with
// (--allowed-path-roots). A run spec names paths (model.hf_model_dir,
// task.dataset.path, checkpoint.dir, ...) that a service reads, or writes,
// with its own rights; without a policy anyone who can submit a run could
// make the trainer write checkpoints into /etc or read any file it can.
//
// Confinement is judged on the path the kernel would open: the longest
// prefix of the path that resolves is resolved with realpath(3) (so `..`
// after a symlink and symlinks that point outside are followed), the rest,
// which does not exist yet, is normalised lexically, and the result must
// lie under a root (component-wise: /data2 is not under /data). Roots are
// resolved the same way when the policy is made, so a root that is itself
// a symlink admits the paths under its target.
//
// Relative paths are resolved against the first root (not the process's
// working directory), and Confine returns the resolved path: the caller
// opens that, so that what is checked is what is opened. Absolute paths
// come back unchanged.
//
// A path outside every root gets one message, whatever is or is not on the
// disk there: "<field> '<path>' is outside the allowed roots [...]; add its
// parent to --allowed-path-roots". Existence, permissions and symlink loops
// outside the roots never show in it. (What the check cannot close: a
// symlink planted inside a root between the check and the open. Whoever can
// write inside a root is trusted.)
//
// Immutable after construction; thread-safe. Confine does O(components)
// realpath(3) calls.
class PathPolicy {
 public:
  // No confinement: Confine returns every path unchanged. For in-process
  // tests and tools run by the file's owner; services take Create.
  static PathPolicy Unrestricted();

  // Confines to `roots` (absolute, or relative to the working directory;
  // need not exist yet). An empty list admits no path at all.
  // INVALID_ARGUMENT for an empty root string.
  static absl::StatusOr<PathPolicy> Create(const std::vector<std::string>& roots);

  // The path to open for `path`, named by the request's `field` (e.g.
  // "checkpoint.dir", used in messages): `path` itself when absolute, the
  // resolved path under the first root when relative. INVALID_ARGUMENT with
  // the uniform message above when it is outside every root (and for an
  // empty path, a NUL byte, or one longer than PATH_MAX). Reads the file
  // system (realpath) but never tells what it found outside the roots.
  absl::StatusOr<std::string> Confine(absl::string_view field, absl::string_view path) const;

  bool unrestricted() const { return unrestricted_; }
  // The roots as configured, made absolute and lexically normal.
  const std::vector<std::string>& roots() const { return roots_; }
  // "[/var/lib/sluice, /models]"; "any path" when unrestricted.
  std::string DescribeRoots() const;

 private:
  PathPolicy() = default;

  bool unrestricted_ = false;
  std::vector<std::string> roots_;
  std::vector<std::string> resolved_roots_;  // What paths are compared with.
};

// `path` as the kernel would resolve it, as far as it exists (see
// PathPolicy). `path` must be absolute. Exposed for tests.
std::string ResolveExistingPrefix(const std::string& path);

}  // namespace sluice

#endif  // SLUICE_COMMON_PATH_POLICY_H_
