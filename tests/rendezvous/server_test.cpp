// The leader's server at the protocol level: authentication, hostile frames, joins,
// heartbeats and verdicts, with real sockets on loopback.
#include "rendezvous/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "rendezvous/auth.h"
#include "rendezvous/client.h"
#include "rendezvous/commit_keys.h"
#include "rendezvous/key_policy.h"
#include "rendezvous/wire.h"

namespace bt::rendezvous {
namespace {

using namespace std::chrono_literals;
constexpr const char* kToken = "job-token";

ServerOptions Options(int nodes, std::chrono::milliseconds join_timeout = 30s,
                      std::chrono::milliseconds heartbeat_timeout = 5s) {
  return ServerOptions{0, kToken, nodes, join_timeout, 100ms, heartbeat_timeout, 2s};
}

std::unique_ptr<StoreClient> Connect(const StoreServer& server, const std::string& token = kToken,
                                     std::chrono::milliseconds heartbeat_interval = 100ms) {
  return StoreClient::Connect(ClientOptions{"127.0.0.1", server.port(), token, 5s, heartbeat_interval, 5s, -1});
}

NodeInfo Node(int rank, const std::string& host = "host") {
  NodeInfo info;
  info.rank = rank;
  info.host = host + std::to_string(rank);
  info.pid = 1000 + rank;
  return info;
}

// Connects and joins ranks 0..nodes-1 of a `nodes`-node job, in order.
std::vector<std::unique_ptr<StoreClient>> JoinAll(const StoreServer& server, int nodes) {
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int rank = 0; rank < nodes; ++rank) {
    clients.push_back(Connect(server));
    clients.back()->Join(Node(rank), nodes);
  }
  return clients;
}

// Waits for the next event of the given kind, skipping others.
std::optional<PeerEvent> NextEvent(StoreClient& client, PeerEvent::Kind kind, std::chrono::milliseconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    while (auto event = client.TakeEvent()) {
      if (event->kind == kind) return event;
    }
    pollfd readable = {client.event_fd(), POLLIN, 0};
    poll(&readable, 1, 50);
  }
  return std::nullopt;
}

// A socket that speaks raw bytes to the server.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    hello_ = ReadMessage();
  }
  ~RawPeer() { close(fd_); }
  void Send(const std::string& bytes) { [[maybe_unused]] auto n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  std::optional<Message> ReadMessage(std::chrono::milliseconds timeout = 3s) {
    char buffer[4096];
    Message message;
    while (!decoder_.Next(message)) {
      pollfd readable = {fd_, POLLIN, 0};
      if (poll(&readable, 1, int(timeout.count())) != 1) return std::nullopt;
      ssize_t got = read(fd_, buffer, sizeof buffer);
      if (got <= 0) return std::nullopt;
      decoder_.Feed(buffer, size_t(got));
    }
    return message;
  }
  // True when the server closes the connection within the timeout.
  bool ClosedByServer(std::chrono::milliseconds timeout = 3s) {
    char buffer[4096];
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd readable = {fd_, POLLIN, 0};
      if (poll(&readable, 1, 50) != 1) continue;
      ssize_t got = read(fd_, buffer, sizeof buffer);
      if (got <= 0) return true;
    }
    return false;
  }
  const Message& hello() const { return *hello_; }
  // Proves the token as a real node would; returns whether the server welcomed it.
  bool Authenticate(const std::string& token = kToken) {
    Send(EncodeFrame({{"op", "auth"},
                      {"proof", BytesValue(ProveToken(token, BytesField(hello(), "nonce"), "client"))},
                      {"nonce", BytesValue(RandomNonce())}}));
    auto answer = ReadMessage();
    return answer && StringField(*answer, "op") == "welcome";
  }

 private:
  int fd_ = -1;
  FrameDecoder decoder_{kMaxFrameBytes};
  std::optional<Message> hello_;
};

TEST(Server, WrongTokenIsRejectedByName) {
  StoreServer server(Options(1));
  try {
    Connect(server, "wrong-token");
    FAIL();
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("wrong job token"), std::string::npos) << error.what();
  }
}


// Two jobs holding one token (one Kubernetes Secret per namespace) whose nodes reach the
// same leader: a node of the other job is refused, naming both jobs; its own job's nodes,
// and a client that names no job (doctor), are let in.
TEST(Server, ANodeOfAnotherJobIsRejectedNamingBothJobs) {
  ServerOptions options = Options(2);
  options.job_id = "k8s-trainer";
  StoreServer server(options);
  auto client_of = [&](const std::string& job_id) {
    return StoreClient::Connect(ClientOptions{"127.0.0.1", server.port(), kToken, 5s, 100ms, 5s, -1, job_id});
  };
  try {
    client_of("k8s-trainer-b");
    FAIL() << "a node of job k8s-trainer-b was let into job k8s-trainer's rendezvous";
  } catch (const StoreError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("job k8s-trainer-b"), std::string::npos) << message;
    EXPECT_NE(message.find("serves job k8s-trainer:"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(client_of("k8s-trainer"));
  EXPECT_NO_THROW(client_of(""));
}
// Two Slurm jobs on one node and port: each job's token is derived from its own job id, so
// the other job's node fails the proof. It is told its job is not the leader's (the likely
// cause, and the fix), but not which job the leader serves.
TEST(Server, ANodeOfAnotherJobWithItsOwnTokenIsToldTheLeaderServesAnotherJob) {
  ServerOptions options = Options(2);
  options.job_id = "slurm-41.0";
  StoreServer server(options);
  try {
    StoreClient::Connect(ClientOptions{"127.0.0.1", server.port(), "token-of-job-42", 5s, 100ms, 5s, -1, "slurm-42.0"});
    FAIL() << "a node of job slurm-42.0 was let in with another token";
  } catch (const StoreError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("wrong job token: this node is of job slurm-42.0, but the leader serves another job"),
              std::string::npos) << message;
    EXPECT_NE(message.find("--exclusive"), std::string::npos) << message;
    EXPECT_EQ(message.find("slurm-41"), std::string::npos) << "an unproven node learned the leader's job: " << message;
  }
}

TEST(Server, NothingIsAcceptedBeforeAuthentication) {
  StoreServer server(Options(1));
  RawPeer peer(server.port());
  ASSERT_EQ(StringField(peer.hello(), "op"), "hello");
  peer.Send(EncodeFrame({{"op", "set"}, {"id", 1}, {"key", "k"}, {"value", BytesValue("v")}}));
  EXPECT_TRUE(peer.ClosedByServer());
  auto client = Connect(server);
  EXPECT_THROW(client->Get("k", 200ms), StoreTimeout) << "the unauthenticated set must not have happened";
}

// Listening sockets on `port`, from /proc/net/tcp and tcp6 (state 0A is LISTEN).
int ListeningSockets(uint16_t port) {
  char wanted[16];
  std::snprintf(wanted, sizeof wanted, ":%04X ", port);
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* file = std::fopen(table, "r");
    if (file == nullptr) continue;
    char line[512];
    while (std::fgets(line, sizeof line, file) != nullptr) {
      const std::string text(line);
      const size_t local = text.find(wanted);
      if (local != std::string::npos && local < 60 && text.find(" 0A ") != std::string::npos) ++count;
    }
    std::fclose(file);
  }
  return count;
}

// More nodes than one accept queue holds: the leader listens on several sockets sharing
// the port (SO_REUSEPORT), each connection lands on one of them, and a port held by another
// leader still fails as before instead of being shared.
TEST(Server, MoreNodesThanOneAcceptQueueHoldsShareThePortAndStillOwnIt) {
  int somaxconn = 0;
  if (FILE* file = std::fopen("/proc/sys/net/core/somaxconn", "r")) {
    if (std::fscanf(file, "%d", &somaxconn) != 1) somaxconn = 0;
    std::fclose(file);
  }
  if (somaxconn <= 0 || somaxconn > 8192) GTEST_SKIP() << "net.core.somaxconn is " << somaxconn << ": one queue is enough";
  StoreServer server(Options(2 * somaxconn));
  EXPECT_GE(ListeningSockets(server.port()), 2);
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int rank = 0; rank < 64; ++rank) {  // spread over the queues by the kernel's hash
    clients.push_back(Connect(server));
    clients.back()->Join(Node(rank), 2 * somaxconn);
  }
  EXPECT_EQ(server.roster().size(), 64u);
  ServerOptions same_port = Options(2 * somaxconn);
  same_port.port = server.port();
  try {
    StoreServer second(same_port);
    FAIL() << "a second leader shared port " << server.port();
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("Address already in use"), std::string::npos) << error.what();
  }
}

TEST(Server, OversizedUnauthenticatedFrameClosesTheConnection) {
  StoreServer server(Options(1));
  RawPeer peer(server.port());
  peer.Send(std::string{char(0x7f), char(0xff), char(0xff), char(0xff)});
  EXPECT_TRUE(peer.ClosedByServer());
}

TEST(Server, TruncatedFrameThenCloseLeavesTheServerServing) {
  StoreServer server(Options(1));
  {
    RawPeer peer(server.port());
    std::string frame = EncodeFrame({{"op", "auth"}, {"proof", BytesValue("x")}});
    peer.Send(frame.substr(0, frame.size() / 2));
  }
  auto client = Connect(server);
  client->Set("still", "serving");
  EXPECT_EQ(client->Get("still", 1s), "serving");
}

TEST(Server, RandomFramesAreRejectedAndOthersKeepWorking) {
  StoreServer server(Options(1));
  auto client = Connect(server);
  std::mt19937 random(7);
  for (int round = 0; round < 50; ++round) {
    RawPeer peer(server.port());
    std::string garbage(1 + random() % 200, '\0');
    for (char& byte : garbage) byte = char(random());
    garbage[0] = 0;  // keep the length under the pre-auth limit so the payload is parsed
    peer.Send(garbage);
    client->Set("round", std::to_string(round));
  }
  EXPECT_EQ(client->Get("round", 1s), "49");
}

// Frames that are well formed but not what their op needs, from a peer that knows the token
// (with the token derived from the job id, anyone who knows the id): the connection goes,
// the leader stays.
TEST(Server, MalformedJoinsFromAnAuthenticatedPeerCloseOnlyThatConnection) {
  StoreServer server(Options(2));
  {
    RawPeer peer(server.port());
    ASSERT_TRUE(peer.Authenticate());
    peer.Send(EncodeFrame({{"op", "join"}, {"id", 1}, {"count", 2}}));  // no info
    EXPECT_TRUE(peer.ClosedByServer());
  }
  {
    RawPeer peer(server.port());  // one connection claiming two ranks, then gone
    ASSERT_TRUE(peer.Authenticate());
    peer.Send(EncodeFrame({{"op", "join"}, {"id", 1}, {"count", 2}, {"info", Node(0).ToJson()}}));
    peer.Send(EncodeFrame({{"op", "join"}, {"id", 2}, {"count", 2}, {"info", Node(1).ToJson()}}));
    EXPECT_TRUE(peer.ClosedByServer());
  }
  // The leader still serves, and both ranks are free again for real nodes.
  auto clients = JoinAll(server, 2);
  for (auto& client : clients) EXPECT_TRUE(NextEvent(*client, PeerEvent::Kind::kComplete));
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kPending);
}

TEST(Server, RosterWithAHostThatIsNotUtf8IsPublished) {
  StoreServer server(Options(2));
  auto first = Connect(server);
  first->Join(Node(0, "bad\xff\xfehost"), 2);
  auto second = Connect(server);
  second->Join(Node(1), 2);
  EXPECT_TRUE(NextEvent(*second, PeerEvent::Kind::kComplete));
  auto roster = RosterFromJson(nlohmann::json::parse(second->Get("bt/roster", 1s)));
  ASSERT_EQ(roster.size(), 2u);
  EXPECT_EQ(roster[1].host, "host1");
}

TEST(Server, WaitsOfAClosedConnectionDoNotFollowItsFdNumber) {
  StoreServer server(Options(1));
  {
    RawPeer peer(server.port());
    ASSERT_TRUE(peer.Authenticate());
    for (int id = 1; id <= 50; ++id) peer.Send(EncodeFrame({{"op", "wait"}, {"id", id}, {"key", "later"}}));
    std::this_thread::sleep_for(100ms);  // parked on the server
  }
  std::this_thread::sleep_for(100ms);
  auto client = Connect(server);  // likely the same fd number on the server
  client->Set("later", "x");      // must not answer (or un-count) the dead connection's waits
  for (int i = 0; i < 100; ++i) EXPECT_EQ(client->Get("later", 1s), "x");
  client->Set("still", "connected");
  EXPECT_EQ(client->Get("still", 1s), "connected");
}

// A key's value is encoded once for all the requests parked on it: each waiter still gets
// its own id and the whole value, whether it asked with get (the value) or wait (none),
// over several connections and ids of every width.
TEST(Server, WaitersWokenByOneSetEachGetTheirOwnIdAndTheWholeValue) {
  StoreServer server(Options(1));
  std::vector<std::unique_ptr<RawPeer>> peers;
  const std::vector<int64_t> ids = {1, 200, 70000, 5000000000ll};
  for (int i = 0; i < 3; ++i) {
    peers.push_back(std::make_unique<RawPeer>(server.port()));
    ASSERT_TRUE(peers.back()->Authenticate());
    std::string frames;
    for (int64_t id : ids) {
      frames += EncodeFrame({{"op", (id + i) % 2 ? "get" : "wait"}, {"id", id + i}, {"key", "shared"}, {"timeout_ms", 10000}});
    }
    peers.back()->Send(frames);
  }
  std::this_thread::sleep_for(200ms);  // every request parked
  std::string value(100000, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = char(i * 7 + 3);
  auto writer = Connect(server);
  writer->Set("shared", value);
  for (int i = 0; i < 3; ++i) {
    for (int64_t id : ids) {
      auto answer = peers[size_t(i)]->ReadMessage(5s);
      while (answer && StringField(*answer, "op") == "hb") answer = peers[size_t(i)]->ReadMessage(5s);
      ASSERT_TRUE(answer) << "connection " << i << " id " << id + i;
      EXPECT_EQ(StringField(*answer, "op"), "ok");
      EXPECT_EQ(IntField(*answer, "id"), id + i);
      if ((id + i) % 2) {
        EXPECT_EQ(BytesField(*answer, "value"), value);
      } else {
        EXPECT_FALSE(answer->contains("value"));
      }
    }
  }
}

// Node 0 reads its own server's table in-process: what a node set is there at once, a
// key not set is nullopt, and a wait for a counter returns when a node's add reaches it.
TEST(Server, NodeZeroReadsItsOwnTableWithoutARequest) {
  StoreServer server(Options(1));
  auto client = Connect(server);
  client->Set("a", std::string("x\0y", 3));
  auto values = server.Peek({"a", "missing"});
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0], std::string("x\0y", 3));
  EXPECT_FALSE(values[1]);
  EXPECT_FALSE(server.WaitCounter("count", 2, 100ms));
  client->Add("count", 1);
  EXPECT_FALSE(server.WaitCounter("count", 2, 100ms));
  std::thread adder([&] {
    std::this_thread::sleep_for(200ms);
    client->Add("count", 1);
  });
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(server.WaitCounter("count", 2, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  adder.join();
  EXPECT_TRUE(server.WaitCounter("count", 1, 0ms));
  server.Stop();
  EXPECT_THROW(server.WaitCounter("count", 5, 1s), StoreError);
}

// Any frame shows the leader lives: a connection it answered within the heartbeat interval
// gets no heartbeat, and one it sent nothing gets them again.
TEST(Server, NoHeartbeatToAConnectionThatWasJustAnswered) {
  StoreServer server(Options(1));  // heartbeats every 100 ms
  RawPeer peer(server.port());
  ASSERT_TRUE(peer.Authenticate());
  int heartbeats = 0, answers = 0;
  const auto until = std::chrono::steady_clock::now() + 1s;
  for (int id = 1; std::chrono::steady_clock::now() < until; ++id) {
    peer.Send(EncodeFrame({{"op", "add"}, {"id", id}, {"key", "busy"}, {"delta", 1}}));
    for (auto message = peer.ReadMessage(1s); message; message = peer.ReadMessage(1s)) {
      if (StringField(*message, "op") == "hb") {
        ++heartbeats;
        continue;
      }
      ++answers;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GT(answers, 10);
  EXPECT_LE(heartbeats, 2) << "answered every 20 ms, yet sent " << heartbeats << " heartbeats in 1 s";
  auto idle = peer.ReadMessage(2s);  // nothing else to say: the heartbeats resume
  ASSERT_TRUE(idle);
  EXPECT_EQ(StringField(*idle, "op"), "hb");
}

TEST(Server, ConnectionThatNeverAuthenticatesIsClosedAfterTheDeadline) {
  StoreServer server(Options(1));
  RawPeer silent(server.port());  // reads the hello, then says nothing
  auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(silent.ClosedByServer(10s));
  EXPECT_GE(std::chrono::steady_clock::now() - started, 4s);
}

TEST(Server, LegitimateNodeJoinsWhileAThousandIdleConnectionsAreHeld) {
  StoreServer server(Options(2));
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(server.port());
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0) << i;
    idle.push_back(fd);
  }
  auto started = std::chrono::steady_clock::now();
  auto clients = JoinAll(server, 2);
  for (auto& client : clients) EXPECT_TRUE(NextEvent(*client, PeerEvent::Kind::kComplete, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  for (int fd : idle) close(fd);
}

TEST(Server, TimedOutWaitsExpireInsteadOfPilingUp) {
  StoreServer server(Options(1));
  auto client = Connect(server);
  // More timed-out waits than one connection may park at once (4,096): each must expire
  // on the server, or the connection would be dropped as abusive.
  for (int i = 0; i < 4200; ++i) EXPECT_THROW(client->Get("never-set", 1ms), StoreTimeout);
  client->Set("after", "still connected");
  EXPECT_EQ(client->Get("after", 1s), "still connected");
}

TEST(Server, ClientRefusesAServerThatCannotProveTheToken) {
  StoreServer server(ServerOptions{0, "leader-token", 1, 30s, 100ms, 5s, 1s});
  EXPECT_THROW(Connect(server, "client-token"), StoreError);
}

TEST(Server, JoinCompletesWhenEveryRankIsIn) {
  StoreServer server(Options(3));
  auto clients = JoinAll(server, 3);
  for (auto& client : clients) EXPECT_TRUE(NextEvent(*client, PeerEvent::Kind::kComplete));
  auto roster = server.roster();
  ASSERT_EQ(roster.size(), 3u);
  EXPECT_EQ(roster[2].host, "host2");
  EXPECT_EQ(roster[2].seen_from, "127.0.0.1");
  auto published = RosterFromJson(nlohmann::json::parse(clients[1]->Get("bt/roster", 1s)));
  EXPECT_EQ(published.size(), 3u);
}

TEST(Server, TwoNodesClaimingOneRankAreBothTold) {
  StoreServer server(Options(3));
  auto first = Connect(server);
  first->Join(Node(1, "alpha"), 3);
  auto second = Connect(server);
  EXPECT_THROW(second->Join(Node(1, "beta"), 3), StoreError);
  for (StoreClient* client : {first.get(), second.get()}) {
    auto abort = NextEvent(*client, PeerEvent::Kind::kAbort);
    ASSERT_TRUE(abort);
    EXPECT_NE(abort->message.find("rank 1 claimed by two nodes: alpha1"), std::string::npos) << abort->message;
    EXPECT_NE(abort->message.find("beta1"), std::string::npos) << abort->message;
  }
}

TEST(Server, NodeCountMismatchAbortsNamingBothCounts) {
  StoreServer server(Options(2));
  auto client = Connect(server);
  EXPECT_THROW(client->Join(Node(1), 3), StoreError);
  auto abort = NextEvent(*client, PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_NE(abort->message.find("expects 3 nodes but the leader expects 2"), std::string::npos) << abort->message;
}

TEST(Server, JoinTimeoutNamesMissingAndJoinedNodes) {
  StoreServer server(Options(5, 500ms));
  auto zero = Connect(server);
  zero->Join(Node(0), 5);
  auto three = Connect(server);
  three->Join(Node(3), 5);
  auto timeout = NextEvent(*three, PeerEvent::Kind::kJoinTimeout);
  ASSERT_TRUE(timeout);
  EXPECT_NE(timeout->message.find("3 of 5 nodes missing"), std::string::npos) << timeout->message;
  EXPECT_NE(timeout->message.find("ranks 1-2, 4"), std::string::npos) << timeout->message;
  EXPECT_NE(timeout->message.find("0 host0 (127.0.0.1), 3 host3 (127.0.0.1)"), std::string::npos) << timeout->message;
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kJoinTimeout);
}

TEST(Server, NodeThatLeavesBeforeCompletionIsMissingAgain) {
  StoreServer server(Options(3, 600ms));
  auto stays = Connect(server);
  stays->Join(Node(0), 3);
  {
    auto leaves = Connect(server);
    leaves->Join(Node(1), 3);
  }
  std::this_thread::sleep_for(100ms);
  auto timeout = NextEvent(*stays, PeerEvent::Kind::kJoinTimeout);
  ASSERT_TRUE(timeout) << "a node that left must not complete the rendezvous";
  EXPECT_NE(timeout->message.find("ranks 1-2;"), std::string::npos) << timeout->message;
}

// A launcher that joins once every node reported success (a pod recreated after the others
// finished) is told the job succeeded, which it exits 0 on; after a failure it is refused.
TEST(Server, AJoinAfterTheJobSucceededIsToldSo) {
  StoreServer server(Options(2));
  auto nodes = JoinAll(server, 2);
  nodes[0]->Report(0, "");
  nodes[1]->Report(0, "");
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kResult));
  auto late = Connect(server);
  EXPECT_THROW(late->Join(Node(1), 2), JobAlreadySucceeded);
  StoreServer failed_server(Options(2));
  auto failed = JoinAll(failed_server, 2);
  failed[1]->Report(3, "exit code 3");
  ASSERT_TRUE(NextEvent(*failed[0], PeerEvent::Kind::kAbort));
  auto refused = Connect(failed_server);
  try {
    refused->Join(Node(1), 2);
    ADD_FAILURE() << "a join after a failed job was accepted";
  } catch (const JobAlreadySucceeded&) {
    ADD_FAILURE() << "a failed job was said to have succeeded";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("already closed"), std::string::npos) << error.what();
  }
}

TEST(Server, FailedReportAbortsEveryoneNamingTheNode) {
  StoreServer server(Options(2));
  auto nodes = JoinAll(server, 2);
  nodes[1]->Report(3, "exit code 3");
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->rank, 1);
  EXPECT_EQ(abort->exit_code, 3) << "the others exit with the failed node's code";
  EXPECT_EQ(server.verdict().exit_code, 3);
  EXPECT_NE(abort->message.find("node 1 (host1, 127.0.0.1) failed: exit code 3"), std::string::npos) << abort->message;
}

// Hangs: the job is hung only when every node is stalled at once; a node that progresses
// again takes its stall back; the stacks are asked for once per cycle.
TEST(Server, StacksAreAskedForOnceEveryNodeIsStalledAtOnce) {
  StoreServer server(Options(3));
  auto nodes = JoinAll(server, 3);
  nodes[1]->ReportStall(0, "60 s");
  nodes[2]->ReportStall(0, "60 s");
  EXPECT_FALSE(NextEvent(*nodes[0], PeerEvent::Kind::kCollectStacks, 300ms)) << "node 0 still progresses";
  nodes[2]->ReportStall(0, "", false);  // node 2 progresses again
  nodes[0]->ReportStall(0, "60 s");
  EXPECT_FALSE(NextEvent(*nodes[0], PeerEvent::Kind::kCollectStacks, 300ms)) << "node 2 took its stall back";
  nodes[2]->ReportStall(0, "61 s");
  for (auto& node : nodes) {
    auto request = NextEvent(*node, PeerEvent::Kind::kCollectStacks);
    ASSERT_TRUE(request);
    EXPECT_EQ(request->cycle, 0);
    EXPECT_EQ(request->rank, 2) << "the last node to stall";
  }
  nodes[1]->ReportStall(0, "", false);
  nodes[1]->ReportStall(0, "62 s");
  EXPECT_FALSE(NextEvent(*nodes[0], PeerEvent::Kind::kCollectStacks, 300ms)) << "asked twice in one cycle";
}

// Node 0 declares the hang (from another node the frame is refused, as any misbehaving
// request); it fails the cycle as the blamed node's failure.
TEST(Server, AHangDeclaredByNodeZeroAbortsNamingTheBlamedNodeWithItsCode) {
  StoreServer server(Options(2));
  auto nodes = JoinAll(server, 2);
  nodes[0]->DeclareHang(0, 1, "no progress on any node for 60 s", 124);
  auto abort = NextEvent(*nodes[1], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->rank, 1);
  EXPECT_EQ(abort->exit_code, 124);
  EXPECT_NE(abort->message.find("node 1 (host1, 127.0.0.1) hung: no progress on any node for 60 s"), std::string::npos)
      << abort->message;
}

// A failure that quotes a table (the fabric's differences at scale) goes to every node in
// the abort: it is cut, so that it does not cost N times its size.
TEST(Server, AHugeFailureCauseIsCutInTheAbortEveryNodeGets) {
  StoreServer server(Options(2));
  auto nodes = JoinAll(server, 2);
  nodes[1]->Report(69, "fabric: the fabric differs between nodes\n" + std::string(1 << 20, 'x'));
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_LT(abort->message.size(), 5000u);
  EXPECT_NE(abort->message.find("fabric: the fabric differs between nodes"), std::string::npos);
  EXPECT_NE(abort->message.find("more bytes in that node's log"), std::string::npos) << abort->message.substr(0, 200);
}

TEST(Server, AllSuccessfulReportsGiveTheResult) {
  StoreServer server(Options(2));
  auto nodes = JoinAll(server, 2);
  for (auto& node : nodes) node->Report(0, "exit code 0");
  for (auto& node : nodes) EXPECT_TRUE(NextEvent(*node, PeerEvent::Kind::kResult));
  for (auto& node : nodes) node->SayGoodbye();
  server.WaitUntilDrained();
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kResult);
}

TEST(Server, LauncherThatDisappearsIsLost) {
  StoreServer server(Options(2));
  auto nodes = JoinAll(server, 2);
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kComplete));
  nodes[1].reset();  // the connection closes without a report, as when a launcher is SIGKILLed
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_NE(abort->message.find("node 1 (host1, 127.0.0.1) lost: connection closed"), std::string::npos) << abort->message;
  EXPECT_EQ(abort->exit_code, 0) << "a lost node reported no code";
}

TEST(Server, SilentNodeIsLostAfterTheHeartbeatTimeout) {
  StoreServer server(Options(2, 30s, 600ms));
  auto zero = Connect(server);
  zero->Join(Node(0), 2);
  // Heartbeats every 100 s: this node goes silent right after joining.
  auto silent = Connect(server, kToken, 100s);
  silent->Join(Node(1), 2);
  auto abort = NextEvent(*zero, PeerEvent::Kind::kAbort, 5s);
  ASSERT_TRUE(abort);
  EXPECT_NE(abort->message.find("node 1 (host1, 127.0.0.1) lost: no heartbeat for"), std::string::npos) << abort->message;
  // The silent node hears why its connection closed, not that node 0 was lost (review 14, F3).
  auto told = NextEvent(*silent, PeerEvent::Kind::kLeaderLost, 5s);
  ASSERT_TRUE(told);
  EXPECT_NE(told->message.find("node 0 took this launcher, node 1 (host1, 127.0.0.1), for lost: no heartbeat for"),
            std::string::npos)
      << told->message;
  EXPECT_EQ(told->message.find("leader (node 0) lost"), std::string::npos) << told->message;
}

// A leader in a process of its own, so that a test can stop and resume it as a starved or
// descheduled leader is; on a port below the ephemeral range. Killed when it goes out of scope.
class LeaderProcess {
 public:
  explicit LeaderProcess(ServerOptions options) {
    int ports[2];
    EXPECT_EQ(pipe(ports), 0);
    pid_ = fork();
    if (pid_ == 0) {
      close(ports[0]);
      ServeUntilKilled(options, ports[1]);
    }
    close(ports[1]);
    pollfd readable = {ports[0], POLLIN, 0};
    if (poll(&readable, 1, 10000) == 1 && read(ports[0], &port_, sizeof port_) != sizeof port_) port_ = 0;
    close(ports[0]);
  }
  ~LeaderProcess() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  uint16_t port() const { return port_; }
  // The CPU time the leader's process has used so far (user + system), from /proc.
  std::chrono::milliseconds CpuTime() const {
    std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    long ticks = 0;
    for (int index = 3; fields >> field && index <= 15; ++index) {
      if (index >= 14) ticks += std::stol(field);  // utime, stime
    }
    return std::chrono::milliseconds(ticks * 1000 / sysconf(_SC_CLK_TCK));
  }
  void Pause() { kill(pid_, SIGSTOP); }
  void Resume() { kill(pid_, SIGCONT); }

 private:
  [[noreturn]] static void ServeUntilKilled(ServerOptions options, int port_pipe) {
    std::mt19937 pick{uint32_t(getpid())};
    for (int attempt = 0; attempt < 50; ++attempt) {
      options.port = uint16_t(20000 + pick() % 12000);
      try {
        StoreServer server(options);
        const uint16_t port = server.port();
        [[maybe_unused]] ssize_t written = write(port_pipe, &port, sizeof port);
        while (true) pause();
      } catch (const StoreError&) {  // that port is taken: another
      }
    }
    _exit(1);
  }

  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// Every node kept sending heartbeats while the leader could not run (a descheduled or starved
// leader): when it resumes, their heartbeats wait unread in the sockets, more of them than
// one turn of its loop handles (512). None of those nodes is silent, and none may be lost.
// Stopped past the heartbeat timeout, the leader ends the job as node 0 lost (soak finding
// F2: real followers, with the same timeout, have taken it as lost by then); it never blames
// a node whose heartbeats wait unread.
TEST(Server, NodesWhoseHeartbeatsWaitUnreadAreNotLostWhenTheLeaderFellBehind) {
  constexpr int kNodes = 700;
  LeaderProcess leader(ServerOptions{0, kToken, kNodes, 30s, 100ms, 2s, 2s});
  ASSERT_NE(leader.port(), 0) << "the leader process did not start";
  const std::string heartbeat = EncodeFrame({{"op", "hb"}});
  std::vector<std::unique_ptr<RawPeer>> nodes;
  for (int rank = 0; rank < kNodes; ++rank) {
    nodes.push_back(std::make_unique<RawPeer>(leader.port()));
    ASSERT_TRUE(nodes.back()->Authenticate()) << rank;
    nodes.back()->Send(EncodeFrame({{"op", "join"}, {"id", 1}, {"count", kNodes}, {"info", Node(rank).ToJson()}}));
    if (rank % 50 == 0) {  // the nodes that joined keep beating while the others join
      for (auto& node : nodes) node->Send(heartbeat);
    }
  }
  auto beat_for = [&](std::chrono::milliseconds duration) {
    for (auto end = std::chrono::steady_clock::now() + duration; std::chrono::steady_clock::now() < end;) {
      for (auto& node : nodes) node->Send(heartbeat);
      std::this_thread::sleep_for(100ms);
    }
  };
  beat_for(500ms);
  leader.Pause();
  beat_for(3500ms);  // past the 2 s heartbeat timeout
  leader.Resume();
  beat_for(1000ms);
  // What the leader sent node 0 since it joined: its answers, heartbeats, "complete", and an
  // abort had it judged any node lost.
  int messages = 0;
  for (auto end = std::chrono::steady_clock::now() + 1s; std::chrono::steady_clock::now() < end;) {
    auto message = nodes[0]->ReadMessage(200ms);
    if (!message) break;
    ++messages;
    if (StringField(*message, "op") != "abort") continue;
    EXPECT_EQ(IntField(*message, "rank"), 0) << "a node whose heartbeats waited unread was lost: " << message->dump();
    EXPECT_NE(StringField(*message, "message").find("its launcher did not run for"), std::string::npos) << message->dump();
  }
  EXPECT_GT(messages, 0) << "node 0 heard nothing from the leader";
}

// Nodes re-issue their blocking reads in slices (1 s for the plan, 0.5 s for the ready
// barrier), so at scale thousands of parked requests on one key expire every second.
// Expiring one must cost the leader O(1), not a pass over every request parked on that
// key: that was quadratic, and at 16,384 nodes it kept the leader's loop from reading the
// nodes' heartbeats for 10 s.
TEST(Server, ExpiringRequestsParkedOnOneKeyCostsLittleEach) {
  constexpr int kConnections = 8, kWaitsEach = 4000;
  LeaderProcess leader(ServerOptions{0, kToken, 1, 30s, 100ms, 30s, 2s});
  ASSERT_NE(leader.port(), 0) << "the leader process did not start";
  std::vector<std::unique_ptr<RawPeer>> peers;
  for (int i = 0; i < kConnections; ++i) {
    peers.push_back(std::make_unique<RawPeer>(leader.port()));
    ASSERT_TRUE(peers.back()->Authenticate());
    std::string frames;
    for (int wait = 0; wait < kWaitsEach; ++wait) {  // expiring over 0.3 to 1.3 s
      const uint64_t timeout_ms = 300 + uint64_t(wait) * 1000 / kWaitsEach;
      frames += EncodeFrame({{"op", "wait"}, {"id", wait}, {"key", "never/set"}, {"timeout_ms", timeout_ms}});
    }
    frames += EncodeFrame({{"op", "add"}, {"id", kWaitsEach}, {"key", "parked"}, {"delta", 1}});
    peers.back()->Send(frames);
  }
  for (auto& peer : peers) {  // each add answered: every wait before it is parked
    auto answer = peer->ReadMessage(10s);
    while (answer && StringField(*answer, "op") == "hb") answer = peer->ReadMessage(10s);
    ASSERT_TRUE(answer && answer->value("id", -1) == kWaitsEach) << (answer ? answer->dump() : "no answer");
  }
  const auto parked = leader.CpuTime();
  std::this_thread::sleep_for(2s);  // every wait expires
  const auto expiring = leader.CpuTime() - parked;
  EXPECT_LT(expiring, 150ms) << kConnections * kWaitsEach << " parked requests cost the leader " << expiring.count()
                             << " ms of CPU to expire";
}

TEST(Server, FollowerNoticesALeaderThatStops) {
  auto server = std::make_unique<StoreServer>(Options(1));
  auto client = Connect(*server);
  server.reset();
  auto lost = NextEvent(*client, PeerEvent::Kind::kLeaderLost);
  ASSERT_TRUE(lost);
  EXPECT_NE(lost->message.find("leader (node 0) lost"), std::string::npos);
}

TEST(Server, PortInUseIsNamed) {
  StoreServer first(Options(1));
  try {
    StoreServer second(ServerOptions{first.port(), kToken, 1, 1s, 100ms, 1s, 1s});
    FAIL();
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot listen on port " + std::to_string(first.port())), std::string::npos);
  }
}

// The expected refusal: the request is answered "refused: ..." and the connection is gone.
void ExpectRefused(const std::function<void()>& request, const std::string& why) {
  try {
    request();
    ADD_FAILURE() << "accepted; expected a refusal naming: " << why;
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find(why), std::string::npos) << error.what();
  }
}

TEST(Server, ConnectionThatNeverJoinedCannotWriteTheLaunchersKeys) {
  StoreServer server(Options(2));
  auto stranger = Connect(server);  // holds the token, never joins
  ExpectRefused([&] { stranger->Set("bt/roster", R"({"nodes":[{"rank":0,"host":"forged"}]})"); },
                "without having joined");
  EXPECT_THROW(stranger->Set("job/key", "x"), StoreError) << "the refused connection must be closed";
  auto another = Connect(server);
  ExpectRefused([&] { another->Add("bt/ready", 1); }, "without having joined");
  auto user = Connect(server);
  user->Set("job/key", "anyone authenticated may use keys outside bt/");
  auto nodes = JoinAll(server, 2);
  ASSERT_TRUE(NextEvent(*nodes[1], PeerEvent::Kind::kComplete));
  const auto roster = RosterFromJson(nlohmann::json::parse(nodes[1]->Get("bt/roster", 1s)));
  ASSERT_EQ(roster.size(), 2u);
  EXPECT_EQ(roster[0].host, "host0") << "a connection that never joined forged the roster";
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kPending);
}

TEST(Server, NodeWritingTheLeadersKeyIsRefusedAndTheJobAbortsNamingIt) {
  StoreServer server(Options(3));
  auto nodes = JoinAll(server, 3);
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kComplete));
  ExpectRefused([&] { nodes[2]->Set("bt/ready/all", "1"); }, "node 2 writes \"bt/ready/all\", which only the leader");
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->rank, 2);
  EXPECT_NE(abort->message.find("refused: node 2 writes \"bt/ready/all\""), std::string::npos) << abort->message;
}

TEST(Server, NodeWritingAnotherNodesKeyIsRefused) {
  StoreServer server(Options(3));
  auto nodes = JoinAll(server, 3);
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kComplete));
  nodes[1]->Set("bt/phase/1", "its own phase");
  nodes[0]->Set("bt/fabric/plan", "the leader's");
  EXPECT_EQ(nodes[1]->Add("bt/ready", 1), 1) << "every node adds to a shared counter";
  ExpectRefused([&] { nodes[1]->Set("bt/phase/2", "ready"); }, "which belongs to node 2");
}

TEST(Server, OversizedKeysAndValuesAreRefused) {
  StoreServer server(Options(1));
  auto long_key = Connect(server);
  ExpectRefused([&] { long_key->Set(std::string(kMaxKeyBytes + 1, 'k'), "v"); }, "a key of 1025 bytes (at most 1024)");
  auto long_value = Connect(server);
  ExpectRefused([&] { long_value->Set("job/key", std::string(kMaxValueBytes + 1, 'v')); }, "at most 16777216");
  auto long_wait = Connect(server);
  ExpectRefused([&] { long_wait->Get(std::string(4u << 20, 'k'), 1s); }, "a key of 4194304 bytes");
  auto fine = Connect(server);
  fine->Set(std::string(kMaxKeyBytes, 'k'), std::string(kMaxValueBytes, 'v'));
  EXPECT_EQ(fine->Get(std::string(kMaxKeyBytes, 'k'), 5s).size(), kMaxValueBytes);
}

TEST(Server, ParkedWaitsOfOneConnectionAreBoundedInBytes) {
  StoreServer server(Options(1));
  RawPeer peer(server.port());
  ASSERT_TRUE(peer.Authenticate());
  // Full-length keys, fewer waits than one connection may park (4,096): only the bytes they
  // hold (over 2 KiB each) exceed a bound.
  const size_t waits = 4090;
  ASSERT_GT(waits * (2 * kMaxKeyBytes + 64), kMaxParkedBytesPerConnection);
  for (size_t id = 1; id <= waits; ++id) {
    std::string key = std::to_string(id) + std::string(kMaxKeyBytes - 8, 'k');
    peer.Send(EncodeFrame({{"op", "wait"}, {"id", id}, {"key", key}}));
  }
  EXPECT_TRUE(peer.ClosedByServer(5s));
  auto client = Connect(server);  // the leader serves on
  client->Set("after", "x");
  EXPECT_EQ(client->Get("after", 1s), "x");
}

TEST(Client, LeaderThatNeverAnswersIsNamed) {
  try {
    StoreClient::Connect(ClientOptions{"127.0.0.1", 1, kToken, 500ms, 100ms, 1s, -1});
    FAIL();
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("leader 127.0.0.1:1 never answered"), std::string::npos) << error.what();
  }
}

TEST(Client, UnresolvableLeaderIsRetriedThenNamed) {
  try {
    StoreClient::Connect(ClientOptions{"no-such-host.invalid", 29300, kToken, 500ms, 100ms, 1s, -1});
    FAIL();
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot resolve no-such-host.invalid"), std::string::npos) << error.what();
  }
}

// The interrupt fd readable without a stop request (a SIGCHLD on the launcher's signalfd,
// read off by `stop_requested`): the retries go on to their deadline. With a stop request
// they end at once.
TEST(Client, OnlyAStopRequestEndsTheConnectRetries) {
  const int interrupt = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(interrupt, 0);
  auto make_readable = [interrupt] {
    uint64_t one = 1;
    ASSERT_EQ(write(interrupt, &one, sizeof one), ssize_t(sizeof one));
  };
  int asked = 0;
  ClientOptions options{"127.0.0.1", 1, kToken, 1s, 100ms, 1s, interrupt};
  options.stop_requested = [&] {
    ++asked;
    uint64_t value = 0;
    [[maybe_unused]] ssize_t ignored = read(interrupt, &value, sizeof value);
    return false;
  };
  make_readable();
  try {
    StoreClient::Connect(options);
    FAIL();
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("never answered"), std::string::npos) << error.what();
  }
  EXPECT_EQ(asked, 1);
  options.stop_requested = [] { return true; };
  make_readable();
  const auto started = std::chrono::steady_clock::now();
  try {
    StoreClient::Connect(options);
    FAIL();
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("interrupted"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 500ms);
  close(interrupt);
}

// Restart in place: a policy that always restarts, with the checkpoint it would resume from.
ServerOptions RestartingOptions(int nodes) {
  ServerOptions options = Options(nodes);
  options.restart_policy = [](const CycleFailure&) { return RestartAnswer{Message{{"resume", "checkpoint-2"}}, ""}; };
  return options;
}

TEST(Server, ARestartableFailureIsPushedAsTheNextCycleToEveryNode) {
  StoreServer server(RestartingOptions(2));
  auto nodes = JoinAll(server, 2);
  nodes[1]->Report(3, "exit code 3", 0, true);
  auto restart = NextEvent(*nodes[0], PeerEvent::Kind::kRestart);
  ASSERT_TRUE(restart);
  EXPECT_EQ(restart->cycle, 1);
  EXPECT_EQ(restart->rank, 1);
  EXPECT_EQ(restart->host, "host1");
  EXPECT_EQ(restart->decision["resume"], "checkpoint-2");
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kPending);
  nodes[0]->ArriveAtCycle(1);
  nodes[1]->ArriveAtCycle(1);
  auto go = NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->cycle, 1);
}

TEST(Server, ALaunchersOwnFailureIsNeverRestarted) {
  StoreServer server(RestartingOptions(2));
  auto nodes = JoinAll(server, 2);
  nodes[1]->Report(74, "bt-launch failed (exit code 74): the load failed", 0, false);
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->exit_code, 74);
}

TEST(Server, AReportOfAnEarlierCycleChangesNothing) {
  StoreServer server(RestartingOptions(2));
  auto nodes = JoinAll(server, 2);
  nodes[1]->Report(3, "exit code 3", 0, true);
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart));
  ASSERT_TRUE(NextEvent(*nodes[1], PeerEvent::Kind::kRestart));
  // Node 0's own failure of cycle 0 arrives late: neither a second restart nor an abort.
  nodes[0]->Report(5, "exit code 5", 0, true);
  nodes[0]->ArriveAtCycle(0);
  EXPECT_FALSE(NextEvent(*nodes[1], PeerEvent::Kind::kRestart, 500ms));
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kPending);
  // Cycle 1 goes on: both succeed and the job has its result.
  nodes[0]->Report(0, "exit code 0", 1, true);
  nodes[1]->Report(0, "exit code 0", 1, true);
  EXPECT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kResult));
}

// The run has started (node 0 says so as its commands begin): a lost launcher is then a
// failed cycle, not a failed start.
std::vector<std::unique_ptr<StoreClient>> JoinAllAndStartTheRun(const StoreServer& server, int nodes) {
  auto clients = JoinAll(server, nodes);
  EXPECT_TRUE(NextEvent(*clients[0], PeerEvent::Kind::kComplete));
  clients[0]->Set(kRunStartedKey, "1");
  return clients;
}

// Node 1's job finished and reported, then its launcher was lost (a node drained for
// maintenance). Nothing failed then; but when node 2 fails later, the restart needs rank 1
// again: it is awaited, and a launcher that joins with it takes it back.
TEST(Server, ANodeLostAfterItsJobFinishedIsAwaitedAtTheNextRestart) {
  StoreServer server(RestartingOptions(3));
  auto nodes = JoinAllAndStartTheRun(server, 3);
  nodes[1]->Report(0, "exit code 0", 0, true);
  nodes[1].reset();  // lost without a goodbye, its job's success already reported
  EXPECT_FALSE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart, 300ms)) << "a loss after a success failed nothing";
  nodes[2]->Report(3, "exit code 3", 0, true);
  auto restart = NextEvent(*nodes[0], PeerEvent::Kind::kRestart);
  ASSERT_TRUE(restart);
  EXPECT_EQ(restart->cycle, 1);
  auto replacement = Connect(server);
  ASSERT_NO_THROW(replacement->Join(Node(1, "new-host"), 3)) << "the replacement of node 1 was refused";
  auto rejoin = NextEvent(*replacement, PeerEvent::Kind::kRejoin);
  ASSERT_TRUE(rejoin);
  EXPECT_EQ(rejoin->cycle, 1);
  for (auto* node : {nodes[0].get(), nodes[2].get(), replacement.get()}) node->ArriveAtCycle(1);
  auto go = NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->cycle, 1);
}

// A replacement of node 2 joined for cycle 1; node 1 failed before it was ready, so the job
// moved to cycle 2; the replacement then left with its report of cycle 1 (dropped as stale)
// and a goodbye. Rank 2 must not stay held by nobody: another launcher takes it, in cycle 2.
TEST(Server, AReplacementThatLeavesWhileTheJobMovesOnLeavesItsRankFillable) {
  StoreServer server(RestartingOptions(3));
  auto nodes = JoinAllAndStartTheRun(server, 3);
  nodes[2].reset();
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart));
  auto first = Connect(server);
  first->Join(Node(2, "first-replacement"), 3);
  ASSERT_TRUE(NextEvent(*first, PeerEvent::Kind::kRejoin));
  nodes[1]->Report(3, "exit code 3", 1, true);
  auto second_restart = NextEvent(*nodes[0], PeerEvent::Kind::kRestart);
  ASSERT_TRUE(second_restart);
  EXPECT_EQ(second_restart->cycle, 2);
  first->Report(69, "bt-launch failed (exit code 69): stopping", 1, false);
  first->SayGoodbye();
  first.reset();
  std::unique_ptr<StoreClient> second;
  std::string refusal;
  for (int attempt = 0; attempt < 50 && !second; ++attempt) {  // until the leader has seen the close
    auto candidate = Connect(server);
    try {
      candidate->Join(Node(2, "second-replacement"), 3);
      second = std::move(candidate);
    } catch (const StoreError& error) {
      refusal = error.what();
      std::this_thread::sleep_for(50ms);
    }
  }
  ASSERT_TRUE(second) << "rank 2 could never be filled again: " << refusal;
  auto rejoin = NextEvent(*second, PeerEvent::Kind::kRejoin);
  ASSERT_TRUE(rejoin);
  EXPECT_EQ(rejoin->cycle, 2) << "the goodbye cost a restart";
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kPending);
  for (auto* node : {nodes[0].get(), nodes[1].get(), second.get()}) node->ArriveAtCycle(rejoin->cycle);
  auto go = NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->cycle, rejoin->cycle);
}

// Node 2 lost: cycle 1 waits for its replacement. Node 1 arrives, then is lost too before
// the cycle starts: no work ran in cycle 1, so no second restart is spent; rank 1 is awaited
// again in cycle 1, and both replacements meet the others there (review finding F5).
TEST(Server, ALauncherLostWhileARestartWaitsIsAwaitedAgainWithoutANewCycle) {
  StoreServer server(RestartingOptions(3));
  auto nodes = JoinAllAndStartTheRun(server, 3);
  nodes[2].reset();
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart));
  nodes[0]->ArriveAtCycle(1);
  nodes[1]->ArriveAtCycle(1);
  nodes[1].reset();
  EXPECT_FALSE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart, 500ms)) << "a loss at the barrier spent a restart";
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kPending);
  std::vector<std::unique_ptr<StoreClient>> replacements;
  for (int rank : {1, 2}) {
    replacements.push_back(Connect(server));
    ASSERT_NO_THROW(replacements.back()->Join(Node(rank, "new-host" + std::to_string(rank)), 3));
    auto rejoin = NextEvent(*replacements.back(), PeerEvent::Kind::kRejoin);
    ASSERT_TRUE(rejoin);
    EXPECT_EQ(rejoin->cycle, 1);
  }
  replacements[0]->ArriveAtCycle(1);
  EXPECT_FALSE(NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo, 300ms)) << "the barrier opened without rank 2";
  replacements[1]->ArriveAtCycle(1);
  auto go = NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->cycle, 1);
}

// Node 2 lost: the barrier of cycle 1 waits (rejoin_timeout 3 s). Node 1 is lost 2 s in:
// its replacement gets a whole rejoin_timeout from that loss, as a new restart would give it
// (review 3, D2: it got what was left of node 2's, and the job ended with restarts left).
TEST(Server, ALauncherLostLateInTheBarrierGetsAWholeRejoinTimeout) {
  ServerOptions options = RestartingOptions(3);
  options.rejoin_timeout = 3s;  // seconds of margin for a busy machine's round trips
  StoreServer server(options);
  auto nodes = JoinAllAndStartTheRun(server, 3);
  nodes[2].reset();
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart));
  nodes[0]->ArriveAtCycle(1);
  nodes[1]->ArriveAtCycle(1);
  std::this_thread::sleep_for(2s);
  nodes[1].reset();
  std::vector<std::unique_ptr<StoreClient>> replacements;
  auto replace = [&](int rank) {
    replacements.push_back(Connect(server));
    ASSERT_NO_THROW(replacements.back()->Join(Node(rank, "new-host" + std::to_string(rank)), 3));
    replacements.back()->ArriveAtCycle(1);
  };
  replace(2);  // within its 3 s from the opening
  std::this_thread::sleep_for(2s);  // past 3 s from the opening, within node 1's from its loss
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kPending) << server.verdict().message;
  replace(1);
  auto go = NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->cycle, 1);
}

// Review 5: a node that arrived at a restart's barrier and then left with a goodbye (its GPU
// failed while it waited) stayed counted as ready: the cycle started without it, and every
// launcher that came to replace it was refused. It is awaited again, its arrival undone.
TEST(Server, ANodeThatSaysGoodbyeAfterItArrivedAtTheBarrierIsAwaitedAgain) {
  ServerOptions options = RestartingOptions(3);
  StoreServer server(options);
  auto nodes = JoinAllAndStartTheRun(server, 3);
  nodes[2].reset();
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart));
  nodes[0]->ArriveAtCycle(1);
  nodes[1]->ArriveAtCycle(1);
  nodes[1]->SayGoodbye();
  nodes[1].reset();
  auto replacement2 = Connect(server);
  ASSERT_NO_THROW(replacement2->Join(Node(2, "new-host2"), 3));
  replacement2->ArriveAtCycle(1);
  EXPECT_FALSE(NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo, 1s)) << "the cycle started without node 1";
  auto replacement1 = Connect(server);
  ASSERT_NO_THROW(replacement1->Join(Node(1, "new-host1"), 3)) << "node 1's replacement was refused";
  replacement1->ArriveAtCycle(1);
  auto go = NextEvent(*nodes[0], PeerEvent::Kind::kCycleGo);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->cycle, 1);
}

// Review 4, F4: the deadline was shared, so each loss of a flapping replacement at the
// barrier moved it for every rank, and a rank gone for good was waited for as long as
// another kept failing. Each rank has its own deadline now.
TEST(Server, ARankGoneForGoodIsNotWaitedForLongerBecauseAnotherRankFlaps) {
  ServerOptions options = RestartingOptions(3);
  options.rejoin_timeout = 3s;  // seconds of margin for a busy machine's round trips
  StoreServer server(options);
  auto nodes = JoinAllAndStartTheRun(server, 3);
  nodes[1].reset();
  nodes[2].reset();
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart));
  nodes[0]->ArriveAtCycle(1);
  const auto opened = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(2s);
  {
    auto flapping = Connect(server);
    ASSERT_NO_THROW(flapping->Join(Node(2, "new-host2"), 3));
    flapping->ArriveAtCycle(1);
  }  // lost again at the barrier: node 2 gets 3 s from here, node 1 none more
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort) << server.verdict().message;
  const auto waited = abort->received - opened;
  EXPECT_LT(waited, 4400ms) << "node 1 was waited for until node 2's deadline";
  EXPECT_EQ(abort->rank, 1) << abort->message;
  EXPECT_NE(abort->message.find("node 1 (host1, lost"), std::string::npos) << abort->message;
}

// A rank lost at the barrier again and again holds it at most twice rejoin_timeout_s.
TEST(Server, ARankLostAgainAndAgainAtTheBarrierHoldsItAtMostTwiceTheRejoinTimeout) {
  ServerOptions options = RestartingOptions(2);
  options.rejoin_timeout = 2s;  // margin for a busy machine's round trips
  StoreServer server(options);
  auto nodes = JoinAllAndStartTheRun(server, 2);
  nodes[1].reset();
  ASSERT_TRUE(NextEvent(*nodes[0], PeerEvent::Kind::kRestart));
  nodes[0]->ArriveAtCycle(1);
  const auto opened = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - opened < 5200ms) {
    std::this_thread::sleep_for(1200ms);
    if (server.verdict().kind != ServerVerdict::Kind::kPending) break;
    try {
      auto flapping = Connect(server);
      flapping->Join(Node(1, "new-host1"), 2);
    } catch (const std::exception&) {
      break;  // the job ended meanwhile: the rank is refused
    }
  }
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort) << server.verdict().message;
  const auto held = abort->received - opened;  // when node 0 heard it, not when this loop looked
  EXPECT_LT(held, 5000ms) << "the barrier was held past twice rejoin_timeout_s";
  EXPECT_GE(held, 3800ms) << "a loss at the barrier did not extend the rank's wait";
}

// Review 15, F1 and F3. Node 0 cannot train: rank 0 moves to the spare in slot 2 while node
// 0's agent still writes a commit it had begun. Slot 2 is lost at the barrier, and rank 0
// moves on to slot 3. No later leader may begin a commit until node 0 says its agent stopped
// (the server had marked the hand-over done at slot 2's loss, and `latest` moved back to node
// 0's older commit); node 0's word then releases the cycle, and an older word never lowers
// it. The cycle's go names where rank 0 runs now (it carried nothing, and every rank's
// MASTER_ADDR was the lost slot 2's).
TEST(Server, NoLeaderCommitsBeforeNodeZerosOwnHandOverEndsAndTheGoNamesWhereRankZeroRuns) {
  ServerOptions options = RestartingOptions(4);
  options.spares = 2;
  StoreServer server(options);
  auto nodes = JoinAllAndStartTheRun(server, 4);
  nodes[2]->SpareReady(0);
  nodes[3]->SpareReady(0);
  nodes[0]->Report(75, "GPU 0 fell off the bus", 0, true, true);
  auto restart = NextEvent(*nodes[1], PeerEvent::Kind::kRestart);
  ASSERT_TRUE(restart);
  ASSERT_EQ(restart->decision["slots"], (nlohmann::json{2, 1})) << restart->decision.dump();
  nodes[2].reset();  // rank 0's new launcher is lost at the barrier: slot 3 takes rank 0
  for (auto deadline = std::chrono::steady_clock::now() + 5s;
       server.nodes_running_ranks() != std::vector<int>{1, 3} && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(server.nodes_running_ranks(), (std::vector<int>{1, 3}));
  EXPECT_EQ(server.Peek({kHandedOverKey}).front(), std::nullopt) << "a leader may commit while node 0 still writes";
  nodes[0]->Set(kHandedOverKey, "1");
  EXPECT_EQ(server.Peek({kHandedOverKey}).front(), "1");
  nodes[0]->Set(kHandedOverKey, "0");
  EXPECT_EQ(server.Peek({kHandedOverKey}).front(), "1") << "an older word lowered the hand-over";

  nodes[1]->ArriveAtCycle(1);
  nodes[3]->ArriveAtCycle(1);
  auto go = NextEvent(*nodes[1], PeerEvent::Kind::kCycleGo);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->decision["slots"], (nlohmann::json{3, 1})) << go->decision.dump();
  EXPECT_EQ(go->decision.value("master_addr", ""), "127.0.0.1") << go->decision.dump();
}

// The policy reads `latest` at the destination, which can fail: the failure was taken for a
// bad frame of the reporting node, whose connection was dropped, and since that node had
// reported, no verdict came at all: the other nodes waited for their exit barrier.
TEST(Server, ARestartPolicyThatFailsEndsTheJobWithTheFailedNodesCode) {
  ServerOptions options = Options(2);
  options.restart_policy = [](const CycleFailure&) -> RestartAnswer {
    throw std::runtime_error("cannot read s3://bucket/job/latest");
  };
  StoreServer server(options);
  auto nodes = JoinAll(server, 2);
  nodes[1]->Report(3, "exit code 3", 0, true);
  auto abort = NextEvent(*nodes[0], PeerEvent::Kind::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->rank, 1);
  EXPECT_EQ(abort->exit_code, 3) << abort->message;
  EXPECT_NE(abort->message.find("the restart policy failed: cannot read s3://bucket/job/latest"), std::string::npos)
      << abort->message;
  EXPECT_TRUE(NextEvent(*nodes[1], PeerEvent::Kind::kAbort)) << "the reporting node was cut off";
}

// An exception escaping the server's loop called std::terminate on its thread: node 0's
// launcher, PID 1 of its container, ended with its training and said nothing.
TEST(Server, AnExceptionEscapingTheLoopEndsTheJobNotTheProcess) {
  ServerOptions options = Options(2);
  options.restart_policy = [](const CycleFailure&) -> RestartAnswer { throw 42; };  // not a std::exception
  StoreServer server(options);
  auto nodes = JoinAll(server, 2);
  nodes[1]->Report(3, "exit code 3", 0, true);
  for (auto& node : nodes) {
    auto abort = NextEvent(*node, PeerEvent::Kind::kAbort);
    ASSERT_TRUE(abort);
    EXPECT_NE(abort->message.find("the rendezvous server on node 0 stopped on an internal error"), std::string::npos)
        << abort->message;
    EXPECT_TRUE(NextEvent(*node, PeerEvent::Kind::kLeaderLost)) << "the connection stays open to nothing";
  }
  EXPECT_EQ(server.verdict().kind, ServerVerdict::Kind::kAbort);
  server.WaitUntilDrained();
  EXPECT_THROW(StoreClient::Connect(ClientOptions{"127.0.0.1", server.port(), kToken, 1s, 100ms, 5s, -1}), StoreError)
      << "the port still accepts";
}

}  // namespace
}  // namespace bt::rendezvous
