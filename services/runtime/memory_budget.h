#ifndef SLUICE_SERVICES_RUNTIME_MEMORY_BUDGET_H_
#define SLUICE_SERVICES_RUNTIME_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace sluice::runtime {

class ServiceContext;

// --memory-budget, the same flag with the same meaning on every service that
// holds a run's big allocations (the trainer, the rollout workers, the
// replay buffer): how much memory the service may use, as bytes ("17179869184"),
// a size ("16GiB", "512M") or a share of the machine or its cgroup ("80%"),
// parsed by run::ParseMemorySize. The service reports it in its status
// (memory_budget_bytes) so that the controller can refuse a run that does
// not fit at submit, refuses requests whose estimate exceeds it itself
// (another client may call it), and exports it as the gauge
// sluice_memory_budget_bytes.
//
//   runtime::MemoryBudgetFlag memory_budget(main.app());
//   return main.Run(argc, argv, [&](ServiceContext& context) {
//     const int64_t budget = memory_budget.Apply(context);
//     ...
class MemoryBudgetFlag {
 public:
  static constexpr const char* kDefault = "80%";

  // Adds the flag to `app` (so also the config file's memory_budget key). A
  // value ParseMemorySize refuses is a usage error when `app` parses: the
  // process exits 2 naming the flag and the value.
  explicit MemoryBudgetFlag(CLI::App& app);

  // Call once `app` has parsed (in the setup function): the budget in
  // bytes, logged, and exported as sluice_memory_budget_bytes on the
  // context's registry. 0 (unknown: nothing is checked against it) only
  // when the flag was left at its default share and this machine's memory
  // cannot be read (logged as a warning).
  int64_t Apply(ServiceContext& context) const;

  const std::string& text() const { return text_; }

 private:
  std::string text_ = kDefault;
};

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_MEMORY_BUDGET_H_
