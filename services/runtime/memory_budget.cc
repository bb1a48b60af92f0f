#include "services/runtime/memory_budget.h"

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "common/run/run_memory.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "services/runtime/service_main.h"

namespace sluice::runtime {

MemoryBudgetFlag::MemoryBudgetFlag(CLI::App& app) {
  app.add_option("--memory-budget", text_,
                 "memory this service may use: bytes, a size (16GiB, 512M) or a share of the "
                 "machine or its cgroup (80%); runs and requests whose estimate exceeds it are "
                 "refused")
      ->capture_default_str()
      ->type_name("SIZE")
      ->check([](const std::string& value) -> std::string {
        absl::StatusOr<int64_t> bytes = run::ParseMemorySize(value);
        return bytes.ok() ? "" : std::string(bytes.status().message());
      });
}

int64_t MemoryBudgetFlag::Apply(ServiceContext& context) const {
  absl::StatusOr<int64_t> bytes = run::ParseMemorySize(text_);
  if (!bytes.ok()) {
    // Only the default can get here (CLI11 checked a given value): a
    // machine whose memory cannot be read. The service still starts.
    log::Warning("no memory budget: nothing is checked against one",
                 {{"memory_budget", text_}, {"error", std::string(bytes.status().message())}});
    bytes = 0;
  } else {
    log::Info("memory budget", {{"memory_budget", text_},
                                {"bytes", *bytes},
                                {"size", run::FormatBytes(*bytes)}});
  }
  prometheus::BuildGauge()
      .Name("sluice_memory_budget_bytes")
      .Help("Memory this service may use (--memory-budget); 0 = unknown")
      .Register(context.metrics_registry())
      .Add({})
      .Set(static_cast<double>(*bytes));
  return *bytes;
}

}  // namespace sluice::runtime
