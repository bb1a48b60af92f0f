// RolloutRun::Impl, internal to the rollout worker: one run's generation loop
// (rollout_run.cc), the weights it follows (rollout_weights_follow.cc) and the
// finisher thread that scores, inserts and reports done groups
// (rollout_finisher.cc).
#ifndef SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_IMPL_H_
#define SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_IMPL_H_

#include "rollout_worker/rollout_run.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/model/engine.h"
#include "common/model/generation.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/status_macros.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "google/protobuf/util/time_util.h"
#include "rollout_worker/generation_budget.h"
#include "services/clients/group_inserter.h"
#include "services/clients/score_batches.h"
#include "services/weights/weight_transport.h"

namespace sluice::rollout_worker {

class RolloutRun::Impl {
 public:
  Impl(std::string run_id, v1::RunSpec spec, RolloutRunDeps deps)
      : run_id_(std::move(run_id)), spec_(std::move(spec)), deps_(std::move(deps)) {
    status_.set_run_id(run_id_);
    status_.set_policy_version(-1);
  }

  ~Impl() {
    Stop(/*abort=*/true);
    StopFinisher();
    if (follower_.joinable()) follower_.join();
  }

  absl::Status Run();
  void Stop(bool abort);
  v1::RolloutRunStatus Status() const;

 private:
  // How long an AcquireSlots call of a worker with nothing to decode waits
  // for a slot (a busy worker does not wait).
  static constexpr int64_t kAcquireWaitMs = 1000;
  // Flushed batches waiting for the finisher at most; past this the loop waits
  // for it (scoring or inserting has fallen behind generation).
  static constexpr size_t kMaxQueuedFlushes = 2;

  // Sample i of a group whose samples start at `seed` draws from this stream.
  static uint64_t SampleSeed(uint64_t seed, int64_t i) {
    return seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(i + 1);
  }

  bool stopping() const;
  bool aborting() const;
  // Sleeps up to `d`, waking early when the run stops.
  void Pause(absl::Duration d);

  // Builds what Run needs beyond the constructor.
  absl::Status Init();

  // ---- weights -----------------------------------------------------------

  void FollowWeights();

  // The latest version, from the weight receiver (weight_sync.transport),
  // with the version held (held_weights_) as the base of a delta. `transfer`
  // gets what it moved.
  absl::StatusOr<clients::FetchedWeights> Download(WeightTransfer* transfer);
  absl::StatusOr<std::shared_ptr<const model::Transformer>> BuildModel(
      const clients::FetchedWeights& fetched);

  // How versions reach this worker (services/weights/weight_transport.h);
  // made by Init() from the resolved weight_sync. Follower thread only.
  std::unique_ptr<weights::WeightReceiver> weight_receiver_;
  // The version the worker holds as it came (in weight_sync.dtype), the base
  // of the next delta; null without deltas (float32 runs keep nothing). It
  // costs one more copy of the weights in the transfer dtype (bf16: half the
  // float32 model the worker computes with). Follower thread only.
  std::unique_ptr<clients::FetchedWeights> held_weights_;
  model::PolicySnapshot Latest() const;

  // Blocks until the worker holds weights of at least `version`, or holds
  // some weights and refused `version` or a newer one (nothing better is
  // coming until the trainer publishes again); false if the run stops first.
  bool AwaitVersion(int64_t version);

  // ---- generation loop ---------------------------------------------------

  // A leased prompt's group on its way through the engine.
  struct InFlightGroup {
    v1::Prompt prompt;
    std::string slot_lease;
    std::vector<int32_t> ids;
    uint64_t batch = 0;  // the lease it came in (names the group)
    int index = 0;       // its prompt's place in that lease
    uint64_t seed = 0;   // sample g draws from SampleSeed(seed, g)
    google::protobuf::Timestamp started_at;
    absl::Time start;
    int64_t initial_version = 0;
    std::vector<model::Completion> completions;
    int finished = 0;
  };

  // The generation loop: keeps the engine's rows busy with the groups of
  // the prompts it leases, within the staleness gate (a slot per group),
  // and hands the groups that are done to the finisher (score, insert,
  // report, on its own thread) in batches, decoding on meanwhile. Holds up
  // to max_groups groups (those without rows wait in the engine's queue) and
  // leases more once a quarter of them are done. A stop, or the controller
  // saying the run is done, lets the engine finish what it holds and the
  // finisher what it was handed; an abort cuts both short and abandons what
  // they hold.
  absl::Status Loop();

  // Idle time counts from the loop's first decoding step: before it the
  // run is in its warm start, or waits for its first weights.
  void AddIdleSeconds(absl::Time since);

  // Groups the loop holds: in the engine, done, or waiting for room.
  int32_t LoopGroups() const;

  // ---- the finisher ------------------------------------------------------
  //
  // Scoring (a reward server round trip), inserting (the buffer's, durable)
  // and reporting (the controller's) take as long as many decoding steps of
  // a small model: done on the generation thread they leave the engine's
  // rows idle. So the loop hands each flushed batch over (HandOver) and
  // decodes on, and this thread finishes the batches in the order they were
  // handed over. At most kMaxQueuedFlushes wait: a finisher that falls
  // behind (a slow reward server) holds the loop back rather than letting
  // done groups pile up and go stale. Its first error ends the run: the
  // loop sees it (FinisherError) and gives back what it and the queue hold;
  // FinishGroups gave back the batch that failed.

  // Hands ready_ (in lease order) to the finisher; waits while its queue is
  // full (idle time).
  void HandOver();

  // The finisher's thread: until StopFinisher, and then until its queue is
  // empty.
  void Finisher();
  absl::Status FinisherError() const;

  // Waits until the finisher has finished everything handed to it (idle
  // time), or failed; its error.
  absl::Status AwaitFinisher();

  // Tells the finisher to finish what it was handed and exit; joins it.
  void StopFinisher();

  // Groups in flight: those the loop holds (`loop_groups`) and those handed
  // to the finisher and not yet inserted or given back.
  void SetGroupsInFlight(int32_t loop_groups);
  void Release(const std::vector<std::string>& leases, const std::string& reason);

  // Admission, weights and prompts for up to `groups` more groups, added to
  // the engine. `busy`: the engine has work, so nothing here may block (no
  // waiting for slots or weights: slots granted at a version the worker
  // does not hold yet go back, to be asked for again after a step). The
  // error ends the run (a service away for the whole retry deadline, a
  // group that cannot fit the memory budget).
  absl::Status TopUp(int groups, int group_size, bool busy);

  // Adds the groups to the engine, made (or remade, once idle) with rows
  // that fit the memory budget for prompts as long as theirs. Groups whose
  // prompts need more room than a busy engine was made for wait in
  // deferred_ until it is idle (Loop leases nothing meanwhile).
  absl::Status AddToEngine(std::vector<InFlightGroup> groups_in, int group_size);

  // Groups a worker holds at most: rollout.max_concurrent_groups_per_worker,
  // else a training batch.
  int MaxGroups() const;
  int64_t ContextTokens() const;

  // The engine, its rows as many as the memory budget holds for prompts of
  // `longest` tokens and the run's max_new_tokens (run::GenerationBatchBytes).
  absl::Status MakeEngine(int64_t longest, int group_size);

  // The run's sampling options (the seed is per batch: BatchSeed).
  model::SamplingOptions RunSampling() const;
  uint64_t BatchSeed() const;
  int64_t NewestRefused() const;

  // A decoding step: its seconds, and the tokens it sampled.
  void RecordStep(int64_t tokens, double seconds);
  static std::vector<const InFlightGroup*> Pointers(const std::vector<InFlightGroup>& groups,
                                                    size_t from);

  // Gives the groups' slots and prompts back: one release, one report.
  void GiveBack(const std::vector<const InFlightGroup*>& groups, const std::string& reason);

  // Everything in flight, ready and deferred given back (stop with abort,
  // an error).
  void AbandonAll(const std::string& reason);

  // Scores the groups' completions, inserts the groups and reports them.
  absl::Status FinishGroups(std::vector<InFlightGroup>& groups);

  // Inserts the groups (GroupInserter: retries, backoff, deadline) and sorts
  // their prompts by the buffer's answers (the table in rollout_run.h): a
  // group stored keeps its prompt in `completed`; a late DUPLICATE keeps it
  // there too (the prompt is in the buffer); a group refused for good (stale,
  // invalid, unknown run) or never confirmed moves its prompt to `abandoned`,
  // so the controller hands it out again. (An unconfirmed group may have been
  // stored with its ack lost; generating its prompt again costs a group the
  // buffer then refuses as a DUPLICATE, where keeping it completed would lose
  // the prompt for good if it was not stored.) The slots of unconfirmed
  // groups are released; the buffer already released those of answered ones.
  //
  // Returns the error that should end the run: a fatal InsertGroups error
  // (GroupInserter makes it sticky, so every later batch would fail too), or
  // the buffer unreachable for the whole retry deadline. `insert_error` gets
  // why the insert gave up with groups not stored (its stream refused, the
  // buffer answering RETRYABLE_ERROR until the retries ran out), fatal or
  // not; it is left empty when every group was answered.
  absl::Status Insert(v1::InsertGroupsRequest request, std::vector<std::string>* completed,
                      std::vector<std::string>* abandoned, int64_t* stored,
                      std::string* insert_error);

  // Tells the controller which prompts are done and which go back to the
  // pool. A controller away is waited for by the client (it retries); one
  // away for the whole retry deadline ends the run (the error returned).
  // Other failures are logged: the prompt leases expire and are handed out
  // again, and a group of theirs already stored makes the next one a
  // DUPLICATE. `insert_error`: ReportRolloutProgressRequest.insert_error.
  absl::Status Report(const std::vector<std::string>& completed,
                      const std::vector<std::string>& abandoned, int64_t groups_inserted,
                      const std::string& insert_error = "");
  const std::string run_id_;
  const v1::RunSpec spec_;
  RolloutRunDeps deps_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  model::ModelConfig config_;
  model::ModelPlacement placement_;  // the policy's device and dtypes
  std::vector<int32_t> stop_token_ids_;
  std::thread follower_;
  std::unique_ptr<clients::GroupInserter> inserter_;
  uint64_t batch_counter_ = 0;
  // The run's sampling options, set by Run once the config is loaded.
  model::SamplingOptions sampling_;
  // The generation loop's engine and its groups (Loop's thread only): in
  // the engine, keyed by its handle; done and waiting for FinishGroups.
  std::unique_ptr<model::Engine> engine_;
  std::map<int64_t, InFlightGroup> in_flight_;
  std::vector<InFlightGroup> ready_;
  // When an insert's retry last told the controller why it retries (the
  // finisher's thread only), and how often it may.
  static constexpr absl::Duration kInsertErrorReportInterval = absl::Seconds(5);
  absl::Time last_insert_error_report_ = absl::InfinitePast();
  // When TopUp last warned that slots or prompts could not be had.
  absl::Time last_acquire_warning_ = absl::InfinitePast();
  absl::Time last_lease_warning_ = absl::InfinitePast();
  // Leased for prompts longer than the busy engine has room for.
  std::vector<InFlightGroup> deferred_;
  int64_t sampled_tokens_seen_ = 0;
  // The loop has made its first decoding step (idle time counts from it).
  bool decoded_ = false;
  // LeasePrompts said the run is done: lease no more, finish what is held.
  bool run_done_ = false;
  // Tokens and late groups refused since the last report that reached the
  // controller (the finisher reports; a loop giving groups back, too).
  std::atomic<int64_t> tokens_since_report_{0};
  std::atomic<int64_t> late_since_report_{0};
  // The finisher (see HandOver): its thread, the batches handed to it in
  // order, and its first error.
  std::thread finisher_;
  mutable absl::Mutex finish_mu_;
  std::deque<std::vector<InFlightGroup>> finish_queue_ ABSL_GUARDED_BY(finish_mu_);
  bool finisher_exit_ ABSL_GUARDED_BY(finish_mu_) = false;
  absl::Status finish_error_ ABSL_GUARDED_BY(finish_mu_);
  // Groups queued for or in the finisher (0: it has finished all it was
  // handed), and those the loop last said it holds: together,
  // status_.groups_in_flight.
  int64_t groups_finishing_ ABSL_GUARDED_BY(finish_mu_) = 0;
  std::atomic<int32_t> loop_groups_{0};
  // What generation may use (deps_.memory_budget_bytes and the model's
  // shape), set by Run once the config is loaded.
  GenerationBudget generation_budget_;
  bool logged_chunking_ = false;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool aborting_ ABSL_GUARDED_BY(mu_) = false;
  model::PolicySnapshot latest_ ABSL_GUARDED_BY(mu_);
  // The newest version the follower refused (-1: none).
  int64_t newest_refused_version_ ABSL_GUARDED_BY(mu_) = -1;
  v1::RolloutRunStatus status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::rollout_worker

#endif  // SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_IMPL_H_
