// How long N nodes take to join node 0's store and hear that everyone is in. The leader
// is a real `bt-launch rendezvous --serve` process (node 0); one thread here plays nodes
// 1..N-1 over TCP on loopback: connect, authenticate, join; wait for "complete"; report
// success and wait for the job's result. Same shape as tests/bench/tcpstore_scale.py
// for torch's TCPStore.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>

#include "rendezvous/client.h"
#include "rendezvous/node_info.h"
#include "rendezvous/wire.h"

using namespace bt::rendezvous;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kToken = "bench-token";

struct Node {
  int fd = -1;
  FrameDecoder decoder{kMaxFrameBytes};
};

Message Read(Node& node) {
  Message message;
  char buffer[4096];
  while (!node.decoder.Next(message)) {
    ssize_t got = read(node.fd, buffer, sizeof buffer);
    if (got <= 0) throw std::runtime_error("server closed the connection");
    node.decoder.Feed(buffer, size_t(got));
  }
  return message;
}

void Write(int fd, const std::string& bytes) {
  if (send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != ssize_t(bytes.size())) throw std::runtime_error("send failed");
}

int ConnectLoopback(uint16_t port) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    close(fd);
    usleep(1000);  // backlog full: retry, as real nodes do
  }
  throw std::runtime_error("cannot connect");
}

void Join(Node& node, uint16_t port, int rank, int count) {
  node.fd = ConnectLoopback(port);
  AuthenticateToLeader(node.fd, kToken);
  NodeInfo info;
  info.rank = rank;
  info.host = "bench-host-" + std::to_string(rank);
  info.pid = rank;
  Write(node.fd, EncodeFrame({{"op", "join"}, {"id", 1}, {"count", count}, {"info", info.ToJson()}}));
  if (StringField(Read(node), "op") != "ok") throw std::runtime_error("join refused");
}

void WaitFor(Node& node, const std::string& op) {
  while (true) {
    Message message = Read(node);
    if (StringField(message, "op") == op) return;
  }
}

extern "C" char** environ;

// node 0: the real launcher, serving.
pid_t StartLeader(const char* binary, int count, uint16_t port) {
  const std::string config = R"({"compute": {"node_count": )" + std::to_string(count) +
                             R"(}, "launcher": {"rendezvous": {"join_timeout_s": 600, "heartbeat_interval_s": 30,
                                 "heartbeat_timeout_s": 600}}})";
  std::vector<std::string> env = {"BT_JOB_CONFIG=" + config, "BT_RENDEZVOUS_TOKEN=" + std::string(kToken),
                                  "BT_RENDEZVOUS_PORT=" + std::to_string(port), "BT_LEADER_ADDR=127.0.0.1",
                                  "PATH=/usr/bin:/bin"};
  std::vector<char*> envp;
  for (auto& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string root = "/tmp/bt-bench-root";
  const char* argv[] = {binary, "rendezvous", "--serve", "--root", root.c_str(), "--log-level", "warn", nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  if (posix_spawn(&pid, binary, &actions, nullptr, const_cast<char**>(argv), envp.data()) != 0) {
    throw std::runtime_error("cannot start the leader");
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BT_LAUNCH [NODES...]\n", argv[0]);
    return 64;
  }
  std::vector<int> counts;
  for (int i = 2; i < argc; ++i) counts.push_back(std::atoi(argv[i]));
  if (counts.empty()) counts = {1024, 4096, 16384};
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  std::printf("%-8s %12s %14s %12s %14s %8s\n", "nodes", "all_joined_s", "all_complete_s", "result_s",
              "per_node_us", "leader");
  uint16_t port = 29390;
  for (int count : counts) {
    if (rlim_t(count) + 64 > files.rlim_cur) {
      std::printf("%-8d skipped: needs %d file descriptors per process, the limit is %ld\n", count, count + 64,
                  long(files.rlim_cur));
      continue;
    }
    ++port;
    auto start = Clock::now();
    pid_t leader = StartLeader(argv[1], count, port);
    std::vector<Node> nodes(static_cast<size_t>(count));
    for (int rank = 1; rank < count; ++rank) Join(nodes[size_t(rank)], port, rank, count);
    auto joined = Clock::now();
    for (int rank = 1; rank < count; ++rank) WaitFor(nodes[size_t(rank)], "complete");
    auto complete = Clock::now();
    for (int rank = 1; rank < count; ++rank) {
      Write(nodes[size_t(rank)].fd, EncodeFrame({{"op", "report"}, {"id", 2}, {"code", 0}, {"cause", "exit code 0"}}));
    }
    for (int rank = 1; rank < count; ++rank) {
      WaitFor(nodes[size_t(rank)], "result");
      Write(nodes[size_t(rank)].fd, EncodeFrame({{"op", "bye"}}));
    }
    auto result = Clock::now();
    int status = 0;
    waitpid(leader, &status, 0);
    for (Node& node : nodes) {
      if (node.fd >= 0) close(node.fd);
    }
    auto seconds = [&](Clock::time_point t) { return std::chrono::duration<double>(t - start).count(); };
    std::printf("%-8d %12.3f %14.3f %12.3f %14.1f %8s\n", count, seconds(joined), seconds(complete), seconds(result),
                seconds(complete) * 1e6 / count, WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "exit 0" : "FAILED");
    std::fflush(stdout);
  }
  return 0;
}
