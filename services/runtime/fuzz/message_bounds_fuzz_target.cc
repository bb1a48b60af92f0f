// libFuzzer target for the walk every service makes over a request's bytes
// before parsing it (message_bounds.h): the first byte picks a request type,
// the rest is its wire form. Arbitrary bytes must give an error or a cost,
// never a crash; and whatever the walk passes that protobuf parses must cost
// no more than the walk's estimate (its bound is what the docs promise).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "services/runtime/message_bounds.h"
#include "sluice/v1/controller.pb.h"
#include "sluice/v1/replay_buffer.pb.h"
#include "sluice/v1/reward_server.pb.h"
#include "sluice/v1/trainer.pb.h"

namespace {

namespace v1 = sluice::v1;

const google::protobuf::Message* const kTypes[] = {
    &v1::SubmitRunRequest::default_instance(),
    &v1::InsertGroupsRequest::default_instance(),
    &v1::ScoreBatchRequest::default_instance(),
    &v1::ReportTrainerProgressRequest::default_instance(),
    &v1::WorkerHeartbeatRequest::default_instance(),
    &v1::StreamWeightsRequest::default_instance(),
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size < 1) return 0;
  const google::protobuf::Message& type = *kTypes[data[0] % (sizeof(kTypes) / sizeof(kTypes[0]))];
  const absl::string_view wire(reinterpret_cast<const char*>(data + 1), size - 1);
  sluice::runtime::MessageBounds bounds;
  bounds.max_elements_per_field = 64;
  bounds.max_parsed_bytes = 1 << 20;
  const absl::StatusOr<sluice::runtime::WireCost> cost =
      sluice::runtime::CheckMessageBounds(*type.GetDescriptor(), wire, bounds);
  if (!cost.ok()) return 0;
  if (cost->bytes != static_cast<int64_t>(wire.size())) __builtin_trap();
  std::unique_ptr<google::protobuf::Message> parsed(type.New());
  if (!parsed->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return 0;
  // The estimate bounds what the parse really holds, whole or read in
  // slices as gRPC's ByteBuffer hands a request over.
  if (static_cast<int64_t>(parsed->SpaceUsedLong()) > cost->parsed_bytes) __builtin_trap();
  std::unique_ptr<google::protobuf::Message> sliced(type.New());
  google::protobuf::io::ArrayInputStream slices(wire.data(), static_cast<int>(wire.size()), 64);
  if (!sliced->ParseFromZeroCopyStream(&slices)) __builtin_trap();
  if (static_cast<int64_t>(sliced->SpaceUsedLong()) > cost->parsed_bytes) __builtin_trap();
  return 0;
}
