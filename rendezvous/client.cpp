#include "rendezvous/client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>

#include <spdlog/spdlog.h>

#include "rendezvous/auth.h"
#include "rendezvous/key_policy.h"

namespace bt::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kHandshakeTimeout{10000};
constexpr std::chrono::milliseconds kRequestTimeout{60000};
constexpr std::chrono::seconds kProgressLogInterval{30};

int64_t MillisLeft(Clock::time_point deadline) {
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

// How often a name lookup in progress looks at the interrupt fd.
constexpr int kResolvePollMs = 50;

enum class Woken { kTimedOut, kReady, kStopRequested };

// Waits up to `timeout` for `watched` (null: nothing) to be ready, or for a stop request:
// `interrupt_fd` readable and `stop_requested` (when set) agreeing. A readable interrupt fd
// that asks for no stop (a SIGCHLD on the launcher's signalfd, consumed by `stop_requested`)
// does not end the wait: it goes on for the rest of `timeout`. Sets `watched->revents`.
Woken WaitUnlessStopped(pollfd* watched, int interrupt_fd, const std::function<bool()>& stop_requested,
                        std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    // poll ignores an entry whose fd is negative: no watched fd, or no interrupt fd.
    pollfd fds[2] = {watched ? pollfd{watched->fd, watched->events, 0} : pollfd{-1, 0, 0}, {interrupt_fd, POLLIN, 0}};
    poll(fds, 2, int(MillisLeft(deadline)));
    if (fds[1].revents != 0 && (!stop_requested || stop_requested())) return Woken::kStopRequested;
    if (watched && fds[0].revents != 0) {
      watched->revents = fds[0].revents;
      return Woken::kReady;
    }
    if (MillisLeft(deadline) <= 0) return Woken::kTimedOut;
  }
}

// One lookup handed to glibc's resolver thread. On an interrupt it is abandoned: a lookup
// that cannot be cancelled still writes into it, so it is never freed then.
struct PendingLookup {
  std::string host;
  std::string service;
  addrinfo hints{};
  gaicb request{};
};

// getaddrinfo would block the launcher's only thread for the resolver's whole timeout (a
// DNS server that never answers: seconds per attempt and family), deaf to SIGTERM: the
// lookup runs on glibc's thread (getaddrinfo_a) while this one watches for a stop request.
int ResolveInterruptibly(const std::string& host, const std::string& service, const ClientOptions& options,
                         addrinfo** result) {
  auto lookup = std::make_unique<PendingLookup>();
  lookup->host = host;
  lookup->service = service;
  lookup->hints.ai_socktype = SOCK_STREAM;
  lookup->hints.ai_family = AF_UNSPEC;
  lookup->request.ar_name = lookup->host.c_str();
  lookup->request.ar_service = lookup->service.c_str();
  lookup->request.ar_request = &lookup->hints;
  gaicb* requests[] = {&lookup->request};
  if (int status = getaddrinfo_a(GAI_NOWAIT, requests, 1, nullptr); status != 0) return status;
  int status = EAI_INPROGRESS;
  while ((status = gai_error(&lookup->request)) == EAI_INPROGRESS) {
    const auto woken = WaitUnlessStopped(nullptr, options.interrupt_fd, options.stop_requested,
                                         std::chrono::milliseconds(kResolvePollMs));
    if (woken == Woken::kStopRequested) {
      if (gai_cancel(&lookup->request) != EAI_CANCELED) static_cast<void>(lookup.release());
      throw StoreError("interrupted while resolving the leader's name " + host);
    }
  }
  *result = lookup->request.ar_result;
  return status;
}

}  // namespace

// One attempt rides the kernel's SYN retransmissions (1 s, then 3 s) for up to 5 s. Abandoning
// a connect after 250 ms for a fresh SYN was tried against 16,384 nodes arriving at once: twice
// the retries, no faster (docs/PERFORMANCE.md).
std::chrono::milliseconds ConnectSchedule::AttemptTimeout(int) { return std::chrono::milliseconds(5000); }

std::chrono::milliseconds ConnectSchedule::Backoff(int attempt, uint32_t random) {
  const int64_t full = std::min<int64_t>(kMaxBackoff.count(), kFirstBackoff.count() << std::min(attempt - 1, 10));
  return std::chrono::milliseconds(full / 2 + int64_t(random % uint32_t(full / 2 + 1)));
}

namespace {

// DNS may not know the leader yet (headless services appear late): both a failed lookup
// and a refused connect are retried.
int ConnectWithBackoff(const ClientOptions& options, Clock::time_point deadline) {
  std::mt19937 jitter(std::random_device{}());
  std::string last_error;
  int attempts = 0;
  auto next_progress_log = Clock::now() + kProgressLogInterval;
  while (true) {
    ++attempts;
    addrinfo* addresses = nullptr;
    int lookup = ResolveInterruptibly(options.leader_host, std::to_string(options.port), options, &addresses);
    if (lookup != 0) {
      last_error = std::string("cannot resolve ") + options.leader_host + ": " + gai_strerror(lookup);
    } else {
      for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
        int error = 0;
        auto attempt_timeout = std::min<std::chrono::milliseconds>(ConnectSchedule::AttemptTimeout(attempts),
                                                                   std::chrono::milliseconds(MillisLeft(deadline) + 1));
        int fd = ConnectWithin(*address, attempt_timeout, error, options.interrupt_fd, options.stop_requested);
        if (fd >= 0) {
          freeaddrinfo(addresses);
          return fd;
        }
        if (error == EINTR) {
          freeaddrinfo(addresses);
          throw StoreError("interrupted while connecting to the leader");
        }
        last_error = error == ETIMEDOUT ? "connect timed out" : std::strerror(error);
      }
      freeaddrinfo(addresses);
    }
    if (Clock::now() >= deadline) {
      throw StoreError("leader " + options.leader_host + ":" + std::to_string(options.port) + " never answered (" +
                       std::to_string(attempts) + " attempts; last: " + last_error + ")");
    }
    if (Clock::now() >= next_progress_log || attempts == 1) {
      spdlog::info("waiting for the leader at {}:{} ({}), {} s left", options.leader_host, options.port, last_error,
                   MillisLeft(deadline) / 1000);
      next_progress_log = Clock::now() + kProgressLogInterval;
    }
    auto sleep = std::min<int64_t>(MillisLeft(deadline), ConnectSchedule::Backoff(attempts, uint32_t(jitter())).count());
    if (WaitUnlessStopped(nullptr, options.interrupt_fd, options.stop_requested, std::chrono::milliseconds(sleep)) ==
        Woken::kStopRequested) {
      throw StoreError("interrupted while waiting for the leader");
    }
  }
}

// A leader that closes a fresh connection before the handshake is shedding load (out of
// descriptors, too many unauthenticated connections): worth another try, unlike a reject.
struct HandshakeClosed : StoreError {
  HandshakeClosed() : StoreError("the leader closed the connection during the handshake") {}
};

// Reads exactly one frame with a deadline; used only during the handshake.
Message ReadFrameBlocking(int fd, FrameDecoder& decoder, Clock::time_point deadline) {
  Message message;
  char buffer[4096];
  while (!decoder.Next(message)) {
    pollfd readable = {fd, POLLIN, 0};
    if (poll(&readable, 1, int(MillisLeft(deadline))) != 1) throw StoreError("the leader did not answer the handshake");
    ssize_t got = read(fd, buffer, sizeof buffer);
    if (got <= 0) throw HandshakeClosed();
    decoder.Feed(buffer, size_t(got));
  }
  return message;
}

void WriteAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd writable = {fd, POLLOUT, 0};
      poll(&writable, 1, 1000);
      continue;
    }
    if (n <= 0) throw StoreError(std::string("send to the leader failed: ") + std::strerror(errno));
    sent += size_t(n);
  }
}

}  // namespace

int ConnectWithin(const addrinfo& address, std::chrono::milliseconds timeout, int& error, int interrupt_fd,
                  const std::function<bool()>& stop_requested) {
  int fd = socket(address.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = errno;
    return -1;
  }
  if (connect(fd, address.ai_addr, address.ai_addrlen) != 0 && errno != EINPROGRESS) {
    error = errno;
    close(fd);
    return -1;
  }
  // A SYN that is dropped keeps the attempt open for its whole timeout: a stop request
  // (interrupt_fd readable with a shutdown signal) must not wait for it.
  pollfd connected = {fd, POLLOUT, 0};
  int status = ETIMEDOUT;
  socklen_t length = sizeof status;
  switch (WaitUnlessStopped(&connected, interrupt_fd, stop_requested, timeout)) {
    case Woken::kStopRequested:
      status = EINTR;
      break;
    case Woken::kReady:
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &status, &length);
      break;
    case Woken::kTimedOut:
      break;
  }
  if (status != 0) {
    error = status;
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// The server proves the token first by answering our nonce only after checking ours:
// both sides learn that the other holds the token, and neither sends it.
LeaderHandshake AuthenticateToLeader(int fd, const std::string& token, const std::string& job_id) {
  FrameDecoder decoder(kMaxUnauthenticatedFrameBytes);
  auto deadline = Clock::now() + kHandshakeTimeout;
  Message hello = ReadFrameBlocking(fd, decoder, deadline);
  if (StringField(hello, "op") != "hello") throw StoreError("the leader spoke first with something other than hello");
  const std::string client_nonce = RandomNonce();
  const auto sent = std::chrono::system_clock::now();
  WriteAll(fd, EncodeFrame({{"op", "auth"},
                            {"proof", BytesValue(ProveToken(token, BytesField(hello, "nonce"), "client"))},
                            {"nonce", BytesValue(client_nonce)},
                            {"job_id", BytesValue(job_id)}}));
  Message answer = ReadFrameBlocking(fd, decoder, deadline);
  const auto received = std::chrono::system_clock::now();
  const std::string op = StringField(answer, "op");
  if (op == "reject") throw StoreError("the leader rejected this node: " + StringField(answer, "message"));
  if (op != "welcome" || !VerifyProof(token, client_nonce, "server", BytesField(answer, "proof"))) {
    throw StoreError("the leader failed to prove the job token: wrong BT_RENDEZVOUS_TOKEN, or not our leader");
  }
  LeaderHandshake handshake;
  handshake.round_trip = received - sent;
  if (answer.contains("time_ns")) {
    const auto midpoint = sent.time_since_epoch() + handshake.round_trip / 2;
    handshake.clock_offset = std::chrono::nanoseconds(IntField(answer, "time_ns")) - midpoint;
  }
  return handshake;
}

std::unique_ptr<StoreClient> StoreClient::Connect(const ClientOptions& options) {
  auto deadline = Clock::now() + options.connect_timeout;
  std::mt19937 jitter(std::random_device{}());
  for (int shed = 1;; ++shed) {
    int fd = ConnectWithBackoff(options, deadline);
    try {
      const LeaderHandshake handshake = AuthenticateToLeader(fd, options.token, options.job_id);
      return std::unique_ptr<StoreClient>(new StoreClient(fd, options, handshake));
    } catch (const HandshakeClosed&) {
      close(fd);
      if (MillisLeft(deadline) <= 0) throw;
    } catch (const FrameError& error) {
      close(fd);
      throw StoreError(std::string("bad handshake frame from the leader: ") + error.what());
    } catch (...) {
      close(fd);
      throw;
    }
    const int64_t pause = ConnectSchedule::Backoff(shed, uint32_t(jitter())).count();
    if (WaitUnlessStopped(nullptr, options.interrupt_fd, options.stop_requested,
                          std::chrono::milliseconds(std::min<int64_t>(MillisLeft(deadline), pause))) == Woken::kStopRequested) {
      throw StoreError("interrupted while waiting for the leader");
    }
  }
}

StoreClient::StoreClient(int fd, ClientOptions options, LeaderHandshake handshake)
    : fd_(fd), event_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), stop_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      options_(std::move(options)), handshake_(handshake) {
  if (event_fd_ < 0 || stop_fd_ < 0) {
    const std::string why = std::strerror(errno);
    if (event_fd_ >= 0) close(event_fd_);
    if (stop_fd_ >= 0) close(stop_fd_);
    throw StoreError("eventfd: " + why + " (out of file descriptors?)");
  }
  reader_ = std::thread([this] { ReaderGuarded(); });
}

// An exception leaving the reader's thread would call std::terminate and end the launcher
// (PID 1) with its training. Whatever escapes the loop is a broken connection instead:
// every request fails, and the launcher hears that the leader is lost, with the cause.
void StoreClient::ReaderGuarded() {
  try {
    ReaderLoop();
  } catch (const std::exception& error) {
    FailAll(std::string("this node's connection failed on an internal error: ") + error.what());
  } catch (...) {
    FailAll("this node's connection failed on an internal error");
  }
}

StoreClient::~StoreClient() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t ignored = write(stop_fd_, &one, sizeof one);
  reader_.join();
  close(fd_);
  close(event_fd_);
  close(stop_fd_);
}

void StoreClient::SendFrame(const Message& message) {
  std::lock_guard lock(send_mutex_);
  WriteAll(fd_, EncodeFrame(message));
  last_sent_ns_ = Clock::now().time_since_epoch().count();
}

Message StoreClient::Request(Message request, std::chrono::milliseconds timeout) {
  int64_t id;
  {
    std::lock_guard lock(mutex_);
    if (broken_) throw StoreError(*broken_);
    id = next_id_++;
    pending_[id] = std::nullopt;
  }
  request["id"] = id;
  try {
    SendFrame(request);
  } catch (const StoreError&) {
    std::lock_guard lock(mutex_);
    pending_.erase(id);
    throw;
  }
  std::unique_lock lock(mutex_);
  bool answered = answered_.wait_for(lock, timeout, [&] { return pending_[id].has_value() || broken_.has_value(); });
  std::optional<Message> reply = std::move(pending_[id]);
  pending_.erase(id);  // a late answer to a timed-out wait finds no entry and is dropped
  if (reply) {
    if (StringField(*reply, "op") == "error") {
      const std::string why = "the leader refused: " + StringField(*reply, "message");
      if (reply->value("succeeded", false) == true) throw JobAlreadySucceeded(why);
      throw StoreError(why);
    }
    return *reply;
  }
  if (broken_) throw StoreError(*broken_);
  if (!answered) throw StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms");
  throw StoreError("no answer");
}

void StoreClient::Set(const std::string& key, const std::string& value) {
  Request({{"op", "set"}, {"key", key}, {"value", BytesValue(value)}}, kRequestTimeout);
}

std::string StoreClient::Get(const std::string& key, std::chrono::milliseconds timeout) {
  try {
    return BytesField(Request({{"op", "get"}, {"key", key}, {"timeout_ms", uint64_t(timeout.count())}}, timeout), "value");
  } catch (const StoreTimeout&) {
    throw StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms waiting for " + key);
  }
}

void StoreClient::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (size_t i = 0; i < keys.size(); ++i) {
    try {
      const auto left = std::chrono::milliseconds(MillisLeft(deadline));
      Request({{"op", "wait"}, {"key", keys[i]}, {"timeout_ms", uint64_t(left.count())}}, left);
    } catch (const StoreTimeout&) {
      std::string missing;
      for (size_t j = i; j < keys.size(); ++j) missing += (missing.empty() ? "" : ", ") + keys[j];
      throw StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms waiting for " + missing);
    }
  }
}

int64_t StoreClient::Add(const std::string& key, int64_t delta) {
  return IntField(Request({{"op", "add"}, {"key", key}, {"delta", delta}}, kRequestTimeout), "value");
}

std::vector<std::optional<std::string>> StoreClient::Peek(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> values;
  for (size_t first = 0; first < keys.size(); first += kMaxPeekKeys) {
    const auto batch_end = keys.begin() + int64_t(std::min(keys.size(), first + kMaxPeekKeys));
    const Message reply = Request({{"op", "mget"}, {"keys", std::vector<std::string>(keys.begin() + int64_t(first), batch_end)}},
                                  kRequestTimeout);
    auto answered = reply.find("values");
    if (answered == reply.end() || !answered->is_array() || answered->size() != size_t(batch_end - keys.begin()) - first) {
      throw StoreError("the leader answered mget without one value per key");
    }
    for (const auto& value : *answered) {
      if (value.is_binary()) {
        values.emplace_back(std::string(value.get_binary().begin(), value.get_binary().end()));
      } else {
        values.emplace_back(std::nullopt);
      }
    }
  }
  return values;
}

void StoreClient::Join(const NodeInfo& info, int node_count) {
  Request({{"op", "join"}, {"count", node_count}, {"info", info.ToJson()}}, kRequestTimeout);
}

void StoreClient::Report(int exit_code, const std::string& cause, int64_t cycle, bool restartable, bool cannot_train) {
  Request({{"op", "report"}, {"code", exit_code}, {"cause", cause}, {"cycle", cycle}, {"restartable", restartable},
           {"cannot_train", cannot_train}},
          kRequestTimeout);
}

void StoreClient::ArriveAtCycle(int64_t cycle, double stopped_s) {
  Request({{"op", "cycle_ready"}, {"cycle", cycle}, {"stopped_s", stopped_s}}, kRequestTimeout);
}

void StoreClient::SpareReady(int64_t cycle) { Request({{"op", "spare_ready"}, {"cycle", cycle}}, kRequestTimeout); }

void StoreClient::ReportStall(int64_t cycle, const std::string& quiet, bool stalled) {
  Request({{"op", stalled ? "stall" : "resumed"}, {"cycle", cycle}, {"quiet", quiet}}, kRequestTimeout);
}

void StoreClient::DeclareHang(int64_t cycle, int rank, const std::string& cause, int exit_code) {
  Request({{"op", "hang"}, {"cycle", cycle}, {"rank", rank}, {"cause", cause}, {"code", exit_code}}, kRequestTimeout);
}

void StoreClient::GiveUp(const std::string& cause) {
  Request({{"op", "give_up"}, {"cause", cause}}, kRequestTimeout);
}

void StoreClient::SayGoodbye() {
  try {
    SendFrame({{"op", "bye"}});
  } catch (const StoreError&) {
    // The leader is gone already; there is nobody to say goodbye to.
  }
}

std::string StoreClient::LocalAddress() const {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "";
  return AddressText(reinterpret_cast<const sockaddr*>(&address));
}

std::chrono::steady_clock::time_point StoreClient::LastCycleWait() const {
  return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(last_cycle_wait_ns_.load()));
}

bool StoreClient::LeaderLost() {
  std::lock_guard lock(mutex_);
  return broken_.has_value();
}

std::optional<PeerEvent> StoreClient::TakeEvent() {
  std::lock_guard lock(mutex_);
  if (events_.empty()) {
    uint64_t value;
    [[maybe_unused]] ssize_t ignored = read(event_fd_, &value, sizeof value);
    return std::nullopt;
  }
  PeerEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

void StoreClient::PushEvent(PeerEvent event) {
  event.received = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t ignored = write(event_fd_, &one, sizeof one);
}

void StoreClient::FailAll(const std::string& why) { Break("leader (node 0) lost: " + why); }

// Every request fails from now on, and the launcher hears `message` once (the first cause:
// a "lost" frame is followed by the connection's close, which must not replace it).
void StoreClient::Break(const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    if (!broken_) broken_ = message;
  }
  answered_.notify_all();
  if (!leader_lost_reported_) {
    leader_lost_reported_ = true;
    PushEvent({PeerEvent::Kind::kLeaderLost, 0, message});
  }
}

// Reads frames and sends heartbeats; the only thread that reads the socket.
void StoreClient::ReaderLoop() {
  FrameDecoder decoder(kMaxFrameBytes);
  auto last_heard = Clock::now();
  auto next_heartbeat = Clock::now();
  char buffer[65536];
  while (true) {
    auto now = Clock::now();
    // After this node's freeze (SIGSTOP, a starved host) the leader's frames may wait
    // unread: they are read before the leader is called silent (one may say that node 0
    // took this node for lost), and before a heartbeat is sent into a connection it closed.
    const bool silent = now - last_heard > options_.heartbeat_timeout;
    if (silent && !HasUnreadBytes(fd_)) {
      return FailAll("no heartbeat for " +
                     std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - last_heard).count()) + " s");
    }
    if (!silent && now >= next_heartbeat) {
      // Any frame tells the leader this node lives: a heartbeat only when nothing else was
      // sent within the interval (a node busy with requests sends none).
      const auto last_sent = Clock::time_point(Clock::duration(last_sent_ns_.load()));
      if (now - last_sent >= options_.heartbeat_interval) {
        try {
          SendFrame({{"op", "hb"}});
        } catch (const StoreError& error) {
          return FailAll(error.what());
        }
        next_heartbeat = now + options_.heartbeat_interval;
      } else {
        next_heartbeat = last_sent + options_.heartbeat_interval;
      }
    }
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    poll(fds, 2, int(MillisLeft(next_heartbeat)) + 1);
    if (fds[1].revents & POLLIN) return;
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t got = read(fd_, buffer, sizeof buffer);
    if (got == 0) return FailAll("connection closed");
    if (got < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return FailAll(std::string("read failed: ") + std::strerror(errno));
    }
    last_heard = Clock::now();
    decoder.Feed(buffer, size_t(got));
    try {
      Message message;
      while (decoder.Next(message)) OnMessage(message);
    } catch (const FrameError& error) {
      return FailAll(std::string("bad frame from the leader: ") + error.what());
    }
  }
}

namespace {

// A "restart" frame (or a rejoin's), as the event the launcher acts on.
PeerEvent RestartEvent(const Message& message, PeerEvent::Kind kind) {
  PeerEvent event{kind, int(IntField(message, "rank")), StringField(message, "message"), int(IntField(message, "code"))};
  event.cycle = IntField(message, "cycle");
  event.host = StringField(message, "host");
  if (auto decision = message.find("decision"); decision != message.end()) event.decision = *decision;
  return event;
}

}  // namespace

void StoreClient::OnMessage(const Message& message) {
  const std::string op = StringField(message, "op");
  if (message.contains("id")) {
    std::lock_guard lock(mutex_);
    auto it = pending_.find(IntField(message, "id"));
    if (it != pending_.end()) it->second = message;
    answered_.notify_all();
    return;
  }
  if (op == "hb") return;
  // Node 0 took this node for lost (silent past the heartbeat timeout: frozen, starved, cut
  // off) and went on without it; the close that follows is not node 0's loss.
  if (op == "lost") return Break(StringField(message, "message"));
  if (op == "complete") return PushEvent({PeerEvent::Kind::kComplete, -1, ""});
  if (op == "result") return PushEvent({PeerEvent::Kind::kResult, -1, "every node succeeded"});
  if (op == "abort") {
    // A leader of an older version sends no code: the failed node's code is then unknown.
    const int code = message.contains("code") ? int(IntField(message, "code")) : 0;
    return PushEvent({PeerEvent::Kind::kAbort, int(IntField(message, "rank")), StringField(message, "message"), code});
  }
  if (op == "restart") return PushEvent(RestartEvent(message, PeerEvent::Kind::kRestart));
  if (op == "rejoin") {
    auto restart = message.find("restart");
    if (restart == message.end() || !restart->is_object()) throw FrameError("rejoin without its restart");
    PeerEvent event = RestartEvent(*restart, PeerEvent::Kind::kRejoin);
    event.training_rank = int(IntField(message, "training_rank"));
    return PushEvent(std::move(event));
  }
  if (op == "cycle_wait") {  // the leader's word on a restart's barrier, every 10 s while it waits
    last_cycle_wait_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
    spdlog::info("restart: {}", StringField(message, "message"));
    return;
  }
  if (op == "cycle_go") {
    PeerEvent event{PeerEvent::Kind::kCycleGo, -1, ""};
    event.cycle = IntField(message, "cycle");
    event.decision = message;
    return PushEvent(std::move(event));
  }
  if (op == "collect_stacks") {
    PeerEvent event{PeerEvent::Kind::kCollectStacks, int(IntField(message, "rank")), StringField(message, "message")};
    event.cycle = IntField(message, "cycle");
    return PushEvent(std::move(event));
  }
  if (op == "join_timeout") return PushEvent({PeerEvent::Kind::kJoinTimeout, -1, StringField(message, "message")});
  throw FrameError("unexpected op \"" + op + "\" from the leader");
}

}  // namespace bt::rendezvous
