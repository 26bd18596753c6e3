#include "rendezvous/server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "rendezvous/auth.h"
#include "rendezvous/key_policy.h"
#include "rendezvous/store.h"
#include "rendezvous/wire.h"

namespace bt::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxPendingOutputBytes = 256u << 20;  // a peer that stops reading is dropped
constexpr size_t kMaxWaitsPerConnection = 4096;
// A failed node's cause goes to every node in the abort: a failure that quotes a table
// (the fabric's differences, thousands of rows at scale) must not cost N times its size.
constexpr size_t kMaxCauseBytes = 4096;
// While a restart's barrier waits, every node hears this often which ranks it waits for.
constexpr std::chrono::seconds kAwaitedLogEvery{10};
// The longest a new leader of rank 0 waits for one on a spare that left alive to exit (its
// hand-over writes for at most 10 s: launcher/launch.cpp kHandOverBound).
constexpr std::chrono::seconds kHandOverWait{30};
constexpr size_t kMaxAwaitedListed = 32;
constexpr int kEpollBatch = 512;
// A connection must prove the token this soon after it is accepted, and only so many may be
// waiting to: idle connections (a port scanner, a health check, anyone on the network)
// cannot hold the leader's descriptors.
constexpr std::chrono::seconds kAuthDeadline{5};
constexpr size_t kMaxUnauthenticated = 1024;
constexpr const char* kRosterKey = "bt/roster";
constexpr int kMaxListeners = 16;  // accept queues sharing the port: 65,536 nodes at somaxconn 4,096
// Descriptors the leader's process keeps for itself (its own node's client, files, the
// uploader's pipes): connections beyond the rest are closed at accept.
constexpr size_t kReservedDescriptors = 32;

std::string PeerAddress(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "?";
  return AddressText(reinterpret_cast<sockaddr*>(&address));
}

// Every node holds one connection, and as many strangers may be proving the token (see
// max_unauthenticated_): the open-file limit must cover both. Returns the limit in force.
size_t RaiseFileLimit(int node_count) {
  const size_t limit = RaiseOpenFileLimit(2 * size_t(node_count) + 1024);
  if (size_t(node_count) + 64 > limit) {
    spdlog::warn("the open-file limit is {} but {} nodes will connect: raise it (ulimit -n, or the container's "
                 "nofile limit) or some nodes cannot join", limit, node_count);
  }
  return limit;
}

int SomaxConn() {
  std::ifstream file("/proc/sys/net/core/somaxconn");
  int value = 0;
  file >> value;
  return value;
}

// Binds the wildcard address of `family` and listens (backlog < 0: binds only); -1 with
// errno set on failure.
int ListenOn(int family, uint16_t port, int backlog, bool reuse_port) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (reuse_port) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  sockaddr_storage address{};
  socklen_t length = 0;
  if (family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 arrives mapped
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
    v6->sin6_family = AF_INET6;
    v6->sin6_addr = in6addr_any;
    v6->sin6_port = htons(port);
    length = sizeof *v6;
  } else {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4->sin_port = htons(port);
    length = sizeof *v4;
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 && (backlog < 0 || listen(fd, backlog) == 0)) return fd;
  int saved = errno;
  close(fd);
  errno = saved;
  return -1;
}

uint16_t BoundPort(int fd);

// Listening sockets on every address: IPv6 with IPv4 mapped in, or IPv4 alone where IPv6
// is disabled. `count` > 1 shares the port between sockets (SO_REUSEPORT), each with its
// own accept queue: the kernel caps one queue at net.core.somaxconn (4,096 by default,
// rarely writable in a container), and a cluster arriving at once overflows it, every
// dropped SYN costing its node a 1 s retransmission. A plain bind first makes a port that
// another process holds fail as it always did, instead of being shared with it.
std::vector<int> Listen(uint16_t port, int backlog, int count) {
  int family = AF_INET6;
  auto listen_one = [&](uint16_t on_port, int with_backlog, bool shared) {
    int fd = ListenOn(family, on_port, with_backlog, shared);
    if (fd < 0 && family == AF_INET6 && (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL)) {
      family = AF_INET;
      fd = ListenOn(family, on_port, with_backlog, shared);
    }
    if (fd < 0) throw StoreError("cannot listen on port " + std::to_string(on_port) + ": " + std::strerror(errno));
    return fd;
  };
  if (count <= 1) return {listen_one(port, backlog, false)};
  if (port != 0) close(listen_one(port, -1, false));  // in use by someone else: fail here
  std::vector<int> fds = {listen_one(port, backlog, true)};
  const uint16_t bound = BoundPort(fds.front());
  while (int(fds.size()) < count) fds.push_back(listen_one(bound, backlog, true));
  return fds;
}

uint16_t BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

struct Connection {
  int fd = -1;
  std::string peer;
  FrameDecoder decoder;
  std::string output;
  size_t output_sent = 0;
  bool watching_writable = false;  // EPOLLOUT is in its epoll mask
  bool queued_for_flush = false;   // in to_flush_: output waits for the end of this turn
  Clock::time_point last_sent{};   // the last frame queued to it (a heartbeat is skipped within the interval)
  std::string nonce;
  bool authenticated = false;
  bool said_goodbye = false;
  bool dead = false;  // closed at the end of the current event, never in the middle of a handler
  std::string dead_reason;
  int rank = -1;
  size_t pending_waits = 0;
  size_t parked_bytes = 0;  // what its parked requests hold on the leader (see ParkedBytes)
  Clock::time_point last_seen = Clock::now();
  Clock::time_point accepted_at = Clock::now();
};

// A request parked until its key exists: wait, or get (which answers with the value).
// It expires with the client's own timeout, so timed-out waits do not pile up.
struct Waiter {
  int fd;
  int64_t id;
  bool wants_value;
  size_t bytes;  // charged to its connection's parked_bytes while parked
};

// The requests parked on one key, by arrival: nodes re-issue their blocking reads in slices,
// so at 16,384 nodes thousands on one key expire every second, and each must be found
// without a pass over the others (that pass, once per expiry, starved the leader's loop).
using ParkedOnKey = std::map<uint64_t, Waiter>;

// Where the expiry index finds a parked request.
struct ParkedRequest {
  std::string key;
  uint64_t arrival;
};

// What a parked request on `key` holds: the key twice (the waiter table and the expiry
// index), the waiter and the tables' nodes.
size_t ParkedBytes(const std::string& key) { return 2 * key.size() + sizeof(Waiter) + 128; }

}  // namespace

class StoreServer::Loop {
 public:
  explicit Loop(ServerOptions options) : options_(std::move(options)), start_(Clock::now()) {
    const size_t file_limit = RaiseFileLimit(options_.node_count);
    max_connections_ = file_limit > 2 * kReservedDescriptors ? file_limit - kReservedDescriptors : file_limit / 2;
    // Half of them at most may be strangers that have not proved the token: the nodes
    // always find room. A whole cluster arriving at once may all be waiting to prove it:
    // below the node count, the cap itself would shed real nodes into retry loops.
    max_unauthenticated_ = std::min(std::max(kMaxUnauthenticated, size_t(options_.node_count)),
                                    std::max<size_t>(1, max_connections_ / 2));
    const int backlog = std::max(options_.node_count + 128, 4096);
    const int somaxconn = SomaxConn();
    const int queues = somaxconn > 0 ? std::clamp((backlog + somaxconn - 1) / somaxconn, 1, kMaxListeners) : 1;
    listen_fds_ = Listen(options_.port, backlog, queues);
    if (somaxconn > 0 && int64_t(somaxconn) * queues < options_.node_count) {
      spdlog::warn("net.core.somaxconn is {} but {} nodes will connect: raise it (sysctl -w net.core.somaxconn={}) "
                   "or nodes will retry their connects", somaxconn, options_.node_count, options_.node_count);
    }
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int fd : listen_fds_) Watch(fd, EPOLLIN);
    Watch(wake_fd_, EPOLLIN);
    joined_.resize(size_t(options_.node_count), -1);
    infos_.resize(size_t(options_.node_count));
    reported_.resize(size_t(options_.node_count), false);
    awaiting_rejoin_.resize(size_t(options_.node_count), false);
    spare_ready_.resize(size_t(options_.node_count), false);
    moved_away_.resize(size_t(options_.node_count), false);
    rank_slots_ = cycles_.assignment().Slots();
    join_deadline_ = start_ + options_.join_timeout;
    next_tick_ = start_ + options_.heartbeat_interval;
  }

  ~Loop() {
    for (auto& [fd, connection] : connections_) close(fd);
    if (spare_fd_ >= 0) close(spare_fd_);
    for (int fd : listen_fds_) close(fd);
    close(epoll_fd_);
    close(wake_fd_);
  }

  uint16_t port() const { return BoundPort(listen_fds_.front()); }

  void Run() {
    epoll_event events[kEpollBatch];
    Clock::time_point last_woke = Clock::now();
    while (!stop_requested_) {
      int timeout = int(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                   NextDeadline() - Clock::now()).count()) + 1);
      int ready = epoll_wait(epoll_fd_, events, kEpollBatch, timeout);
      // Measured from the last wake, not from this wait's start: a freeze that caught the
      // thread handling the last turn (or preempted before this wait) is a stall as much as
      // one inside epoll_wait, and must be seen before this turn's events, which may be a
      // follower's goodbye sent because of it (CI: node 0 spent a restart on its own freeze).
      const Clock::time_point woke = Clock::now();
      NoticeOwnStall(woke - last_woke - std::chrono::milliseconds(timeout));
      last_woke = woke;
      for (int i = 0; i < ready; ++i) HandleEvent(events[i]);
      OnTimers();
      FlushQueued();
      CloseDead();
      if (IsDrained()) {
        std::lock_guard lock(mutex_);
        drained_ = true;
        drained_changed_.notify_all();
      }
    }
  }

  // An exception leaving the server's thread would call std::terminate: node 0's launcher
  // (PID 1) and its training would end without a word, and the other nodes would wait for
  // their heartbeat timeout. Whatever escapes the loop ends the job instead, with its cause.
  void RunGuarded() {
    try {
      Run();
    } catch (const std::exception& error) {
      FailJob(error.what());
    } catch (...) {
      FailJob("an exception that is not a std::exception");
    }
  }

  void RequestStop() {
    {
      std::lock_guard lock(store_mutex_);
      stop_requested_ = true;
    }
    values_changed_.notify_all();
    uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = write(wake_fd_, &one, sizeof one);
  }

  void WaitUntilDrained() {
    std::unique_lock lock(mutex_);
    drained_changed_.wait(lock, [&] { return drained_ || stop_requested_; });
  }

  // Whether the job ended because node 0 itself stalled past the heartbeat timeout.
  bool StalledItself() const {
    std::lock_guard lock(mutex_);
    return verdict_stalled_itself_;
  }

  ServerVerdict verdict() const {
    std::lock_guard lock(mutex_);
    return verdict_;
  }

  std::vector<NodeInfo> roster(bool with_addresses = true) const {
    std::lock_guard lock(mutex_);
    std::vector<NodeInfo> nodes;
    nodes.reserve(joined_.size());
    for (size_t rank = 0; rank < joined_.size(); ++rank) {
      const NodeInfo& info = infos_[rank];
      if (info.host.empty()) continue;  // set when the rank joined
      if (with_addresses) {
        nodes.push_back(info);
      } else {
        nodes.push_back({info.rank, info.host, {}, info.pid, info.seen_from, info.joined_after_s});
      }
    }
    return nodes;
  }

  // Node 0's own reads, from its launcher's thread: the values under store_mutex_, never a
  // request over its own socket (encoding, a loopback round trip and decoding megabytes).
  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) const {
    std::vector<std::optional<std::string>> values;
    values.reserve(keys.size());
    std::lock_guard lock(store_mutex_);
    for (const std::string& key : keys) {
      auto it = values_.find(key);
      values.push_back(it == values_.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return values;
  }

  bool WaitCounter(const std::string& key, int64_t at_least, std::chrono::milliseconds timeout) {
    std::unique_lock lock(store_mutex_);
    ++counter_watchers_;
    const bool reached = values_changed_.wait_for(lock, timeout, [&] {
      if (stop_requested_) return true;
      auto it = values_.find(key);
      if (it == values_.end()) return at_least <= 0;
      try {
        return AddToCounter(key, &it->second, 0) >= at_least;
      } catch (const StoreError&) {
        return false;
      }
    });
    --counter_watchers_;
    if (stop_requested_) throw StoreError("the leader's store has stopped");
    return reached;
  }

  std::vector<int> absent() const {
    std::lock_guard lock(mutex_);
    std::vector<int> ranks;
    for (size_t rank = 0; rank < rank_slots_.size(); ++rank) {
      if (joined_[size_t(rank_slots_[rank])] < 0) ranks.push_back(int(rank));
    }
    return ranks;
  }

  StoreServer::NodeStates node_states() const {
    std::lock_guard lock(mutex_);
    StoreServer::NodeStates states;
    std::vector<bool> runs_rank(joined_.size(), false);
    for (int slot : rank_slots_) {
      runs_rank[size_t(slot)] = true;
      ++(joined_[size_t(slot)] >= 0 ? states.ready : states.lost);
    }
    for (size_t slot = 0; slot < joined_.size(); ++slot) states.spare += !runs_rank[slot] && joined_[slot] >= 0;
    return states;
  }

  std::vector<int> nodes_running_ranks() const {
    std::lock_guard lock(mutex_);
    std::vector<int> slots = rank_slots_;
    std::sort(slots.begin(), slots.end());
    return slots;
  }

  std::vector<int> unreported() const {
    std::lock_guard lock(mutex_);
    std::vector<int> slots;
    for (int slot : rank_slots_) {
      if (!reported_[size_t(slot)]) slots.push_back(slot);
    }
    std::sort(slots.begin(), slots.end());
    return slots;
  }

 private:
  void Watch(int fd, uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
  }

  Clock::time_point NextDeadline() const {
    Clock::time_point next = next_tick_;
    if (!wait_deadlines_.empty()) next = std::min(next, wait_deadlines_.begin()->first);
    if (verdict_.kind == ServerVerdict::Kind::kPending && joined_count_ < options_.node_count) {
      next = std::min(next, join_deadline_);
    }
    return next;
  }

  void HandleEvent(const epoll_event& event) {
    if (event.data.fd == wake_fd_) {
      uint64_t value;
      [[maybe_unused]] ssize_t ignored = read(wake_fd_, &value, sizeof value);
      return;
    }
    if (std::find(listen_fds_.begin(), listen_fds_.end(), event.data.fd) != listen_fds_.end()) {
      AcceptAll(event.data.fd);
      return;
    }
    auto it = connections_.find(event.data.fd);
    if (it == connections_.end()) return;
    Connection& connection = *it->second;
    if (event.events & EPOLLIN) ReadFrom(connection);
    if (event.events & EPOLLOUT) Flush(connection);
    if ((event.events & (EPOLLHUP | EPOLLERR)) && !(event.events & EPOLLIN)) Kill(connection, "connection closed");
    CloseDead();
  }

  void AcceptAll(int listen_fd) {
    while (true) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        if (!ShedWithSpareDescriptor(listen_fd)) return;
        continue;
      }
      if (fd < 0) return;  // EAGAIN: the backlog is empty
      const std::string peer = PeerAddress(fd);
      if (unauthenticated_ >= max_unauthenticated_ || connections_.size() >= max_connections_) {
        close(fd);
        NoteRefused(peer, unauthenticated_ >= max_unauthenticated_ ? "too many connections waiting to authenticate"
                                                                    : "the leader's open-file limit is reached");
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto connection = std::make_unique<Connection>();
      connection->fd = fd;
      connection->peer = peer;
      connection->nonce = RandomNonce();
      Watch(fd, EPOLLIN | EPOLLRDHUP);
      Send(*connection, {{"op", "hello"}, {"nonce", BytesValue(connection->nonce)}});
      connections_.emplace(fd, std::move(connection));
      ++unauthenticated_;
    }
  }

  // Out of descriptors: the listening socket stays readable and epoll would return at once,
  // forever. Give back the spare, accept one pending connection and close it, take the spare
  // again: the backlog drains and the peers retry.
  bool ShedWithSpareDescriptor(int listen_fd) {
    if (spare_fd_ < 0) return false;
    close(spare_fd_);
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    std::string peer = fd >= 0 ? PeerAddress(fd) : "";
    if (fd >= 0) close(fd);
    spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    NoteRefused(peer, "the leader is out of file descriptors");
    return true;
  }

  // One log line per peer address and reason, then only at 10, 100, 1000...: a scanner
  // must not flood the log.
  void NoteRefused(const std::string& peer, const std::string& why) {
    size_t count = ++refusals_[peer + ": " + why];
    if (count != 1 && count != 10 && count != 100 && count != 1000 && count % 10000 != 0) return;
    spdlog::warn("rendezvous: closed a connection from {}: {} ({} from this address so far)", peer, why, count);
  }

  void CloseSilentUnauthenticated(Clock::time_point now) {
    for (auto& [fd, connection] : connections_) {
      if (connection->authenticated || connection->dead || now - connection->accepted_at < kAuthDeadline) continue;
      NoteRefused(connection->peer, "no authentication within " + std::to_string(kAuthDeadline.count()) + " s");
      Kill(*connection, "did not authenticate in time");
    }
  }

  void ReadFrom(Connection& connection) {
    char buffer[65536];
    while (!connection.dead) {
      ssize_t got = read(connection.fd, buffer, sizeof buffer);
      if (got == 0) return Kill(connection, "connection closed");
      if (got < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        // A peer that dies with unread data in its socket resets it instead of closing.
        if (errno == ECONNRESET) return Kill(connection, "connection closed (reset)");
        return Kill(connection, std::string("read failed: ") + std::strerror(errno));
      }
      connection.last_seen = Clock::now();
      connection.decoder.Feed(buffer, size_t(got));
      try {
        Message message;
        while (!connection.dead && connection.decoder.Next(message)) Dispatch(connection, message);
      } catch (const std::exception& error) {
        // FrameError, or a well-formed frame whose fields are not what its op needs (a
        // missing `info`, a wrong type): that one connection goes, never the leader.
        spdlog::warn("rendezvous: dropping connection from {}: bad frame: {}", connection.peer, error.what());
        return Kill(connection, std::string("bad frame: ") + error.what());
      }
    }
  }

  void Dispatch(Connection& connection, const Message& message) {
    const std::string op = StringField(message, "op");
    if (!connection.authenticated) return Authenticate(connection, op, message);
    if (op == "hb") return;
    if (op == "set") return OnSet(connection, message);
    if (op == "get" || op == "wait") return OnWait(connection, message, op == "get");
    if (op == "add") return OnAdd(connection, message);
    if (op == "mget") return OnPeek(connection, message);
    if (op == "join") return OnJoin(connection, message);
    if (op == "report") return OnReport(connection, message);
    if (op == "give_up") return OnGiveUp(connection, message);
    if (op == "cycle_ready") return OnCycleReady(connection, message);
    if (op == "spare_ready") return OnSpareReady(connection, message);
    if (op == "stall" || op == "resumed") return OnStall(connection, message, op == "stall");
    if (op == "hang") return OnHang(connection, message);
    if (op == "bye") {
      connection.said_goodbye = true;
      return;
    }
    throw FrameError("unknown op \"" + op + "\"");
  }

  // The job id a node named, when it is not this job's. Only a node that proved the token
  // learns which job the leader serves.
  std::optional<std::string> OtherJob(const Message& message) const {
    if (options_.job_id.empty() || !message.contains("job_id")) return std::nullopt;
    std::string job_id = BytesField(message, "job_id");
    if (job_id.empty() || job_id == options_.job_id) return std::nullopt;
    return job_id;
  }

  // A token derived from the job id (Slurm's, Kubernetes') differs between two jobs, so a
  // node that reaches another job's leader (two jobs on one node, one port) fails the proof
  // before its job id is compared: name that likely cause, without saying which job the
  // leader serves.
  void RejectWrongToken(Connection& connection, const std::optional<std::string>& other_job) {
    std::string message = "wrong job token (check BT_RENDEZVOUS_TOKEN on every node)";
    if (other_job) {
      message = "wrong job token: this node is of job " + *other_job +
                ", but the leader serves another job: two jobs share the leader's address and port (give each job "
                "its own nodes, e.g. Slurm's --exclusive, or its own BT_RENDEZVOUS_PORT)";
    }
    spdlog::warn("rendezvous: rejected {}: wrong job token{}", connection.peer,
                 other_job ? " (a node of job " + *other_job + ")" : "");
    Send(connection, {{"op", "reject"}, {"message", message}});
    FlushAndClose(connection);
  }

  // The first message must prove the token; anything else closes the connection.
  void Authenticate(Connection& connection, const std::string& op, const Message& message) {
    if (op != "auth") throw FrameError("expected auth, got \"" + op + "\"");
    if (!VerifyProof(options_.token, connection.nonce, "client", BytesField(message, "proof"))) {
      RejectWrongToken(connection, OtherJob(message));
      return;
    }
    if (auto other_job = OtherJob(message)) {
      spdlog::warn("rendezvous: rejected {}: a node of job {}, not of this job {}", connection.peer, *other_job,
                   options_.job_id);
      Send(connection, {{"op", "reject"},
                        {"message", "this node is of job " + *other_job + ", but the leader serves job " +
                                        options_.job_id + ": two jobs share the leader address and the token "
                                        "(give each job its own BT_LEADER_ADDR, or its own BT_RENDEZVOUS_TOKEN)"}});
      FlushAndClose(connection);
      return;
    }
    connection.authenticated = true;
    --unauthenticated_;
    connection.decoder.set_max_frame_bytes(kMaxFrameBytes);
    // The wall clock lets a node (bt-launch doctor) measure its skew against the leader.
    const int64_t wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
    Send(connection, {{"op", "welcome"},
                      {"proof", BytesValue(ProveToken(options_.token, BytesField(message, "nonce"), "server"))},
                      {"time_ns", wall_ns}});
  }

  // Every write of the table: under store_mutex_ (node 0's own thread reads it), and a
  // wake-up for node 0's thread when it waits for a counter.
  void StoreValue(const std::string& key, std::string value) {
    bool watched = false;
    {
      std::lock_guard lock(store_mutex_);
      values_[key] = std::move(value);
      watched = counter_watchers_ > 0;
    }
    if (watched) values_changed_.notify_all();
  }

  void OnSet(Connection& connection, const Message& message) {
    const std::string key = StringField(message, "key");
    std::string value = BytesField(message, "value");
    if (auto why = KeySizeRefusal(key)) return Refuse(connection, message, *why);
    if (auto why = ValueSizeRefusal(key, value.size())) return Refuse(connection, message, *why);
    if (auto why = WriteRefusal(key, KeyWrite::kSet, connection.rank, TrainingRankOf(connection))) {
      return Refuse(connection, message, *why);
    }
    if (key == kStartRanksKey && !StartWithRanks(connection, message, value)) return;
    if (key == kHandedOverKey) return NodeZeroHandedOver(connection, message, value);
    StoreValue(key, std::move(value));
    Reply(connection, message, {{"op", "ok"}});
    WakeWaiters(key);
  }

  // "node 2 (host, address)", and with hot spares the rank it runs ("...; rank 1)", "...; a
  // spare)"): a slot and its training rank differ once a spare took a rank.
  std::string NodeName(int slot) const {
    std::string label = infos_[size_t(slot)].Label();
    if (!cycles_.HasSpares() || label.empty() || label.back() != ')') return label;
    const int rank = cycles_.assignment().RankOf(slot);
    const std::string no_rank = slot == 0 ? "; running no rank" : "; a spare";
    label.insert(label.size() - 1, rank < 0 ? no_rank : "; rank " + std::to_string(rank));
    return label;
  }

  // The training rank a joined node runs, where hot spares make it differ from its slot.
  std::optional<int> TrainingRankOf(const Connection& connection) const {
    if (connection.rank < 0 || !cycles_.HasSpares()) return std::nullopt;
    return cycles_.assignment().RankOf(connection.rank);
  }

  // A request the leader does not accept: the node is told why, then its connection is
  // closed (a joined node's loss aborts the job, and the abort names the refusal).
  void Refuse(Connection& connection, const Message& request, const std::string& why) {
    spdlog::warn("rendezvous: refused a request from {}{}: {}", connection.peer,
                 connection.rank >= 0 ? " (node " + std::to_string(connection.rank) + ")" : "", why);
    Reply(connection, request, {{"op", "error"}, {"message", "refused: " + why}});
    Flush(connection);
    shutdown(connection.fd, SHUT_WR);
    Kill(connection, "refused: " + why);
  }

  void OnWait(Connection& connection, const Message& message, bool wants_value) {
    const std::string key = StringField(message, "key");
    const int64_t id = IntField(message, "id");
    if (auto why = KeySizeRefusal(key)) return Refuse(connection, message, *why);
    if (key == kRosterKey && roster_complete_ && !values_.count(key)) PublishRoster();
    auto it = values_.find(key);
    if (it != values_.end()) {
      Message reply = {{"op", "ok"}, {"id", id}};
      if (wants_value) reply["value"] = BytesValue(it->second);
      return Send(connection, reply);
    }
    if (connection.pending_waits >= kMaxWaitsPerConnection) throw FrameError("too many pending waits");
    const size_t bytes = ParkedBytes(key);
    if (connection.parked_bytes + bytes > kMaxParkedBytesPerConnection) {
      return Refuse(connection, message, "parked requests would hold more than " +
                                             std::to_string(kMaxParkedBytesPerConnection) + " bytes on the leader");
    }
    const uint64_t arrival = next_arrival_++;
    if (auto timeout = message.find("timeout_ms"); timeout != message.end() && timeout->is_number_unsigned()) {
      const auto deadline = Clock::now() + std::chrono::milliseconds(std::min<uint64_t>(timeout->get<uint64_t>(), 1ull << 40));
      wait_deadlines_.emplace(deadline, ParkedRequest{key, arrival});
    }
    ++connection.pending_waits;
    connection.parked_bytes += bytes;
    waiters_[key].emplace(arrival, Waiter{connection.fd, id, wants_value, bytes});
  }

  // Drops parked requests whose client has given up on them.
  void ExpireWaits() {
    const auto now = Clock::now();
    while (!wait_deadlines_.empty() && wait_deadlines_.begin()->first <= now) {
      const auto expired = wait_deadlines_.extract(wait_deadlines_.begin());
      auto parked = waiters_.find(expired.mapped().key);
      if (parked == waiters_.end()) continue;
      auto waiter = parked->second.find(expired.mapped().arrival);
      if (waiter == parked->second.end()) continue;  // answered, or gone with its connection
      if (auto connection = connections_.find(waiter->second.fd); connection != connections_.end()) {
        Unpark(*connection->second, waiter->second);
      }
      parked->second.erase(waiter);
      if (parked->second.empty()) waiters_.erase(parked);
    }
  }

  // The values of several keys as they are now, null for those not set.
  void OnPeek(Connection& connection, const Message& message) {
    auto keys = message.find("keys");
    if (keys == message.end() || !keys->is_array()) throw FrameError("field \"keys\": expected an array");
    if (keys->size() > kMaxPeekKeys) {
      return Refuse(connection, message, "mget of " + std::to_string(keys->size()) + " keys (at most " +
                                             std::to_string(kMaxPeekKeys) + ")");
    }
    Message values = Message::array();
    size_t bytes = 0;
    for (const auto& key : *keys) {
      if (!key.is_string()) throw FrameError("field \"keys\": expected strings");
      if (key == kAbsentRanksKey) {  // answered from the server's own state, never stored
        values.push_back(BytesValue(nlohmann::json(absent()).dump()));
        continue;
      }
      auto it = values_.find(key.get_ref<const std::string&>());
      if (it == values_.end()) {
        values.push_back(nullptr);
        continue;
      }
      bytes += it->second.size();
      if (bytes > kMaxPeekReplyBytes) {
        return Reply(connection, message, {{"op", "error"}, {"message", "mget answer over " +
                                                                          std::to_string(kMaxPeekReplyBytes) + " bytes: ask for fewer keys"}});
      }
      values.push_back(BytesValue(it->second));
    }
    Reply(connection, message, {{"op", "ok"}, {"values", std::move(values)}});
  }

  static void Unpark(Connection& connection, const Waiter& waiter) {
    --connection.pending_waits;
    connection.parked_bytes -= waiter.bytes;
  }

  void OnAdd(Connection& connection, const Message& message) {
    const std::string key = StringField(message, "key");
    const int64_t delta = IntField(message, "delta");
    if (auto why = KeySizeRefusal(key)) return Refuse(connection, message, *why);
    if (auto why = WriteRefusal(key, delta == 0 ? KeyWrite::kRead : KeyWrite::kAdd, connection.rank,
                                TrainingRankOf(connection))) {
      return Refuse(connection, message, *why);
    }
    auto it = values_.find(key);
    // A commit's state of a sealed cycle is created sealed: its begin reads it, in this one step.
    const std::string sealed = std::to_string(kCommitSealed);
    const std::string* stored = it != values_.end()                          ? &it->second
                                : BornSealed(key, commits_sealed_through_) ? &sealed
                                                                           : nullptr;
    int64_t value = 0;
    try {
      value = AddToCounter(key, stored, delta);
    } catch (const StoreError& error) {
      return Reply(connection, message, {{"op", "error"}, {"message", error.what()}});
    }
    StoreValue(key, std::to_string(value));
    Reply(connection, message, {{"op", "ok"}, {"value", value}});
    WakeWaiters(key);
  }

  void WakeWaiters(const std::string& key) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    const ParkedOnKey waiters = std::move(it->second);
    waiters_.erase(it);
    // The value is encoded once for every waiter (a plan read by thousands of nodes): each
    // answer is its own small head and this shared tail.
    std::string value;
    for (const auto& parked : waiters) {
      if (parked.second.wants_value && value.empty()) value = EncodeBin(values_[key]);
    }
    for (const auto& parked : waiters) {
      const Waiter& waiter = parked.second;
      auto connection = connections_.find(waiter.fd);
      if (connection == connections_.end()) continue;
      Unpark(*connection->second, waiter);
      if (connection->second->dead) continue;
      AppendOkFrame(connection->second->output, waiter.id, waiter.wants_value ? &value : nullptr);
      MarkToFlush(*connection->second);
    }
  }

  void OnJoin(Connection& connection, const Message& message) {
    if (connection.rank >= 0) {
      throw FrameError("this connection already joined as rank " + std::to_string(connection.rank));
    }
    auto info_field = message.find("info");
    if (info_field == message.end()) throw FrameError("join without info");
    NodeInfo info = NodeInfo::FromJson(*info_field);
    const int64_t count = IntField(message, "count");
    info.seen_from = connection.peer;
    info.joined_after_s = std::chrono::duration<double>(Clock::now() - start_).count();
    if (verdict_.kind == ServerVerdict::Kind::kPending && roster_complete_) return OnLateJoin(connection, message, info, count);
    if (verdict_.kind == ServerVerdict::Kind::kResult) {
      return Reply(connection, message, {{"op", "error"},
                                         {"message", "the job has already ended: every node succeeded"},
                                         {"succeeded", true}});
    }
    if (verdict_.kind != ServerVerdict::Kind::kPending || joined_count_ == options_.node_count) {
      return Reply(connection, message, {{"op", "error"}, {"message", "the rendezvous is already closed"}});
    }
    const std::string refusal = JoinRefusal(info, count);
    if (!refusal.empty()) {
      // The refused node gets the whole reason in its answer; everyone else in the abort.
      Reply(connection, message, {{"op", "error"}, {"message", refusal}});
      return Abort(info.rank, refusal);
    }
    const size_t rank = size_t(info.rank);
    connection.rank = info.rank;
    {
      std::lock_guard lock(mutex_);
      joined_[rank] = connection.fd;
      infos_[rank] = info;
    }
    ++joined_count_;
    Reply(connection, message, {{"op", "ok"}});
    spdlog::debug("rendezvous: {} joined ({}/{})", info.Label(), joined_count_, options_.node_count);
    if (joined_count_ == options_.node_count) Complete();
  }

  // A join once every node had joined: a launcher that replaces a lost one (a recreated pod,
  // a requeued task, from any address) takes its rank back and is told the cycle to meet
  // the others in; any other is refused and named, and changes nothing (a launcher of an
  // earlier cycle coming back, a second launcher given a rank that is held).
  void OnLateJoin(Connection& connection, const Message& message, const NodeInfo& info, int64_t count) {
    const bool awaited = count == options_.node_count && info.rank >= 0 && info.rank < options_.node_count &&
                         awaiting_rejoin_[size_t(info.rank)];
    if (!awaited) {
      const std::string why = RefusedLateJoin(info, count);
      spdlog::warn("rendezvous: refused a join from {}: {}", info.Label(), why);
      return Reply(connection, message, {{"op", "error"}, {"message", "the rendezvous is already closed: " + why}});
    }
    const size_t rank = size_t(info.rank);
    const std::string before = infos_[rank].seen_from;
    connection.rank = info.rank;
    {
      std::lock_guard lock(mutex_);
      joined_[rank] = connection.fd;
      infos_[rank] = info;
    }
    awaiting_rejoin_[rank] = false;
    moved_away_[rank] = false;
    cycles_.ForgetFailures(info.rank);  // a new launcher: what its predecessor failed is not its
    Reply(connection, message, {{"op", "ok"}});
    if (cycles_.assignment().IsSpare(info.rank)) return JoinAsSpare(connection, info, before);
    rejoined_.push_back(info.rank);
    spdlog::warn("rendezvous: {} joined again from {} (was {}): it meets the others in cycle {}", info.Label(),
                 info.seen_from, before, cycles_.current());
    // The cycle first: once the launcher has seen "complete", it knows it rejoined.
    Send(connection, {{"op", "rejoin"}, {"restart", *last_restart_}, {"training_rank", cycles_.assignment().RankOf(info.rank)}});
    Send(connection, {{"op", "complete"}, {"count", options_.node_count}});
  }

  // A launcher in a slot that runs no rank (a spare's, or one whose rank moved to a spare):
  // it prepares and waits as a spare, in the job's current cycle.
  void JoinAsSpare(Connection& connection, const NodeInfo& info, const std::string& before) {
    spdlog::warn("rendezvous: {} joined again from {} (was {}): it is a spare from cycle {}", info.Label(), info.seen_from,
                 before, cycles_.current());
    const Message now = last_restart_ ? *last_restart_
                                      : Message{{"op", "restart"}, {"cycle", cycles_.current()}, {"rank", -1}, {"host", ""},
                                                {"message", "joined as a spare"}, {"code", 0}, {"decision", Message::object()}};
    Send(connection, {{"op", "rejoin"}, {"restart", now}, {"training_rank", -1}});
    Send(connection, {{"op", "complete"}, {"count", options_.node_count}});
  }

  std::string RefusedLateJoin(const NodeInfo& info, int64_t count) const {
    if (count != options_.node_count || info.rank < 0 || info.rank >= options_.node_count) return JoinRefusal(info, count);
    const NodeInfo& holder = infos_[size_t(info.rank)];
    if (joined_[size_t(info.rank)] >= 0) {
      return "rank " + std::to_string(info.rank) + " is held by " + holder.host + " (" + holder.seen_from + ") in cycle " +
             std::to_string(cycles_.current()) + ": a launcher of an earlier cycle, or a second launcher with this rank";
    }
    return "rank " + std::to_string(info.rank) + " is not awaited: the job's restarts (launcher.restart) let a lost node's "
           "launcher join again only while a restart waits for it";
  }

  // Why this node may not join (empty when it may): each reason fails the whole job,
  // because no later node can fix it.
  std::string JoinRefusal(const NodeInfo& info, int64_t count) const {
    if (count != options_.node_count) {
      return info.Label() + " expects " + std::to_string(count) + " nodes but the leader expects " +
             std::to_string(options_.node_count) + " (compute.node_count must match on every node)";
    }
    if (info.rank < 0 || info.rank >= options_.node_count) {
      return info.Label() + " claims rank " + std::to_string(info.rank) + ", outside [0, " +
             std::to_string(options_.node_count) + ")";
    }
    const NodeInfo& holder = infos_[size_t(info.rank)];
    if (joined_[size_t(info.rank)] >= 0) {
      return "rank " + std::to_string(info.rank) + " claimed by two nodes: " + holder.host + " (" + holder.seen_from +
             ") and " + info.host + " (" + info.seen_from + "); give every node its own rank";
    }
    return "";
  }

  // Everyone is here: send each node a fixed-size notice, so the broadcast costs O(nodes),
  // not O(nodes^2). The roster (2 KiB a node: 32 MB at 16,384 nodes, most of a second to
  // serialise) is published under its key when someone first asks for it, not here.
  void Complete() {
    roster_complete_ = true;
    spdlog::info("rendezvous complete: {} nodes joined in {:.3f} s", options_.node_count,
                 std::chrono::duration<double>(Clock::now() - start_).count());
    Broadcast({{"op", "complete"}, {"count", options_.node_count}});
    if (waiters_.count(kRosterKey)) PublishRoster();
  }

  void PublishRoster() {
    // Hosts are bytes from the nodes, not always UTF-8: replace what is not, never throw.
    StoreValue(kRosterKey, RosterToJson(roster()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    WakeWaiters(kRosterKey);
  }

  void OnReport(Connection& connection, const Message& message) {
    const int64_t code = IntField(message, "code");
    const std::string cause = Bounded(StringField(message, "cause"));
    // A leader-side restart needs the node's word that its launcher can run the job again.
    const bool restartable = message.contains("restartable") && message["restartable"].is_boolean() &&
                             message["restartable"].get<bool>();
    const bool cannot_train = message.contains("cannot_train") && message["cannot_train"].is_boolean() &&
                              message["cannot_train"].get<bool>();
    const int64_t cycle = message.contains("cycle") ? IntField(message, "cycle") : cycles_.current();
    Reply(connection, message, {{"op", "ok"}});
    if (connection.rank < 0 || IgnoredAsStale(connection, "report", cycle) || reported_[size_t(connection.rank)]) return;
    if (cycles_.assignment().IsSpare(connection.rank)) {
      // A spare runs nothing: its outcome decides nothing. But node 0 running no rank that
      // stops (a SIGTERM, its launcher's own failure) takes the store with it: the job ends
      // now, not when the others find the store gone.
      if (connection.rank == 0 && code != 0 && verdict_.kind == ServerVerdict::Kind::kPending) {
        Abort(0, NodeName(0) + " stopped (it serves the rendezvous): " + cause, int(code));
      }
      return;
    }
    {
      std::lock_guard lock(mutex_);
      reported_[size_t(connection.rank)] = true;
    }
    ++reported_count_;
    if (code != 0) {
      return FailCycle(connection.rank, NodeName(connection.rank) + " failed: " + cause, int(code), restartable, false,
                       cannot_train);
    }
    CollectStacksIfHung(connection.rank);  // the others may be stalled, waiting for nothing but this node
    if (reported_count_ == cycles_.assignment().ranks() && verdict_.kind == ServerVerdict::Kind::kPending) {
      SetVerdict(ServerVerdict::Kind::kResult, -1, "every node succeeded");
      Broadcast({{"op", "result"}, {"code", 0}});
    }
  }

  // A message of an earlier cycle (a node that had not yet heard of the restart) must
  // never change the job's state: it is logged and dropped.
  bool IgnoredAsStale(const Connection& connection, const char* what, int64_t cycle) {
    if (!cycles_.IsStale(cycle)) return false;
    spdlog::warn("rendezvous: ignoring a {} of cycle {} from {}: the job is in cycle {}", what, cycle,
                 NodeName(connection.rank), cycles_.current());
    return true;
  }

  // A failed job with restarts left: every node is told to run the next cycle; otherwise
  // (no budget, no progress, a launcher's own failure) the job is aborted as before.
  // With spares, a node that must leave (CountFailure) gives its rank to a ready spare in
  // the new cycle; the decision's "slots" tells every node who runs which rank.
  void FailCycle(int rank, const std::string& message, int exit_code, bool restartable, bool lost = false,
                 bool cannot_train = false) {
    std::string refusal;
    if (restartable && verdict_.kind == ServerVerdict::Kind::kPending) {
      CycleFailure failure{cycles_.current(), rank, infos_[size_t(rank)].host, message, exit_code, lost, cannot_train, {}};
      const std::string leaves = cycles_.HasSpares() ? cycles_.CountFailure(failure) : "";
      // Rank 0 leaves a spare's launcher (lost, or moving on to another spare): it commits
      // nothing more, and what it began is settled now, not named (it may never be written).
      const bool leader_leaves = rank != 0 && cycles_.assignment().RankOf(rank) == 0 &&
                                 (lost || (!leaves.empty() && FirstReadySpare()));
      failure.remote_commits = SealRemoteCommits(cycles_.current(), leader_leaves);
      if (leader_leaves) AwaitHandOver(rank, cycles_.current() + 1, lost);
      std::optional<Message> restart;
      try {
        restart = cycles_.Decide(failure, refusal);
      } catch (const std::exception& error) {
        // The policy is node 0's launcher's (it reads `latest` at the destination): its
        // failure ends the job as a refusal would, and is not blamed on the reporting node.
        refusal = std::string("no restart: the restart policy failed: ") + error.what();
      }
      if (restart) {
        // Only a node that failed too often can run again where it is when no spare is ready.
        const bool stays = !lost && !cannot_train;
        std::optional<int> spare = leaves.empty() ? std::nullopt : ChooseSpare(rank, leaves, stays);
        if (spare) {
          (*restart)["decision"]["promoted"] = {{"rank", cycles_.assignment().RankOf(rank)}, {"from", rank},
                                                {"to", *spare}, {"why", leaves}};
          // Node 0's agent hands over what it had begun; until it says so, nobody commits.
          if (rank == 0 && cycles_.assignment().RankOf(0) == 0) AwaitHandOver(0, cycles_.current(), false);
          MoveRank(rank, *spare);
        }
        if (cycles_.HasSpares()) {
          (*restart)["decision"]["slots"] = cycles_.assignment().Slots();
          if (auto master = MasterAddress()) (*restart)["decision"]["master_addr"] = *master;
        }
        BeginCycle(*restart);
        if (lost && spare) rejoined_.push_back(rank);  // its job's stop is not known (no launcher rejoins it)
        if (spare) TellPromoted(*spare);
        return;
      }
    }
    Abort(rank, refusal.empty() ? message : message + "; " + refusal, exit_code);
  }

  // Node 0's start ranks (kStartRanksKey, once it read every node's health): taken before
  // the first cycle only, and only when they are a valid assignment.
  bool StartWithRanks(Connection& connection, const Message& message, const std::string& value) {
    if (values_.count(kRunStartedKey) || cycles_.current() > 0 || values_.count(kStartRanksKey)) {
      Refuse(connection, message, std::string(kStartRanksKey) + " is set once, before the run");
      return false;
    }
    try {
      cycles_.StartWith(ParseStartRanks(value, options_.node_count, cycles_.assignment().ranks()));
    } catch (const FrameError& error) {
      Refuse(connection, message, error.what());
      return false;
    }
    for (int slot = 0; slot < cycles_.assignment().ranks(); ++slot) {
      if (cycles_.assignment().IsSpare(slot)) moved_away_[size_t(slot)] = true;  // it cannot train: it leaves
    }
    std::lock_guard lock(mutex_);
    rank_slots_ = cycles_.assignment().Slots();
    return true;
  }

  // A checkpoint leader on a spare (rank 0 moved) commits through this table: the decision
  // seals the failed cycle first, on this thread, between two of the leader's requests: no
  // commit of it begins after this (OnAdd, BornSealed), and what began is named, unless that
  // leader's launcher is the one lost (`leader_lost`): then what it began may never be
  // written, and is revoked instead, and its saves are settled (rendezvous/commit_keys.h).
  // Nothing is there while node 0 runs rank 0.
  RemoteCommits SealRemoteCommits(int64_t cycle, bool leader_lost) {
    commits_sealed_through_ = std::max(commits_sealed_through_, cycle);
    auto declared = values_.find(kCommitDeclaredKey);
    int64_t count = 0;
    if (declared != values_.end()) {
      try {
        count = AddToCounter(kCommitDeclaredKey, &declared->second, 0);
      } catch (const StoreError&) {
        count = 0;
      }
    }
    if (leader_lost) {
      std::lock_guard lock(store_mutex_);
      SettleLostLeadersSaves(values_, rank_zero_since_, cycle, count);
    }
    return ReadRemoteCommits(values_, cycle, count);
  }

  // Where the job's MASTER_ADDR points once rank 0 runs on a spare: that node, as this server
  // sees it. Nullopt while node 0 runs rank 0 (every node's MASTER_ADDR is node 0's already).
  std::optional<std::string> MasterAddress() const {
    const int slot = cycles_.assignment().SlotOf(0);
    if (slot == 0) return std::nullopt;
    return infos_[size_t(slot)].seen_from;
  }

  // The first spare ready to take `from`'s rank, or nullopt (then `from` restarts in place,
  // or its rank waits for a launcher in its slot). Slot 0's rank moves too: its launcher
  // keeps serving the store, and the spare running rank 0 commits the job's checkpoints.
  std::optional<int> ChooseSpare(int from, const std::string& why, bool stays_without_spare) {
    const std::string node = NodeName(from);
    if (auto spare = FirstReadySpare()) return spare;
    spdlog::warn("rendezvous: {} must leave ({}), but no spare is ready: {}", node, why,
                 stays_without_spare ? "it restarts in place" : "its rank waits for a launcher in its slot");
    return std::nullopt;
  }

  std::optional<int> FirstReadySpare() const {
    for (int slot = 0; slot < options_.node_count; ++slot) {
      if (cycles_.assignment().IsSpare(slot) && joined_[size_t(slot)] >= 0 && spare_ready_[size_t(slot)]) return slot;
    }
    return std::nullopt;
  }

  // Every leader of rank 0 before the current one must have stopped writing before the
  // current one begins a commit (`bt/ckpt/handed_over` reaches its cycle): a leader on a spare
  // whose rank moved on stops at the decision, but a write its uploader had begun may still
  // land, so it is waited for until its launcher is gone (its uploader dies with it), or
  // kHandOverWait after the decision at most; a lost one is gone already, as far as anything
  // here can know. Node 0's own agent, when rank 0 left node 0, writes what it had begun
  // (at most 10 s once its job stopped) and then says so: it is waited for until its word,
  // however long its job takes to stop (review 15, F1 and review 16: a later leader's
  // commits, then node 0's older one, moved `latest` back). Several may be waited for at once
  // (rank 0 moving twice in a row); the mark waits for all of them.
  void AwaitHandOver(int slot, int64_t cycle, bool lost) {
    hand_over_cycle_ = std::max(hand_over_cycle_, cycle);
    if (!lost && joined_[size_t(slot)] >= 0) {
      handing_over_[slot] = slot == 0 ? Clock::time_point::max() : Clock::now() + kHandOverWait;
    }
    MarkHandedOverOnceAllStopped();
  }

  // `slot`'s launcher is gone (or its word came, or its wait ran out): it writes nothing more.
  void HandOverDone(int slot) {
    handing_over_.erase(slot);
    MarkHandedOverOnceAllStopped();
  }

  void MarkHandedOverOnceAllStopped() {
    if (!handing_over_.empty() || hand_over_cycle_ <= hand_over_marked_) return;
    hand_over_marked_ = hand_over_cycle_;
    {
      std::lock_guard lock(store_mutex_);
      MarkHandedOver(values_, hand_over_cycle_);
    }
    WakeWaiters(kHandedOverKey);
  }

  // Node 0's launcher says its agent has stopped (launch.cpp TellHandedOver). Its cycle is
  // not taken as given: what the mark may reach is the server's to say.
  void NodeZeroHandedOver(Connection& connection, const Message& message, const std::string& value) {
    if (!HandedOverCycle(value)) {
      return Refuse(connection, message, std::string(kHandedOverKey) + " must be a cycle, not \"" + value + "\"");
    }
    Reply(connection, message, {{"op", "ok"}});
    HandOverDone(0);
  }

  void WatchHandOver(Clock::time_point now) {
    const size_t waited_for = handing_over_.size();
    std::erase_if(handing_over_, [now](const auto& entry) { return now >= entry.second; });
    if (handing_over_.size() != waited_for) MarkHandedOverOnceAllStopped();
  }

  // `from`'s rank runs on the spare `to` from the current cycle on; `from` is a spare slot
  // now (a launcher started again in it joins as one).
  void MoveRank(int from, int to) {
    const int rank = cycles_.assignment().RankOf(from);
    spdlog::warn("rendezvous: rank {} moves from {} to the spare {} in cycle {}", rank, NodeName(from),
                 NodeName(to), cycles_.current());
    cycles_.Promote(from, to);
    if (rank == 0) rank_zero_since_ = cycles_.current();
    spare_ready_[size_t(to)] = false;
    moved_away_[size_t(from)] = true;
    std::lock_guard lock(mutex_);
    rank_slots_ = cycles_.assignment().Slots();
  }

  // The promoted spare meets the others at the current barrier, as a launcher that joined
  // again in place of a lost one does.
  void TellPromoted(int spare) {
    auto connection = connections_.find(joined_[size_t(spare)]);
    if (connection == connections_.end() || !last_restart_) return;
    Send(*connection->second,
         {{"op", "rejoin"}, {"restart", *last_restart_}, {"training_rank", cycles_.assignment().RankOf(spare)}});
  }

  // A spare said it is prepared and waits (its weights, fabric, health and load are done).
  // A rank already awaited at a barrier (its launcher lost, no spare ready then) is given to
  // it at once.
  void OnSpareReady(Connection& connection, const Message& message) {
    if (connection.rank < 0) return Refuse(connection, message, "spare_ready from a connection that never joined");
    Reply(connection, message, {{"op", "ok"}});
    if (!cycles_.assignment().IsSpare(connection.rank) || spare_ready_[size_t(connection.rank)]) return;
    spare_ready_[size_t(connection.rank)] = true;
    spdlog::info("rendezvous: {} is a ready spare", NodeName(connection.rank));
    if (!last_restart_ || verdict_.kind != ServerVerdict::Kind::kPending) return;
    for (int slot : cycles_.Awaited()) {
      if (slot == 0 || !awaiting_rejoin_[size_t(slot)]) continue;
      MoveRank(slot, connection.rank);
      return TellPromoted(connection.rank);
    }
  }

  // Every node reports again in the new cycle; the push is the only way a node learns of it.
  // Every rank without a launcher now is awaited, however it was lost: during a cycle, at a
  // barrier, or after its own job had finished and reported (then its loss failed nothing,
  // but the new cycle needs the rank all the same).
  void BeginCycle(const Message& restart) {
    {
      std::lock_guard lock(mutex_);
      std::fill(reported_.begin(), reported_.end(), false);
    }
    for (size_t rank = 0; rank < joined_.size(); ++rank) {
      if (joined_[rank] < 0) awaiting_rejoin_[rank] = true;
    }
    reported_count_ = 0;
    rejoined_.clear();
    last_restart_ = restart;
    barrier_opened_ = Clock::now();
    awaited_until_.assign(joined_.size(), barrier_opened_ + options_.rejoin_timeout);
    next_barrier_log_ = barrier_opened_ + kAwaitedLogEvery;
    spdlog::warn("rendezvous: restarting every node in cycle {}: {}", cycles_.current(), StringField(restart, "message"));
    Broadcast(restart);
  }

  // The barrier before a cycle's commands: once every node has stopped its job (and loaded
  // what it resumes from), all are told at once.
  void OnCycleReady(Connection& connection, const Message& message) {
    const int64_t cycle = IntField(message, "cycle");
    if (connection.rank < 0) return Refuse(connection, message, "cycle_ready from a connection that never joined");
    Reply(connection, message, {{"op", "ok"}});
    if (IgnoredAsStale(connection, "cycle_ready", cycle) || cycle != cycles_.current()) return;
    const double stopped_s = message.contains("stopped_s") && message["stopped_s"].is_number()
                                 ? std::max(0.0, message["stopped_s"].get<double>())
                                 : 0.0;
    if (auto go = cycles_.Arrive(connection.rank, stopped_s)) {
      last_restart_.reset();  // the barrier has passed: nobody is awaited any more
      // A lost launcher never said when its job stopped: the figure covers the others.
      if (!rejoined_.empty()) (*go)["lost"] = FormatRanks(rejoined_);
      // Who runs rank 0 as the cycle starts: a spare promoted at the barrier, or a launcher
      // that joined again from a new address, is not the one the decision named (review 15, F3).
      if (cycles_.HasSpares()) {
        (*go)["slots"] = cycles_.assignment().Slots();
        if (auto master = MasterAddress()) (*go)["master_addr"] = *master;
      }
      Broadcast(*go);
    }
  }

  // A restart's barrier waits for every rank, a lost one until a launcher joins again with
  // its rank: every node hears which ranks are awaited every kAwaitedLogEvery, and the job
  // ends once a rank is still awaited past its own deadline (AwaitAgain): rejoin_timeout_s
  // from the opening, or from its loss at the barrier.
  void WatchBarrier(Clock::time_point now) {
    const std::vector<int> awaited = cycles_.Awaited();
    if (awaited.empty()) return;
    const int64_t waited_s = std::chrono::duration_cast<std::chrono::seconds>(now - barrier_opened_).count();
    const std::string cycle = "cycle " + std::to_string(cycles_.current());
    std::vector<int> overdue;
    for (int rank : awaited) {
      if (now >= awaited_until_[size_t(rank)]) overdue.push_back(rank);
    }
    if (!overdue.empty()) {
      const double limit_s = std::chrono::duration<double>(options_.rejoin_timeout).count();
      return Abort(overdue.front(), cycle + " did not start: " + DescribeAwaited(overdue) + " not ready within " +
                                        fmt::format("{:g}", limit_s) + " s (launcher.restart.rejoin_timeout_s)");
    }
    if (now < next_barrier_log_) return;
    next_barrier_log_ = now + kAwaitedLogEvery;
    const std::string message = cycle + ": waiting " + std::to_string(waited_s) + " s for " + DescribeAwaited(awaited);
    Broadcast({{"op", "cycle_wait"}, {"cycle", cycles_.current()}, {"message", message}});
  }

  std::string DescribeAwaited(const std::vector<int>& ranks) const {
    std::string text;
    for (size_t i = 0; i < ranks.size() && i < kMaxAwaitedListed; ++i) {
      const size_t rank = size_t(ranks[i]);
      text += (text.empty() ? "node " : ", node ") + std::to_string(rank) + " (" + infos_[rank].host +
              (awaiting_rejoin_[rank] ? ", lost: its launcher has not joined again)" : ", stopping its job)");
    }
    if (ranks.size() > kMaxAwaitedListed) text += ", and " + std::to_string(ranks.size() - kMaxAwaitedListed) + " more";
    return text;
  }

  // A node that will not wait for the verdict any longer: the job has failed, and every
  // node is told so, whatever its own outcome.
  // A node's job made no progress within launcher.watchdog's limit ("stall"), or made some
  // again ("resumed"). The job is hung when every node's is stalled at once: a node whose
  // ranks print nothing by design (only rank 0 logs) is not, while the others progress.
  // Then every node is asked for its job's stacks, once per cycle, before anything is
  // stopped (docs/PROTOCOL.md, "Hangs").
  void OnStall(Connection& connection, const Message& message, bool stalled) {
    if (connection.rank < 0) return Refuse(connection, message, "stall from a connection that never joined");
    Reply(connection, message, {{"op", "ok"}});
    const int64_t cycle = IntField(message, "cycle");
    if (IgnoredAsStale(connection, "stall", cycle) || cycle != cycles_.current()) return;
    if (cycles_.assignment().IsSpare(connection.rank)) return;  // a spare runs no job
    if (stalled_cycle_ != cycle) {
      stalled_cycle_ = cycle;
      stalled_.assign(size_t(options_.node_count), false);
    }
    if (stalled_[size_t(connection.rank)] == stalled) return;
    stalled_[size_t(connection.rank)] = stalled;
    const std::string node = NodeName(connection.rank);
    if (!stalled) return spdlog::info("rendezvous: cycle {}: {} makes progress again", cycle, node);
    spdlog::warn("rendezvous: cycle {}: {} made no progress for {}", cycle, node, Bounded(StringField(message, "quiet")));
    CollectStacksIfHung(connection.rank);
  }

  // The job is hung when no node's job progresses: every node is stalled, or has finished
  // its job (one node stuck in a final save while the others wait at the exit barrier).
  // Finished nodes answer the request too, with no stacks.
  void CollectStacksIfHung(int last_rank) {
    const int64_t cycle = cycles_.current();
    if (stalled_cycle_ != cycle || stacks_asked_in_ == cycle || verdict_.kind != ServerVerdict::Kind::kPending) return;
    int stalled = 0;
    for (size_t rank = 0; rank < stalled_.size(); ++rank) {
      if (cycles_.assignment().IsSpare(int(rank))) continue;
      if (stalled_[rank]) {
        ++stalled;
      } else if (!reported_[rank]) {
        return;  // a node whose job still runs and progresses
      }
    }
    if (stalled == 0) return;
    stacks_asked_in_ = cycle;
    const std::string what = "no node's job made progress (" + std::to_string(stalled) + " stalled, the last: " +
                             infos_[size_t(last_rank)].Label() + "; " + std::to_string(cycles_.assignment().ranks() - stalled) +
                             " finished): collecting every node's stacks";
    spdlog::warn("rendezvous: cycle {}: {}", cycle, what);
    Broadcast({{"op", "collect_stacks"}, {"cycle", cycle}, {"rank", last_rank}, {"message", what}});
  }

  // Node 0's watchdog, once it has the stacks: the hang fails the cycle, named after the
  // node it blames, as that node's own failure would.
  void OnHang(Connection& connection, const Message& message) {
    if (connection.rank != 0) return Refuse(connection, message, "only node 0 declares a hang");
    Reply(connection, message, {{"op", "ok"}});
    const int64_t cycle = IntField(message, "cycle");
    const int64_t rank = IntField(message, "rank");
    if (IgnoredAsStale(connection, "hang", cycle) || cycle != cycles_.current() || rank < 0 || rank >= options_.node_count) {
      return;
    }
    FailCycle(int(rank), NodeName(rank) + " hung: " + Bounded(StringField(message, "cause")),
              int(IntField(message, "code")), true);
  }

  void OnGiveUp(Connection& connection, const Message& message) {
    const std::string cause = Bounded(StringField(message, "cause"));
    if (connection.rank < 0) return Refuse(connection, message, "give_up from a connection that never joined");
    Reply(connection, message, {{"op", "ok"}});
    Abort(connection.rank, NodeName(connection.rank) + " gave up: " + cause);
  }

  static std::string Bounded(std::string cause) {
    if (cause.size() <= kMaxCauseBytes) return cause;
    const size_t cut = cause.size() - kMaxCauseBytes;
    cause.resize(kMaxCauseBytes);
    return cause + "... (" + std::to_string(cut) + " more bytes in that node's log)";
  }

  // Node 0's launcher did not run (SIGSTOP, a starved host) for longer than the heartbeat
  // timeout: every follower has taken node 0 as lost and is ending its job (69). The silence
  // the server would see next is its own, not the followers': counted as their loss, each
  // became a failed cycle (a restart spent per node, node 0's own included, and a cycle that
  // waited rejoin_timeout_s for node 0 itself). The job ends at once, node 0 lost, 69 on
  // every node (soak finding F2). `overslept`: how much longer the wait took than asked.
  void NoticeOwnStall(Clock::duration overslept) {
    if (verdict_.kind != ServerVerdict::Kind::kPending || overslept <= options_.heartbeat_timeout) return;
    const auto seconds = std::chrono::duration_cast<std::chrono::milliseconds>(overslept).count() / 1000.0;
    stalled_itself_ = true;
    Abort(0, "node 0 lost: its launcher did not run for " + fmt::format("{:.1f}", seconds) +
                 " s (stopped or starved), longer than the heartbeat timeout, so the other nodes have taken it as lost");
  }

  // `exit_code`: what the failed node reported, passed on so that every node can exit with
  // it; 0 for a node lost without a report.
  void Abort(int rank, const std::string& message, int exit_code = 0) {
    if (verdict_.kind != ServerVerdict::Kind::kPending) return;
    spdlog::error("rendezvous: aborting the job: {}", message);
    SetVerdict(ServerVerdict::Kind::kAbort, rank, message, exit_code);
    Broadcast({{"op", "abort"}, {"rank", rank}, {"message", message}, {"code", exit_code}});
  }

  // The loop has stopped: every node is told why (best effort: nothing flushes what the
  // sockets do not take now) and sees its connection end, new ones are refused, and node 0's
  // launcher, waiting for the drain, gets the verdict at once.
  void FailJob(const std::string& what) {
    const std::string message = "the rendezvous server on node 0 stopped on an internal error (" + what +
                                "); the job cannot go on";
    spdlog::error("rendezvous: {}", message);
    try {
      if (verdict_.kind == ServerVerdict::Kind::kPending) {
        SetVerdict(ServerVerdict::Kind::kAbort, -1, message);
        Broadcast({{"op", "abort"}, {"rank", -1}, {"message", message}, {"code", 0}});
      }
      FlushQueued();  // frames wait for the end of a loop turn, which this turn never reaches
    } catch (...) {  // the state that failed the loop may fail this too: the rest must happen
    }
    for (const auto& [fd, connection] : connections_) shutdown(fd, SHUT_WR);
    for (int fd : listen_fds_) shutdown(fd, SHUT_RDWR);
    std::lock_guard lock(mutex_);
    drained_ = true;
    drained_changed_.notify_all();
  }

  void SetVerdict(ServerVerdict::Kind kind, int rank, const std::string& message, int exit_code = 0) {
    std::lock_guard lock(mutex_);
    verdict_stalled_itself_ = stalled_itself_;
    verdict_ = {kind, rank, message, exit_code};
    verdict_time_ = Clock::now();
  }

  void OnTimers() {
    ExpireWaits();
    auto now = Clock::now();
    if (verdict_.kind == ServerVerdict::Kind::kPending && joined_count_ < options_.node_count && now >= join_deadline_) {
      OnJoinTimeout();
    }
    if (now < next_tick_) return;
    next_tick_ = now + options_.heartbeat_interval;
    CloseSilentUnauthenticated(now);
    SendHeartbeats(now);
    WatchHandOver(now);  // after the verdict too: the last leader's drain may still commit
    if (verdict_.kind != ServerVerdict::Kind::kPending) return;
    for (size_t rank = 0; rank < joined_.size(); ++rank) {
      if (joined_[rank] < 0 || reported_[rank]) continue;
      auto& connection = *connections_.at(joined_[rank]);
      auto silent = now - connection.last_seen;
      // A node whose bytes this loop has not read yet is not silent: the leader fell
      // behind (its thread descheduled, a batch of events ahead of this one).
      if (silent > options_.heartbeat_timeout && !HasUnreadBytes(connection.fd)) {
        const std::string why =
            "no heartbeat for " + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(silent).count()) + " s";
        if (!roster_complete_) return Abort(int(rank), infos_[rank].Label() + " lost: " + why);
        // Its connection is closed now, so nothing it sends later counts: a launcher that
        // was only cut off can never act in a cycle the others have moved on from.
        TakeForLost(connection, int(rank), why);
      }
    }
    if (last_restart_) WatchBarrier(now);
  }

  void OnJoinTimeout() {
    std::vector<int> missing;
    std::string joined;
    size_t shown = 0;
    constexpr size_t kMaxListed = 32;
    for (size_t rank = 0; rank < joined_.size(); ++rank) {
      if (joined_[rank] < 0) {
        missing.push_back(int(rank));
      } else if (shown++ < kMaxListed) {
        joined += (joined.empty() ? "" : ", ") + std::to_string(rank) + " " + infos_[rank].host + " (" +
                  infos_[rank].seen_from + ")";
      }
    }
    if (shown > kMaxListed) joined += ", and " + std::to_string(shown - kMaxListed) + " more";
    std::string message = std::to_string(missing.size()) + " of " + std::to_string(options_.node_count) +
                          " nodes missing after " +
                          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count()) +
                          " s: ranks " + FormatRanks(missing) + "; joined: " + (joined.empty() ? "none" : joined);
    spdlog::error("rendezvous: {}", message);
    SetVerdict(ServerVerdict::Kind::kJoinTimeout, missing.front(), message);
    Broadcast({{"op", "join_timeout"}, {"message", message}});
  }

  // Tells a silent node why its connection closes, where its socket still takes a frame (a
  // frozen launcher reads it when it thaws): else it could only say that node 0 was lost.
  void TakeForLost(Connection& connection, int rank, const std::string& why) {
    Send(connection, {{"op", "lost"},
                      {"message", "node 0 took this launcher, " + NodeName(rank) + ", for lost: " + why}});
    Flush(connection);
    shutdown(connection.fd, SHUT_WR);
    Kill(connection, why);
  }

  void Kill(Connection& connection, const std::string& why) {
    if (connection.dead) return;
    connection.dead = true;
    connection.dead_reason = why;
    dead_.push_back(connection.fd);
  }

  void CloseDead() {
    while (!dead_.empty()) {
      int fd = dead_.back();
      dead_.pop_back();
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      const int rank = it->second->rank;
      const bool goodbye = it->second->said_goodbye;
      if (!it->second->authenticated) --unauthenticated_;
      const std::string why = it->second->dead_reason;
      DropWaitersOf(fd);
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      close(fd);
      connections_.erase(it);
      OnNodeGone(rank, goodbye, why);
    }
  }

  // Its parked get/wait requests go with it: a later connection that reuses the fd number
  // must not be answered, or charged, for them.
  void DropWaitersOf(int fd) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      std::erase_if(it->second, [fd](const auto& parked) { return parked.second.fd == fd; });
      it = it->second.empty() ? waiters_.erase(it) : std::next(it);
    }
  }

  // A joined node's launcher went away before it reported: the job cannot finish.
  void OnNodeGone(int rank, bool goodbye, const std::string& why) {
    if (rank < 0) return;
    if (verdict_.kind == ServerVerdict::Kind::kPending && joined_count_ < options_.node_count) {
      std::lock_guard lock(mutex_);
      joined_[size_t(rank)] = -1;  // left before the rendezvous completed: it is missing again
      --joined_count_;
      return;
    }
    {
      std::lock_guard lock(mutex_);
      joined_[size_t(rank)] = -1;
    }
    if (handing_over_.count(rank)) HandOverDone(rank);
    if (cycles_.assignment().IsSpare(rank)) return SpareGone(rank, goodbye ? "it left" : why);
    if (reported_[size_t(rank)]) return;
    if (!goodbye) return LoseNode(rank, NodeName(rank) + " lost: " + why);
    // A goodbye without a report of this cycle: its report was of an earlier one, dropped as
    // stale (a replacement that gave up while the job moved to a newer cycle), or it left the
    // barrier (its hardware cannot train). While a restart's barrier still waits, the rank is
    // awaited again, as a lost one's, its arrival undone: it must never stay held, nor count
    // as ready, for a launcher that is gone (review 5: a node leaving after it arrived let
    // the cycle start without it, and its replacements were refused). Once the cycle runs it
    // is lost, as a node whose connection closed (review 6, R6-1: a node that left as the go
    // reached it was ignored, the cycle ran without its rank, and the training hung).
    if (verdict_.kind != ServerVerdict::Kind::kPending) return;
    const std::string message =
        NodeName(rank) + " left without reporting on cycle " + std::to_string(cycles_.current());
    if (last_restart_) return AwaitAgain(rank, message);
    LoseNode(rank, message);
  }

  // A launcher lost during the run: with restarts left, every node restarts and the rank
  // waits for a launcher to join again with it (a replaced pod, a requeued task: every rank
  // without a launcher is awaited at BeginCycle); otherwise the job ends, as without restarts.
  void LoseNode(int rank, const std::string& message) {
    if (!values_.count(kRunStartedKey)) return Abort(rank, message);
    if (last_restart_ && verdict_.kind == ServerVerdict::Kind::kPending) return AwaitAgain(rank, message);
    FailCycle(rank, message, 0, true, true);
  }

  // Every launcher passed the ready barrier (launcher/phases/ready.cpp's counter): none of
  // the phases before the run waits for a node any more.
  bool EveryNodeReady() const {
    auto ready = values_.find(kReadyCounterKey);
    if (ready == values_.end()) return false;
    try {
      return std::stoll(ready->second) >= options_.node_count;
    } catch (const std::exception&) {
      return false;
    }
  }

  // A spare's launcher went away: the job goes on without it, and a launcher started again
  // in its slot joins as a spare. Until it said it is ready a spare prepares as every node
  // does (the others read its fabric and health keys, count it at the ready barrier): its
  // loss then ends the start, as any node's.
  void SpareGone(int slot, const std::string& why) {
    const bool was_ready = spare_ready_[size_t(slot)];
    spare_ready_[size_t(slot)] = false;
    if (verdict_.kind != ServerVerdict::Kind::kPending) return;
    if (!was_ready && !values_.count(kRunStartedKey) && !EveryNodeReady()) {
      return Abort(slot, NodeName(slot) + " (a spare) lost while the nodes prepared: " + why);
    }
    awaiting_rejoin_[size_t(slot)] = true;
    int ready = 0;
    for (int other = 0; other < options_.node_count; ++other) ready += spare_ready_[size_t(other)] ? 1 : 0;
    if (moved_away_[size_t(slot)]) {
      return spdlog::warn("rendezvous: {} left after its rank moved to a spare ({}); a launcher started again in its "
                          "slot joins as a spare", infos_[size_t(slot)].Label(), why);
    }
    spdlog::warn("rendezvous: the spare {} is gone ({}): the job goes on, {} spare(s) ready", infos_[size_t(slot)].Label(),
                 why, ready);
  }

  // A launcher lost while a restart's barrier waits: no cycle runs, so no work failed that
  // the pending decision does not already resume from. Its rank is awaited again in the
  // same cycle (its arrival undone), and no restart is spent on a cycle that would never run
  // (review finding F5: a second loss during a restart cost a second restart). Its
  // replacement gets a whole rejoin_timeout_s from the loss, as a new restart would give it
  // (review 3, D2), but that rank's only: a rank gone for good is not waited for longer
  // because another keeps failing (review 4, F4), and a rank lost again and again holds
  // the barrier at most twice rejoin_timeout_s from its opening.
  void AwaitAgain(int rank, const std::string& message) {
    // The launcher running rank 0 on a spare, lost before the cycle it would commit in: its
    // saves are settled, and whoever runs rank 0 next may commit from this cycle on.
    if (rank != 0 && cycles_.assignment().RankOf(rank) == 0) {
      SealRemoteCommits(cycles_.current() - 1, true);
      AwaitHandOver(rank, cycles_.current(), true);
    }
    if (PromotedAtBarrier(rank, message)) return;
    const Clock::time_point bound = barrier_opened_ + 2 * options_.rejoin_timeout;
    awaited_until_[size_t(rank)] = std::min(bound, Clock::now() + options_.rejoin_timeout);
    cycles_.Leave(rank);
    awaiting_rejoin_[size_t(rank)] = true;
    rejoined_.erase(std::remove(rejoined_.begin(), rejoined_.end(), rank), rejoined_.end());
    spdlog::warn("rendezvous: {} while cycle {} waits to start: its rank is awaited again (no restart spent)", message,
                 cycles_.current());
  }

  // A node lost (or gone) while a restart's barrier waits, with a spare ready: the spare
  // takes its rank in this same cycle, as a launcher that joined again in its slot would.
  bool PromotedAtBarrier(int slot, const std::string& message) {
    if (!cycles_.HasSpares() || cycles_.assignment().IsSpare(slot)) return false;
    std::optional<int> spare = ChooseSpare(slot, message, false);
    if (!spare) return false;
    cycles_.Leave(slot);
    rejoined_.erase(std::remove(rejoined_.begin(), rejoined_.end(), slot), rejoined_.end());
    MoveRank(slot, *spare);
    awaiting_rejoin_[size_t(slot)] = true;  // a launcher started again there joins as a spare
    awaited_until_[size_t(*spare)] = Clock::now() + options_.rejoin_timeout;
    TellPromoted(*spare);
    return true;
  }

  // Queued, and sent with whatever else the connection gets in this turn of the loop
  // (FlushQueued): one send() per connection per turn, not one per message.
  void Send(Connection& connection, const Message& message) {
    if (connection.dead) return;
    connection.output += EncodeFrame(message);
    MarkToFlush(connection);
  }

  void MarkToFlush(Connection& connection) {
    connection.last_sent = Clock::now();
    if (connection.queued_for_flush) return;
    connection.queued_for_flush = true;
    to_flush_.push_back(connection.fd);
  }

  void FlushQueued() {
    std::vector<int> fds;
    fds.swap(to_flush_);
    for (int fd : fds) {
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      it->second->queued_for_flush = false;
      Flush(*it->second);
    }
  }

  void Reply(Connection& connection, const Message& request, Message reply) {
    reply["id"] = IntField(request, "id");
    Send(connection, reply);
  }

  // A heartbeat to every node that was sent nothing else within the interval: any frame
  // tells a node that the leader lives, and at 16,384 nodes heartbeats are most of what the
  // leader sends while nodes are busy talking to it.
  void SendHeartbeats(Clock::time_point now) {
    static const std::string frame = EncodeFrame({{"op", "hb"}});
    for (auto& [fd, connection] : connections_) {
      if (!connection->authenticated || connection->dead) continue;
      if (now - connection->last_sent < options_.heartbeat_interval) continue;
      connection->output += frame;
      MarkToFlush(*connection);
    }
  }

  void Broadcast(const Message& message) {
    const std::string frame = EncodeFrame(message);
    std::vector<int> fds;
    fds.reserve(connections_.size());
    for (auto& [fd, connection] : connections_) {
      if (connection->authenticated) fds.push_back(fd);
    }
    for (int fd : fds) {
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      if (it->second->dead) continue;
      it->second->output += frame;
      MarkToFlush(*it->second);
    }
  }

  void Flush(Connection& connection) {
    if (connection.dead) return;
    while (connection.output_sent < connection.output.size()) {
      ssize_t sent = send(connection.fd, connection.output.data() + connection.output_sent,
                          connection.output.size() - connection.output_sent, MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EAGAIN) break;
        return Kill(connection, std::string("send failed: ") + std::strerror(errno));
      }
      connection.output_sent += size_t(sent);
    }
    if (connection.output_sent == connection.output.size()) {
      connection.output.clear();
      connection.output_sent = 0;
    } else if (connection.output.size() - connection.output_sent > kMaxPendingOutputBytes) {
      return Kill(connection, "peer stopped reading");
    }
    // One epoll_ctl only when the interest changes: most sends complete at once, and a
    // syscall per message was a measurable part of the leader's time at 16,384 nodes.
    const bool want_writable = !connection.output.empty();
    if (want_writable == connection.watching_writable) return;
    connection.watching_writable = want_writable;
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP | (want_writable ? uint32_t(EPOLLOUT) : 0u);
    event.data.fd = connection.fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, connection.fd, &event);
  }

  void FlushAndClose(Connection& connection) {
    Flush(connection);
    shutdown(connection.fd, SHUT_WR);
    Kill(connection, "rejected");
  }

  bool IsDrained() const {
    if (verdict_.kind == ServerVerdict::Kind::kPending) return false;
    if (Clock::now() - verdict_time_ > options_.exit_linger) return true;
    // Nodes still heartbeating are reachable and get the verdict and the time to report;
    // a silent one (a cut link, a dead host) is not waited for.
    const auto now = Clock::now();
    for (const auto& [fd, connection] : connections_) {
      const bool reachable = now - connection->last_seen <= options_.heartbeat_timeout;
      if (connection->authenticated && !connection->said_goodbye && reachable) return false;
    }
    return true;
  }

  ServerOptions options_;
  Clock::time_point start_;
  std::vector<int> listen_fds_;  // one, or several sharing the port (see Listen)
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int spare_fd_ = -1;  // given back when accept4 fails with EMFILE (see ShedWithSpareDescriptor)
  size_t unauthenticated_ = 0;
  size_t max_unauthenticated_ = kMaxUnauthenticated;
  bool roster_complete_ = false;  // every node joined: bt/roster can be published
  size_t max_connections_ = 0;
  std::unordered_map<std::string, size_t> refusals_;  // "peer: reason" -> count
  std::unordered_map<int, std::unique_ptr<Connection>> connections_;
  std::vector<int> dead_;
  std::vector<int> to_flush_;  // connections with output queued in this turn of the loop
  // Written by the loop only, under store_mutex_; read by the loop without it, and by node
  // 0's launcher thread (Peek, WaitCounter) with it.
  std::unordered_map<std::string, std::string> values_;
  mutable std::mutex store_mutex_;
  std::condition_variable values_changed_;
  int counter_watchers_ = 0;  // node 0's threads in WaitCounter
  std::unordered_map<std::string, ParkedOnKey> waiters_;
  std::multimap<Clock::time_point, ParkedRequest> wait_deadlines_;  // when parked requests expire
  uint64_t next_arrival_ = 0;
  std::vector<int> joined_;  // rank -> fd, -1 when not joined
  std::vector<NodeInfo> infos_;
  std::vector<bool> reported_;
  std::vector<bool> awaiting_rejoin_;       // lost in a cycle that restarted: a launcher may join again
  std::optional<Message> last_restart_;     // the current cycle's push while its barrier waits
  std::vector<int> rejoined_;               // ranks that joined again at the current barrier
  Clock::time_point barrier_opened_;
  std::vector<Clock::time_point> awaited_until_;  // by rank: rejoin_timeout_s from the opening, or from its loss (AwaitAgain)
  Clock::time_point next_barrier_log_;
  int joined_count_ = 0;
  int reported_count_ = 0;
  Clock::time_point join_deadline_;
  Clock::time_point next_tick_;
  bool stalled_itself_ = false;         // the server's thread's own
  bool verdict_stalled_itself_ = false;  // mutex_: read by node 0's launcher
  Clock::time_point verdict_time_;
  ServerVerdict verdict_;
  Cycles cycles_{options_.node_count, options_.node_count - options_.spares, options_.restart_policy,
                 options_.max_failures_per_node};
  std::vector<bool> spare_ready_;  // by slot: a spare that said it is prepared (OnSpareReady)
  std::vector<bool> moved_away_;   // by slot: its launcher's rank moved to a spare
  int64_t commits_sealed_through_ = -1;  // loop only: SealRemoteCommits
  // Loop only (AwaitHandOver): the leaders of rank 0 that may still write, by slot, each
  // until when at most; and the cycle the mark reaches once none is left.
  std::map<int, Clock::time_point> handing_over_;
  int64_t hand_over_cycle_ = 0;
  int64_t hand_over_marked_ = 0;  // the cycle last marked
  int64_t rank_zero_since_ = 0;   // loop only: the cycle rank 0's launcher took it in (MoveRank)
  std::vector<int> rank_slots_;    // mutex_: cycles_.assignment().Slots(), for absent() and unreported()
  int64_t stacks_asked_in_ = -1;  // the cycle whose hang the nodes were asked for stacks
  int64_t stalled_cycle_ = -1;    // the cycle stalled_ counts
  std::vector<bool> stalled_;     // by rank: its job made no progress within its limit
  mutable std::mutex mutex_;  // guards what other threads read: verdict_, infos_, joined_, drained_
  std::condition_variable drained_changed_;
  bool drained_ = false;
  std::atomic<bool> stop_requested_{false};
};

size_t RaiseOpenFileLimit(size_t wanted) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return 1024;
  if (files.rlim_max < wanted) {
    rlimit raised{wanted, wanted};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return wanted;
  }
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  getrlimit(RLIMIT_NOFILE, &files);
  return size_t(std::min<rlim_t>(files.rlim_cur, rlim_t(1) << 30));
}

StoreServer::StoreServer(ServerOptions options) : loop_(std::make_unique<Loop>(std::move(options))) {
  port_ = loop_->port();
  thread_ = std::thread([this] { loop_->RunGuarded(); });
}

StoreServer::~StoreServer() { Stop(); }

void StoreServer::Stop() {
  if (!thread_.joinable()) return;
  loop_->RequestStop();
  thread_.join();
}

void StoreServer::WaitUntilDrained() { loop_->WaitUntilDrained(); }
ServerVerdict StoreServer::verdict() const { return loop_->verdict(); }
bool StoreServer::StalledItself() const { return loop_->StalledItself(); }
std::vector<int> StoreServer::unreported() const { return loop_->unreported(); }
std::vector<int> StoreServer::absent() const { return loop_->absent(); }
std::vector<int> StoreServer::nodes_running_ranks() const { return loop_->nodes_running_ranks(); }
StoreServer::NodeStates StoreServer::node_states() const { return loop_->node_states(); }
std::vector<NodeInfo> StoreServer::roster() const { return loop_->roster(); }
std::vector<NodeInfo> StoreServer::brief_roster() const { return loop_->roster(false); }
std::vector<std::optional<std::string>> StoreServer::Peek(const std::vector<std::string>& keys) const {
  return loop_->Peek(keys);
}
bool StoreServer::WaitCounter(const std::string& key, int64_t at_least, std::chrono::milliseconds timeout) {
  return loop_->WaitCounter(key, at_least, timeout);
}

std::optional<std::string> PortUnavailable(uint16_t port) {
  try {
    for (int fd : Listen(port, -1, 1)) close(fd);  // backlog -1: bound, never listening
    return std::nullopt;
  } catch (const StoreError& error) {
    return std::string(error.what());
  }
}

}  // namespace bt::rendezvous
