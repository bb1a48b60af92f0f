#include "trainer/ranks/trainer_group.h"

// ProcessGroupGloo.hpp declares the class only under USE_C10D_GLOO, which
// the LibTorch build defines for itself; Debian's libtorch_cpu has it.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace sluice::trainer::ranks {
namespace {

std::chrono::milliseconds Milliseconds(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// The local address this host reaches `host` from (the interface its route
// goes out of): where the other ranks can reach this one. A UDP socket's
// connect sends nothing.
std::string LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return host;
  std::string local = host;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    char text[INET6_ADDRSTRLEN] = {};
    const void* ip = nullptr;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      ip = address.ss_family == AF_INET
               ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&address)->sin_addr)
               : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&address)->sin6_addr);
    }
    close(fd);
    if (ip != nullptr && inet_ntop(address.ss_family, ip, text, sizeof(text)) != nullptr) {
      local = text;
      break;
    }
  }
  freeaddrinfo(found);
  return local;
}

std::string StoreValue(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> StoreBytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// The first line of a c10d error: its messages carry a C++ backtrace.
std::string Short(const std::exception& e) {
  std::string what = e.what();
  if (const size_t newline = what.find('\n'); newline != std::string::npos) {
    what.resize(newline);
  }
  return what;
}

}  // namespace

struct TrainerGroup::Backend {
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
};

TrainerGroup::TrainerGroup(RankConfig config, std::unique_ptr<Backend> backend)
    : config_(std::move(config)), backend_(std::move(backend)) {}

TrainerGroup::~TrainerGroup() = default;

absl::StatusOr<std::unique_ptr<TrainerGroup>> TrainerGroup::Join(const RankConfig& config) {
  if (config.alone()) {
    return std::unique_ptr<TrainerGroup>(new TrainerGroup(config, nullptr));
  }
  auto backend = std::make_unique<Backend>();
  const std::string where = config.rendezvous();
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(config.port);
    options.isServer = config.rank == 0;
    options.numWorkers = static_cast<size_t>(config.world_size);
    options.waitWorkers = false;
    options.timeout = Milliseconds(config.timeout);
    backend->store = c10::make_intrusive<c10d::TCPStore>(config.host, options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rank ", config.rank, " cannot ", config.rank == 0 ? "serve" : "reach",
                     " the trainer group's rendezvous at ", where, ": ", Short(e),
                     config.rank == 0 ? " (is the port taken?)" : " (is rank 0 running there?)"));
  }
  try {
    c10d::TCPStore& store = *backend->store;
    // A rank number held twice would make the group wait for ever on the
    // rank that is missing; the second to come is refused.
    const int64_t holders = store.add(absl::StrCat("sluice/rank/", config.rank), 1);
    if (holders > 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", config.rank, " of the trainer group at ", where,
                       " is already taken: each rank must be started once (--rank)"));
    }
    if (config.rank == 0) {
      store.set("sluice/world_size", StoreBytes(absl::StrCat(config.world_size)));
    } else {
      const std::string theirs = StoreValue(store.get("sluice/world_size"));
      if (theirs != absl::StrCat(config.world_size)) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", config.rank, " was started with --world-size ", config.world_size,
                         " but rank 0 of the trainer group at ", where, " with ", theirs,
                         ": start every rank with the same world size"));
      }
    }
    auto options = c10d::ProcessGroupGloo::Options::create(Milliseconds(config.timeout));
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
        LocalAddressToward(config.host, config.port)));
    backend->group = c10::make_intrusive<c10d::ProcessGroupGloo>(backend->store, config.rank,
                                                                 config.world_size, options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rank ", config.rank, " could not join the trainer group at ", where, " (",
                     config.world_size, " ranks) within ", absl::FormatDuration(config.timeout),
                     ": ", Short(e)));
  }
  return std::unique_ptr<TrainerGroup>(new TrainerGroup(config, std::move(backend)));
}

namespace {

// What a failed collective of the group says, wherever it failed.
absl::Status CollectiveFailed(int rank, absl::string_view what, absl::Duration timeout,
                              const std::exception& e) {
  return absl::UnavailableError(absl::StrCat("rank ", rank, ": ", what,
                                             " of the trainer group failed (a rank is gone or "
                                             "did not answer within ",
                                             absl::FormatDuration(timeout), "): ", Short(e)));
}

// c10d's tensor list is one tensor per device: several tensors of one
// device go as one flat tensor, copied back after.
at::Tensor Flatten(absl::Span<const at::Tensor> tensors) {
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& tensor : tensors) pieces.push_back(tensor.reshape({-1}));
  return torch::cat(pieces);
}

void Unflatten(const at::Tensor& flat, absl::Span<const at::Tensor> tensors) {
  int64_t offset = 0;
  for (const at::Tensor& tensor : tensors) {
    tensor.copy_(flat.narrow(0, offset, tensor.numel()).view_as(tensor));
    offset += tensor.numel();
  }
}

}  // namespace

absl::Status TrainerGroup::AllReduceSum(const std::vector<at::Tensor>& tensors,
                                        int64_t bucket_bytes) {
  if (backend_ == nullptr || tensors.empty()) return absl::OkStatus();
  try {
    size_t first = 0;
    while (first < tensors.size()) {
      // One bucket: consecutive tensors up to bucket_bytes (at least one).
      size_t last = first;
      int64_t bytes = 0;
      do {
        bytes += tensors[last].numel() * static_cast<int64_t>(tensors[last].element_size());
        ++last;
      } while (last < tensors.size() &&
               bytes + tensors[last].numel() * static_cast<int64_t>(tensors[last].element_size()) <=
                   bucket_bytes);
      const absl::Span<const at::Tensor> bucket(tensors.data() + first, last - first);
      std::vector<at::Tensor> flat = {Flatten(bucket)};
      backend_->group->allreduce(flat)->wait();
      Unflatten(flat[0], bucket);
      first = last;
    }
  } catch (const std::exception& e) {
    return CollectiveFailed(config_.rank, "an all-reduce", config_.timeout, e);
  }
  return absl::OkStatus();
}

struct TrainerGroup::PendingSum::Work {
  c10::intrusive_ptr<c10d::Work> work;  // Null alone.
};

TrainerGroup::PendingSum::PendingSum(std::unique_ptr<Work> work, int rank, absl::Duration timeout)
    : work_(std::move(work)), rank_(rank), timeout_(timeout) {}

TrainerGroup::PendingSum::~PendingSum() {
  // A sum never waited for must still finish before its tensor goes away.
  if (work_ != nullptr && work_->work) Wait().IgnoreError();
}

absl::Status TrainerGroup::PendingSum::Wait() {
  if (work_ == nullptr || !work_->work) return absl::OkStatus();
  const c10::intrusive_ptr<c10d::Work> work = std::move(work_->work);
  try {
    work->wait();
  } catch (const std::exception& e) {
    return CollectiveFailed(rank_, "an all-reduce", timeout_, e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TrainerGroup::PendingSum>> TrainerGroup::StartAllReduceSum(
    const at::Tensor& flat) {
  auto work = std::make_unique<PendingSum::Work>();
  if (backend_ != nullptr) {
    try {
      std::vector<at::Tensor> tensors = {flat};
      work->work = backend_->group->allreduce(tensors);
    } catch (const std::exception& e) {
      return CollectiveFailed(config_.rank, "an all-reduce", config_.timeout, e);
    }
  }
  return std::unique_ptr<PendingSum>(
      new PendingSum(std::move(work), config_.rank, config_.timeout));
}

absl::Status TrainerGroup::AllGather(const at::Tensor& mine, const at::Tensor& all) {
  if (backend_ == nullptr) {
    all.copy_(mine.reshape({-1}));
    return absl::OkStatus();
  }
  try {
    std::vector<at::Tensor> input = {mine.reshape({-1}).contiguous()};
    std::vector<std::vector<at::Tensor>> output(1);
    const int64_t n = input[0].numel();
    for (int r = 0; r < config_.world_size; ++r) output[0].push_back(all.narrow(0, r * n, n));
    backend_->group->allgather(output, input)->wait();
  } catch (const std::exception& e) {
    return CollectiveFailed(config_.rank, "an all-gather", config_.timeout, e);
  }
  return absl::OkStatus();
}

absl::Status TrainerGroup::Broadcast(const std::vector<at::Tensor>& tensors, int root) {
  if (backend_ == nullptr || tensors.empty()) return absl::OkStatus();
  try {
    std::vector<at::Tensor> flat = {Flatten(tensors)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    backend_->group->broadcast(flat, options)->wait();
    Unflatten(flat[0], tensors);
  } catch (const std::exception& e) {
    return CollectiveFailed(config_.rank, "a broadcast", config_.timeout, e);
  }
  return absl::OkStatus();
}

absl::Status TrainerGroup::Barrier() {
  if (backend_ == nullptr) return absl::OkStatus();
  try {
    backend_->group->barrier()->wait();
  } catch (const std::exception& e) {
    return CollectiveFailed(config_.rank, "a barrier", config_.timeout, e);
  }
  return absl::OkStatus();
}

}  // namespace sluice::trainer::ranks
