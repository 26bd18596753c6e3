#include "launcher/phases/weights.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "storage/destination.h"
#include "storage/json_bytes.h"
#include "storage/durable_file.h"
#include "storage/file_copy.h"
#include "storage/paths.h"
#include "storage/subprocess.h"

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kSentinel = ".complete";
constexpr std::chrono::seconds kProgressEvery{5};
constexpr std::chrono::milliseconds kWaitPoll{500};
// rclone's --max-duration is the time left, in whole seconds: it may stop the transfer up to
// this much before the deadline itself passes, which is still the deadline's doing.
constexpr std::chrono::seconds kRcloneDeadlineSlack{2};


std::string Scheme(const std::string& source) { return source.substr(0, source.find("://")); }
std::string AfterScheme(const std::string& source) { return source.substr(source.find("://") + 3); }
bool Stageable(const std::string& scheme) {
  return scheme == "file" || scheme == "s3" || scheme == "gs" || scheme == "r2" || scheme == "azure" || scheme == "cw";
}

// What is under a mount right now.
struct MountState {
  uint64_t files = 0;
  uint64_t bytes = 0;
  std::vector<std::string> temporary;  // .tmp* files still being downloaded
  bool sentinel = false;
};

void Walk(const std::string& root, const std::string& relative, MountState& state) {
  DIR* dir = opendir(storage::JoinPath(root, relative).c_str());
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = storage::JoinPath(relative, name);
    struct stat info {};
    if (lstat((root + "/" + path).c_str(), &info) != 0) continue;
    if (S_ISDIR(info.st_mode)) {
      Walk(root, path, state);
    } else if (name.rfind(".tmp", 0) == 0) {
      state.temporary.push_back(path);
    } else if (relative.empty() && name == kSentinel) {
      state.sentinel = true;
    } else {
      ++state.files;
      state.bytes += uint64_t(info.st_size);
    }
  }
  closedir(dir);
}

MountState Inspect(const std::string& mount) {
  MountState state;
  Walk(mount, "", state);
  return state;
}

bool IsEmptyOrAbsent(const std::string& path) {
  std::error_code error;
  return !std::filesystem::exists(path, error) || std::filesystem::is_empty(path, error);
}

struct SourceFile {
  std::string path;
  uint64_t size = 0;
};

std::vector<SourceFile> Select(const std::vector<SourceFile>& files, const env::WeightsSource& weights) {
  std::vector<SourceFile> selected;
  for (const auto& file : files) {
    if (WeightsPathSelected(file.path, weights.allow_patterns, weights.ignore_patterns)) selected.push_back(file);
  }
  for (const std::string& pattern : weights.allow_patterns) {
    bool matched = false;
    for (const auto& file : files) matched |= WeightsPathSelected(file.path, {pattern}, {});
    if (!matched) spdlog::warn("weights: allow pattern \"{}\" matches nothing in {}", pattern, weights.source);
  }
  if (selected.empty()) spdlog::warn("weights: nothing of {} is selected by its patterns; {} will be empty", weights.source, weights.mount_location);
  return selected;
}

void ListLocal(const std::string& root, const std::string& relative, std::vector<SourceFile>& files) {
  DIR* dir = opendir(storage::JoinPath(root, relative).c_str());
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = storage::JoinPath(relative, name);
    struct stat info {};
    if (stat((root + "/" + path).c_str(), &info) != 0) continue;  // a dangling link
    if (S_ISDIR(info.st_mode)) {
      ListLocal(root, path, files);
    } else if (S_ISREG(info.st_mode)) {
      files.push_back({path, uint64_t(info.st_size)});
    }
  }
}

// Serialises staging of one mount between the nodes that share a host (and a mount).
class MountLock {
 public:
  MountLock(const std::string& mount, const WeightsHooks& hooks) {
    const std::filesystem::path path(mount);
    const std::string lock = (path.parent_path() / ("." + path.filename().string() + ".bt-weights.lock")).string();
    storage::MakeDirectories(path.parent_path().string());
    fd_ = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw LaunchFailure(kExitIo, "weights: cannot create the lock " + lock + ": " + std::strerror(errno));
    auto logged = Clock::now() - kProgressEvery;
    while (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (Clock::now() - logged >= kProgressEvery) {
        spdlog::info("weights: another bt-launch on this host is staging {}; waiting for it", mount);
        logged = Clock::now();
      }
      hooks.check_stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  ~MountLock() { close(fd_); }  // closing releases the lock

 private:
  int fd_ = -1;
};

class Stager {
 public:
  Stager(const env::WeightsSource& weights, std::string where, const env::JobEnvironment& environment,
         const WeightsHooks& hooks, Clock::time_point deadline)
      : weights_(weights), where_(std::move(where)), environment_(environment), hooks_(hooks), deadline_(deadline) {}

  void Run() {
    const std::string& mount = weights_.mount_location;
    MountLock lock(mount, hooks_);
    if (WeightsMountComplete(mount)) {
      spdlog::info("weights: {} is already complete", mount);
      return;
    }
    const std::filesystem::path path(mount);
    const std::string prefix = "." + path.filename().string() + ".bt-staging-";
    RemoveCrashedStaging(path.parent_path().string(), prefix);
    if (!IsEmptyOrAbsent(mount)) {
      throw LaunchFailure(kExitIo, where_ + ": " + mount + " holds files but no " + kSentinel +
                                       ": not staged by bt-launch; remove it, or set launcher.weights.mode to \"wait\"");
    }
    staging_ = (path.parent_path() / (prefix + std::to_string(getpid()))).string();
    storage::MakeDirectories(staging_);
    try {
      if (Scheme(weights_.source) == "file") {
        StageLocal();
      } else {
        StageWithRclone();
      }
    } catch (...) {  // a stop, the deadline, an error: nothing half-staged stays behind
      storage::RemoveTree(staging_);
      std::error_code ignored;
      std::filesystem::remove(staging_ + ".files", ignored);
      throw;
    }
    std::error_code ignored;
    std::filesystem::remove(mount, ignored);  // an empty directory left for us
    if (rename(staging_.c_str(), mount.c_str()) != 0) {
      throw LaunchFailure(kExitIo, "weights: cannot rename " + staging_ + " to " + mount + ": " + std::strerror(errno));
    }
    WriteSentinel(mount);
    spdlog::info("weights: staged {} into {} ({} files, {})", weights_.source, mount, staged_files_, storage::FormatBytes(staged_bytes_));
  }

 private:
  static void RemoveCrashedStaging(const std::string& parent, const std::string& prefix) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(parent, error)) {
      if (entry.path().filename().string().rfind(prefix, 0) != 0) continue;
      spdlog::warn("weights: removing {}, left by a staging that did not finish", entry.path().string());
      storage::RemoveTree(entry.path().string());
    }
  }

  void StageLocal() {
    const std::string source = AfterScheme(weights_.source);
    struct stat root_info {};
    if (stat(source.c_str(), &root_info) != 0) {
      throw LaunchFailure(kExitConfig, where_ + ".source: " + weights_.source + " does not exist (" + std::strerror(errno) + ")");
    }
    std::vector<SourceFile> files;
    if (S_ISDIR(root_info.st_mode)) {
      ListLocal(source, "", files);
    } else {
      files.push_back({std::filesystem::path(source).filename().string(), uint64_t(root_info.st_size)});
    }
    const std::string base = S_ISDIR(root_info.st_mode) ? source : std::filesystem::path(source).parent_path().string();
    const auto selected = Select(files, weights_);
    uint64_t total = 0;
    for (const auto& file : selected) total += file.size;
    const bool same_filesystem = SameFilesystem(base, staging_);
    spdlog::info("weights: staging {} into {} ({} files, {}, {})", weights_.source, weights_.mount_location, selected.size(),
                 storage::FormatBytes(total), same_filesystem ? "hard links" : "copies");
    for (const auto& file : selected) {
      const std::string from = base + "/" + file.path;
      const std::string to = staging_ + "/" + file.path;
      storage::MakeDirectories(storage::ParentOf(to));
      // The listing followed links (stat): link(2) would not, and a relative symlink (the Hugging
      // Face cache's snapshots/<rev>/f -> ../../blobs/<hash>) dangled in the mount. What is
      // staged is the target's bytes, linked or copied.
      const bool linked = same_filesystem && linkat(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), AT_SYMLINK_FOLLOW) == 0;
      if (!linked) storage::CopyFile(from, to);
      ++staged_files_;
      staged_bytes_ += file.size;
      Progress(total);
    }
    CheckStaged(selected);
  }

  // A mount is marked complete only when every file it should hold opens as a regular file
  // of the listed size: nothing dangles, nothing is cut short.
  void CheckStaged(const std::vector<SourceFile>& selected) const {
    for (const auto& file : selected) {
      const std::string path = staging_ + "/" + file.path;
      const storage::FileDescriptor opened(open(path.c_str(), O_RDONLY | O_CLOEXEC));
      struct stat info {};
      if (!opened.valid() || fstat(opened.get(), &info) != 0) {
        throw LaunchFailure(kExitIo, where_ + ": staged " + path + " does not open: " + std::strerror(errno));
      }
      if (!S_ISREG(info.st_mode) || uint64_t(info.st_size) != file.size) {
        throw LaunchFailure(kExitIo, where_ + ": staged " + path + " is not the " + std::to_string(file.size) +
                                         "-byte file the source listed");
      }
    }
  }

  void StageWithRclone() {
    std::optional<std::string> secret;
    if (weights_.auth_secret_name) {
      secret = env::ReadSecretFile(environment_.secrets_dir, *weights_.auth_secret_name, where_ + ".auth_secret_name");
    }
    const std::string scheme = Scheme(weights_.source) == "cw" ? "s3" : Scheme(weights_.source);
    std::vector<std::string> rclone_env;
    try {
      rclone_env = storage::RcloneEnvironment(scheme, secret, weights_.auth_secret_name.value_or(""), environment_.variables);
    } catch (const storage::DestinationError& error) {
      throw LaunchFailure(kExitConfig, where_ + ".auth_secret_name: " + error.what());
    }
    const std::string remote = "btdest:" + AfterScheme(weights_.source);
    // The listing is filtered here, with huggingface_hub's semantics, and rclone copies
    // exactly that list: no translation into rclone's own filter language.
    auto listing = Rclone({"lsf", "-R", "--files-only", "--format", "sp", "--separator", "\t", remote}, rclone_env, 0);
    std::vector<SourceFile> files;
    std::istringstream lines(listing);
    for (std::string line; std::getline(lines, line);) {
      auto tab = line.find('\t');
      if (tab == std::string::npos) continue;
      files.push_back({line.substr(tab + 1), std::stoull(line.substr(0, tab))});
    }
    const auto selected = Select(files, weights_);
    spdlog::info("weights: staging {} into {} ({} files, through rclone)", weights_.source, weights_.mount_location, selected.size());
    std::string list;
    uint64_t total = 0;
    for (const auto& file : selected) {
      list += file.path + "\n";
      total += file.size;
    }
    const std::string list_path = staging_ + ".files";
    {
      std::FILE* out = std::fopen(list_path.c_str(), "w");
      if (out == nullptr) throw LaunchFailure(kExitIo, "weights: cannot write " + list_path);
      std::fputs(list.c_str(), out);
      std::fclose(out);
    }
    const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline_ - Clock::now()).count();
    Rclone({"copy", "--files-from-raw", list_path, "--no-traverse", "--transfers", "8", "--max-duration",
            std::to_string(std::max<int64_t>(1, left)) + "s", remote, staging_},
           rclone_env, total);
    std::filesystem::remove(list_path);
    CheckStaged(selected);
    staged_files_ = selected.size();
    staged_bytes_ = total;
    Progress(total);
  }

  // `total`: the bytes this call stages (0 for a listing), for the deadline's message.
  std::string Rclone(std::vector<std::string> arguments, const std::vector<std::string>& rclone_env, uint64_t total) {
    std::vector<std::string> argv = {"rclone", "--use-json-log", "--log-level", "NOTICE", "--retries", "3"};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    std::string last_error;
    // Once a second: a SIGTERM stops the transfer as it stops a checkpoint load (RunProcess
    // kills rclone when this throws), and so does the deadline, with its own message.
    auto every_second = [&] {
      hooks_.check_stop();
      if (Clock::now() >= deadline_) ThrowTimedOut(Inspect(staging_).bytes, total);
    };
    auto result = storage::RunProcess(argv, rclone_env, [&](const std::string& text) {
      auto line = nlohmann::json::parse(text, nullptr, false);
      if (storage::FieldOr<std::string>(line, "level", "") == "error") last_error = storage::FieldOr(line, "msg", text);
    }, every_second);
    // rclone's own --max-duration may end it a moment before the check above does.
    if (result.exit_code != 0 && Clock::now() + kRcloneDeadlineSlack >= deadline_) ThrowTimedOut(Inspect(staging_).bytes, total);
    if (result.exit_code != 0) {
      std::string why = !result.spawn_error.empty() ? result.spawn_error : "rclone exited " + std::to_string(result.exit_code) +
                                                                                " (" + storage::DescribeRcloneExit(result.exit_code) + ")";
      throw LaunchFailure(kExitIo, where_ + ": cannot stage " + weights_.source + ": " + why + (last_error.empty() ? "" : ": " + last_error));
    }
    return result.output;
  }

  static bool SameFilesystem(const std::string& a, const std::string& b) {
    struct stat first {};
    struct stat second {};
    return stat(a.c_str(), &first) == 0 && stat(b.c_str(), &second) == 0 && first.st_dev == second.st_dev;
  }

  void Progress(uint64_t total) {
    hooks_.check_stop();
    if (Clock::now() >= deadline_) ThrowTimedOut(staged_bytes_, total);
    if (Clock::now() - last_report_ < kProgressEvery && staged_bytes_ < total) return;
    last_report_ = Clock::now();
    std::string line = "staging " + weights_.mount_location + ": " + storage::FormatBytes(staged_bytes_) + " of " + storage::FormatBytes(total);
    spdlog::info("weights: {}", line);
    if (hooks_.report) hooks_.report(line);
  }

  [[noreturn]] void ThrowTimedOut(uint64_t staged, uint64_t total) const {
    throw LaunchFailure(kExitIo, "weights not complete after launcher.weights.timeout_s: " + weights_.mount_location +
                                     " (from " + weights_.source + "): still staging, " + storage::FormatBytes(staged) + " of " +
                                     storage::FormatBytes(total));
  }

  static void WriteSentinel(const std::string& mount) {
    std::FILE* file = std::fopen((mount + "/" + kSentinel).c_str(), "w");
    if (file == nullptr) throw LaunchFailure(kExitIo, "weights: cannot write " + mount + "/" + kSentinel);
    std::fclose(file);
  }

  const env::WeightsSource& weights_;
  std::string where_;
  const env::JobEnvironment& environment_;
  const WeightsHooks& hooks_;
  Clock::time_point deadline_;
  std::string staging_;
  uint64_t staged_files_ = 0;
  uint64_t staged_bytes_ = 0;
  Clock::time_point last_report_ = Clock::now();
};

std::string DescribeMissing(const env::WeightsSource& weights) {
  MountState state = Inspect(weights.mount_location);
  std::string text = weights.mount_location + " (from " + weights.source + "): ";
  if (!std::filesystem::exists(weights.mount_location)) return text + "not mounted";
  if (!state.sentinel) text += std::string(kSentinel) + " missing";
  if (!state.temporary.empty()) {
    text += std::string(state.sentinel ? "" : ", ") + std::to_string(state.temporary.size()) + " .tmp file(s) left (" +
            state.temporary.front() + ")";
  }
  return text + "; " + std::to_string(state.files) + " files, " + storage::FormatBytes(state.bytes) + " present";
}

void WaitForMounts(const std::vector<const env::WeightsSource*>& mounts, Clock::time_point deadline, const WeightsHooks& hooks) {
  for (const auto* weights : mounts) {
    const std::string scheme = Scheme(weights->source);
    if (scheme == "hf" || scheme == "https") {
      spdlog::info("weights: {} is not downloaded by bt-launch (no network assumptions for hf:// and https://); waiting "
                   "for the platform to mount it at {} with {}", weights->source, weights->mount_location, kSentinel);
    } else {
      spdlog::info("weights: waiting for {} to be delivered at {}", weights->source, weights->mount_location);
    }
  }
  const bool tty = isatty(STDERR_FILENO);
  auto started = Clock::now();
  auto last_log = Clock::now();
  while (true) {
    std::vector<const env::WeightsSource*> waiting;
    uint64_t bytes = 0;
    uint64_t files = 0;
    for (const auto* weights : mounts) {
      if (WeightsMountComplete(weights->mount_location)) continue;
      waiting.push_back(weights);
      MountState state = Inspect(weights->mount_location);
      bytes += state.bytes;
      files += state.files;
    }
    if (waiting.empty()) break;
    if (Clock::now() >= deadline) {
      std::string names;
      for (const auto* weights : waiting) names += (names.empty() ? "" : "; ") + DescribeMissing(*weights);
      if (tty) std::fputs("\n", stderr);
      throw LaunchFailure(kExitIo, "weights not complete after launcher.weights.timeout_s: " + names);
    }
    double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    std::string line = "waiting for " + waiting.front()->mount_location + (waiting.size() > 1 ? " and " + std::to_string(waiting.size() - 1) + " more" : "") +
                       ": " + std::to_string(files) + " files, " + storage::FormatBytes(bytes) + " present (" +
                       storage::FormatBytes(uint64_t(double(bytes) / std::max(seconds, 1.0))) + "/s)";
    if (tty) {
      std::fprintf(stderr, "\r[weights] %-100s", line.c_str());
    } else if (Clock::now() - last_log >= kProgressEvery) {
      spdlog::info("weights: {}", line);
      last_log = Clock::now();
    }
    if (hooks.report) hooks.report(line);
    hooks.check_stop();
    std::this_thread::sleep_for(kWaitPoll);
  }
  if (tty) std::fputs("\n", stderr);
  spdlog::info("weights: every mount is complete");
}

}  // namespace

bool WeightsPathSelected(const std::string& path, const std::vector<std::string>& allow,
                         const std::vector<std::string>& ignore) {
  auto matches = [&](std::string pattern) {
    if (!pattern.empty() && pattern.back() == '/') pattern += "*";
    return fnmatch(pattern.c_str(), path.c_str(), 0) == 0;
  };
  if (!allow.empty() && std::none_of(allow.begin(), allow.end(), matches)) return false;
  return std::none_of(ignore.begin(), ignore.end(), matches);
}

bool WeightsMountComplete(const std::string& mount) {
  struct stat info {};
  if (stat((mount + "/" + kSentinel).c_str(), &info) != 0) return false;
  return Inspect(mount).temporary.empty();
}

void PrepareWeights(const env::JobConfig& config, const env::JobEnvironment& environment, const WeightsHooks& hooks) {
  if (config.weights.empty()) return;
  const auto& settings = config.launcher.weights;
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(settings.timeout_s * 1000));
  std::vector<const env::WeightsSource*> to_wait;
  for (size_t i = 0; i < config.weights.size(); ++i) {
    const env::WeightsSource& weights = config.weights[i];
    const std::string where = "weights[" + std::to_string(i) + "]";
    bool stage = settings.mode == env::WeightsMode::kStage ||
                 (settings.mode == env::WeightsMode::kAuto && Stageable(Scheme(weights.source)) &&
                  !WeightsMountComplete(weights.mount_location) && IsEmptyOrAbsent(weights.mount_location));
    if (stage && !Stageable(Scheme(weights.source))) {
      throw LaunchFailure(kExitConfig, where + ".source: bt-launch cannot stage " + weights.source +
                                           " (hf:// and https:// are mounted by the platform); set launcher.weights.mode to \"wait\"");
    }
    if (stage) {
      Stager(weights, where, environment, hooks, deadline).Run();
    } else if (WeightsMountComplete(weights.mount_location)) {
      spdlog::info("weights: {} is complete", weights.mount_location);
    } else {
      to_wait.push_back(&weights);
    }
  }
  if (!to_wait.empty()) WaitForMounts(to_wait, deadline, hooks);
}

}  // namespace bt::launcher
