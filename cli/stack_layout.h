#ifndef SLUICE_CLI_STACK_LAYOUT_H_
#define SLUICE_CLI_STACK_LAYOUT_H_

// Where a local stack's files go and what each of its services is told on
// its command line: the part of `sluice up` that is pure data, tested
// without starting a process (local_stack.h starts and supervises them).

#include <optional>
#include <string>
#include <vector>

#include "cli/stack_options.h"

namespace sluice::cli {

class StackLayout {
 public:
  explicit StackLayout(const LocalStackOptions& options) : options_(options) {}

  // <state_dir>/endpoints.json.
  std::string endpoints_path() const;
  // <state_dir>/tls, absolute: `sluice up --tls`'s CA, certificates and
  // tokens (stack_security.h).
  std::string tls_dir() const;
  // <state_dir>/logs/<service name>.log, absolute.
  std::string log_path(const std::string& service_name) const;
  // The runs directory the controller is given (absolute).
  std::string runs_dir() const;
  // The replay buffer's data directory (absolute); empty when in memory.
  std::string buffer_data_dir() const;
  // The --allowed-path-roots the services get (absolute): the options' (or
  // the working directory), then the state and runs directories unless a
  // root already holds them.
  std::vector<std::string> allowed_path_roots() const;

  // The command line of `service`: its binary, then the flags every service
  // gets (listen address on `port`, "0" for any; metrics on any port; the
  // ready pipe; the log format), then its kind's own flags, then the TLS
  // flags when `security` is set. `stack`: every service's endpoint as
  // known now, in start order (the controller is told the addresses of
  // those before it, a rollout worker the controller's).
  std::vector<std::string> Argv(const ServiceEndpoint& service, const std::string& port,
                                int ready_fd, const std::vector<ServiceEndpoint>& stack,
                                const std::optional<StackSecurity>& security) const;

  // The flags of `service`'s kind (part of Argv).
  std::vector<std::string> FlagsFor(const ServiceEndpoint& service,
                                    const std::vector<ServiceEndpoint>& stack) const;
  // "--memory-budget=40%" for a service that holds a run's memory; empty
  // for the others.
  std::string MemoryBudgetFlag(const std::string& kind) const;

 private:
  // The controller's: the runs directory, the workers this stack starts
  // (trusted: their groups are verified at a sampled fraction), and where
  // the services started before it are.
  std::vector<std::string> ControllerFlags(const std::vector<ServiceEndpoint>& stack) const;

  const LocalStackOptions& options_;
};

}  // namespace sluice::cli

#endif  // SLUICE_CLI_STACK_LAYOUT_H_
