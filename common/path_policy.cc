#include "common/path_policy.h"

#include <limits.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

// "/a/b/" -> "/a/b"; "/" stays.
std::string WithoutTrailingSlash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Both absolute, resolved and without a trailing slash.
bool IsWithin(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  if (path.size() < root.size() || path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

}  // namespace

std::string ResolveExistingPrefix(const std::string& path) {
  std::string resolved = "/";
  std::vector<std::string> rest;
  bool resolving = true;
  for (const fs::path& component : fs::path(path).relative_path()) {
    const std::string name = component.string();
    if (name.empty() || name == ".") continue;
    if (resolving) {
      const std::string candidate = resolved == "/" ? "/" + name : resolved + "/" + name;
      // Whatever stops resolution (missing, not a directory, no permission,
      // a loop) ends the part the kernel can tell us about; the rest is
      // taken lexically, as a path that does not exist yet would be created.
      std::unique_ptr<char, decltype(&free)> real(realpath(candidate.c_str(), nullptr), &free);
      if (real != nullptr) {
        resolved = real.get();
        continue;
      }
      resolving = false;
    }
    rest.push_back(name);
  }
  fs::path out(resolved);
  for (const std::string& name : rest) out /= name;
  return WithoutTrailingSlash(out.lexically_normal().string());
}

PathPolicy PathPolicy::Unrestricted() {
  PathPolicy policy;
  policy.unrestricted_ = true;
  return policy;
}

absl::StatusOr<PathPolicy> PathPolicy::Create(const std::vector<std::string>& roots) {
  PathPolicy policy;
  for (const std::string& root : roots) {
    if (root.empty()) {
      return absl::InvalidArgumentError("allowed path roots: a root must not be empty");
    }
    if (root.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("allowed path roots: a root must not contain a NUL byte");
    }
    std::error_code error;
    fs::path absolute = fs::absolute(root, error);
    if (error) {
      return absl::InvalidArgumentError(absl::StrCat("allowed path roots: cannot make '", root,
                                                     "' absolute: ", error.message()));
    }
    const std::string normal = WithoutTrailingSlash(absolute.lexically_normal().string());
    policy.roots_.push_back(normal);
    policy.resolved_roots_.push_back(ResolveExistingPrefix(normal));
  }
  return policy;
}

std::string PathPolicy::DescribeRoots() const {
  if (unrestricted_) return "any path";
  return absl::StrCat("[", absl::StrJoin(roots_, ", "), "]");
}

absl::StatusOr<std::string> PathPolicy::Confine(absl::string_view field,
                                                absl::string_view path) const {
  if (unrestricted_) return std::string(path);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must not contain a NUL byte"));
  }
  if (path.size() >= PATH_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be shorter than ", PATH_MAX, " bytes, got ", path.size()));
  }
  const auto outside = [&] {
    return absl::InvalidArgumentError(absl::StrCat(field, " '", path,
                                                   "' is outside the allowed roots ",
                                                   DescribeRoots(),
                                                   "; add its parent to --allowed-path-roots"));
  };
  const bool relative = path.front() != '/';
  if (relative && roots_.empty()) return outside();
  const std::string absolute =
      relative ? absl::StrCat(roots_.front(), "/", path) : std::string(path);
  const std::string resolved = ResolveExistingPrefix(absolute);
  for (const std::string& root : resolved_roots_) {
    if (IsWithin(resolved, root)) return relative ? resolved : std::string(path);
  }
  return outside();
}

}  // namespace sluice
