// Protocol between the launcher and its worker, one line each way at a time:
//   worker: "gpus N" | "skip REASON"        (after loading CUDA and NCCL)
//   node 0's worker: "id HEX"               (ncclGetUniqueId; its root thread lives there)
//   launcher: "go ID_HEX TOTAL_RANKS FIRST_RANK"
//   worker: "result {json}" | "error TEXT"
#include "launcher/phases/nccl_preflight.h"

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "rendezvous/fabric/nccl_library.h"
#include "storage/subprocess.h"

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// ---- the worker: NCCL and CUDA through dlopen, declared here as their headers do ----

struct NcclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
using NcclComm = void*;
using CudaStream = void*;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclSum = 0;

struct Cuda {
  int (*get_device_count)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  int (*malloc)(void**, size_t) = nullptr;
  int (*memset)(void*, int, size_t) = nullptr;
  int (*stream_create)(CudaStream*) = nullptr;
  int (*stream_synchronize)(CudaStream) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

struct Nccl {
  int (*get_unique_id)(NcclUniqueId*) = nullptr;
  int (*comm_init_rank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  int (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, CudaStream) = nullptr;
  int (*comm_destroy)(NcclComm) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

class WorkerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void* OpenFirst(const std::vector<std::string>& names, std::string& tried) {
  for (const std::string& name : names) {
    if (void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return library;
    tried += std::string(tried.empty() ? "" : "; ") + dlerror();
  }
  return nullptr;
}

template <typename Function>
void Bind(void* library, const char* name, Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, name));
  if (function == nullptr) throw WorkerError(std::string("missing symbol ") + name);
}

// "" when loaded, else why not (the preflight is then SKIPPED).
std::string LoadLibraries(Cuda& cuda, Nccl& nccl) {
  std::string tried;
  void* cudart = OpenFirst({"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}, tried);
  if (cudart == nullptr) return "the CUDA runtime cannot be loaded (" + tried + ")";
  Bind(cudart, "cudaGetDeviceCount", cuda.get_device_count);
  Bind(cudart, "cudaSetDevice", cuda.set_device);
  Bind(cudart, "cudaMalloc", cuda.malloc);
  Bind(cudart, "cudaMemset", cuda.memset);
  Bind(cudart, "cudaStreamCreate", cuda.stream_create);
  Bind(cudart, "cudaStreamSynchronize", cuda.stream_synchronize);
  Bind(cudart, "cudaGetErrorString", cuda.error_string);
  tried.clear();
  const std::string found = rendezvous::fabric::FindNcclLibrary();
  void* library = OpenFirst(found.empty() ? std::vector<std::string>{"libnccl.so.2"} : std::vector<std::string>{found, "libnccl.so.2"}, tried);
  if (library == nullptr) return "NCCL cannot be loaded (" + tried + ")";
  Bind(library, "ncclGetUniqueId", nccl.get_unique_id);
  Bind(library, "ncclCommInitRank", nccl.comm_init_rank);
  Bind(library, "ncclGroupStart", nccl.group_start);
  Bind(library, "ncclGroupEnd", nccl.group_end);
  Bind(library, "ncclAllReduce", nccl.all_reduce);
  Bind(library, "ncclCommDestroy", nccl.comm_destroy);
  Bind(library, "ncclGetErrorString", nccl.error_string);
  return "";
}

void CheckCuda(const Cuda& cuda, int code, const char* call) {
  if (code != 0) throw WorkerError(std::string(call) + ": " + cuda.error_string(code) + " (cudaError " + std::to_string(code) + ")");
}

void CheckNccl(const Nccl& nccl, int code, const char* call) {
  if (code != 0) throw WorkerError(std::string(call) + ": " + nccl.error_string(code) + " (ncclResult " + std::to_string(code) + ")");
}

std::string Hex(const void* data, size_t size) {
  std::string text;
  char byte[3];
  for (size_t i = 0; i < size; ++i) {
    std::snprintf(byte, sizeof byte, "%02x", static_cast<const unsigned char*>(data)[i]);
    text += byte;
  }
  return text;
}

NcclUniqueId IdFromHex(const std::string& hex) {
  NcclUniqueId id{};
  if (hex.size() != 2 * sizeof id.internal) throw WorkerError("malformed NCCL unique id from the launcher");
  for (size_t i = 0; i < sizeof id.internal; ++i) id.internal[i] = char(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return id;
}

void Say(const std::string& line) {
  std::cout << line << std::endl;  // flushed: the launcher waits for each line
}

// One process drives every local GPU, as nccl-tests does with -g: communicators created
// in one group, then all-reduces issued in one group per iteration.
nlohmann::json MeasureAllReduce(const Cuda& cuda, const Nccl& nccl, int gpus, const NcclUniqueId& id, int total_ranks,
                                int first_rank, size_t bytes) {
  std::vector<NcclComm> comms(size_t(gpus), nullptr);
  std::vector<CudaStream> streams(size_t(gpus), nullptr);
  std::vector<void*> buffers(size_t(gpus), nullptr);
  for (int gpu = 0; gpu < gpus; ++gpu) {
    CheckCuda(cuda, cuda.set_device(gpu), "cudaSetDevice");
    CheckCuda(cuda, cuda.malloc(&buffers[size_t(gpu)], bytes), "cudaMalloc");
    CheckCuda(cuda, cuda.memset(buffers[size_t(gpu)], 0, bytes), "cudaMemset");
    CheckCuda(cuda, cuda.stream_create(&streams[size_t(gpu)]), "cudaStreamCreate");
  }
  CheckNccl(nccl, nccl.group_start(), "ncclGroupStart");
  for (int gpu = 0; gpu < gpus; ++gpu) {
    CheckCuda(cuda, cuda.set_device(gpu), "cudaSetDevice");
    CheckNccl(nccl, nccl.comm_init_rank(&comms[size_t(gpu)], total_ranks, id, first_rank + gpu), "ncclCommInitRank");
  }
  CheckNccl(nccl, nccl.group_end(), "ncclGroupEnd (communicator init)");
  auto all_reduce = [&] {
    CheckNccl(nccl, nccl.group_start(), "ncclGroupStart");
    for (int gpu = 0; gpu < gpus; ++gpu) {
      CheckNccl(nccl, nccl.all_reduce(buffers[size_t(gpu)], buffers[size_t(gpu)], bytes / 4, kNcclFloat32, kNcclSum,
                                      comms[size_t(gpu)], streams[size_t(gpu)]),
                "ncclAllReduce");
    }
    CheckNccl(nccl, nccl.group_end(), "ncclGroupEnd (all-reduce)");
    for (int gpu = 0; gpu < gpus; ++gpu) CheckCuda(cuda, cuda.stream_synchronize(streams[size_t(gpu)]), "cudaStreamSynchronize");
  };
  constexpr int kWarmup = 3, kTimed = 10;
  for (int i = 0; i < kWarmup; ++i) all_reduce();
  const auto start = Clock::now();
  for (int i = 0; i < kTimed; ++i) all_reduce();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / kTimed;
  for (NcclComm comm : comms) nccl.comm_destroy(comm);
  return {{"gpus", gpus}, {"ranks", total_ranks}, {"bytes", bytes}, {"time_s", seconds},
          {"algbw_gbps", double(bytes) / seconds / 1e9},
          {"busbw_gbps", AllReduceBusBandwidth(double(bytes), seconds, total_ranks)}};
}

// ---- the launcher's side ----

// This node's worker failed (no answer, exited, an error line): this node's result, which
// node 0 names in the verdict. A stop (signal, failed peer) is a plain LaunchFailure.
class WorkerFailed : public LaunchFailure {
 public:
  explicit WorkerFailed(const std::string& message) : LaunchFailure(kExitUnavailable, message) {}
};

// The worker as a child with pipes both ways; SIGKILLed if the launcher dies.
class Worker {
 public:
  Worker(const std::vector<std::string>& argv, const std::vector<std::string>& environ) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) throw LaunchFailure(kExitInternal, "pipe2 failed");
    auto args = storage::CStringArray(argv);
    auto envp = storage::CStringArray(environ);
    pid_ = fork();
    if (pid_ == 0) {
      sigset_t all;
      sigfillset(&all);
      sigprocmask(SIG_UNBLOCK, &all, nullptr);  // the launcher blocks every signal in its threads
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    write_fd_ = to_child[1];
    read_fd_ = from_child[0];
  }
  ~Worker() {
    close(write_fd_);
    close(read_fd_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void Send(const std::string& line) {
    const std::string text = line + "\n";
    if (write(write_fd_, text.data(), text.size()) != ssize_t(text.size())) {
      throw LaunchFailure(kExitUnavailable, "NCCL preflight: the worker went away");
    }
  }

  // NCCL's init can take minutes on a bad fabric: `check_stop` runs between polls, so a
  // shutdown signal or a failed peer does not wait for the deadline.
  std::string ReadLine(Clock::time_point deadline, const std::function<void()>& check_stop) {
    for (;;) {
      if (size_t newline = buffer_.find('\n'); newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) throw WorkerFailed("NCCL preflight: no answer from the worker before launcher.fabric.preflight_timeout_s");
      pollfd entry{read_fd_, POLLIN, 0};
      if (poll(&entry, 1, int(std::min<int64_t>(left, 1000))) <= 0) {
        check_stop();
        continue;
      }
      char chunk[4096];
      const ssize_t got = read(read_fd_, chunk, sizeof chunk);
      if (got <= 0) throw WorkerFailed("NCCL preflight: the worker exited without an answer");
      buffer_.append(chunk, size_t(got));
    }
  }

 private:
  pid_t pid_ = -1;
  int write_fd_ = -1;
  int read_fd_ = -1;
  std::string buffer_;
};

std::string Key(const std::string& what, int rank) { return "bt/nccl/" + what + "/" + std::to_string(rank); }

struct NodeAnswer {
  int gpus = 0;
  std::string skip;
};

NodeAnswer ParseFirstLine(const std::string& line) {
  if (line.rfind("gpus ", 0) == 0) return {std::stoi(line.substr(5)), ""};
  if (line.rfind("skip ", 0) == 0) return {0, line.substr(5)};
  throw LaunchFailure(kExitUnavailable, "NCCL preflight: " + (line.rfind("error ", 0) == 0 ? line.substr(6) : line));
}

nlohmann::json ParseResult(const std::string& line) {
  if (line.rfind("result ", 0) == 0) return nlohmann::json::parse(line.substr(7));
  throw WorkerFailed("NCCL preflight failed: " + (line.rfind("error ", 0) == 0 ? line.substr(6) : line));
}

// Node 0: the slowest node (results in rank order), and whether it is below the floor.
// One rank moves no data: its bus bandwidth is 0 by definition, so no floor applies.
nlohmann::json Judge(const std::vector<nlohmann::json>& results, double floor) {
  int slowest = 0;
  double lowest = 0;
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const auto& result = results[rank];
    if (result.contains("error")) {
      return {{"ok", false}, {"message", "node " + std::to_string(rank) + ": " + result["error"].get<std::string>()}};
    }
    const double busbw = result["busbw_gbps"].get<double>();
    if (rank == 0 || busbw < lowest) {
      lowest = busbw;
      slowest = int(rank);
    }
  }
  char text[256];
  if (results.front()["ranks"].get<int>() == 1) {
    return {{"ok", true}, {"skipped", true},
            {"message", "one GPU in the whole job: an all-reduce over one rank moves no data (NCCL returns at once), so "
                        "there is no bus bandwidth to compare with min_busbw_gbps"}};
  }
  std::snprintf(text, sizeof text, "slowest node %d at %.1f GB/s bus bandwidth (floor %.1f GB/s)", slowest, lowest, floor);
  return {{"ok", floor <= 0 || lowest >= floor}, {"message", text}};
}

}  // namespace

double AllReduceBusBandwidth(double bytes, double seconds, int ranks) {
  if (ranks < 1 || seconds <= 0) return 0;
  return bytes / seconds / 1e9 * 2.0 * (ranks - 1) / ranks;
}

int NcclPreflightWorker(const CliOptions& cli) {
  Cuda cuda;
  Nccl nccl;
  try {
    if (const std::string skip = LoadLibraries(cuda, nccl); !skip.empty()) {
      Say("skip " + skip);
      return 0;
    }
    int gpus = 0;
    if (const int code = cuda.get_device_count(&gpus); code != 0 || gpus == 0) {
      Say("skip no GPU visible (cudaGetDeviceCount: " + std::string(code != 0 ? cuda.error_string(code) : "0 devices") + ")");
      return 0;
    }
    Say("gpus " + std::to_string(gpus));
    if (cli.identity.node_rank && *cli.identity.node_rank == "0") {
      NcclUniqueId id{};
      CheckNccl(nccl, nccl.get_unique_id(&id), "ncclGetUniqueId");
      Say("id " + Hex(&id, sizeof id));
    }
    std::string word, id_hex;
    int total_ranks = 0, first_rank = 0;
    if (!(std::cin >> word >> id_hex >> total_ranks >> first_rank) || word != "go") throw WorkerError("no go from the launcher");
    Say("result " + MeasureAllReduce(cuda, nccl, gpus, IdFromHex(id_hex), total_ranks, first_rank, cli.preflight_bytes).dump());
    return 0;
  } catch (const std::exception& error) {
    Say(std::string("error ") + error.what());
    return 1;
  }
}

void RunNcclPreflight(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                      const env::JobEnvironment& environment, const std::function<void()>& check_stop) {
  const auto& settings = config.launcher.fabric;
  if (!settings.nccl_preflight) return;
  rendezvous::Store* store = peers ? peers->store() : nullptr;
  if (peers && store == nullptr) {
    spdlog::warn("NCCL preflight SKIPPED: it needs the tcp rendezvous backend's store");
    return;
  }
  const auto timeout = std::chrono::milliseconds(int64_t(settings.preflight_timeout_s * 1000));
  const auto deadline = Clock::now() + timeout;
  Worker worker({storage::CurrentExecutable(), "nccl-preflight-worker", "--node-rank", std::to_string(identity.rank), "--bytes",
                 std::to_string(settings.preflight_bytes)},
                environment.ToEnviron());
  const NodeAnswer mine = ParseFirstLine(worker.ReadLine(deadline, check_stop));
  // Every node's GPU count (or reason to skip): ranks are numbered node by node.
  int first_rank = 0, total_ranks = mine.gpus;
  std::string skip = mine.skip;
  if (store != nullptr) {
    store->Set(Key("gpus", identity.rank), mine.skip.empty() ? std::to_string(mine.gpus) : "skip " + mine.skip);
    total_ranks = 0;
    for (int rank = 0; rank < identity.count; ++rank) {
      const std::string answer = store->Get(Key("gpus", rank), timeout);
      if (answer.rfind("skip ", 0) == 0) {
        if (skip.empty()) skip = "node " + std::to_string(rank) + ": " + answer.substr(5);
        continue;
      }
      if (rank < identity.rank) first_rank += std::stoi(answer);
      total_ranks += std::stoi(answer);
    }
  }
  if (!skip.empty()) {
    spdlog::warn("NCCL preflight SKIPPED: {}", skip);
    return;
  }
  std::string id_hex;
  if (identity.rank == 0) {
    const std::string line = worker.ReadLine(deadline, check_stop);
    if (line.rfind("id ", 0) != 0) {
      if (store != nullptr) store->Set("bt/nccl/id", "error " + line);  // the others stop waiting
      ParseResult(line);  // throws with the worker's error
    }
    id_hex = line.substr(3);
    if (store != nullptr) store->Set("bt/nccl/id", id_hex);
  } else {
    id_hex = store->Get("bt/nccl/id", timeout);
    if (id_hex.rfind("error ", 0) == 0) throw LaunchFailure(kExitUnavailable, "NCCL preflight failed on node 0: " + id_hex.substr(6));
  }
  worker.Send("go " + id_hex + " " + std::to_string(total_ranks) + " " + std::to_string(first_rank));
  nlohmann::json result;
  try {
    result = ParseResult(worker.ReadLine(deadline, check_stop));
  } catch (const WorkerFailed& failure) {
    if (store == nullptr) throw;
    std::string text = failure.what();
    const std::string prefix = "NCCL preflight failed: ";
    if (text.rfind(prefix, 0) == 0) text = text.substr(prefix.size());
    result = {{"error", text}};  // node 0 names this node in the verdict
  }
  spdlog::info("NCCL preflight: {}", result.dump());
  nlohmann::json verdict;
  if (store == nullptr) {
    verdict = Judge({result}, settings.min_busbw_gbps);
  } else {
    store->Set(Key("result", identity.rank), result.dump());
    if (identity.rank == 0) {
      std::vector<nlohmann::json> results;
      for (int rank = 0; rank < identity.count; ++rank) results.push_back(nlohmann::json::parse(store->Get(Key("result", rank), timeout)));
      store->Set("bt/nccl/verdict", Judge(results, settings.min_busbw_gbps).dump());
    }
    verdict = nlohmann::json::parse(store->Get("bt/nccl/verdict", timeout));
  }
  if (!verdict["ok"].get<bool>()) {
    throw LaunchFailure(kExitUnavailable, "NCCL preflight failed: " + verdict["message"].get<std::string>());
  }
  // NCCL did initialise and run, but nothing was measured: that is not a pass.
  if (verdict.value("skipped", false)) {
    spdlog::warn("NCCL preflight: the all-reduce ran; bandwidth check SKIPPED: {}", verdict["message"].get<std::string>());
    return;
  }
  spdlog::info("NCCL preflight passed: {}", verdict["message"].get<std::string>());
}

}  // namespace bt::launcher
