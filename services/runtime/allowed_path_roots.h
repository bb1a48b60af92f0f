#ifndef SLUICE_SERVICES_RUNTIME_ALLOWED_PATH_ROOTS_H_
#define SLUICE_SERVICES_RUNTIME_ALLOWED_PATH_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/path_policy.h"

namespace CLI {
class App;
}

namespace sluice::runtime {

// --allowed-path-roots (config key allowed_path_roots, a list), the same
// flag on every service that opens a path a run spec names (the controller,
// the trainer, the rollout workers): the directories those paths must lie
// in (PathPolicy; run::ConfineRunSpecPaths lists the fields). A relative
// path in a spec is resolved against the first root.
//
// Default: the service's working directory, where a relative path resolved
// before the flag existed: `sluice up` runs every service in its own working
// directory (and adds its state and runs directories), the container image
// in /var/lib/sluice (models/, checkpoints/, runs/). A service whose roots
// include "/" says at start that a run spec may name any path.
//
//   runtime::AllowedPathRootsFlag path_roots(main.app());
//   return main.Run(argc, argv, [&](ServiceContext& context) {
//     ASSIGN_OR_RETURN(PathPolicy paths, path_roots.Apply());
//     ...
class AllowedPathRootsFlag {
 public:
  // Adds the flag to `app` (so also the config file's key).
  explicit AllowedPathRootsFlag(CLI::App& app);

  // Call once `app` has parsed (in the setup function): the policy, logged.
  // INVALID_ARGUMENT (the service exits 2) for an empty root.
  absl::StatusOr<PathPolicy> Apply() const;

 private:
  std::vector<std::string> roots_;
};

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_ALLOWED_PATH_ROOTS_H_
