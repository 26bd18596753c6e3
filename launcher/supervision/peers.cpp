#include "launcher/supervision/peers.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "env/environment.h"
#include "launcher/exit_codes.h"
#include "launcher/log.h"
#include "rendezvous/auth.h"

namespace bt::launcher {
namespace {

// How long after node 0's last `cycle_wait` (sent every 10 s while a restart's barrier
// waits) this node still takes the barrier for alive past its own deadline.
constexpr std::chrono::seconds kLeaderSaysItWaits{25};
// How often a node waiting at a restart's barrier asks whether it leaves (its health).
constexpr std::chrono::milliseconds kLeavingCheckEvery{250};

using Clock = std::chrono::steady_clock;
using rendezvous::PeerEvent;

std::chrono::milliseconds Millis(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

std::string LoopbackHint(const env::NodeIdentity& identity) {
  if (identity.count < 2 || !IsLoopback(identity.leader_addr)) return "";
  return "; the leader address " + identity.leader_addr +
         " is a loopback address, which only reaches node 0 when every node runs on its host: on a cluster set "
         "BT_LEADER_ADDR (or --leader-addr) to node 0's routable address";
}

// Node 0's port is taken: most often by another job's node 0 on this host (two jobs sharing
// nodes, or a second task of this one), whose rendezvous this job's other nodes would reach.
std::string PortInUseHint(const rendezvous::StoreError& error) {
  if (std::string(error.what()).find(std::strerror(EADDRINUSE)) == std::string::npos) return "";
  return "; another job (or another task of this one) probably serves its rendezvous on this node: give each job "
         "its nodes (Slurm: --exclusive, one task per node) or its own port (BT_RENDEZVOUS_PORT, "
         "launcher.rendezvous.port) and its own BT_RENDEZVOUS_TOKEN";
}

std::string DescribeExit(const JobOutcome& outcome) {
  if (outcome.launcher_failure) return "bt-launch failed (exit code " + std::to_string(outcome.exit_code) + "): " + *outcome.launcher_failure;
  if (outcome.stop_reason) return "stopped because " + *outcome.stop_reason;
  if (outcome.cause) return "exit code " + std::to_string(outcome.exit_code) + ": " + *outcome.cause;
  // Only the wait status tells a signal: a job's own `exit 130` is an exit code.
  if (outcome.terminating_signal) {
    return std::string("killed by signal ") + sigabbrev_np(*outcome.terminating_signal) + " (exit code " +
           std::to_string(outcome.exit_code) + ")";
  }
  return "exit code " + std::to_string(outcome.exit_code);
}

// A node stopped by another node's failure exits with that node's code: schedulers report
// the highest task code (srun) or read every pod's, so the job then has one result, the
// training's, instead of 69 hiding it. A node lost without a report has no code: 69.
int SurvivorExitCode(const PeerEvent& verdict) {
  if (verdict.kind != PeerEvent::Kind::kAbort || verdict.exit_code == 0) return kExitUnavailable;
  // 75 says "replace this node" (launcher.health): the orchestrator recreates a pod that exits
  // with it without counting a failure (podFailurePolicy Ignore). Only the node that cannot
  // train says it; the others report that a peer failed (hot spares review, D3: every pod of
  // a job that ran out of restarts exited 75 and was recreated forever).
  if (verdict.exit_code == kExitUnhealthy) {
    spdlog::info("node {} cannot train (exit {}): this node exits {} (a peer failed)", verdict.rank, verdict.exit_code,
                 int(kExitUnavailable));
    return kExitUnavailable;
  }
  spdlog::info("exiting with node {}'s exit code {}: the job's result", verdict.rank, verdict.exit_code);
  return verdict.exit_code;
}

// The training rank `slot` runs in `slot_of_rank` ([slot of rank 0, ...]); -1: none.
int RankOfSlot(const std::vector<int>& slot_of_rank, int slot) {
  const auto found = std::find(slot_of_rank.begin(), slot_of_rank.end(), slot);
  return found == slot_of_rank.end() ? -1 : int(found - slot_of_rank.begin());
}

// Leftovers of the job (or the uploader) that exit while the launcher waits for the other
// nodes: reaped here, or they stay zombies until the launcher exits.
void ReapExitedChildren() {
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

}  // namespace

// Node 0's store. Writes and blocking reads go through its client like any node's (the key
// rules, the wake-ups of parked requests and the order of its own writes hold as for every
// node); a read of what is there now (Peek, a counter, a wait for a counter) is served from
// its own server's table in-process: at 1,024 nodes the inventories alone are 6 MB, which
// over node 0's own socket were encoded, sent, received and decoded again.
class LeaderStore final : public rendezvous::Store {
 public:
  LeaderStore(rendezvous::StoreClient& client, rendezvous::StoreServer& server) : client_(client), server_(server) {}

  void Set(const std::string& key, const std::string& value) override { client_.Set(key, value); }
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override { return client_.Get(key, timeout); }
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override { client_.Wait(keys, timeout); }
  int64_t Add(const std::string& key, int64_t delta) override {
    if (delta != 0) return client_.Add(key, delta);
    const auto value = server_.Peek({key}).front();
    return rendezvous::AddToCounter(key, value ? &*value : nullptr, 0);
  }
  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) override { return server_.Peek(keys); }
  bool WaitCounter(const std::string& key, int64_t at_least, std::chrono::milliseconds timeout) override {
    return server_.WaitCounter(key, at_least, timeout);
  }

 private:
  rendezvous::StoreClient& client_;
  rendezvous::StoreServer& server_;
};

rendezvous::Store* TcpPeers::store() { return leader_store_ ? leader_store_.get() : client_.get(); }

bool IsLoopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr address{};
  return inet_pton(AF_INET, host.c_str(), &address) == 1 && (ntohl(address.s_addr) >> 24) == 127;
}

std::unique_ptr<Peers> JoinPeers(const env::JobConfig& config, const env::NodeIdentity& identity,
                                 const std::string& job_id, SignalRouter& signals, rendezvous::RestartPolicy restart_policy) {
  if (config.launcher.rendezvous.backend == env::RendezvousBackend::kMpi) return MpiPeers::Join(identity);
  return TcpPeers::Join(config, identity, job_id, signals, std::move(restart_policy));
}

const std::string& RendezvousTokenFromEnvironment() {
  static const std::string token = [] {
    std::string value;
    if (const char* file = std::getenv("BT_RENDEZVOUS_TOKEN_FILE"); file != nullptr && *file != '\0') {
      std::ifstream in(file);
      if (!in) throw LaunchFailure(kExitConfig, std::string("BT_RENDEZVOUS_TOKEN_FILE: cannot read ") + file);
      std::getline(in, value);
    }
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const size_t prefix = std::strlen(env::kRendezvousTokenVariable);
      if (std::strncmp(*entry, env::kRendezvousTokenVariable, prefix) != 0 || (*entry)[prefix] != '=') continue;
      char* text = *entry + prefix + 1;
      if (value.empty()) value = text;
      // /proc/<pid>/environ shows the memory the kernel set up at exec, not what unsetenv
      // leaves: overwrite the value there too, so the job (same user) cannot read it.
      std::memset(text, 'x', std::strlen(text));
    }
    unsetenv(env::kRendezvousTokenVariable);
    return value;
  }();
  return token;
}

uint16_t RendezvousPort(const env::JobConfig& config) {
  const char* port = std::getenv("BT_RENDEZVOUS_PORT");
  if (port == nullptr || *port == '\0') return config.launcher.rendezvous.port;
  char* end = nullptr;
  long value = std::strtol(port, &end, 10);
  if (*end != '\0' || value < 1 || value > 65535) {
    throw LaunchFailure(kExitConfig, std::string("BT_RENDEZVOUS_PORT: expected a port in [1, 65535], got \"") + port + "\"");
  }
  return uint16_t(value);
}

RendezvousEndpoint ResolveEndpoint(const env::JobConfig& config, const std::string& job_id) {
  RendezvousEndpoint endpoint{RendezvousPort(config), "", false};
  if (const std::string& token = RendezvousTokenFromEnvironment(); !token.empty()) {
    endpoint.token = token;
    log::RegisterSecret(endpoint.token);
  } else {
    endpoint.token = rendezvous::DeriveTokenFromJobId(job_id);
    endpoint.token_derived = true;
  }
  return endpoint;
}

TcpPeers::TcpPeers(const env::JobConfig& config, const env::NodeIdentity& identity)
    : config_(config), identity_(identity), training_rank_(identity.rank < identity.training_count() ? identity.rank : -1) {}

// Closing a socket that still holds unread data sends RST, which can destroy a verdict
// still in flight: so say goodbye, and on node 0 keep serving until the others have.
TcpPeers::~TcpPeers() {
  if (client_) client_->SayGoodbye();
  client_.reset();
  if (!server_) return;
  if (server_->verdict().kind != rendezvous::ServerVerdict::Kind::kPending) server_->WaitUntilDrained();
  server_->Stop();
}

std::unique_ptr<TcpPeers> TcpPeers::Join(const env::JobConfig& config, const env::NodeIdentity& identity,
                                         const std::string& job_id, SignalRouter& signals,
                                         rendezvous::RestartPolicy restart_policy) {
  const auto& settings = config.launcher.rendezvous;
  const RendezvousEndpoint endpoint = ResolveEndpoint(config, job_id);
  if (endpoint.token_derived) {
    spdlog::warn("BT_RENDEZVOUS_TOKEN is not set: the rendezvous token is derived from the job id {}, which keeps "
                 "other jobs out by mistake but not by intent; set BT_RENDEZVOUS_TOKEN to a shared secret", job_id);
  }
  std::unique_ptr<TcpPeers> peers(new TcpPeers(config, identity));
  const auto join_timeout = std::chrono::seconds(settings.join_timeout_s);
  // Only a job id that names a job (the platform's, the config's, the orchestrator's) keeps
  // another job's nodes out; one derived from the config text differs with any edit of it.
  const std::string checked_job_id = job_id == env::ConfigDerivedJobId(config) ? "" : job_id;
  if (identity.rank == 0) {
    rendezvous::ServerOptions options{endpoint.port, endpoint.token, identity.count, join_timeout,
                                      Millis(settings.heartbeat_interval_s), Millis(settings.heartbeat_timeout_s),
                                      // after the verdict, serve every node still reachable until it has said goodbye
                                      std::chrono::seconds(settings.exit_barrier_timeout_s), checked_job_id,
                                      std::move(restart_policy), Millis(config.launcher.restart.rejoin_timeout_s),
                                      identity.spares, config.launcher.restart.max_failures_per_node};
    try {
      peers->server_ = std::make_unique<rendezvous::StoreServer>(options);
    } catch (const rendezvous::StoreError& error) {
      throw LaunchFailure(kExitUnavailable, std::string("cannot serve the rendezvous: ") + error.what() + PortInUseHint(error));
    }
    spdlog::info("serving the rendezvous for {} nodes on port {}", identity.count, peers->server_->port());
  }
  if (!LoopbackHint(identity).empty()) {
    spdlog::info("leader address {} is loopback: this works only when all {} nodes share this host",
                 identity.leader_addr, identity.count);
  }
  // Node 0 joins through the leader address too: the roster then shows the address the
  // others use, and a leader address that does not reach node 0 fails here, not later.
  rendezvous::ClientOptions options{identity.leader_addr,
                                    peers->server_ ? peers->server_->port() : endpoint.port,
                                    endpoint.token,
                                    join_timeout,
                                    Millis(settings.heartbeat_interval_s),
                                    Millis(settings.heartbeat_timeout_s),
                                    signals.fd(),
                                    checked_job_id};
  // Only a shutdown signal stops the retries: the SIGCHLD of a child run before the
  // rendezvous (node 0's restart policy reads `latest` through rclone) is no stop.
  std::optional<int> stop_signal;
  options.stop_requested = [&signals, &stop_signal] {
    if (!stop_signal) stop_signal = signals.TakeShutdownRequest();
    return stop_signal.has_value();
  };
  try {
    peers->client_ = rendezvous::StoreClient::Connect(options);
  } catch (const rendezvous::StoreError& error) {
    // The retries stop early on a shutdown signal: a stop, not a failed rendezvous.
    if (!stop_signal) stop_signal = signals.TakeShutdownRequest();
    if (stop_signal) {
      throw LaunchFailure(128 + *stop_signal, std::string("stopped by ") + strsignal(*stop_signal) + " while waiting for the leader");
    }
    throw LaunchFailure(kExitUnavailable, std::string("rendezvous failed: ") + error.what() + LoopbackHint(identity) +
                                              "; `bt-launch doctor` on this node checks the name, the port, the token and the clock");
  }
  if (peers->server_) peers->leader_store_ = std::make_unique<LeaderStore>(*peers->client_, *peers->server_);
  try {
    peers->client_->Join(rendezvous::LocalNodeInfo(identity.rank), identity.count);
  } catch (const rendezvous::JobAlreadySucceeded& error) {
    // A pod recreated after the others finished (its predecessor left, a spare took its rank):
    // the job succeeded, and failing here would fail it again in the orchestrator's eyes.
    throw LaunchFailure(0, std::string("nothing to do: ") + error.what() + " (exit 0)");
  } catch (const std::runtime_error& error) {  // StoreError, or StoreTimeout from a stalled leader
    throw LaunchFailure(kExitUnavailable, std::string("rendezvous failed: ") + error.what());
  }
  // The leader enforces the join deadline and names the missing ranks; the slack only
  // covers a leader that died without a word.
  auto deadline = Clock::now() + join_timeout + std::chrono::seconds(10);
  {
    int signal_number = 0;
    if (!peers->WaitUntil([&] { return peers->complete_ || peers->verdict_; }, signals, deadline, signal_number)) {
      throw LaunchFailure(kExitUnavailable, "rendezvous failed: the leader never said that all nodes joined");
    }
    if (signal_number != 0) {
      throw LaunchFailure(128 + signal_number, std::string("stopped by ") + strsignal(signal_number) + " during the rendezvous");
    }
    if (peers->verdict_) throw LaunchFailure(kExitUnavailable, "rendezvous failed: " + peers->verdict_->message);
  }
  spdlog::info("all {} nodes joined", identity.count);
  return peers;
}

void TcpPeers::DrainEvents() {
  if (!client_) return;
  while (auto event = client_->TakeEvent()) {
    if (event->kind == PeerEvent::Kind::kComplete) {
      complete_ = true;
    } else if (event->kind == PeerEvent::Kind::kRejoin) {
      // This launcher's reports and barrier arrivals belong to the cycle it meets the others
      // in, and until it begins one it has no job for a newer restart to stop. A spare given
      // a rank has heard that cycle's restart too: it is this rejoin, not one more.
      cycle_ = event->cycle;
      preparing_rejoin_ = true;
      training_rank_ = event->training_rank;
      NoteMasterAddress(event->decision);
      if (restart_ && restart_->cycle <= event->cycle) restart_.reset();
      rejoin_ = std::move(*event);
    } else if (event->kind == PeerEvent::Kind::kRestart || event->kind == PeerEvent::Kind::kCycleGo) {
      OnCycleEvent(std::move(*event));
    } else if (event->kind == PeerEvent::Kind::kCollectStacks) {
      std::lock_guard lock(stack_request_mutex_);
      if (stack_request_handler_) stack_request_handler_(*event);
    } else if (!verdict_) {
      verdict_ = event;
    }
  }
}

// Cycle numbers only grow: a push about an earlier cycle (delivered late, or about a barrier
// this node has left) must not move the node back, so it is logged and dropped.
void TcpPeers::OnCycleEvent(PeerEvent event) {
  const int64_t newest = restart_ ? restart_->cycle : cycle_;
  if (event.kind == PeerEvent::Kind::kCycleGo) {
    if (event.cycle == cycle_ && !restart_) {
      cycle_started_ = true;
      NoteMasterAddress(event.decision);
      cycle_go_ = std::move(event.decision);
      return;
    }
    if (restart_ && event.cycle == restart_->cycle) {
      early_go_ = std::move(event);
      return;
    }
    spdlog::warn("ignoring the leader's start of cycle {}: this node is in cycle {}", event.cycle, newest);
    return;
  }
  if (event.cycle <= newest) {
    spdlog::warn("ignoring a restart into cycle {}: this node is already in cycle {}", event.cycle, newest);
    return;
  }
  // A replacement still preparing had no job for the push to stop: its stop took no time.
  if (preparing_rejoin_) event.received = {};
  // With spares, who runs which rank from that cycle on: a node whose rank moved leaves.
  if (auto slots = event.decision.find("slots"); slots != event.decision.end() && slots->is_array()) {
    std::vector<int> slot_of_rank;
    for (const auto& slot : *slots) slot_of_rank.push_back(slot.is_number_integer() ? slot.get<int>() : -1);
    training_rank_ = RankOfSlot(slot_of_rank, identity_.rank);
  }
  NoteMasterAddress(event.decision);
  restart_ = std::move(event);
  stop_delivered_ = false;  // the job of this cycle (when one runs) is stopped for the restart
}

void TcpPeers::ReportStall(int64_t cycle, const std::string& quiet, bool stalled) {
  client_->ReportStall(cycle, quiet, stalled);
}

void TcpPeers::DeclareHang(int64_t cycle, int rank, const std::string& cause, int exit_code) {
  client_->DeclareHang(cycle, rank, cause, exit_code);
}

void TcpPeers::OnStackRequest(StackRequestHandler handler) {
  std::lock_guard lock(stack_request_mutex_);
  stack_request_handler_ = std::move(handler);
}

bool TcpPeers::WaitUntil(const std::function<bool()>& done, SignalRouter& signals, Clock::time_point deadline,
                         int& signal_number) {
  signal_number = 0;
  while (true) {
    DrainEvents();
    if (done()) return true;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd fds[2] = {{client_->event_fd(), POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    poll(fds, 2, int(left));
    while (auto taken = signals.Take()) {
      if (StartsShutdown(*taken)) signal_number = *taken;
      if (*taken == SIGCHLD) ReapExitedChildren();
    }
    if (signal_number != 0) return true;
  }
}

std::optional<std::string> TcpPeers::TakeStop() {
  DrainEvents();
  if (stop_delivered_) return std::nullopt;
  if (verdict_ && verdict_->kind != PeerEvent::Kind::kResult) {
    stop_delivered_ = true;
    return verdict_->message;
  }
  // A replacement still preparing (weights, the seed) has no job to stop: a newer restart
  // is the cycle it meets the others in (RunCycles takes it at the barrier), never a reason
  // to give up a rank the leader now awaits from it.
  if (!restart_ || preparing_rejoin_) return std::nullopt;
  stop_delivered_ = true;
  return restart_->message + "; every node restarts in cycle " + std::to_string(restart_->cycle);
}

void TcpPeers::BeginCycle(int64_t cycle) {
  cycle_ = cycle;
  preparing_rejoin_ = false;
  stop_delivered_ = false;
  reported_ = false;
  cycle_started_ = false;
  if (early_go_ && early_go_->cycle == cycle) {
    cycle_started_ = true;
    NoteMasterAddress(early_go_->decision);
    cycle_go_ = std::move(early_go_->decision);
  }
  early_go_.reset();
}

// With spares, each restart and each cycle's go say where training rank 0 runs when it is
// not on node 0 (the go is the newer word: the barrier may have moved it).
void TcpPeers::NoteMasterAddress(const rendezvous::Message& decision) {
  auto master = decision.find("master_addr");
  if (master != decision.end() && master->is_string()) {
    master_addr_ = master->get<std::string>();
  } else if (decision.contains("slots")) {
    master_addr_.reset();
  }
}

bool TcpPeers::AwaitRestart(SignalRouter& signals, int& signal_number, const std::function<void()>& every_slice) {
  while (true) {
    WaitUntil([&] { return verdict_.has_value() || restart_.has_value(); }, signals,
              Clock::now() + std::chrono::milliseconds(250), signal_number);
    if (signal_number != 0 || verdict_) return false;
    if (restart_) return true;
    if (every_slice) every_slice();
  }
}

std::optional<PeerEvent> TcpPeers::TakeRestart() {
  DrainEvents();
  if (verdict_) return std::nullopt;  // the job has ended: no restart can follow
  return std::exchange(restart_, std::nullopt);
}

std::optional<PeerEvent> TcpPeers::TakeRejoin() {
  DrainEvents();
  return std::exchange(rejoin_, std::nullopt);
}

std::optional<std::string> TcpPeers::Verdict() {
  DrainEvents();
  if (!verdict_ || verdict_->kind == PeerEvent::Kind::kResult) return std::nullopt;
  return verdict_->message;
}

int TcpPeers::StopExitCode() {
  DrainEvents();
  return verdict_ ? SurvivorExitCode(*verdict_) : kExitUnavailable;
}

bool TcpPeers::AwaitRestartOrVerdict(SignalRouter& signals, int& signal_number) {
  // The leader answers a report at once; the bound is the exit barrier's, as for a verdict.
  const auto deadline = Clock::now() + std::chrono::seconds(config_.launcher.rendezvous.exit_barrier_timeout_s);
  WaitUntil([&] { return verdict_.has_value() || restart_.has_value(); }, signals, deadline, signal_number);
  return signal_number == 0 && !verdict_ && restart_;
}

int TcpPeers::StartWithRanks(const std::vector<int>& slots) {
  training_rank_ = RankOfSlot(slots, identity_.rank);
  // Rank 0 starts on a spare (node 0 cannot train): every node's MASTER_ADDR is that node's.
  if (!slots.empty() && slots.front() != 0) {
    for (const rendezvous::NodeInfo& node : Roster()) {
      if (node.rank == slots.front()) master_addr_ = node.seen_from;
    }
  }
  return training_rank_;
}

bool TcpPeers::AwaitRank(SignalRouter& signals, int& signal_number, const std::function<bool()>& leaving) {
  try {
    client_->SpareReady(cycle_);
  } catch (const std::runtime_error& error) {  // StoreError, or StoreTimeout from a stalled leader
    spdlog::error("cannot tell the leader that this spare is ready: {}", error.what());
  }
  bool left = false;
  const auto news = [&] {
    left = left || (leaving && leaving());
    return rejoin_.has_value() || restart_.has_value() || verdict_.has_value() || left;
  };
  while (true) {
    // `leaving` changes on another thread, which wakes no poll: it is asked every slice.
    WaitUntil(news, signals, Clock::now() + kLeavingCheckEvery, signal_number);
    if (signal_number != 0 || left || verdict_) return false;
    if (rejoin_) return true;
    // The others restart without this spare: it waits on in their cycle.
    if (restart_) cycle_ = std::exchange(restart_, std::nullopt)->cycle;
  }
}

bool TcpPeers::AwaitCycleStart(int64_t cycle, double stopped_s, Clock::time_point deadline, SignalRouter& signals,
                               int& signal_number, const std::function<bool()>& leaving) {
  try {
    client_->ArriveAtCycle(cycle, stopped_s);
  } catch (const std::runtime_error& error) {  // StoreError, or StoreTimeout from a stalled leader
    spdlog::error("cannot tell the leader that this node is ready for cycle {}: {}", cycle, error.what());
  }
  bool left = false;
  const auto news = [&] {
    left = left || (leaving && leaving());
    return cycle_started_ || restart_.has_value() || verdict_.has_value() || left;
  };
  // `leaving` changes on another thread, which wakes no poll: it is asked every slice.
  const auto wait = [&](Clock::time_point until) {
    while (true) {
      const Clock::time_point slice = leaving ? std::min(until, Clock::now() + kLeavingCheckEvery) : until;
      if (WaitUntil(news, signals, slice, signal_number)) return true;
      if (Clock::now() >= until) return false;
    }
  };
  bool ended = wait(deadline);
  // Node 0 decides when its barrier has waited too long (a rank lost at the barrier moves
  // its deadline); this node's own deadline only covers a leader gone silent. While the
  // leader still says it waits, so does this node.
  while (!ended && Clock::now() - client_->LastCycleWait() < kLeaderSaysItWaits) {
    ended = wait(Clock::now() + kLeaderSaysItWaits);
  }
  // A go that came is taken even when this node found it must leave meanwhile: the others
  // run the cycle already, so it runs it too and fails it with its cause (its health watch
  // stops it at once), rather than leave a rank the cycle counts on (review 6, R6-1).
  return ended && signal_number == 0 && cycle_started_ && !restart_ && !verdict_;
}

void TcpPeers::Report(const JobOutcome& outcome) {
  if (reported_) return;
  reported_ = true;
  try {
    // A launcher's own failure (bad config, weights, a load) is not mended by running again,
    // a signal from the orchestrator asks for a stop, and a stopped node did not fail.
    const bool restartable = !outcome.launcher_failure && !outcome.shutdown_signal && !outcome.stop_reason;
    // The health watch's 75, not a job that exits 75 itself (review 8, N3).
    const bool cannot_train = outcome.exit_code == kExitUnhealthy && outcome.cause && outcome.cause->starts_with("health:");
    client_->Report(outcome.exit_code, DescribeExit(outcome), cycle_, restartable, cannot_train);
  } catch (const std::runtime_error& error) {  // StoreError, or StoreTimeout from a stalled leader
    spdlog::warn("cannot report this node's result to the leader: {}", error.what());
  }
}

int TcpPeers::Finish(const JobOutcome& outcome, SignalRouter& signals) {
  const bool own_failure = outcome.exit_code != 0 && !outcome.stop_reason;
  Report(outcome);
  int code = outcome.exit_code;
  if (outcome.shutdown_signal) {
    // The platform is stopping this node (preemption, a user's stop): no exit barrier.
    spdlog::info("stopped by {}: not waiting for the other nodes", strsignal(*outcome.shutdown_signal));
    // A signal that came while another node's failure was already stopping this job is
    // that failure's consequence (srun --kill-on-bad-exit SIGTERMs every task): the job's
    // result is still the failed node's code, or the scheduler sees 143.
    if (outcome.stop_reason && verdict_ && verdict_->kind == PeerEvent::Kind::kAbort && verdict_->rank != identity_.rank) {
      spdlog::error("job failed: {}", verdict_->message);
      code = SurvivorExitCode(*verdict_);
    }
  } else {
    auto deadline = Clock::now() + std::chrono::seconds(config_.launcher.rendezvous.exit_barrier_timeout_s);
    if (!verdict_) spdlog::info("waiting for the other nodes to finish (exit barrier)");
    int signal_number = 0;
    bool decided = WaitUntil([&] { return verdict_.has_value(); }, signals, deadline, signal_number);
    if (signal_number != 0) {
      code = own_failure ? code : 128 + signal_number;
    } else if (!decided) {
      const int waited = config_.launcher.rendezvous.exit_barrier_timeout_s;
      std::string who = server_ ? "nodes " + rendezvous::FormatRanks(server_->unreported()) + " have"
                                : "the other nodes have";
      const std::string cause = "left the exit barrier after " + std::to_string(waited) + " s: " + who + " not finished";
      // The job now has one result, a failure, on every node: the leader aborts it, which
      // stops the nodes still running and tells node 0 (not "every node succeeded" later).
      try {
        client_->GiveUp(cause);
        spdlog::error("exit barrier: {} not finished after {} s; ending the job as failed, which stops them "
                      "(raise launcher.rendezvous.exit_barrier_timeout_s for uneven workloads)", who, waited);
      } catch (const std::runtime_error& error) {  // StoreError, or StoreTimeout from a stalled leader
        spdlog::error("exit barrier: {} not finished after {} s, and the leader cannot be told ({}); leaving",
                      who, waited, error.what());
      }
      code = own_failure ? code : kExitUnavailable;
    } else if (verdict_->kind == PeerEvent::Kind::kResult) {
      code = 0;
    } else if (verdict_->rank == identity_.rank && own_failure) {
      code = outcome.exit_code;
    } else {
      spdlog::error("job failed: {}", verdict_->message);
      code = own_failure ? outcome.exit_code : SurvivorExitCode(*verdict_);
    }
  }
  return code;
}

std::vector<rendezvous::NodeInfo> TcpPeers::Roster() {
  if (server_) return server_->roster();
  try {
    return rendezvous::RosterFromJson(nlohmann::json::parse(client_->Get("bt/roster", std::chrono::seconds(60))));
  } catch (const std::exception& error) {
    throw LaunchFailure(kExitUnavailable, std::string("cannot read the roster from the leader: ") + error.what());
  }
}

}  // namespace bt::launcher
