// `bt-launch bench checkpoint`: manifest hashing speed, the handoff latency of the agent (last
// write of a checkpoint → snapshotted and queued) and a file:// upload against `cp -r` of the
// same bytes in the same run. A table, then one JSON line.
#include "launcher/tools/bench.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "launcher/tools/bench.h"

#include "checkpoint/agent.h"
#include "checkpoint/snapshot.h"
#include "launcher/exit_codes.h"
#include "launcher/tools/bench_rendezvous.h"
#include "storage/destination.h"
#include "storage/hash.h"
#include "storage/paths.h"
#include "storage/subprocess.h"

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kHashFileBytes = 1ull << 30;
constexpr int kHandoffCheckpoints = 120;
constexpr uint64_t kUploadFileBytes = 512ull << 20;
constexpr int kUploadFiles = 4;  // 2 GiB in all
constexpr int kRuns = 5;  // medians of 5: this disk is noisy
// `cp -r` alone ranges 0.55-4.1 s here (page cache allocation), more than anything else.
constexpr int kUploadRuns = 9;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  size_t index = std::min(values.size() - 1, size_t(fraction * double(values.size() - 1) + 0.5));
  return values[index];
}

void WriteFile(const std::string& path, uint64_t bytes, unsigned seed) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw LaunchFailure(kExitIo, "cannot create " + path);
  std::vector<uint64_t> block(1 << 17);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t written = 0; written < bytes;) {
    for (auto& word : block) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      word = state;
    }
    size_t chunk = size_t(std::min<uint64_t>(bytes - written, block.size() * sizeof(uint64_t)));
    if (write(fd, block.data(), chunk) != ssize_t(chunk)) throw LaunchFailure(kExitIo, "cannot write " + path);
    written += chunk;
  }
  close(fd);
}

int RunCommand(const std::vector<std::string>& argv) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// XXH3-128 of a file whose pages are cached, as the uploader hashes a checkpoint just written.
double MeasureHashing(const std::string& dir) {
  const std::string path = dir + "/hash-input";
  WriteFile(path, kHashFileBytes, 1);
  storage::HashFile(path);  // warm the page cache
  std::vector<double> rates;
  for (int run = 0; run < kRuns; ++run) {
    auto start = Clock::now();
    storage::HashFile(path);
    rates.push_back(double(kHashFileBytes) / Seconds(Clock::now() - start) / 1e9);
  }
  unlink(path.c_str());
  return Median(rates);
}

// The agent on a real directory, with checkpoints written in the Hugging Face order; the
// clock starts when trainer_state.json is closed.
std::vector<double> MeasureHandoff(const std::string& dir) {
  const std::string checkpoints = dir + "/ckpts";
  storage::MakeDirectories(checkpoints);
  std::mutex mutex;
  std::condition_variable handed_off;
  std::map<std::string, Clock::time_point> at;
  checkpoint::AgentOptions options;
  options.checkpoint_dir = checkpoints;
  options.settings.scan_interval_s = 60;  // only inotify events, no help from the timer
  options.job_id = "bench";
  options.destination = storage::ParseDestination("file://" + dir + "/remote", "bench");
  options.uploader_environ = {"PATH=/usr/bin:/bin"};
  options.uploader_binary = storage::CurrentExecutable();
  options.on_handoff = [&](const std::string& name) {
    std::lock_guard lock(mutex);
    at[name] = Clock::now();
    handed_off.notify_all();
  };
  checkpoint::CheckpointAgent agent(options);
  std::vector<double> latencies;
  for (int step = 1; step <= kHandoffCheckpoints; ++step) {
    const std::string name = "checkpoint-" + std::to_string(step);
    const std::string path = checkpoints + "/" + name;
    storage::MakeDirectories(path);
    WriteFile(path + "/model.safetensors.bin", 1 << 20, unsigned(step));
    WriteFile(path + "/optimizer.pt.bin", 2 << 20, unsigned(step) + 7);
    for (const char* small : {"config.json", "scheduler.pt.bin", "rng_state.pth.bin"}) WriteFile(path + "/" + small, 1024, 3);
    WriteFile(path + "/trainer_state.json", 2048, 5);
    auto closed = Clock::now();
    std::unique_lock lock(mutex);
    if (!handed_off.wait_for(lock, std::chrono::seconds(10), [&] { return at.contains(name); })) {
      throw LaunchFailure(kExitInternal, "bench: " + name + " was not handed off within 10 s");
    }
    latencies.push_back(std::chrono::duration<double, std::milli>(at[name] - closed).count());
  }
  agent.Drain(true, Clock::now() + std::chrono::seconds(120));
  return latencies;
}

struct UploadFigures {
  double upload_s;
  double cp_s;       // cp -r: done when the bytes are in the page cache
  double cp_sync_s;  // cp -r, then sync: done when they are on the disk, as an upload is
  double disk_floor_s;  // the same bytes written O_DIRECT from memory and synced: no copy is durable sooner
  double fastest_pair_vs_cp;  // upload / cp -r of the pair where the upload fared best
  double slowest_pair_vs_cp;  // ... and worst: the spread this disk gives one figure
};

// The disk's floor for a durable copy of `files` x `bytes`: written with O_DIRECT from a
// buffer (nothing read, nothing hashed), each file fdatasync'ed. Seconds.
double WriteDirectFromMemory(const std::string& dir, int files, uint64_t bytes) {
  constexpr size_t kChunk = 4 << 20;
  std::unique_ptr<char, decltype(&std::free)> buffer(static_cast<char*>(std::aligned_alloc(4096, kChunk)), &std::free);
  if (!buffer) throw LaunchFailure(kExitInternal, "bench: cannot allocate a buffer");
  std::memset(buffer.get(), 0x5a, kChunk);
  const auto start = Clock::now();
  for (int i = 0; i < files; ++i) {
    const std::string path = dir + "/floor-" + std::to_string(i);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) throw LaunchFailure(kExitIo, "bench: cannot create " + path + " with O_DIRECT");
    for (uint64_t written = 0; written < bytes; written += kChunk) {
      if (write(fd, buffer.get(), kChunk) != ssize_t(kChunk)) throw LaunchFailure(kExitIo, "bench: cannot write " + path);
    }
    fdatasync(fd);
    close(fd);
  }
  const double seconds = Seconds(Clock::now() - start);
  for (int i = 0; i < files; ++i) unlink((dir + "/floor-" + std::to_string(i)).c_str());
  return seconds;
}

// 2 GiB to a file:// destination on the same disk, the uploader's whole path (hash for the
// manifest, copy, fsync, rename), against `cp -r` of the same directory; runs interleaved.
UploadFigures MeasureUpload(const std::string& dir) {
  const std::string source = dir + "/upload-source";
  storage::MakeDirectories(source);
  checkpoint::Snapshot snapshot;
  snapshot.name = "checkpoint-1";
  snapshot.layout = "huggingface";
  snapshot.staging_dir = source;
  for (int i = 0; i < kUploadFiles; ++i) {
    const std::string file = "shard-" + std::to_string(i) + ".bin";
    WriteFile(source + "/" + file, kUploadFileBytes, unsigned(100 + i));
    snapshot.files.push_back({file, kUploadFileBytes, 0, checkpoint::StagingMethod::kCopy});
    snapshot.total_bytes += kUploadFileBytes;
  }
  std::vector<double> upload;
  std::vector<double> copy;
  std::vector<double> copy_synced;
  for (int run = 0; run < kUploadRuns; ++run) {

    // Each starts with no dirty pages of the other's run still being written back.
    const std::string cp_target = dir + "/cp-" + std::to_string(run);
    sync();
    auto start = Clock::now();
    if (RunCommand({"cp", "-r", source, cp_target}) != 0) throw LaunchFailure(kExitIo, "bench: cp -r failed");
    copy.push_back(Seconds(Clock::now() - start));
    sync();
    copy_synced.push_back(Seconds(Clock::now() - start));
    storage::RemoveTree(cp_target);

    const std::string remote = dir + "/remote-" + std::to_string(run);
    auto destination = storage::OpenDestination(storage::ParseDestination("file://" + remote, "bench"));
    sync();
    start = Clock::now();
    storage::Manifest header;
    header.job_id = "bench";
    header.name = snapshot.name;
    header.layout = snapshot.layout;
    destination->Upload(snapshot.Staged(), header, "bench/rank-0", [](uint64_t, uint64_t) {});
    upload.push_back(Seconds(Clock::now() - start));
    storage::RemoveTree(remote);
  }
  storage::RemoveTree(source);
  // Apart from the pairs: interleaved, these writes slowed the next cp -r by half.
  std::vector<double> floor;
  for (int run = 0; run < kRuns; ++run) {
    sync();
    floor.push_back(WriteDirectFromMemory(dir, kUploadFiles, kUploadFileBytes));
  }
  std::vector<double> pair_ratios;
  for (size_t run = 0; run < upload.size(); ++run) pair_ratios.push_back(upload[run] / copy[run]);
  const auto [fastest, slowest] = std::minmax_element(pair_ratios.begin(), pair_ratios.end());
  return {Median(upload), Median(copy), Median(copy_synced), Median(floor), *fastest, *slowest};
}

}  // namespace

int BenchSubcommand(const CliOptions& cli) {
  if (cli.bench_target == "rendezvous") return BenchRendezvous(cli);
  std::string dir;
  bool own_dir = !cli.bench_dir;
  if (cli.bench_dir) {
    dir = *cli.bench_dir;
    storage::MakeDirectories(dir);
  } else {
    char temporary[] = "/var/tmp/bt-launch-bench.XXXXXX";
    if (mkdtemp(temporary) == nullptr) throw LaunchFailure(kExitIo, "bench: cannot create a directory in /var/tmp");
    dir = temporary;
  }
  spdlog::set_level(spdlog::level::warn);  // the agent's per-checkpoint lines would drown the table
  const double hash_gbps = MeasureHashing(dir);
  const std::vector<double> handoff = MeasureHandoff(dir);
  const UploadFigures upload = MeasureUpload(dir);
  if (own_dir) storage::RemoveTree(dir);

  nlohmann::json figures = {{"hash_gbps_per_core", hash_gbps},
                            {"hash_impl", storage::HashImplementation()},
                            {"handoffs", handoff.size()},
                            {"handoff_p50_ms", Percentile(handoff, 0.5)},
                            {"handoff_p99_ms", Percentile(handoff, 0.99)},
                            {"handoff_max_ms", Percentile(handoff, 1.0)},
                            {"upload_bytes", kUploadFileBytes * kUploadFiles},
                            {"upload_s", upload.upload_s},
                            {"cp_s", upload.cp_s},
                            {"cp_sync_s", upload.cp_sync_s},
                            {"upload_vs_cp", upload.upload_s / upload.cp_s},
                            {"upload_vs_cp_sync", upload.upload_s / upload.cp_sync_s},
                            {"disk_floor_s", upload.disk_floor_s},
                            {"upload_vs_disk_floor", upload.upload_s / upload.disk_floor_s},
                            {"upload_vs_cp_pair_min", upload.fastest_pair_vs_cp},
                            {"upload_vs_cp_pair_max", upload.slowest_pair_vs_cp}};
  std::printf("%-44s %12s\n", "figure", "value");
  std::printf("%-44s %9.2f GB/s (%s)\n", "manifest hashing, XXH3-128, one core", hash_gbps, storage::HashImplementation());
  std::printf("%-44s %9.2f ms\n", "handoff p50 (last write -> queued)", Percentile(handoff, 0.5));
  std::printf("%-44s %9.2f ms  (over %zu checkpoints)\n", "handoff p99", Percentile(handoff, 0.99), handoff.size());
  std::printf("%-44s %9.2f ms\n", "handoff max", Percentile(handoff, 1.0));
  std::printf("%-44s %9.2f s\n", "upload 2 GiB to file:// (hash+copy+fsync)", upload.upload_s);
  std::printf("%-44s %9.2f s\n", "disk floor: 2 GiB O_DIRECT from memory+fsync", upload.disk_floor_s);
  std::printf("%-44s %9.2f s\n", "cp -r of the same 2 GiB", upload.cp_s);
  std::printf("%-44s %9.2f s\n", "cp -r, then sync (on the disk, as uploads are)", upload.cp_sync_s);
  std::printf("%-44s %9.2f x  (>1: slower than cp)\n", "upload / cp", upload.upload_s / upload.cp_s);
  const std::string pair_range = fmt::format("{:.2f}-{:.2f}", upload.fastest_pair_vs_cp, upload.slowest_pair_vs_cp);
  std::printf("%-44s %9s x  (each of the %d pairs)\n", "upload / cp, pair by pair", pair_range.c_str(), kUploadRuns);
  std::printf("%-44s %9.2f x\n", "upload / (cp + sync)", upload.upload_s / upload.cp_sync_s);
  std::printf("%-44s %9.2f x  (1: as fast as the disk writes)\n", "upload / disk floor", upload.upload_s / upload.disk_floor_s);
  std::printf("%s\n", figures.dump().c_str());
  return 0;
}

}  // namespace bt::launcher
