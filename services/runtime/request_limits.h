#ifndef SLUICE_SERVICES_RUNTIME_REQUEST_LIMITS_H_
#define SLUICE_SERVICES_RUNTIME_REQUEST_LIMITS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class ServerContext;
class Status;
}  // namespace grpc
namespace prometheus {
class Registry;
}

namespace sluice::runtime {

// What one request may ask of a service, beyond the message-size limit that
// gRPC enforces (--max-message-size-bytes). A hostile or broken client gets a
// clear error and the service stays up with bounded memory:
//
//   - an absurd value (a count or an identifier far beyond any real workload)
//     is INVALID_ARGUMENT naming the field, the value and the limit;
//   - too many streams open at once (server-streaming and bidi calls, each of
//     which holds a server thread for as long as it is open) is
//     RESOURCE_EXHAUSTED naming the limit and its flag;
//   - a long-poll (a Sample or AcquireGenerationSlots wait) never waits longer
//     than max_wait_ms, whatever the request asks and whether or not the
//     client set a deadline: it answers "timed out" and the client asks again.
//
// The defaults are far above what Sluice's own clients send (a rollout worker
// leases as many prompts as it got generation slots, tens; a local stack opens
// a few streams per worker); each is a ServiceMain flag (and YAML key).
struct RequestLimits {
  // Concurrent streams one client connection may hold open on this service
  // (a gRPC peer, "ipv4:127.0.0.1:53122": one client channel), whoever the
  // caller is. Per connection, not per host or per identity, so that a
  // local process cannot use up the allowance of the stack's own worker on
  // the same host, nor one holder of a shared token (the viewers') that of
  // every other holder.
  int max_streams_per_peer = 256;
  // Concurrent streams on this service from users and anonymous callers, all
  // together. Callers authenticated as a service (worker, trainer,
  // controller) have a pool of this size of their own, so that no user can
  // crowd out the stack's services (auth.h; on a plain stack every caller is
  // anonymous and shares the first pool).
  int max_streams = 1024;
  // Longest identifier (run_id, worker_id, group_id, lease_id, ...).
  int64_t max_id_bytes = 1024;
  // Most items one request may name (prompts per lease, generation slots per
  // acquire, groups per sample or insert message, trajectories per group).
  int64_t max_items_per_request = 4096;
  // Longest any long-poll waits before it answers "timed out".
  int64_t max_wait_ms = 600000;

  // Every problem at once, one per line, each naming the field and value.
  absl::Status Validate() const;
};

// Counts the calls refused, per reason, as
// sluice_requests_refused_total{reason} on `registry` (when non-null).
// Thread-safe.
class RefusalCounter {
 public:
  explicit RefusalCounter(prometheus::Registry* registry);
  ~RefusalCounter();
  // `reason` is one of "streams_per_peer", "streams_total", "id_too_long",
  // "too_many_items", "value_out_of_range", "request_too_large" (a request
  // over its method's size, or one whose parse would cost too much),
  // "malformed_request" (bounded_methods.h).
  void Refused(absl::string_view reason);

 private:
  struct Counters;
  std::unique_ptr<Counters> counters_;
};

// Who opens a stream, as the stream limits count it.
struct StreamClient {
  // The client's connection (grpc::ServerContext::peer()): the per-peer
  // limit counts streams per connection.
  std::string connection;
  // For messages and logs: "worker:rollout_worker-0 on ipv4:10.0.0.7:53122",
  // or the connection of an anonymous caller.
  std::string description;
  // Authenticated as a service (worker, trainer, controller): counted in the
  // services' pool, apart from users and anonymous callers.
  bool service = false;
};

// The StreamClient of a call: its connection, and who its authenticated
// caller is (Caller(), auth.h), if any.
StreamClient StreamClientOf(const grpc::ServerContext& context);

// Caps how many streams are open at once, per client connection and in
// total per pool (services; everyone else). A Slot holds one until it is
// destroyed. Thread-safe; Acquire is O(1).
class StreamGate {
 public:
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&& other) noexcept;
    ~Slot();

   private:
    friend class StreamGate;
    Slot(StreamGate* gate, std::string connection, bool service)
        : gate_(gate), connection_(std::move(connection)), service_(service) {}
    StreamGate* gate_ = nullptr;
    std::string connection_;
    bool service_ = false;
  };

  // `max_total` bounds each pool (services, and everyone else) on its own.
  StreamGate(int max_per_peer, int max_total, RefusalCounter* refusals = nullptr)
      : max_per_peer_(max_per_peer), max_total_(max_total), refusals_(refusals) {}

  // A slot for one more stream from `client`, or RESOURCE_EXHAUSTED saying
  // which limit is reached and how to raise it. Never blocks.
  absl::StatusOr<Slot> Acquire(const StreamClient& client, absl::string_view method)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Streams open now: all of them, those of one connection.
  int open() const ABSL_LOCKS_EXCLUDED(mu_);
  int open_from(absl::string_view connection) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Release(const std::string& connection, bool service) ABSL_LOCKS_EXCLUDED(mu_);

  const int max_per_peer_;
  const int max_total_;
  RefusalCounter* const refusals_;
  mutable absl::Mutex mu_;
  int open_services_ ABSL_GUARDED_BY(mu_) = 0;
  int open_others_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> open_by_connection_ ABSL_GUARDED_BY(mu_);
};

// INVALID_ARGUMENT "<field>: <n> bytes, at most <limit> (...)" when `value`
// is longer than `max_bytes`.
absl::Status CheckIdLength(absl::string_view field, absl::string_view value, int64_t max_bytes);
// INVALID_ARGUMENT "<field>: <n> items, at most <limit> per request (...)".
absl::Status CheckItemCount(absl::string_view field, int64_t count, int64_t max_items);

// The process-wide limits, installed once by ServiceMain before the server
// starts (defaults until then, e.g. in in-process tests).
void InstallRequestLimits(const RequestLimits& limits, prometheus::Registry* registry);
const RequestLimits& ProcessRequestLimits();

// Initial metadata key a stream carries when the server holds a slot for it
// ("held"): a client that waits for initial metadata can tell an established
// stream from a refused one before the first message.
inline constexpr char kStreamSlotMetadataKey[] = "sluice-stream-slot";

// Counts a call refused for `reason` on the process-wide counter
// (sluice_requests_refused_total{reason}).
void CountRefusal(absl::string_view reason);

// Handler helpers over the process-wide limits; each counts what it refuses.
// A stream slot for this call (keep it until the handler returns), or
// RESOURCE_EXHAUSTED. Call it before the handler sends anything.
grpc::Status AcquireStreamSlot(grpc::ServerContext* context, absl::string_view method,
                               StreamGate::Slot* slot);
grpc::Status CheckId(absl::string_view field, absl::string_view value);
grpc::Status CheckItems(absl::string_view field, int64_t count);
// INVALID_ARGUMENT "<field>: must be in [min, max], got v" (for absurd
// intervals and counts that have their own natural bound).
grpc::Status CheckRange(absl::string_view field, int64_t value, int64_t min, int64_t max);
// `wait` capped by the client's deadline and by max_wait_ms.
absl::Duration CapWait(absl::Duration wait, const grpc::ServerContext& context);

// Returns from the enclosing handler with `check`'s status unless it is OK.
#define SLUICE_RETURN_IF_REFUSED(check)                      \
  do {                                                       \
    if (::grpc::Status refused_ = (check); !refused_.ok()) { \
      return refused_;                                       \
    }                                                        \
  } while (false)

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_REQUEST_LIMITS_H_
