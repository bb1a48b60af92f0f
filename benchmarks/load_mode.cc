#include "benchmarks/load_mode.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmarks/bench_group.h"
#include "services/runtime/grpc_status.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::bench {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;
constexpr int kMaxAttempts = 20;
constexpr absl::Duration kRetryBackoff = absl::Milliseconds(100);

// An append-only file of acknowledged keys.
class AckLog {
 public:
  static absl::StatusOr<std::unique_ptr<AckLog>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("ack log ", path, ": cannot open: ", std::strerror(errno)));
    }
    return std::unique_ptr<AckLog>(new AckLog(path, fd));
  }
  ~AckLog() { ::close(fd_); }

  // One write(2) per key, so a line is in the file whole or not at all.
  absl::Status Append(const std::string& key) {
    const std::string line = absl::StrCat(key, "\n");
    size_t written = 0;
    while (written < line.size()) {
      const ssize_t n = ::write(fd_, line.data() + written, line.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::DataLossError(
            absl::StrCat("ack log ", path_, ": cannot append: ", std::strerror(errno)));
      }
      written += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

 private:
  AckLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
};

absl::Status GoneAway(const grpc::Status& status, int64_t acknowledged, int64_t total,
                      const std::string& target) {
  return absl::UnavailableError(absl::StrCat(
      "the replay buffer at ", target, " went away after ", acknowledged, " of ", total,
      " groups were acknowledged: ", runtime::StatusCodeName(status.error_code()), " ",
      status.error_message()));
}

absl::Status ConfigureRun(sluice::v1::ReplayBufferService::Stub& stub, const LoadOptions& options) {
  v1::ConfigureRunRequest request;
  request.set_run_id(options.run_id);
  request.set_batch_size_groups(16);
  // Versions never advance under this load; the bound keeps every group
  // admissible even if a trainer were to publish.
  request.set_max_staleness(1'000'000);
  request.set_group_size(options.group_size);
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.connect_timeout));
  v1::ConfigureRunResponse response;
  const grpc::Status status = stub.ConfigureRun(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    std::cerr << "bench_replay_buffer: run " << options.run_id
              << " exists with another configuration; inserting into it as it is: "
              << status.error_message() << "\n";
    return absl::OkStatus();
  }
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("ConfigureRun on ", options.target, ": ",
                                               runtime::StatusCodeName(status.error_code()), " ",
                                               status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadOptions::Validate() const {
  std::vector<std::string> problems;
  if (target.empty()) problems.push_back("--target: required");
  if (insert_groups <= 0) {
    problems.push_back(absl::StrCat("--insert-groups: must be > 0, got ", insert_groups));
  }
  if (group_bytes <= 0) {
    problems.push_back(absl::StrCat("--group-bytes: must be > 0, got ", group_bytes));
  }
  if (group_bytes > kMaxMessageBytes / 2) {
    problems.push_back(
        absl::StrCat("--group-bytes: must be <= ", kMaxMessageBytes / 2, ", got ", group_bytes));
  }
  if (group_size <= 0) {
    problems.push_back(absl::StrCat("--group-size: must be > 0, got ", group_size));
  }
  if (ack_log.empty()) problems.push_back("--ack-log: required");
  if (run_id.empty()) problems.push_back("--run-id: must not be empty");
  if (window <= 0) problems.push_back(absl::StrCat("--insert-window: must be > 0, got ", window));
  if (connect_timeout < absl::ZeroDuration())
    problems.push_back("--connect-timeout-s: must be >= 0");
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

absl::Status RunLoad(const LoadOptions& options) {
  if (absl::Status valid = options.Validate(); !valid.ok()) return valid;
  absl::StatusOr<std::unique_ptr<AckLog>> ack_log = AckLog::Open(options.ack_log);
  if (!ack_log.ok()) return ack_log.status();
  const std::string prefix =
      options.key_prefix.empty()
          ? absl::StrCat("load-", absl::ToUnixMillis(absl::Now()), "-", ::getpid())
          : options.key_prefix;

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  auto stub = sluice::v1::ReplayBufferService::NewStub(
      grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args));
  if (absl::Status configured = ConfigureRun(*stub, options); !configured.ok()) return configured;

  v1::InsertGroupsRequest request;
  v1::Group* group = request.add_groups();
  // Sized under the longest id, so that renaming never makes a group bigger.
  *group = MakeBenchGroup(options.run_id, absl::StrCat(prefix, "-", options.insert_groups - 1),
                          options.group_size, options.group_bytes);
  const int64_t total = options.insert_groups;
  std::cerr << "bench_replay_buffer: inserting " << total << " groups of " << group->ByteSizeLong()
            << " bytes into run " << options.run_id << " on " << options.target << ", keys "
            << options.run_id << "/" << prefix << "-<i>\n";

  grpc::ClientContext context;
  auto stream = stub->InsertGroups(&context);
  // A group by its index, and how many times it was sent.
  struct Pending {
    int64_t index = 0;
    int attempts = 0;
  };
  // Sent and not yet acknowledged, by key; and RETRYABLE_ERROR ones to resend.
  absl::flat_hash_map<std::string, Pending> in_flight;
  std::deque<Pending> retries;
  int64_t next_new = 0;
  int64_t acknowledged = 0;
  int64_t duplicates = 0;
  const absl::Time start = absl::Now();
  while (acknowledged < total) {
    while (static_cast<int>(in_flight.size()) < options.window &&
           (!retries.empty() || next_new < total)) {
      Pending pending{.index = next_new, .attempts = 0};
      if (!retries.empty()) {
        pending = retries.front();
        retries.pop_front();
      } else {
        ++next_new;
      }
      RenameGroup(absl::StrCat(prefix, "-", pending.index), group);
      if (!stream->Write(request)) {
        return GoneAway(stream->Finish(), acknowledged, total, options.target);
      }
      ++pending.attempts;
      in_flight.emplace(group->idempotency_key(), pending);
    }
    v1::InsertGroupsResponse response;
    if (!stream->Read(&response)) {
      return GoneAway(stream->Finish(), acknowledged, total, options.target);
    }
    bool backoff = false;
    for (const v1::InsertGroupResult& result : response.results()) {
      auto it = in_flight.find(result.idempotency_key());
      if (it == in_flight.end()) continue;  // not ours (cannot happen on our own stream)
      const Pending pending = it->second;
      in_flight.erase(it);
      switch (result.status()) {
        case v1::INSERT_STATUS_STORED:
        case v1::INSERT_STATUS_DUPLICATE:
          if (absl::Status logged = (*ack_log)->Append(result.idempotency_key()); !logged.ok()) {
            return logged;
          }
          ++acknowledged;
          if (result.status() == v1::INSERT_STATUS_DUPLICATE) ++duplicates;
          break;
        case v1::INSERT_STATUS_RETRYABLE_ERROR:
          if (pending.attempts >= kMaxAttempts) {
            return absl::UnavailableError(absl::StrCat(
                "insert of ", result.idempotency_key(), " still RETRYABLE_ERROR after ",
                kMaxAttempts, " attempts: ", result.message(), " (", acknowledged, " of ", total,
                " groups acknowledged)"));
          }
          retries.push_back(pending);
          backoff = true;
          break;
        default:
          return absl::FailedPreconditionError(absl::StrCat(
              "insert of ", result.idempotency_key(),
              " was refused for good: ", v1::InsertStatus_Name(result.status()), ": ",
              result.message(), " (", acknowledged, " of ", total, " groups acknowledged)"));
      }
    }
    if (backoff) absl::SleepFor(kRetryBackoff);
  }
  stream->WritesDone();
  const grpc::Status finished = stream->Finish();
  if (!finished.ok()) {
    // Everything was acknowledged; a late error does not undo that.
    std::cerr << "bench_replay_buffer: InsertGroups ended with "
              << runtime::StatusCodeName(finished.error_code()) << " " << finished.error_message()
              << " after every group was acknowledged\n";
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::cerr << "bench_replay_buffer: " << acknowledged << " groups acknowledged ("
            << acknowledged - duplicates << " stored, " << duplicates << " duplicate) in "
            << seconds << " s, " << static_cast<double>(acknowledged) / seconds
            << " groups/s; keys appended to " << options.ack_log << "\n";
  return absl::OkStatus();
}

}  // namespace sluice::bench
