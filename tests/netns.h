#ifndef SLUICE_TESTS_NETNS_H_
#define SLUICE_TESTS_NETNS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::testing {

// Runs the iproute2 `ip` binary with `args`; returns its output (stdout and
// stderr together). A non-zero exit is an error quoting the command and the
// output. Blocks until it exits (at most 30 s).
absl::StatusOr<std::string> RunIp(const std::vector<std::string>& args);

// Names of what a TestNetwork makes, all carrying the pid of the process
// that made them, so that parallel tests never collide and leftovers of a
// test that was killed can be recognised and removed by the next one.
// "sluice-<pid>-<host>": a host's network namespace ("switch" for the bridge).
std::string NamespaceName(pid_t owner, absl::string_view host);
// The owner's pid when `name` is one of NamespaceName's; nullopt otherwise.
std::optional<pid_t> NamespaceOwner(absl::string_view name);
// "sluice<pid>": the test process's own end of its link to the switch, in
// the namespace the test runs in (interface names are at most 15
// characters).
std::string UplinkName(pid_t owner);
std::optional<pid_t> UplinkOwner(absl::string_view name);
// Namespace names in the output of `ip netns list` ("name (id: 3)" lines).
std::vector<std::string> ParseNetnsList(absl::string_view output);

// A private IPv4 network of test "hosts", each a network namespace, joined
// by a Linux bridge in a "switch" namespace:
//
//     test process (its own namespace): sluice<pid> 10.231.S.1/24
//        │ veth
//     ┌──┴──────────── sluice-<pid>-switch: bridge br0 ──────────────┐
//     │ port p-<host0>        port p-<host1>        ...              │
//     └──┬────────────────────┬──────────────────────────────────────┘
//        │ veth               │ veth
//     sluice-<pid>-<host0>   sluice-<pid>-<host1>     (lo up, eth0 10.231.S.2, .3, ...)
//
// Hosts have no default route: traffic can reach only the other hosts and
// the test process. The test process reaches every host through its uplink
// (it plays the operator's machine), so a host address is an ordinary
// gRPC target for it. Disconnect() takes a host's switch port down (the
// cable pulled at the switch): the host keeps its address and its
// processes, and packets to and from it are dropped silently, as in a real
// partition; Reconnect() brings the port back.
//
// The subnet S is one that no route or address of the test's own namespace
// uses, and is locked (a file lock under /tmp) for the network's lifetime
// so that two tests at once take different ones.
//
// Creating one needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2.
// The destructor removes every namespace and link it made, also when
// Create() fails half way; processes still running in a host's namespace
// should be stopped first (a namespace lives on, unnamed, while a process
// is in it). Create() also removes the leftovers of tests that died without
// cleaning up (their pid is no longer alive).
//
// Thread-compatible.
class TestNetwork {
 public:
  // Host names: 1-12 characters of [a-z0-9-], unique, not "switch".
  // FAILED_PRECONDITION when network namespaces cannot be made here (not
  // root, no `ip`, or `ip netns add` refused): callers skip then. Other
  // errors are failures.
  static absl::StatusOr<std::unique_ptr<TestNetwork>> Create(const std::vector<std::string>& hosts);

  ~TestNetwork();
  TestNetwork(const TestNetwork&) = delete;
  TestNetwork& operator=(const TestNetwork&) = delete;

  // The host's IPv4 address ("10.231.S.N"). The host must exist.
  const std::string& Address(const std::string& host) const;
  // The host's namespace name, for `ip netns exec`.
  const std::string& Namespace(const std::string& host) const;
  // The test process's own address on the network.
  const std::string& test_address() const { return test_address_; }
  // "10.231.S.0/24".
  const std::string& subnet() const { return subnet_; }

  // `argv` run inside the host: {ip, "netns", "exec", ns, argv...}. `ip netns
  // exec` execs the command, so the pid of the started process is the
  // command's own (a signal reaches it, not a wrapper).
  std::vector<std::string> ExecArgv(const std::string& host,
                                    const std::vector<std::string>& argv) const;

  // Takes the host's switch port down / up. Blocks only for the `ip` call.
  absl::Status Disconnect(const std::string& host);
  absl::Status Reconnect(const std::string& host);

 private:
  TestNetwork() = default;
  absl::Status Build(const std::vector<std::string>& hosts);
  absl::Status ChooseSubnet();
  void TearDown();

  std::string ip_;
  pid_t owner_ = 0;
  int subnet_lock_fd_ = -1;
  std::string subnet_lock_path_;
  std::string subnet_prefix_;  // "10.231.S."
  std::string subnet_;
  std::string test_address_;
  std::string switch_namespace_;
  std::string uplink_;
  std::vector<std::string> namespaces_made_;
  bool uplink_made_ = false;
  std::map<std::string, std::string> addresses_;
  std::map<std::string, std::string> namespaces_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_NETNS_H_
