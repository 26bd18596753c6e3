// A node's connection to the leader's store server: a Store, plus the join, report and
// heartbeat of the run. A background thread reads every frame (answers to requests, and
// the leader's pushed verdicts) and sends heartbeats; the leader's silence past the
// heartbeat timeout counts as its loss.
#pragma once

#include <netdb.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "rendezvous/node_info.h"
#include "rendezvous/store.h"
#include "rendezvous/wire.h"

namespace bt::rendezvous {

struct ClientOptions {
  std::string leader_host;
  uint16_t port = 0;
  std::string token;
  std::chrono::milliseconds connect_timeout{900'000};  // total, DNS + connect retries included
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{10'000};
  int interrupt_fd = -1;  // readable (e.g. a signalfd): `stop_requested` says whether the retries end
  // Sent with the proof: a leader serving another job's rendezvous refuses this node by
  // name, even when both jobs hold one token (one Kubernetes Secret per namespace).
  std::string job_id;
  // Asked each time `interrupt_fd` is readable: true ends the connect retries (a shutdown
  // signal); false says that what made it readable asks for no stop and has been consumed
  // (a SIGCHLD read off the signalfd: a child the launcher ran before the rendezvous, such
  // as rclone reading `latest`, must not fail the rendezvous). Unset: any readiness stops.
  std::function<bool()> stop_requested{};
};

// What the leader pushes, or what the client concludes about the leader.
struct PeerEvent {
  // kRejoin: this launcher joined in place of a lost one; the event is the restart of the
  // cycle it meets the others in.
  enum class Kind { kComplete, kAbort, kResult, kJoinTimeout, kLeaderLost, kRestart, kCycleGo, kRejoin,
                    kCollectStacks } kind;
  int rank = -1;        // the failed node, for kAbort and kRestart
  std::string message;  // one line for the log
  int exit_code = 0;    // kAbort, kRestart: the failed node's reported exit code; 0 when it was lost
  int64_t cycle = 0;    // kRestart: the cycle to run; kCycleGo: the cycle whose barrier passed;
                        // kCollectStacks: the cycle whose hang is looked at (rank: who stalled)
  std::string host{};   // kRestart: the failed node's host
  Message decision{};   // kRestart: what the leader decided with it (resume checkpoint, budget);
                        // kCycleGo: the leader's figures of the restart (stopped_s, restarted_s)
  std::chrono::steady_clock::time_point received{};  // when this node had it
  // kRejoin: the training rank this launcher runs from `cycle` on (-1: it waits as a spare;
  // launcher.spares, docs/SPARES.md).
  int training_rank = -1;
};

// How a node retries reaching the leader; the rendezvous benchmark's simulated nodes
// follow the same schedule. `attempt` counts from 1.
struct ConnectSchedule {
  static constexpr std::chrono::milliseconds kFirstBackoff{100};
  static constexpr std::chrono::milliseconds kMaxBackoff{2000};
  // How long one connect may wait for the SYN-ACK before it is abandoned for a new one.
  static std::chrono::milliseconds AttemptTimeout(int attempt);
  // The pause after a refused, failed or shed attempt: doubling, with jitter in [50%, 100%]
  // so that a cluster's nodes do not retry in lockstep. `random` is any uniform value.
  static std::chrono::milliseconds Backoff(int attempt, uint32_t random);
};

// One non-blocking connect bounded by `timeout`: the socket (still non-blocking), or -1
// with `error` set to the errno, ETIMEDOUT when nothing answered (packets dropped), EINTR
// when `interrupt_fd` (a signalfd) became readable first and `stop_requested` (when set)
// said it asks for a stop.
int ConnectWithin(const addrinfo& address, std::chrono::milliseconds timeout, int& error, int interrupt_fd = -1,
                  const std::function<bool()>& stop_requested = {});

// What the handshake learnt about the leader besides its proof.
struct LeaderHandshake {
  // The leader's wall clock minus ours, estimated at the midpoint of the auth round trip
  // (uncertain by half of it); nullopt from a leader that does not send its clock.
  std::optional<std::chrono::nanoseconds> clock_offset;
  std::chrono::nanoseconds round_trip{0};
};

// The handshake a freshly connected socket goes through (docs/PROTOCOL.md): proves the
// token to the leader and checks the leader's proof. Throws StoreError. An empty job id
// is not checked: doctor, run as another Slurm step, measures any leader holding the token.
LeaderHandshake AuthenticateToLeader(int fd, const std::string& token, const std::string& job_id = "");

class StoreClient final : public Store {
 public:
  // Resolves and connects with capped exponential backoff until connect_timeout, then
  // authenticates both ways. Throws StoreError saying what the last attempt saw.
  static std::unique_ptr<StoreClient> Connect(const ClientOptions& options);
  ~StoreClient() override;

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override;
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  // At most kMaxPeekKeys keys a request; more are asked for in several.
  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) override;

  // Claims `info.rank`; throws StoreError when the leader refuses (a verdict explains why).
  void Join(const NodeInfo& info, int node_count);
  // `cycle`: the cycle the outcome belongs to; `restartable`: this launcher can run the job
  // again (not a failure of its own), so the leader may restart instead of aborting.
  // `cannot_train`: the launcher found this node's hardware cannot train (launcher.health),
  // not the job's own exit code.
  void Report(int exit_code, const std::string& cause, int64_t cycle = 0, bool restartable = false,
              bool cannot_train = false);
  // This node has stopped its job and is ready for `cycle`: the leader pushes kCycleGo once
  // every node is.
  // `stopped_s`: how long this node's job took to stop after it heard of the restart.
  void ArriveAtCycle(int64_t cycle, double stopped_s = 0);
  // This launcher is a spare, prepared, waiting in `cycle` for a rank to take.
  void SpareReady(int64_t cycle);
  // Ends the job as failed by this node (after its report, e.g. when it stops waiting at the
  // exit barrier): the leader aborts it, so every node reports the same result.
  void GiveUp(const std::string& cause);
  // Hangs (docs/PROTOCOL.md): this node's job made no progress for `quiet` (a duration, for
  // the log), or (`stalled` false) makes progress again; once every node's job is stalled
  // the leader asks every node for its stacks (kCollectStacks), once per cycle.
  void ReportStall(int64_t cycle, const std::string& quiet, bool stalled = true);
  // Node 0 only: the hang fails `cycle`, blamed on `rank`, with `exit_code`.
  void DeclareHang(int64_t cycle, int rank, const std::string& cause, int exit_code);
  void SayGoodbye();

  int event_fd() const { return event_fd_; }  // readable when TakeEvent() has something
  // The connection to the leader is gone (no heartbeat, closed): nothing sent to it arrives.
  // Thread-safe, and cheap: no event is taken.
  bool LeaderLost();
  // What this connection's handshake measured: the leader's wall clock against ours (one
  // time base for the job's report, launcher/report/recorder.h).
  const LeaderHandshake& handshake() const { return handshake_; }
  // This end's address of the connection to the leader: the one that is proven to reach it.
  std::string LocalAddress() const;
  std::optional<PeerEvent> TakeEvent();
  // When the leader last said a restart's barrier still waits (`cycle_wait`, every 10 s
  // while it does); the epoch when it never did.
  std::chrono::steady_clock::time_point LastCycleWait() const;

 private:
  StoreClient(int fd, ClientOptions options, LeaderHandshake handshake);
  Message Request(Message request, std::chrono::milliseconds timeout);
  void SendFrame(const Message& message);
  void ReaderGuarded();
  void ReaderLoop();
  void OnMessage(const Message& message);
  void PushEvent(PeerEvent event);
  void FailAll(const std::string& why);
  void Break(const std::string& message);

  int fd_;
  int event_fd_;
  int stop_fd_;
  ClientOptions options_;
  LeaderHandshake handshake_;
  std::thread reader_;
  std::mutex send_mutex_;
  std::atomic<int64_t> last_sent_ns_{0};  // steady_clock, when the last frame went out
  std::atomic<int64_t> last_cycle_wait_ns_{0};  // steady_clock, when the last cycle_wait came
  std::mutex mutex_;
  std::condition_variable answered_;
  std::map<int64_t, std::optional<Message>> pending_;
  int64_t next_id_ = 1;
  std::optional<std::string> broken_;  // set once the connection is unusable
  std::deque<PeerEvent> events_;
  bool leader_lost_reported_ = false;
};

}  // namespace bt::rendezvous
