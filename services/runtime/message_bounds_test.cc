#include "services/runtime/message_bounds.h"

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/controller.pb.h"
#include "sluice/v1/replay_buffer.pb.h"
#include "sluice/v1/reward_server.pb.h"
#include "sluice/v1/rollout_worker.pb.h"
#include "sluice/v1/trainer.pb.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

template <typename Message>
absl::StatusOr<WireCost> Check(const Message &message, const MessageBounds &bounds = {}) {
  return CheckMessageBounds(*Message::descriptor(), message.SerializeAsString(), bounds);
}

// What parsing `message`'s bytes really costs, for comparison with the
// estimate (SpaceUsedLong counts the objects, their strings and repeated
// fields' capacity, not malloc's overhead).
template <typename Message>
int64_t ParsedBytes(const Message &message) {
  Message parsed;
  EXPECT_TRUE(parsed.ParseFromString(message.SerializeAsString()));
  return static_cast<int64_t>(parsed.SpaceUsedLong());
}

v1::InsertGroupsRequest RealisticInsert(int groups, int samples, int tokens) {
  v1::InsertGroupsRequest request;
  for (int g = 0; g < groups; ++g) {
    v1::Group *group = request.add_groups();
    group->set_group_id("group-" + std::to_string(g));
    group->set_run_id("run-20260101-abcdef");
    group->set_idempotency_key("worker-0/7/" + std::to_string(g));
    for (int s = 0; s < samples; ++s) {
      v1::Trajectory *trajectory = group->add_trajectories();
      trajectory->set_trajectory_id("t" + std::to_string(s));
      trajectory->set_completion_text(std::string(tokens, 'x'));
      trajectory->set_rollout_worker_id("rollout_worker-0");
      for (int t = 0; t < tokens; ++t) {
        trajectory->add_prompt_token_ids(t);
        trajectory->add_completion_token_ids(t);
        trajectory->add_behaviour_logprobs(-0.5f);
        trajectory->add_token_policy_versions(3);
      }
    }
  }
  return request;
}

TEST(MessageBoundsTest, RealisticRequestsPassAndTheEstimateBoundsTheirParse) {
  const v1::InsertGroupsRequest insert = RealisticInsert(4, 8, 300);
  absl::StatusOr<WireCost> cost = Check(insert, {.max_bytes = 64 << 20});
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->bytes, static_cast<int64_t>(insert.ByteSizeLong()));
  EXPECT_EQ(cost->messages, 4 + 4 * 8);
  EXPECT_GE(cost->parsed_bytes, ParsedBytes(insert));
  // Token arrays dominate: the estimate stays within a small factor of the
  // wire.
  EXPECT_LT(cost->parsed_bytes, 4 * cost->bytes);

  v1::SubmitRunRequest submit;
  submit.mutable_spec()->set_name("a run");
  for (int i = 0; i < 50; ++i) {
    (*submit.mutable_spec()->mutable_labels())["key" + std::to_string(i)] = "value";
  }
  v1::WeightedVerifier *verifier = submit.mutable_spec()->mutable_reward()->add_verifiers();
  verifier->set_name("math");
  (*verifier->mutable_params())["mode"] = "symbolic";
  cost = Check(submit);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_GE(cost->parsed_bytes, ParsedBytes(submit));
}

TEST(MessageBoundsTest, EmptyItemsAreCountedBeforeAnyIsParsed) {
  // The attack: "0a 00" repeated, 2 bytes per item on the wire.
  v1::ScoreBatchRequest request;
  for (int i = 0; i < 100000; ++i) request.add_items();
  const absl::StatusOr<WireCost> cost = Check(request);
  ASSERT_FALSE(cost.ok());
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cost.status().message(),
            "items: 100000 items, at most 4096 per "
            "request (--max-items-per-request)");
}

TEST(MessageBoundsTest, ElementLimitsApplyPerParentAtAnyDepthAndNameThePath) {
  v1::InsertGroupsRequest request;
  request.add_groups();
  for (int i = 0; i < 5000; ++i) request.add_groups()->add_trajectories();
  request.mutable_groups(0)->add_trajectories();
  ASSERT_EQ(Check(request).status().message(),
            "groups: 5001 items, at most 4096 per request (--max-items-per-request)");

  v1::InsertGroupsRequest nested;
  nested.add_groups();
  v1::Group *second = nested.add_groups();
  for (int i = 0; i < 4097; ++i) second->add_trajectories();
  EXPECT_EQ(Check(nested).status().message(),
            "groups[1].trajectories: 4097 items, at most 4096 per request "
            "(--max-items-per-request)");

  // 4096 in each of two groups: each parent is within its limit.
  v1::InsertGroupsRequest wide;
  for (int g = 0; g < 2; ++g) {
    v1::Group *group = wide.add_groups();
    for (int i = 0; i < 4096; ++i) group->add_trajectories();
  }
  EXPECT_TRUE(Check(wide).ok()) << Check(wide).status();
}

TEST(MessageBoundsTest, MapEntriesAndRepeatedStringsAreElements) {
  v1::SubmitRunRequest labels;
  for (int i = 0; i < 5000; ++i) {
    (*labels.mutable_spec()->mutable_labels())[std::to_string(i)] = "";
  }
  EXPECT_THAT(Check(labels).status().message(), HasSubstr("spec.labels: 5000 items, at most 4096"));

  v1::ReportRolloutProgressRequest ids;
  for (int i = 0; i < 4097; ++i) ids.add_completed_prompt_ids("");
  EXPECT_THAT(Check(ids).status().message(), HasSubstr("completed_prompt_ids: 4097 items"));
}

TEST(MessageBoundsTest, AFieldCanHaveItsOwnLimitAndFlag) {
  v1::ScoreBatchRequest request;
  for (int i = 0; i < 11; ++i) request.add_items();
  MessageBounds bounds;
  bounds.field_max_elements["sluice.v1.ScoreBatchRequest.items"] = {10, "--max-batch-items"};
  EXPECT_EQ(Check(request, bounds).status().message(),
            "items: 11 items, at most 10 per request (--max-batch-items)");
  // The method's other fields keep the general limit and its flag.
  for (int i = 0; i < 4097; ++i) request.add_composition();
  EXPECT_EQ(Check(request, bounds).status().message(),
            "items: 11 items, at most 10 per request (--max-batch-items)");
  bounds.field_max_elements["sluice.v1.ScoreBatchRequest.items"] = {11, "--max-batch-items"};
  EXPECT_EQ(Check(request, bounds).status().message(),
            "composition: 4097 items, at most 4096 per request "
            "(--max-items-per-request)");
}

TEST(MessageBoundsTest, ALargerMessageThanTheMethodTakesIsRefusedBeforeItsFieldsAreRead) {
  v1::GetRunRequest request;
  request.set_run_id(std::string(2000, 'x'));
  const absl::StatusOr<WireCost> cost = Check(request, {.max_bytes = 1024});
  ASSERT_FALSE(cost.ok());
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(cost.status().message(), HasSubstr("GetRunRequest of 2003 bytes"));
  EXPECT_THAT(cost.status().message(), HasSubstr("1024 bytes this method accepts"));
}

TEST(MessageBoundsTest, ScalarsThatGrowOnParsingCountAgainstTheParsedBound) {
  // A packed int64 of one-byte varints: 8 bytes parsed per byte on the wire.
  v1::TensorSpec spec;
  for (int i = 0; i < 1000000; ++i) spec.add_shape(1);
  MessageBounds bounds{.max_bytes = 64 << 20, .max_parsed_bytes = 4 << 20};
  absl::StatusOr<WireCost> cost = Check(spec, bounds);
  ASSERT_FALSE(cost.ok());
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(cost.status().message(), HasSubstr("once parsed"));

  bounds.max_parsed_bytes = 64 << 20;
  cost = Check(spec, bounds);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_GE(cost->parsed_bytes, ParsedBytes(spec));
}

TEST(MessageBoundsTest, UnknownFieldsAreCostedLikeTheStringsTheyBecome) {
  // Field 1000 is not a field of GetRunRequest: kept as an unknown field.
  std::string wire;
  for (int i = 0; i < 1000; ++i) wire += std::string("\xc2\x3e\x00", 3);  // tag (1000, LEN), 0
  const absl::StatusOr<WireCost> cost =
      CheckMessageBounds(*v1::GetRunRequest::descriptor(), wire, MessageBounds());
  ASSERT_TRUE(cost.ok()) << cost.status();
  v1::GetRunRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_GE(cost->parsed_bytes, static_cast<int64_t>(parsed.SpaceUsedLong()));
}

// Checks that parsing `wire` as `type` costs no more than the walk
// estimates, parsed whole and in 64-byte slices (as gRPC's ByteBuffer hands
// it over: protobuf then grows packed fields a slice at a time).
void ExpectWithinTheEstimate(const google::protobuf::Descriptor &type, const std::string &wire,
                             const std::string &what) {
  const absl::StatusOr<WireCost> cost =
      CheckMessageBounds(type, wire, {.max_elements_per_field = 1 << 20});
  ASSERT_TRUE(cost.ok()) << what << ": " << cost.status();
  const google::protobuf::Message *prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(&type);
  std::unique_ptr<google::protobuf::Message> whole(prototype->New());
  ASSERT_TRUE(whole->ParseFromString(wire)) << what;
  EXPECT_GE(cost->parsed_bytes, static_cast<int64_t>(whole->SpaceUsedLong())) << what;
  std::unique_ptr<google::protobuf::Message> sliced(prototype->New());
  google::protobuf::io::ArrayInputStream slices(wire.data(), static_cast<int>(wire.size()), 64);
  ASSERT_TRUE(sliced->ParseFromZeroCopyStream(&slices)) << what;
  EXPECT_GE(cost->parsed_bytes, static_cast<int64_t>(sliced->SpaceUsedLong()))
      << what << ", parsed in slices";
}

// A string of 16 to 29 bytes takes 30 once parsed (libstdc++ grows it from
// its 15 inline bytes to at least twice that), known field or unknown; the
// fuzzer found a heartbeat of a few such unknown strings that the estimate
// had costed at their length.
TEST(MessageBoundsTest, ShortStringsAreCostedAtTheCapacityTheyGet) {
  for (int length = 0; length <= 64; ++length) {
    for (int count = 1; count <= 9; ++count) {
      std::string wire;
      for (int i = 0; i < count; ++i) {
        // Tag (1000, LEN): an unknown field of every request.
        wire += std::string("\xc2\x3e", 2) + static_cast<char>(length) + std::string(length, 'x');
      }
      const std::string what = absl::StrCat(count, " unknown strings of ", length, " bytes");
      ExpectWithinTheEstimate(*v1::WorkerHeartbeatRequest::descriptor(), wire, what);
      v1::SamplingParams sampling;
      for (int i = 0; i < count; ++i) sampling.add_stop_strings(std::string(length, 'x'));
      ExpectWithinTheEstimate(*v1::SamplingParams::descriptor(), sampling.SerializeAsString(),
                              absl::StrCat(count, " stop strings of ", length, " bytes"));
    }
  }
}

TEST(MessageBoundsTest, MalformedMessagesAreInvalidArguments) {
  const auto check = [](const std::string &wire) {
    return CheckMessageBounds(*v1::ScoreBatchRequest::descriptor(), wire, MessageBounds()).status();
  };
  // A length past the end.
  EXPECT_THAT(check(std::string("\x0a\x05\x00", 3)).message(), HasSubstr("truncated"));
  // Field number 0.
  EXPECT_THAT(check(std::string("\x00\x00", 2)).message(), HasSubstr("not a valid"));
  // A group (wire type 3).
  EXPECT_THAT(check(std::string("\x0b\x0c", 2)).message(), HasSubstr("group"));
  // A truncated varint.
  EXPECT_THAT(check(std::string("\x18\xff", 2)).message(), HasSubstr("truncated"));
  // A submessage whose own fields overrun it.
  EXPECT_EQ(check(std::string("\x0a\x02\x0a\x05", 4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(check("").ok());
}

TEST(MessageBoundsTest, NestingDeeperThanAllowedIsRefused) {
  v1::InsertGroupsRequest request;
  request.add_groups()->add_trajectories();
  EXPECT_TRUE(Check(request, {.max_depth = 2}).ok());
  EXPECT_THAT(Check(request, {.max_depth = 1}).status().message(),
              HasSubstr("nested deeper than 1"));
}

// Random bytes never crash the walk, and whatever it passes that protobuf
// parses costs no more than its estimate.
TEST(MessageBoundsTest, RandomBytesNeverCrashAndPassedOnesStayWithinTheEstimate) {
  // Protobuf logs each string field that is not UTF-8.
  google::protobuf::LogSilencer quiet;
  std::mt19937 random(7);
  const std::string seed = RealisticInsert(2, 2, 20).SerializeAsString();
  int passed = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string wire = seed;
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits; ++e) {
      wire[random() % wire.size()] = static_cast<char>(random() & 0xff);
    }
    const absl::StatusOr<WireCost> cost =
        CheckMessageBounds(*v1::InsertGroupsRequest::descriptor(), wire, MessageBounds());
    if (!cost.ok()) continue;
    v1::InsertGroupsRequest parsed;
    if (!parsed.ParseFromString(wire)) continue;
    ++passed;
    EXPECT_GE(cost->parsed_bytes, static_cast<int64_t>(parsed.SpaceUsedLong())) << round;
  }
  EXPECT_GT(passed, 100);
}

// Sets every field of `message` (recursing `depth` levels): singular ones
// once, repeated ones `elements` times, with short values, so that each
// field's own first allocation counts as much as its elements do.
void FillEveryField(google::protobuf::Message &message, int elements, int depth,
                    const std::function<bool(const google::protobuf::FieldDescriptor &)> &which) {
  const google::protobuf::Reflection &reflection = *message.GetReflection();
  const google::protobuf::Descriptor &type = *message.GetDescriptor();
  using google::protobuf::FieldDescriptor;
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor &field = *type.field(i);
    if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ? depth == 0 : !which(field)) {
      continue;
    }
    const int n = field.is_repeated() ? elements : 1;
    for (int e = 0; e < n; ++e) {
      switch (field.cpp_type()) {
#define SLUICE_SET(CPPTYPE, Setter, Adder, value) \
  case FieldDescriptor::CPPTYPE:                  \
    if (field.is_repeated()) {                    \
      reflection.Adder(&message, &field, value);  \
    } else {                                      \
      reflection.Setter(&message, &field, value); \
    }                                             \
    break;
        SLUICE_SET(CPPTYPE_INT32, SetInt32, AddInt32, 1)
        SLUICE_SET(CPPTYPE_INT64, SetInt64, AddInt64, 1)
        SLUICE_SET(CPPTYPE_UINT32, SetUInt32, AddUInt32, 1)
        SLUICE_SET(CPPTYPE_UINT64, SetUInt64, AddUInt64, 1)
        SLUICE_SET(CPPTYPE_DOUBLE, SetDouble, AddDouble, 1.5)
        SLUICE_SET(CPPTYPE_FLOAT, SetFloat, AddFloat, 1.5f)
        SLUICE_SET(CPPTYPE_BOOL, SetBool, AddBool, true)
        SLUICE_SET(CPPTYPE_STRING, SetString, AddString, "x" + std::to_string(e))
        SLUICE_SET(CPPTYPE_ENUM, SetEnumValue, AddEnumValue,
                   field.enum_type()->value(field.enum_type()->value_count() - 1)->number())
#undef SLUICE_SET
        case FieldDescriptor::CPPTYPE_MESSAGE:
          FillEveryField(field.is_repeated() ? *reflection.AddMessage(&message, &field)
                                             : *reflection.MutableMessage(&message, &field),
                         elements, depth - 1, which);
          break;
      }
    }
  }
}

// Every message of every service's protos, filled with every field, every
// repeated field, every repeated scalar field or each field alone, with one,
// two, three or seventeen elements per repeated field (a field's first
// allocation is its largest per element), and then once more with one
// element each (protobuf merges the two, growing each field again), costs
// no more once parsed than the walk estimates.
TEST(MessageBoundsTest, EveryFieldOfEveryMessageStaysWithinTheEstimate) {
  using google::protobuf::FieldDescriptor;
  const std::vector<const google::protobuf::FileDescriptor *> files = {
      v1::SubmitRunRequest::descriptor()->file(),
      v1::InsertGroupsRequest::descriptor()->file(),
      v1::ScoreBatchRequest::descriptor()->file(),
      v1::StartTrainingRequest::descriptor()->file(),
      v1::StartRolloutsRequest::descriptor()->file(),
      v1::RunSpec::descriptor()->file()};
  int checked = 0;
  for (const google::protobuf::FileDescriptor *file : files) {
    for (int t = 0; t < file->message_type_count(); ++t) {
      const google::protobuf::Descriptor &type = *file->message_type(t);
      const google::protobuf::Message *prototype =
          google::protobuf::MessageFactory::generated_factory()->GetPrototype(&type);
      std::vector<std::function<bool(const FieldDescriptor &)>> choices = {
          [](const FieldDescriptor &) { return true; },
          [](const FieldDescriptor &field) { return field.is_repeated(); },
          [](const FieldDescriptor &field) {
            return field.is_repeated() && field.cpp_type() != FieldDescriptor::CPPTYPE_STRING;
          },
      };
      for (int f = 0; f < type.field_count(); ++f) {
        choices.push_back(
            [&type, f](const FieldDescriptor &field) { return &field == type.field(f); });
      }
      for (size_t c = 0; c < choices.size(); ++c) {
        for (const int elements : {1, 2, 3, 17}) {
          for (const int depth : {0, 1, 3}) {
            std::unique_ptr<google::protobuf::Message> message(prototype->New());
            FillEveryField(*message, elements, depth, choices[c]);
            std::unique_ptr<google::protobuf::Message> more(prototype->New());
            FillEveryField(*more, 1, depth, choices[c]);
            const std::string what =
                absl::StrCat(type.full_name(), " (choice ", c, ", ", elements,
                             " elements per repeated field, ", depth, " levels deep)");
            ExpectWithinTheEstimate(type, message->SerializeAsString(), what);
            ExpectWithinTheEstimate(type, message->SerializeAsString() + more->SerializeAsString(),
                                    what + " and merged with one more each");
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace sluice::runtime
