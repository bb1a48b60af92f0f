#include "tests/netns.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"

namespace sluice::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kNamespacePrefix[] = "sluice-";
constexpr char kUplinkPrefix[] = "sluice";
constexpr char kSwitchHost[] = "switch";
constexpr char kBridge[] = "br0";
constexpr char kLockDir[] = "/tmp/sluice-netns-locks";
// 10.231.S.0/24 for one S in 0..255; 10.231/16 is private (RFC 1918) and
// rarely routed.
constexpr char kSubnetBase[] = "10.231.";

std::string FindIp() {
  for (const char* candidate : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(candidate, X_OK) == 0) return candidate;
  }
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/ip");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

const std::string& IpBinary() {
  static const std::string* const ip = new std::string(FindIp());
  return *ip;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

std::optional<pid_t> ParsePid(absl::string_view digits) {
  if (digits.empty() || digits.size() > 9) return std::nullopt;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int pid = 0;
  if (!absl::SimpleAtoi(digits, &pid) || pid <= 0) return std::nullopt;
  return static_cast<pid_t>(pid);
}

bool ValidHostName(absl::string_view host) {
  if (host.empty() || host.size() > 12 || host == kSwitchHost) return false;
  for (char c : host) {
    if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
          absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      return false;
    }
  }
  return true;
}

// Removes the namespaces and uplinks of TestNetworks whose process died
// without its destructor running (a crash, a ctest timeout).
void RemoveLeftovers() {
  absl::StatusOr<std::string> listed = RunIp({"netns", "list"});
  if (listed.ok()) {
    for (const std::string& name : ParseNetnsList(*listed)) {
      const std::optional<pid_t> owner = NamespaceOwner(name);
      if (owner.has_value() && !Alive(*owner)) RunIp({"netns", "del", name}).IgnoreError();
    }
  }
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator("/sys/class/net", error)) {
    const std::string name = entry.path().filename().string();
    const std::optional<pid_t> owner = UplinkOwner(name);
    if (owner.has_value() && !Alive(*owner)) RunIp({"link", "del", name}).IgnoreError();
  }
}

}  // namespace

absl::StatusOr<std::string> RunIp(const std::vector<std::string>& args) {
  const std::string& ip = IpBinary();
  if (ip.empty()) return absl::FailedPreconditionError("iproute2's `ip` is not installed");
  char log_template[] = "/tmp/sluice-ip-XXXXXX";
  const int log_fd = mkstemp(log_template);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("mkstemp: ", strerror(errno)));
  close(log_fd);
  const std::string log_path = log_template;
  SubprocessOptions options;
  options.argv = {ip};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.log_path = log_path;
  const std::string command = absl::StrJoin(options.argv, " ");
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(options);
  if (!process.ok()) {
    unlink(log_path.c_str());
    return process.status();
  }
  absl::StatusOr<ExitStatus> exit = (*process)->Wait(absl::Now() + absl::Seconds(30));
  if (!exit.ok()) exit = (*process)->Stop(absl::Seconds(1));
  std::string output;
  {
    std::ifstream in(log_path);
    std::stringstream text;
    text << in.rdbuf();
    output = text.str();
  }
  unlink(log_path.c_str());
  if (!exit->success()) {
    return absl::InternalError(absl::StrCat("`", command, "` ", exit->ToString(), ": ",
                                            absl::StripAsciiWhitespace(output)));
  }
  return output;
}

std::string NamespaceName(pid_t owner, absl::string_view host) {
  return absl::StrCat(kNamespacePrefix, owner, "-", host);
}

std::optional<pid_t> NamespaceOwner(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kNamespacePrefix)) return std::nullopt;
  const size_t dash = name.find('-');
  if (dash == absl::string_view::npos || dash + 1 == name.size()) return std::nullopt;
  return ParsePid(name.substr(0, dash));
}

std::string UplinkName(pid_t owner) { return absl::StrCat(kUplinkPrefix, owner); }

std::optional<pid_t> UplinkOwner(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kUplinkPrefix)) return std::nullopt;
  return ParsePid(name);
}

std::vector<std::string> ParseNetnsList(absl::string_view output) {
  std::vector<std::string> names;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    const size_t space = line.find(' ');
    names.emplace_back(line.substr(0, space));
  }
  return names;
}

absl::StatusOr<std::unique_ptr<TestNetwork>> TestNetwork::Create(
    const std::vector<std::string>& hosts) {
  if (hosts.empty()) return absl::InvalidArgumentError("a test network needs at least one host");
  std::map<std::string, int> seen;
  for (const std::string& host : hosts) {
    if (!ValidHostName(host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host name must be 1-12 characters of [a-z0-9-] and not \"switch\"; got '", host, "'"));
    }
    if (seen[host]++ > 0) {
      return absl::InvalidArgumentError(absl::StrCat("host '", host, "' is named twice"));
    }
  }
  if (hosts.size() > 250) return absl::InvalidArgumentError("at most 250 hosts fit in a /24");
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN); running as uid " +
        std::to_string(geteuid()));
  }
  if (IpBinary().empty()) {
    return absl::FailedPreconditionError("iproute2's `ip` is not installed");
  }
  std::unique_ptr<TestNetwork> network(new TestNetwork());
  network->ip_ = IpBinary();
  network->owner_ = getpid();
  RemoveLeftovers();
  // On failure the destructor removes what was made.
  if (absl::Status built = network->Build(hosts); !built.ok()) return built;
  return network;
}

absl::Status TestNetwork::ChooseSubnet() {
  std::error_code error;
  fs::create_directories(kLockDir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create ", kLockDir, ": ", error.message()));
  }
  const int start = static_cast<int>(owner_ % 256);
  for (int i = 0; i < 256; ++i) {
    const int s = (start + i) % 256;
    const std::string prefix = absl::StrCat(kSubnetBase, s, ".");
    const std::string subnet = absl::StrCat(prefix, "0/24");
    const std::string lock_path = absl::StrCat(kLockDir, "/", prefix, "lock");
    const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      continue;  // Another test's network.
    }
    // Nothing of this namespace may use the subnet: a route inside it or an
    // address in it (a real network, or a leftover we could not remove).
    absl::StatusOr<std::string> routes = RunIp({"-4", "route", "show", "root", subnet});
    absl::StatusOr<std::string> addresses = RunIp({"-4", "-o", "addr", "show", "to", subnet});
    if (!routes.ok() || !addresses.ok()) {
      close(fd);
      return !routes.ok() ? routes.status() : addresses.status();
    }
    if (!absl::StripAsciiWhitespace(*routes).empty() ||
        !absl::StripAsciiWhitespace(*addresses).empty()) {
      close(fd);
      continue;
    }
    subnet_lock_fd_ = fd;
    subnet_lock_path_ = lock_path;
    subnet_prefix_ = prefix;
    subnet_ = subnet;
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("no free subnet in ", kSubnetBase, "0.0/16 for a test network"));
}

absl::Status TestNetwork::Build(const std::vector<std::string>& hosts) {
  switch_namespace_ = NamespaceName(owner_, kSwitchHost);
  if (absl::StatusOr<std::string> made = RunIp({"netns", "add", switch_namespace_}); !made.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a network namespace: ", made.status().message()));
  }
  namespaces_made_.push_back(switch_namespace_);
  if (absl::Status chosen = ChooseSubnet(); !chosen.ok()) return chosen;

  const std::string& sw = switch_namespace_;
  std::vector<std::vector<std::string>> commands = {
      {"-n", sw, "link", "set", "lo", "up"},
      {"-n", sw, "link", "add", kBridge, "type", "bridge"},
      {"-n", sw, "link", "set", kBridge, "up"},
  };
  for (const std::vector<std::string>& command : commands) {
    if (absl::StatusOr<std::string> done = RunIp(command); !done.ok()) return done.status();
  }
  int next = 2;
  for (const std::string& host : hosts) {
    const std::string ns = NamespaceName(owner_, host);
    if (absl::StatusOr<std::string> made = RunIp({"netns", "add", ns}); !made.ok()) {
      return made.status();
    }
    namespaces_made_.push_back(ns);
    const std::string port = absl::StrCat("p-", host);
    const std::string address = absl::StrCat(subnet_prefix_, next++);
    commands = {
        {"-n", ns, "link", "set", "lo", "up"},
        {"-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
        {"-n", sw, "link", "set", port, "master", kBridge},
        {"-n", sw, "link", "set", port, "up"},
        {"-n", ns, "addr", "add", address + "/24", "dev", "eth0"},
        {"-n", ns, "link", "set", "eth0", "up"},
    };
    for (const std::vector<std::string>& command : commands) {
      if (absl::StatusOr<std::string> done = RunIp(command); !done.ok()) return done.status();
    }
    namespaces_[host] = ns;
    addresses_[host] = address;
  }
  uplink_ = UplinkName(owner_);
  test_address_ = absl::StrCat(subnet_prefix_, 1);
  if (absl::StatusOr<std::string> made =
          RunIp({"link", "add", uplink_, "type", "veth", "peer", "name", "uplink", "netns", sw});
      !made.ok()) {
    return made.status();
  }
  uplink_made_ = true;
  commands = {
      {"-n", sw, "link", "set", "uplink", "master", kBridge},
      {"-n", sw, "link", "set", "uplink", "up"},
      {"addr", "add", test_address_ + "/24", "dev", uplink_},
      {"link", "set", uplink_, "up"},
  };
  for (const std::vector<std::string>& command : commands) {
    if (absl::StatusOr<std::string> done = RunIp(command); !done.ok()) return done.status();
  }
  return absl::OkStatus();
}

TestNetwork::~TestNetwork() { TearDown(); }

void TestNetwork::TearDown() {
  // A process left in a namespace would keep it (and its veth) alive after
  // its name is gone; only processes this test started can be in them.
  for (const std::string& ns : namespaces_made_) {
    absl::StatusOr<std::string> pids = RunIp({"netns", "pids", ns});
    if (!pids.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*pids, '\n', absl::SkipWhitespace())) {
      if (std::optional<pid_t> pid = ParsePid(absl::StripAsciiWhitespace(line))) {
        kill(*pid, SIGKILL);
      }
    }
  }
  // Hosts first, then the switch (its ports' peers are gone with the hosts).
  for (auto it = namespaces_made_.rbegin(); it != namespaces_made_.rend(); ++it) {
    RunIp({"netns", "del", *it}).IgnoreError();
  }
  namespaces_made_.clear();
  // The uplink's peer was in the switch namespace, so it is normally gone
  // with it; deleted here in case it is not.
  if (uplink_made_ && fs::exists(fs::path("/sys/class/net") / uplink_)) {
    RunIp({"link", "del", uplink_}).IgnoreError();
  }
  uplink_made_ = false;
  if (subnet_lock_fd_ >= 0) close(subnet_lock_fd_);  // Releases the flock.
  subnet_lock_fd_ = -1;
}

const std::string& TestNetwork::Address(const std::string& host) const {
  return addresses_.at(host);
}

const std::string& TestNetwork::Namespace(const std::string& host) const {
  return namespaces_.at(host);
}

std::vector<std::string> TestNetwork::ExecArgv(const std::string& host,
                                               const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {ip_, "netns", "exec", Namespace(host)};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

absl::Status TestNetwork::Disconnect(const std::string& host) {
  if (!namespaces_.count(host)) return absl::NotFoundError(absl::StrCat("no host ", host));
  return RunIp({"-n", switch_namespace_, "link", "set", absl::StrCat("p-", host), "down"}).status();
}

absl::Status TestNetwork::Reconnect(const std::string& host) {
  if (!namespaces_.count(host)) return absl::NotFoundError(absl::StrCat("no host ", host));
  return RunIp({"-n", switch_namespace_, "link", "set", absl::StrCat("p-", host), "up"}).status();
}

}  // namespace sluice::testing
