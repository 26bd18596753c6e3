#include "launcher/phases/cache_seed.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/phases/ready.h"
#include "launcher/supervision/supervisor.h"
#include "rendezvous/node_info.h"
#include "storage/durable_file.h"
#include "storage/json_bytes.h"
#include "storage/paths.h"

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kSeedStoreKey = "bt/seed";
constexpr std::chrono::seconds kWaitLogEvery{10};
constexpr std::chrono::seconds kSeedPoll{1};

// The lease and the seed marker must survive a crash of this host: durable_file.h's write.
void WriteAtomically(const std::string& path, const std::string& text) {
  try {
    storage::WriteFileAtomically(path, text);
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, std::string("cache seed: ") + error.what());
  }
}

struct LeaseHolder {
  std::string host;
  int pid = 0;
  std::string job_id;
  int64_t renewed_unix = 0;  // hosts' clocks differ: compared only with its own earlier value
  uint64_t renewals = 0;     // what a waiter watches: a live holder changes it every lease_s/4

  // Any field changed is a renewal: a lease written by an older bt-launch has no counter,
  // only its renewed_unix moving.
  bool SameRenewal(const LeaseHolder& other) const {
    return host == other.host && pid == other.pid && job_id == other.job_id && renewals == other.renewals &&
           renewed_unix == other.renewed_unix;
  }
};

std::optional<LeaseHolder> ReadLease(const std::string& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  auto value = nlohmann::json::parse(file, nullptr, false);
  if (!value.is_object()) return std::nullopt;
  using storage::FieldOr;
  return LeaseHolder{FieldOr<std::string>(value, "host", "?"), FieldOr(value, "pid", 0),
                     FieldOr<std::string>(value, "job_id", "?"), FieldOr(value, "renewed_unix", int64_t(0)),
                     FieldOr(value, "renewals", uint64_t(0))};
}

// The seeding node's claim: an flock on `<key>.lock` and a lease file `<key>.lease` renewed
// every lease/4 seconds. On the holder's host the flock decides: held means alive, free means
// dead. From another host (whose flock this filesystem may not share), a lease whose renewals
// this node has not seen change for lease_s seconds of its own clock belongs to a dead (or
// hung) node and is taken over: two hosts' wall clocks are never compared (a host ahead by
// more than lease_s took over a live lease, and the seed ran twice at once).
class SeedLease {
 public:
  SeedLease(std::string directory, const std::string& key, double lease_s, std::string job_id)
      : lock_path_(directory + "/" + key + ".lock"),
        lease_path_(directory + "/" + key + ".lease"),
        marker_path_(directory + "/" + key + ".done"),
        lease_s_(lease_s),
        me_{rendezvous::HostName(), getpid(), std::move(job_id), 0} {
    fd_ = open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw LaunchFailure(kExitIo, "cache seed: cannot open " + lock_path_ + ": " + std::strerror(errno));
  }
  ~SeedLease() {
    Release();
    close(fd_);
  }

  const std::string& marker_path() const { return marker_path_; }
  bool Seeded() const { return access(marker_path_.c_str(), F_OK) == 0; }

  // Returns true once this node holds the lease, false when the marker appeared meanwhile.
  bool Acquire(const std::function<void()>& check_stop) {
    auto last_log = Clock::now() - kWaitLogEvery;
    while (!Seeded()) {
      std::optional<LeaseHolder> holder = ReadLease(lease_path_);
      const bool stale = holder && Unrenewed(*holder) >= std::chrono::duration<double>(lease_s_);
      const bool on_this_host = holder && holder->host == me_.host;
      if (flock(fd_, LOCK_EX | LOCK_NB) == 0) {
        if ((!holder || on_this_host || stale) && !Seeded()) return Take(holder);
        flock(fd_, LOCK_UN);  // a live lease on another host: this filesystem's flock is per host
      } else if (holder && !on_this_host && stale) {
        return Take(holder);
      }
      if (Clock::now() - last_log >= kWaitLogEvery && holder) {
        spdlog::info("cache seed: {} (pid {}, job {}) is seeding the project cache; waiting", holder->host, holder->pid,
                     holder->job_id);
        last_log = Clock::now();
      }
      check_stop();
      std::this_thread::sleep_for(kSeedPoll);
    }
    return false;
  }

  void Release() {
    if (!held_) return;
    {
      std::lock_guard lock(mutex_);
      held_ = false;
    }
    renewed_.notify_all();
    if (renewer_.joinable()) renewer_.join();
    unlink(lease_path_.c_str());
    flock(fd_, LOCK_UN);
  }

 private:
  // How long this node has seen `holder` without a new renewal, by its own steady clock.
  Clock::duration Unrenewed(const LeaseHolder& holder) {
    if (!last_seen_ || !last_seen_->SameRenewal(holder)) {
      last_seen_ = holder;
      last_seen_at_ = Clock::now();
    }
    return Clock::now() - last_seen_at_;
  }

  bool Take(const std::optional<LeaseHolder>& previous) {
    if (previous && previous->host == me_.host) {
      spdlog::warn("cache seed: the lease of {} (pid {}, job {}) is not locked any more: its holder is gone; taking it over",
                   previous->host, previous->pid, previous->job_id);
    } else if (previous) {
      spdlog::warn("cache seed: the lease of {} (pid {}, job {}) was not renewed for launcher.cache.lease_s ({} s); "
                   "taking it over", previous->host, previous->pid, previous->job_id, lease_s_);
    }
    held_ = true;
    Renew();
    renewer_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      while (!renewed_.wait_for(lock, std::chrono::milliseconds(int64_t(lease_s_ * 250)), [&] { return !held_; })) Renew();
    });
    return true;
  }

  // Runs on the renewer's thread too, where an exception would call std::terminate and end
  // the launcher (PID 1): a renewal that fails is logged, and the next one tried. A lease
  // left unrenewed for lease_s is taken over by another job, which the log then explains.
  // A host name that is not UTF-8 is written with U+FFFD rather than not at all.
  void Renew() noexcept {
    try {
      nlohmann::json lease = {{"host", me_.host},       {"pid", me_.pid},
                              {"job_id", me_.job_id},   {"renewed_unix", int64_t(std::time(nullptr))},
                              {"renewals", ++renewals_}};
      WriteAtomically(lease_path_, lease.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    } catch (const LaunchFailure& failure) {
      spdlog::warn("{}", failure.what());
    } catch (const std::exception& error) {
      spdlog::warn("cache seed: cannot renew the lease {}: {}", lease_path_, error.what());
    } catch (...) {
      spdlog::warn("cache seed: cannot renew the lease {}", lease_path_);
    }
  }

  std::string lock_path_;
  std::string lease_path_;
  std::string marker_path_;
  double lease_s_;
  LeaseHolder me_;
  int fd_ = -1;
  bool held_ = false;
  uint64_t renewals_ = 0;
  std::optional<LeaseHolder> last_seen_;
  Clock::time_point last_seen_at_;
  std::mutex mutex_;
  std::condition_variable renewed_;
  std::thread renewer_;
};

void Announce(Peers* peers, const std::string& value) {
  if (peers == nullptr || peers->store() == nullptr) return;
  try {
    peers->store()->Set(kSeedStoreKey, value);
  } catch (const rendezvous::StoreError& error) {  // a stop (LaunchFailure) goes on
    spdlog::warn("cache seed: cannot tell the other nodes: {}", error.what());
  }
}

void SeedOnLeader(const env::JobConfig& config, const env::JobEnvironment& environment, Peers* peers, SignalRouter& signals) {
  const auto& settings = config.launcher.cache;
  const std::string key = SeedKey(settings.seed_commands, settings.seed_key.value_or(""));
  const std::string directory = environment.variables.at("BT_PROJECT_CACHE_DIR") + "/.bt-seed";
  storage::MakeDirectories(directory);
  SeedLease lease(directory, key, settings.lease_s, environment.variables.at("BT_TRAINING_JOB_ID"));
  if (!lease.Acquire([&] { CheckStop(peers, signals); })) {
    spdlog::info("cache seed: already done (key {}, {}); skipping", key.substr(0, 12), lease.marker_path());
    Announce(peers, "done");
    return;
  }
  spdlog::info("cache seed: running {} command(s) (key {})", settings.seed_commands.size(), key.substr(0, 12));
  std::vector<Command> commands;
  for (const auto& text : settings.seed_commands) commands.push_back(ShellCommand(text));
  Supervisor supervisor(signals, std::chrono::milliseconds(int64_t(config.launcher.grace_period_s * 1000)),
                        std::chrono::milliseconds(int64_t(config.launcher.peer_failure_grace_s * 1000)));
  JobOutcome outcome = supervisor.Run(commands, environment.ToEnviron(), environment.working_dir, peers, "cache seed command");
  if (outcome.stop_reason) {
    // Another node's failure (or a lost node) stopped the seed, maybe before its first
    // command: nothing is marked done, and the job goes no further (the stop was this one's
    // to take: a later supervisor would not hear of it again).
    lease.Release();
    throw LaunchFailure(peers != nullptr ? peers->StopExitCode() : kExitUnavailable,
                        "stopping during the cache seed: " + *outcome.stop_reason);
  }
  if (outcome.exit_code != 0) {
    lease.Release();
    std::string what = outcome.failed_command
                           ? "cache seed command " + std::to_string(*outcome.failed_command + 1) + " exited with code " +
                                 std::to_string(outcome.exit_code) + ": " + settings.seed_commands[*outcome.failed_command]
                           : "cache seed stopped (exit code " + std::to_string(outcome.exit_code) + ")";
    Announce(peers, "failed " + std::to_string(outcome.exit_code) + ": " + what);
    throw LaunchFailure(outcome.exit_code, what);
  }
  nlohmann::json marker = {{"key", key}, {"commands", settings.seed_commands}, {"job_id", environment.variables.at("BT_TRAINING_JOB_ID")},
                           {"host", rendezvous::HostName()}, {"done_unix", int64_t(std::time(nullptr))}};
  WriteAtomically(lease.marker_path(), marker.dump(2) + "\n");
  lease.Release();
  spdlog::info("cache seed: done; marker {}", lease.marker_path());
  Announce(peers, "done");
}

// Node 0 announced "failed <code>: <what>": this node exits with the seed command's code
// too, so the scheduler sees the job's one result, not 69 from every other node.
LaunchFailure SeedFailedOnLeader(const std::string& announced) {
  const size_t colon = announced.find(": ");
  int code = kExitUnavailable;
  try {
    code = std::stoi(announced.substr(7, colon - 7));
  } catch (const std::exception&) {  // not a number: the job still fails, with 69
  }
  if (code < 1 || code > 255) code = kExitUnavailable;
  const std::string what = colon == std::string::npos ? announced : announced.substr(colon + 2);
  spdlog::info("exiting with node 0's exit code {}: the job's result", code);
  return LaunchFailure(code, "node 0's cache seed failed: " + what);
}

void WaitForLeader(Peers& peers, SignalRouter& signals) {
  spdlog::info("cache seed: waiting for node 0 to seed the project cache");
  auto last_log = Clock::now();
  while (true) {
    CheckStop(&peers, signals);
    try {
      std::string value = peers.store()->Get(kSeedStoreKey, kSeedPoll);
      if (value.rfind("failed ", 0) == 0) throw SeedFailedOnLeader(value);
      spdlog::info("cache seed: node 0 has seeded the project cache");
      return;
    } catch (const rendezvous::StoreTimeout&) {  // a lost leader is PreRunPeers' to name
    }
    if (Clock::now() - last_log >= kWaitLogEvery) {
      spdlog::info("cache seed: still waiting for node 0 to seed the project cache");
      last_log = Clock::now();
    }
  }
}

}  // namespace

std::string SeedKey(const std::vector<std::string>& commands, const std::string& seed_key) {
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  EVP_DigestInit_ex(context, EVP_sha256(), nullptr);
  for (const auto& command : commands) EVP_DigestUpdate(context, command.c_str(), command.size() + 1);  // NUL-separated
  EVP_DigestUpdate(context, "\x01", 1);
  EVP_DigestUpdate(context, seed_key.data(), seed_key.size());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context, digest, &length);
  EVP_MD_CTX_free(context);
  std::string hex;
  char pair[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(pair, sizeof pair, "%02x", digest[i]);
    hex += pair;
  }
  return hex;
}

void SeedCache(const env::JobConfig& config, const env::JobEnvironment& environment, const env::NodeIdentity& identity,
               Peers* peers, SignalRouter& signals) {
  if (!config.runtime.cache_config.enabled || config.launcher.cache.seed_commands.empty()) return;
  if (identity.rank == 0) {
    SeedOnLeader(config, environment, peers, signals);
  } else if (peers != nullptr && peers->store() != nullptr) {
    WaitForLeader(*peers, signals);
  } else {
    spdlog::warn("cache seed: the mpi rendezvous backend has no store to wait on; not waiting for node 0's seed");
  }
}

}  // namespace bt::launcher
