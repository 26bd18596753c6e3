// `bt-launch bench rendezvous --nodes N`: what starting a job costs when a cluster's nodes
// arrive together. Node 0 is a real `bt-launch run` (its start command `true`, every
// setting at its default); this process plays nodes 1..N-1, every one in flight at once
// on one epoll loop, doing what `run` does between its start and its first command and
// then its exit: connect (retrying as real nodes do), authenticate, join with ~2 KiB of
// node info, hear "complete"; publish the fabric inventory, read node 0's plan, count
// itself a reader (fabric); publish its health findings (none: launcher/phases/health.cpp);
// publish its phase, count itself in and wait for node 0 to open
// the ready barrier (ready); report success and hear the result (exit); a heartbeat after
// each second without another frame, as the client sends them, and blocking reads re-issued in the slices `run` uses. Figures: the
// time from the leader listening until the last node finished each phase, the bytes node 0
// sent each node; median of --runs.
// --protocol-only keeps the earlier shape (node 0 `rendezvous --serve` with the fabric
// check off, no heartbeats, a store barrier instead of fabric and ready) for comparison.
// --restart adds restart in place to the run shape (launcher.restart.max_restarts 1): once
// every node runs its job, the last node reports a failure; node 0 pushes cycle 1 to every
// node, stops its own job (a `sleep`, gone at the SIGTERM) and passes the barrier; each
// node answers the push with cycle_ready; "restart" is the time from the failure's report
// to the last node's go for cycle 1. Then every node reports cycle 1's success.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <random>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/tools/bench_rendezvous.h"
#include "rendezvous/auth.h"
#include "rendezvous/client.h"
#include "launcher/health/findings.h"
#include "rendezvous/fabric/inventory.h"
#include "rendezvous/node_info.h"
#include "rendezvous/server.h"
#include "rendezvous/wire.h"
#include "storage/paths.h"
#include "storage/subprocess.h"

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using rendezvous::Message;
constexpr const char* kToken = "bench-rendezvous-token";
constexpr const char* kBarrierCount = "barrier/bench/count";
constexpr const char* kBarrierDone = "barrier/bench/done";

enum class Phase { kConnecting, kHello, kWelcome, kJoin, kComplete, kBarrierAdd, kBarrierWait, kSteps, kRunning,
                   kCycleReady, kResult, kDone };
enum class Shape { kRun, kProtocol, kRestart };
constexpr int kMaxPhases = 6;
// What the table shows, per shape.
const std::vector<std::string> kRunPhases = {"join", "complete", "fabric", "ready", "exit"};
const std::vector<std::string> kProtocolPhases = {"join", "complete", "barrier", "exit"};
const std::vector<std::string> kRestartPhases = {"join", "complete", "fabric", "ready", "restart", "exit"};
constexpr int kRestartPhase = 4;  // timed from the failure's report, not from the start
const std::vector<std::string>& PhaseNames(Shape shape) {
  return shape == Shape::kRun ? kRunPhases : shape == Shape::kRestart ? kRestartPhases : kProtocolPhases;
}
// As `run` sends them (launcher/phases/ready.cpp, StopAwareStore in the same file): the
// heartbeat at the default interval, blocking reads in slices.
constexpr auto kHeartbeatInterval = std::chrono::seconds(1);
constexpr auto kStopCheckSlice = std::chrono::milliseconds(1000);
constexpr auto kReadyCheckSlice = std::chrono::milliseconds(500);

// One request of a node's sequence after "complete" (run shape): sent when the previous
// one is answered; a sliced one is sent again each `slice` until answered, as a blocking
// call in slices is.
struct Step {
  std::string frame;
  int64_t id = 0;
  std::chrono::milliseconds slice{0};  // 0: answered at once
  int finishes_phase = -1;             // the table's phase this answer ends, or -1
};

struct SimulatedNode {
  int rank = 0;
  int fd = -1;
  Phase phase = Phase::kConnecting;
  rendezvous::FrameDecoder decoder{rendezvous::kMaxFrameBytes};
  std::string pending;  // bytes not yet written
  bool watching_writable = false;  // EPOLLOUT is in its epoll mask
  std::string nonce;
  size_t step = 0;                     // the next of Swarm::steps_ (run shape)
  Clock::time_point resend_at = Clock::time_point::max();  // a sliced request's next slice
  Clock::time_point next_heartbeat = Clock::time_point::max();
  Clock::time_point retry_at{};
  Clock::time_point connect_deadline{};
  Clock::time_point last_sent{};  // a heartbeat is due only after an interval without any frame
  int attempts = 0;
};

// What a node must do at `at`: the timers of every node in one heap, so that a turn of the
// loop costs what is due, not a pass over 16,384 nodes (which, every 10 ms, took a fair part
// of the core the leader shares). A timer that no longer matches its node's state is stale.
enum class TimerKind { kHeartbeat, kResend, kConnectDeadline, kRetry };
struct Timer {
  Clock::time_point at;
  int rank;
  TimerKind kind;
  bool operator>(const Timer& other) const { return at > other.at; }
};

struct RunFigures {
  double phase_s[kMaxPhases] = {};
  uint64_t bytes_from_leader = 0;  // everything nodes 1..N-1 read
  uint64_t heartbeat_bytes_from_leader = 0;  // of which heartbeats: they grow with the run's length, not with N
  int connect_retries = 0;  // refused, timed out or shed connects
  double leader_cpu_s = 0;  // user + system time of the leader process
};

uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// About 2 KiB of node info, as a node with many interfaces and addresses sends.
nlohmann::json NodeInfoOfAbout2KiB(int rank) {
  rendezvous::NodeInfo info;
  info.rank = rank;
  info.host = "bench-node-" + std::to_string(rank) + ".cluster.example.internal";
  info.pid = 1;
  size_t bytes = info.ToJson().dump().size();
  for (int i = 0; bytes < 2048; ++i) {
    info.addresses.push_back("ib" + std::to_string(i) + "=10." + std::to_string(i) + "." + std::to_string(rank / 256 % 256) +
                             "." + std::to_string(rank % 256) + ",fd00:" + std::to_string(i) + "::" + std::to_string(rank));
    bytes += info.addresses.back().size() + 3;  // quotes and comma
  }
  return info.ToJson();
}

// Node 0: `run` with every setting at its default but the join deadline, or (protocol
// only) `rendezvous --serve` with the fabric check off and 30 s heartbeats.
pid_t StartLeader(const std::string& binary, Shape shape, int count, uint16_t port, const std::string& root,
                  const std::string& sysfs_root) {
  nlohmann::json config = {{"compute", {{"node_count", count}}}, {"launcher", {{"rendezvous", {{"join_timeout_s", 600}}}}}};
  std::vector<std::string> argv = {binary, "run", "--root", root, "--log-level", "warn", "--sysfs-root", sysfs_root};
  if (shape == Shape::kRun) {
    config["enable_baseten_workdir"] = false;
    config["runtime"] = {{"start_commands", nlohmann::json::array({"true"})}};
  } else if (shape == Shape::kRestart) {
    config["enable_baseten_workdir"] = false;
    config["runtime"] = {{"start_commands", nlohmann::json::array({"[ \"$BT_RESTART_COUNT\" = 1 ] || exec sleep 600"})}};
    config["launcher"]["restart"] = {{"max_restarts", 1}};
  } else {
    config["launcher"]["fabric"] = {{"require", "none"}};
    config["launcher"]["rendezvous"].update({{"heartbeat_interval_s", 30}, {"heartbeat_timeout_s", 600}});
    argv = {binary, "rendezvous", "--serve", "--root", root, "--log-level", "warn"};
  }
  const std::vector<std::string> environ = {"BT_JOB_CONFIG=" + config.dump(), std::string("BT_RENDEZVOUS_TOKEN=") + kToken,
                                            "BT_RENDEZVOUS_PORT=" + std::to_string(port), "BT_LEADER_ADDR=127.0.0.1",
                                            "BT_NODE_RANK=0", "BT_GROUP_SIZE=" + std::to_string(count), "PATH=/usr/bin:/bin"};
  auto args = storage::CStringArray(argv);
  auto envp = storage::CStringArray(environ);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, binary.c_str(), &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) throw LaunchFailure(kExitInternal, "bench: cannot start the leader " + binary);
  return pid;
}

// One epoll loop driving every simulated node through the protocol (docs/PROTOCOL.md).
class Swarm {
 public:
  Swarm(Shape shape, int count, uint16_t port, const std::string& inventory_json)
      : shape_(shape), phases_(int(PhaseNames(shape).size())), count_(count), port_(port), nodes_(size_t(count)) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    // Everything a node sends that does not depend on the leader's answers is encoded
    // before the clock starts, as a real node has its info ready before it connects: the
    // simulated nodes share the machine's cores with the leader being measured.
    for (int rank = 1; rank < count; ++rank) {
      nodes_[size_t(rank)].rank = rank;
      join_frames_.push_back(rendezvous::EncodeFrame({{"op", "join"}, {"id", 1}, {"count", count}, {"info", NodeInfoOfAbout2KiB(rank)}}));
    }
    add_frame_ = rendezvous::EncodeFrame({{"op", "add"}, {"id", 2}, {"key", kBarrierCount}, {"delta", 1}});
    set_frame_ = rendezvous::EncodeFrame({{"op", "set"}, {"id", 3}, {"key", kBarrierDone}, {"value", rendezvous::BytesValue("1")}});
    wait_frame_ = rendezvous::EncodeFrame({{"op", "wait"}, {"id", 4}, {"key", kBarrierDone}, {"timeout_ms", 600000}});
    report_frame_ = rendezvous::EncodeFrame({{"op", "report"}, {"id", 5}, {"code", 0}, {"cause", "exit code 0"}});
    if (shape_ == Shape::kRestart) {  // cycle 0 fails on one node; cycle 1 succeeds everywhere
      fail_frame_ = rendezvous::EncodeFrame(
          {{"op", "report"}, {"id", 21}, {"code", 1}, {"cause", "exit code 1"}, {"cycle", 0}, {"restartable", true}});
      cycle_ready_frame_ = rendezvous::EncodeFrame({{"op", "cycle_ready"}, {"id", 22}, {"cycle", 1}, {"stopped_s", 0.0}});
      report_frame_ = rendezvous::EncodeFrame({{"op", "report"}, {"id", 5}, {"code", 0}, {"cause", "exit code 0"}, {"cycle", 1}});
    }
    bye_frame_ = rendezvous::EncodeFrame({{"op", "bye"}});
    heartbeat_frame_ = rendezvous::EncodeFrame({{"op", "hb"}});
    if (shape_ != Shape::kProtocol) BuildRunSteps(inventory_json);
  }
  ~Swarm() {
    for (auto& node : nodes_) {
      if (node.fd >= 0) close(node.fd);
    }
    close(epoll_fd_);
  }

  RunFigures Run(Clock::time_point start, Clock::time_point deadline) {
    start_ = start;
    for (int rank = 1; rank < count_; ++rank) Connect(nodes_[size_t(rank)]);
    std::vector<epoll_event> events(4096);
    while (finished_[phases_ - 1] < count_ - 1) {
      if (Clock::now() > deadline) throw LaunchFailure(kExitUnavailable, "bench: the rendezvous did not finish in time");
      const int ready = epoll_wait(epoll_fd_, events.data(), int(events.size()), 5);
      for (int i = 0; i < ready; ++i) OnEvent(nodes_[events[size_t(i)].data.u32], events[size_t(i)].events);
      RetryDue();
    }
    return figures_;
  }

 private:
  // Node 0's inventory as another node of the same cluster would publish it: its own node
  // GUIDs (cloned GUIDs are a difference node 0 reports) and the bootstrap interface that
  // reaches the leader (here, node 0's: they share the loopback).
  static std::string InventoryOfNode(const nlohmann::json& leader_inventory, int rank) {
    nlohmann::json inventory = leader_inventory;
    inventory["bootstrap_interface"] = "lo";
    int device_index = 0;
    for (auto& device : inventory["devices"]) {
      char guid[32];
      std::snprintf(guid, sizeof guid, "b700:%04x:%04x:%04x", unsigned(rank >> 16), unsigned(rank & 0xffff), unsigned(device_index++));
      device["node_guid"] = guid;
      device["sys_image_guid"] = guid;
    }
    const auto packed = nlohmann::json::to_msgpack(inventory);  // as `run` publishes it (launcher/phases/fabric.cpp)
    return std::string(packed.begin(), packed.end());
  }

  // What a follower's `run` asks between "complete" and its report (launcher/phases/
  // fabric.cpp and ready.cpp), every request with the id of its step.
  void BuildRunSteps(const std::string& inventory_json) {
    auto frame = [](const Message& message) { return rendezvous::EncodeFrame(message); };
    const auto leader_inventory = nlohmann::json::parse(inventory_json);
    for (int rank = 1; rank < count_; ++rank) {
      inventory_frames_.push_back(frame({{"op", "set"}, {"id", 10}, {"key", "bt/fabric/inventory/" + std::to_string(rank)},
                                         {"value", rendezvous::BytesValue(InventoryOfNode(leader_inventory, rank))}}));
      const std::string findings = health::NodeFindings{rank, "bench-node-" + std::to_string(rank), {}}.ToJson().dump();
      health_frames_.push_back(frame({{"op", "set"}, {"id", 17}, {"key", "bt/health/node/" + std::to_string(rank)},
                                      {"value", rendezvous::BytesValue(findings)}}));
      phase_frames_.push_back(frame({{"op", "set"}, {"id", 13}, {"key", "bt/phase/" + std::to_string(rank)},
                                     {"value", rendezvous::BytesValue("ready")}}));
    }
    steps_ = {
        {"", 10, {}, -1},  // the node's inventory (its own frame)
        {frame({{"op", "add"}, {"id", 16}, {"key", "bt/fabric/published"}, {"delta", 1}}), 16, {}, -1},
        {frame({{"op", "get"}, {"id", 11}, {"key", "bt/fabric/plan"}, {"timeout_ms", uint64_t(kStopCheckSlice.count())}}), 11, kStopCheckSlice, -1},
        {frame({{"op", "add"}, {"id", 12}, {"key", "bt/fabric/plan/readers"}, {"delta", 1}}), 12, {}, 2},
        {"", 17, {}, -1},  // the node's health findings (its own frame)
        {frame({{"op", "add"}, {"id", 18}, {"key", "bt/health/published"}, {"delta", 1}}), 18, {}, -1},
        {"", 13, {}, -1},  // the node's phase, "ready" (its own frame)
        {frame({{"op", "add"}, {"id", 14}, {"key", "bt/ready"}, {"delta", 1}}), 14, {}, -1},
        {frame({{"op", "wait"}, {"id", 15}, {"key", "bt/ready/all"}, {"timeout_ms", uint64_t(kReadyCheckSlice.count())}}), 15, kReadyCheckSlice, 3},
    };
  }

  void SendStep(SimulatedNode& node) {
    const Step& step = steps_[node.step];
    if (step.id == 10) SendBytes(node, inventory_frames_[size_t(node.rank - 1)]);
    else if (step.id == 17) SendBytes(node, health_frames_[size_t(node.rank - 1)]);
    else if (step.id == 13) SendBytes(node, phase_frames_[size_t(node.rank - 1)]);
    else SendBytes(node, step.frame);
    node.resend_at = step.slice.count() > 0 ? Clock::now() + step.slice : Clock::time_point::max();
    if (step.slice.count() > 0) timers_.push({node.resend_at, node.rank, TimerKind::kResend});
  }

  // An answer to the node's current step: the next one, or the report after the last.
  void OnStepAnswer(SimulatedNode& node, const Message& message) {
    Expect(node, message, "ok");
    const Step& step = steps_[node.step];
    if (rendezvous::IntField(message, "id") != step.id) return;  // a late answer to an earlier slice
    if (step.finishes_phase >= 0) Finished(step.finishes_phase);
    node.resend_at = Clock::time_point::max();
    if (++node.step < steps_.size()) return SendStep(node);
    if (shape_ == Shape::kRestart) return StartRunning(node);
    node.phase = Phase::kResult;
    SendBytes(node, report_frame_);
  }

  // Restart shape: the node's job runs until node 0 pushes cycle 1; once every node's does,
  // the last node reports its failure.
  void StartRunning(SimulatedNode& node) {
    node.phase = Phase::kRunning;
    if (++running_ < count_ - 1) return;
    fault_at_ = Clock::now();
    SendBytes(nodes_[size_t(count_ - 1)], fail_frame_);
  }

  // The push for cycle 1 (this node's job stops at once: it is simulated), then its go.
  void OnCycleMessage(SimulatedNode& node, const Message& message) {
    const std::string op = rendezvous::StringField(message, "op");
    if (op == "ok") return;  // the failed report's or cycle_ready's answer
    if (node.phase == Phase::kRunning) {
      Expect(node, message, "restart");
      node.phase = Phase::kCycleReady;
      return SendBytes(node, cycle_ready_frame_);
    }
    Expect(node, message, "cycle_go");
    Finished(kRestartPhase);
    node.phase = Phase::kResult;
    SendBytes(node, report_frame_);
  }

  // One due timer: a heartbeat (as the real client, only after an interval in which the
  // node sent nothing), a blocking read's next slice, a connect that waited too long, a retry.
  void OnTimer(const Timer& timer, Clock::time_point now) {
    SimulatedNode& node = nodes_[size_t(timer.rank)];
    switch (timer.kind) {
      case TimerKind::kHeartbeat:
        if (node.fd < 0 || node.phase < Phase::kJoin || node.phase == Phase::kDone || timer.at != node.next_heartbeat) return;
        if (now - node.last_sent >= kHeartbeatInterval) SendBytes(node, heartbeat_frame_);
        node.next_heartbeat = std::max(now, node.last_sent) + kHeartbeatInterval;
        timers_.push({node.next_heartbeat, node.rank, TimerKind::kHeartbeat});
        return;
      case TimerKind::kResend:
        if (node.fd >= 0 && node.phase == Phase::kSteps && timer.at == node.resend_at) SendStep(node);
        return;
      case TimerKind::kConnectDeadline:
        if (node.fd >= 0 && node.phase == Phase::kConnecting && timer.at == node.connect_deadline) Reconnect(node);
        return;
      case TimerKind::kRetry:
        if (node.fd < 0 && node.phase == Phase::kConnecting && timer.at == node.retry_at) Connect(node);
        return;
    }
  }

  void Connect(SimulatedNode& node) {
    node.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(node.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Each node from its own address (127.1.x.y), as on a cluster: from one address the
    // kernel's search for a free ephemeral port dominates the run.
    setsockopt(node.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr = htonl((127u << 24) | (1u << 16) | uint32_t(node.rank));
    bind(node.fd, reinterpret_cast<sockaddr*>(&source), sizeof source);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    node.phase = Phase::kConnecting;
    node.connect_deadline = Clock::now() + rendezvous::ConnectSchedule::AttemptTimeout(node.attempts + 1);
    timers_.push({node.connect_deadline, node.rank, TimerKind::kConnectDeadline});
    node.decoder = rendezvous::FrameDecoder(rendezvous::kMaxFrameBytes);
    node.pending.clear();
    node.watching_writable = true;  // EPOLLOUT says how the connect went
    connect(node.fd, reinterpret_cast<sockaddr*>(&address), sizeof address);  // EINPROGRESS: EPOLLOUT says how it went
    epoll_event event{};
    event.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    event.data.u32 = uint32_t(node.rank);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, node.fd, &event);
  }

  // A refused, timed-out or shed connection: back off as the real client does.
  void Reconnect(SimulatedNode& node) {
    if (node.phase == Phase::kDone) {  // the leader leaves once every node said bye
      close(node.fd);
      node.fd = -1;
      return;
    }
    if (node.phase > Phase::kWelcome) throw LaunchFailure(kExitUnavailable, "bench: node " + std::to_string(node.rank) + " lost its joined connection");
    close(node.fd);
    node.fd = -1;
    ++figures_.connect_retries;
    node.phase = Phase::kConnecting;
    node.retry_at = Clock::now() + rendezvous::ConnectSchedule::Backoff(++node.attempts, uint32_t(random_()));
    timers_.push({node.retry_at, node.rank, TimerKind::kRetry});
  }

  // Every timer that is due.
  void RetryDue() {
    const auto now = Clock::now();
    while (!timers_.empty() && timers_.top().at <= now) {
      const Timer timer = timers_.top();
      timers_.pop();
      OnTimer(timer, now);
    }
  }

  void OnEvent(SimulatedNode& node, uint32_t events) {
    if (node.fd < 0) return;
    if (node.phase == Phase::kConnecting && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int error = 0;
      socklen_t length = sizeof error;
      getsockopt(node.fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) return Reconnect(node);
      node.phase = Phase::kHello;
      SetWriteInterest(node, false);
    }
    if (events & EPOLLOUT) Flush(node);
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) Read(node);
  }

  void Read(SimulatedNode& node) {
    char buffer[65536];
    for (;;) {
      const ssize_t got = read(node.fd, buffer, sizeof buffer);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return Reconnect(node);
      if (got < 0) break;
      figures_.bytes_from_leader += uint64_t(got);
      node.decoder.Feed(buffer, size_t(got));
    }
    Message message;
    while (node.fd >= 0 && node.decoder.Next(message)) OnMessage(node, message);
  }

  void OnMessage(SimulatedNode& node, const Message& message) {
    const std::string op = rendezvous::StringField(message, "op");
    if (op == "hb") {
      figures_.heartbeat_bytes_from_leader += heartbeat_frame_.size();  // the leader's is the same frame
      return;
    }
    switch (node.phase) {
      case Phase::kHello:
        node.nonce = rendezvous::RandomNonce();
        node.phase = Phase::kWelcome;
        return Send(node, {{"op", "auth"},
                           {"proof", rendezvous::BytesValue(rendezvous::ProveToken(kToken, rendezvous::BytesField(message, "nonce"), "client"))},
                           {"nonce", rendezvous::BytesValue(node.nonce)}});
      case Phase::kWelcome:
        if (op != "welcome" || !rendezvous::VerifyProof(kToken, node.nonce, "server", rendezvous::BytesField(message, "proof"))) {
          throw LaunchFailure(kExitUnavailable, "bench: the leader refused the handshake: " + message.dump());
        }
        node.phase = Phase::kJoin;
        node.next_heartbeat = Clock::now() + kHeartbeatInterval;  // the real client's reader starts now
        if (shape_ != Shape::kProtocol) timers_.push({node.next_heartbeat, node.rank, TimerKind::kHeartbeat});
        return SendBytes(node, join_frames_[size_t(node.rank - 1)]);
      case Phase::kJoin:
        Expect(node, message, "ok");
        Finished(0);
        node.phase = Phase::kComplete;
        return;
      case Phase::kComplete:
        Expect(node, message, "complete");
        Finished(1);
        if (shape_ != Shape::kProtocol) {
          node.phase = Phase::kSteps;
          return SendStep(node);
        }
        node.phase = Phase::kBarrierAdd;
        return SendBytes(node, add_frame_);
      case Phase::kBarrierAdd:
        Expect(node, message, "ok");
        if (rendezvous::IntField(message, "value") == count_ - 1) SendBytes(node, set_frame_);
        node.phase = Phase::kBarrierWait;
        return SendBytes(node, wait_frame_);
      case Phase::kBarrierWait:
        Expect(node, message, "ok");
        if (rendezvous::IntField(message, "id") != 4) return;  // the set's answer
        Finished(2);
        node.phase = Phase::kResult;
        return SendBytes(node, report_frame_);
      case Phase::kSteps:
        return OnStepAnswer(node, message);
      case Phase::kRunning:
      case Phase::kCycleReady:
        return OnCycleMessage(node, message);
      case Phase::kResult:
        if (op == "ok") return;  // the report's answer
        Expect(node, message, "result");
        Finished(phases_ - 1);
        node.phase = Phase::kDone;
        return SendBytes(node, bye_frame_);
      default:
        return;
    }
  }

  void Expect(const SimulatedNode& node, const Message& message, const char* op) {
    if (rendezvous::StringField(message, "op") != op) {
      throw LaunchFailure(kExitUnavailable, "bench: node " + std::to_string(node.rank) + " expected " + op + ", got " + message.dump());
    }
  }

  void Finished(int phase) {
    if (++finished_[size_t(phase)] < count_ - 1) return;
    const Clock::time_point origin = shape_ == Shape::kRestart && phase == kRestartPhase ? fault_at_ : start_;
    figures_.phase_s[phase] = std::chrono::duration<double>(Clock::now() - origin).count();
  }

  void Send(SimulatedNode& node, const Message& message) { SendBytes(node, rendezvous::EncodeFrame(message)); }

  void SendBytes(SimulatedNode& node, const std::string& frame) {
    node.last_sent = Clock::now();
    node.pending += frame;
    Flush(node);
  }

  void Flush(SimulatedNode& node) {
    while (!node.pending.empty()) {
      const ssize_t sent = send(node.fd, node.pending.data(), node.pending.size(), MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EAGAIN) return SetWriteInterest(node, true);
        return Reconnect(node);
      }
      node.pending.erase(0, size_t(sent));
    }
    SetWriteInterest(node, false);
  }

  // One epoll_ctl only when the interest changes, as the leader does: the simulated nodes
  // share the leader's cores, and a syscall per message was a fair part of their time.
  void SetWriteInterest(SimulatedNode& node, bool on) {
    if (node.watching_writable == on) return;
    node.watching_writable = on;
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0u);
    event.data.u32 = uint32_t(node.rank);
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, node.fd, &event);
  }

  Shape shape_;
  int phases_;
  int count_;
  uint16_t port_;
  std::vector<SimulatedNode> nodes_;
  std::vector<std::string> join_frames_, inventory_frames_, health_frames_, phase_frames_;
  std::vector<Step> steps_;
  std::string add_frame_, set_frame_, wait_frame_, report_frame_, bye_frame_, heartbeat_frame_;
  std::string fail_frame_, cycle_ready_frame_;  // restart shape
  int running_ = 0;                             // restart shape: nodes whose job runs
  Clock::time_point fault_at_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::mt19937 random_{std::random_device{}()};
  int epoll_fd_ = -1;
  std::vector<int> finished_ = std::vector<int>(kMaxPhases, 0);
  Clock::time_point start_;
  RunFigures figures_;
};

// Whether something listens on `port`, from /proc/net/tcp{,6} (state 0A): no connection is
// made, so the leader sees nothing but the nodes.
bool Listening(uint16_t port) {
  char wanted[16];
  std::snprintf(wanted, sizeof wanted, ":%04X ", port);
  for (const char* table : {"/proc/net/tcp6", "/proc/net/tcp"}) {
    FILE* file = std::fopen(table, "r");
    if (file == nullptr) continue;
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, file) != nullptr) {
      const char* local = std::strstr(line, wanted);
      found = local != nullptr && local - line < 60 && std::strstr(line, " 0A ") != nullptr;
    }
    std::fclose(file);
    if (found) return true;
  }
  return false;
}

void WaitUntilListening(uint16_t port, pid_t leader) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!Listening(port)) {
    if (Clock::now() > deadline || waitpid(leader, nullptr, WNOHANG) == leader) {
      throw LaunchFailure(kExitUnavailable, "bench: the leader never listened on port " + std::to_string(port));
    }
    usleep(500);
  }
}

RunFigures RunOnce(Shape shape, int count, const std::string& sysfs_root, const std::string& inventory_json) {
  const uint16_t port = FreePort();
  char root[] = "/tmp/bt-bench-rendezvous.XXXXXX";
  if (mkdtemp(root) == nullptr) throw LaunchFailure(kExitIo, "bench: cannot create a directory in /tmp");
  Swarm swarm(shape, count, port, inventory_json);  // frames built before the clock starts
  const pid_t leader = StartLeader(storage::CurrentExecutable(), shape, count, port, root, sysfs_root);
  RunFigures figures;
  try {
    WaitUntilListening(port, leader);
    const auto start = Clock::now();  // as for the TCPStore peer: once the leader listens
    figures = swarm.Run(start, start + std::chrono::seconds(300));
  } catch (...) {
    kill(leader, SIGKILL);
    waitpid(leader, nullptr, 0);
    throw;
  }
  int status = 0;
  rusage usage{};
  wait4(leader, &status, 0, &usage);
  figures.leader_cpu_s = double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                         double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  storage::RemoveTree(root);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw LaunchFailure(kExitUnavailable, "bench: the leader failed");
  return figures;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int BenchRendezvous(const CliOptions& cli) {
  const int count = cli.bench_nodes;
  const int runs = cli.bench_runs;
  if (cli.bench_protocol_only && cli.bench_restart) {
    throw LaunchFailure(kExitUsage, "bench rendezvous: --protocol-only and --restart do not go together");
  }
  const Shape shape = cli.bench_protocol_only ? Shape::kProtocol : cli.bench_restart ? Shape::kRestart : Shape::kRun;
  const std::vector<std::string>& names = PhaseNames(shape);
  const size_t file_limit = rendezvous::RaiseOpenFileLimit(size_t(count) + 1024);
  if (size_t(count) + 64 > file_limit) {
    throw LaunchFailure(kExitUsage, "bench rendezvous: " + std::to_string(count) + " nodes need " + std::to_string(count + 64) +
                                        " file descriptors; the limit is " + std::to_string(file_limit));
  }
  spdlog::set_level(spdlog::level::warn);
  // Every simulated node publishes what node 0 reads from the same devices: one fabric.
  const std::string sysfs_root = rendezvous::fabric::SysfsRoot(cli.sysfs_root);
  const std::string inventory_json = rendezvous::fabric::ReadInventory(sysfs_root).ToJson().dump();
  std::printf("%-6s %-4s", "nodes", "run");
  for (const auto& name : names) std::printf(" %10s", (name + "_s").c_str());
  std::printf(" %13s %8s %14s %10s\n", "leader_cpu_s", "retries", "leader_B/node", "of_it_hb");
  std::vector<std::vector<double>> phases(names.size());
  std::vector<double> leader_cpu, bytes_per_node, heartbeat_bytes_per_node;
  for (int run = 1; run <= runs; ++run) {
    const RunFigures figures = RunOnce(shape, count, sysfs_root, inventory_json);
    std::printf("%-6d %-4d", count, run);
    for (size_t phase = 0; phase < names.size(); ++phase) {
      phases[phase].push_back(figures.phase_s[phase]);
      std::printf(" %10.3f", figures.phase_s[phase]);
    }
    leader_cpu.push_back(figures.leader_cpu_s);
    bytes_per_node.push_back(double(figures.bytes_from_leader) / double(count - 1));
    heartbeat_bytes_per_node.push_back(double(figures.heartbeat_bytes_from_leader) / double(count - 1));
    std::printf(" %13.3f %8d %14.0f %10.0f\n", figures.leader_cpu_s, figures.connect_retries, bytes_per_node.back(),
                heartbeat_bytes_per_node.back());
    std::fflush(stdout);
  }
  nlohmann::json summary = {{"nodes", count},
                            {"runs", runs},
                            {"shape", shape == Shape::kRun ? "run" : shape == Shape::kRestart ? "restart" : "protocol"},
                            {"p50_s", Median(phases.back())},
                            {"leader_cpu_p50_s", Median(leader_cpu)},
                            {"leader_bytes_per_node_p50", Median(bytes_per_node)},
                            {"leader_heartbeat_bytes_per_node_p50", Median(heartbeat_bytes_per_node)}};
  for (size_t phase = 0; phase < names.size(); ++phase) summary[names[phase] + "_p50_s"] = Median(phases[phase]);
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace bt::launcher
