#include "checkpoint/uploader.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/snapshot.h"
#include "storage/commit_record.h"
#include "storage/destination.h"
#include "storage/json_bytes.h"
#include "storage/manifest.h"
#include "storage/paths.h"
#include "storage/subprocess.h"

namespace bt::checkpoint {

int64_t LeaseClockNs() {
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  return int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kFirstRetryS = 1;
constexpr double kMaxRetryS = 30;
constexpr std::chrono::seconds kProgressEvery{1};
constexpr int kIoPriorityLowestBestEffort = (2 << 13) | 7;  // IOPRIO_CLASS_BE, level 7

const char* KindName(UploaderEvent::Kind kind) {
  switch (kind) {
    case UploaderEvent::Kind::kProgress: return "progress";
    case UploaderEvent::Kind::kUploaded: return "uploaded";
    case UploaderEvent::Kind::kRetrying: return "retrying";
    case UploaderEvent::Kind::kModified: return "modified";
    case UploaderEvent::Kind::kLatestPublished: return "latest";
    case UploaderEvent::Kind::kCommitReady: return "commit-ready";
  }
  return "?";
}

std::optional<UploaderEvent::Kind> KindFromName(const std::string& name) {
  for (auto kind : {UploaderEvent::Kind::kProgress, UploaderEvent::Kind::kUploaded, UploaderEvent::Kind::kRetrying,
                    UploaderEvent::Kind::kModified, UploaderEvent::Kind::kLatestPublished,
                    UploaderEvent::Kind::kCommitReady}) {
    if (name == KindName(kind)) return kind;
  }
  return std::nullopt;
}

// An event field that may be absent, and may carry non-UTF-8 bytes (a checkpoint's name).
std::string OptionalBytes(const nlohmann::json& line, const char* key) {
  return line.contains(key) ? storage::BytesFromJson(line[key]) : std::string();
}

// One line of the uploader's stdout as an event; nothing for a line that is not one (a field
// of another type included: the uploader may be another build, or print something else).
std::optional<UploaderEvent> EventFromLine(const nlohmann::json& line) {
  if (!line.is_object() || !line.contains("event") || !line["event"].is_string()) return std::nullopt;
  auto kind = KindFromName(line["event"].get<std::string>());
  if (!kind) return std::nullopt;
  try {
    UploaderEvent event{*kind, line.value("seq", uint64_t(0)), OptionalBytes(line, "name"), OptionalBytes(line, "message")};
    event.bytes_done = line.value("done", uint64_t(0));
    event.bytes_total = line.value("total", uint64_t(0));
    event.attempt = line.value("attempt", 0);
    event.retry_in_s = line.value("retry_in_s", 0.0);
    return event;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

void Emit(const UploaderEvent& event) {
  nlohmann::json line = {{"event", KindName(event.kind)}, {"seq", event.seq}, {"name", storage::BytesToJson(event.name)}};
  if (!event.message.empty()) line["message"] = storage::BytesToJson(event.message);
  if (event.kind == UploaderEvent::Kind::kProgress) {
    line["done"] = event.bytes_done;
    line["total"] = event.bytes_total;
  }
  if (event.kind == UploaderEvent::Kind::kRetrying) {
    line["attempt"] = event.attempt;
    line["retry_in_s"] = event.retry_in_s;
  }
  std::cout << line.dump() << std::endl;
}

// The staged file is what the manifest describes only while it is as the snapshot saw it:
// a hard link follows a training that rewrites the file in place.
std::optional<std::string> ChangedFile(const Snapshot& snapshot) {
  for (const SnapshotFile& file : snapshot.files) {
    if (file.method != StagingMethod::kHardlink) continue;
    struct stat info {};
    const std::string path = snapshot.staging_dir + "/" + file.path;
    if (stat(path.c_str(), &info) != 0) return file.path + " (gone from staging)";
    int64_t mtime = int64_t(info.st_mtim.tv_sec) * 1'000'000'000 + info.st_mtim.tv_nsec;
    if (uint64_t(info.st_size) != file.size || mtime != file.mtime_ns) return file.path;
  }
  return std::nullopt;
}

// The destination adds the files as it uploads them.
storage::Manifest ManifestHeader(const Snapshot& snapshot, const UploaderConfig& config) {
  storage::Manifest manifest;
  manifest.job_id = config.job_id;
  manifest.node_rank = config.node_rank;
  manifest.name = snapshot.name;
  manifest.layout = snapshot.layout;
  manifest.is_directory = snapshot.is_directory;
  manifest.pointers = snapshot.pointers;
  manifest.created_unix = int64_t(std::time(nullptr));
  return manifest;
}

int64_t BootTimeNs() { return LeaseClockNs(); }

// The worker's requests, one JSON line each on stdin. A commit waits for its answer (go or
// drop) while later requests are kept, in order, for after it.
class Requests {
 public:
  // The next request, nullopt once stdin closed (the launcher is gone).
  std::optional<nlohmann::json> Next() {
    if (!kept_.empty()) {
      nlohmann::json request = std::move(kept_.front());
      kept_.pop_front();
      return request;
    }
    return Read();
  }

  enum class Answer { kGo, kDrop, kExpired };

  // What the launcher says of the commit of `seq`: write it now, drop it (also once stdin
  // closed), or a go whose lease (`until_ns`, CLOCK_BOOTTIME: it counts a freeze too) ran out
  // before it was read here.
  Answer AwaitAnswer(uint64_t seq) {
    while (auto request = Read()) {
      const nlohmann::json& value = *request;
      const bool answer = value.is_object() && value.value("op", "") == "answer" && value.value("seq", uint64_t(0)) == seq;
      if (!answer) {
        kept_.push_back(std::move(*request));
        continue;
      }
      if (!value.value("go", false)) return Answer::kDrop;
      lease_until_ns_ = value.value("until_ns", int64_t(0));
      return LeaseHeld() ? Answer::kGo : Answer::kExpired;
    }
    return Answer::kDrop;
  }

  // The last go's lease has not run out (a go without one holds until the next answer).
  bool LeaseHeld() const { return lease_until_ns_ == 0 || BootTimeNs() < lease_until_ns_; }

 private:
  static std::optional<nlohmann::json> Read() {
    std::string line;
    if (!std::getline(std::cin, line)) return std::nullopt;
    return nlohmann::json::parse(line, nullptr, false);
  }

  std::deque<nlohmann::json> kept_;
  int64_t lease_until_ns_ = 0;
};

class Worker {
 public:
  Worker(const UploaderConfig& config, Requests& requests) : config_(config), requests_(requests) {
    storage::DestinationSpec spec = storage::ParseDestination(config.destination_uri, "destination");
    // The launcher started this process with exactly rclone's environment.
    for (char** entry = environ; *entry != nullptr; ++entry) spec.rclone_environ.emplace_back(*entry);
    destination_ = storage::OpenDestination(spec);
    reads_back_ = spec.scheme != "spool";  // the sidecar owns what a spool was given
  }

  void Handle(const nlohmann::json& request) {
    const std::string op = request.at("op").get<std::string>();
    if (op == "upload") {
      std::ifstream file(storage::BytesFromJson(request.at("snapshot")));
      Upload(Snapshot::FromJson(nlohmann::json::parse(file)));
    } else if (op == "commit") {
      Commit(request.at("seq").get<uint64_t>(),
             storage::CommitRecord::FromText(storage::BytesFromJson(request.at("record")), "the commit request"),
             request.at("move_latest").get<bool>());
    }
  }

 private:
  void Upload(const Snapshot& snapshot) {
    RetryUntilDone(snapshot.seq, snapshot.name, [&] {
      if (auto changed = ChangedFile(snapshot)) return Modified(snapshot, *changed);
      auto last_progress = Clock::now();
      const std::string root = storage::VersionRoot(config_.job_id, config_.node_rank, snapshot.VersionId());
      if (AlreadyUploaded(root, snapshot.name)) return Emit({UploaderEvent::Kind::kUploaded, snapshot.seq, snapshot.name, ""});
      destination_->Upload(snapshot.Staged(), ManifestHeader(snapshot, config_), root, [&](uint64_t done, uint64_t total) {
        if (Clock::now() - last_progress < kProgressEvery && done < total) return;
        last_progress = Clock::now();
        Emit({UploaderEvent::Kind::kProgress, snapshot.seq, snapshot.name, "", done, total});
      });
      // Changed during the upload: the destination may hold a mix, which the manifest
      // does not describe. `latest` never names it; the agent re-stages the new version.
      if (auto changed = ChangedFile(snapshot)) return Modified(snapshot, *changed);
      Emit({UploaderEvent::Kind::kUploaded, snapshot.seq, snapshot.name, ""});
    });
  }

  // A version's manifest is written last, once every file is there: a version that has one
  // is whole, and may already be named by a commit, which must never see it change. Its id
  // is its files' fingerprint, so another uploader of the same files (this one's
  // predecessor before a crash, or a launcher frozen while a replacement took its slot on
  // the same volume: review finding F1) finds it here and writes nothing again.
  bool AlreadyUploaded(const std::string& root, const std::string& name) {
    if (!reads_back_) return false;
    const std::string path = root + "/" + storage::ManifestName(name);
    const std::optional<std::string> text = destination_->ReadText(path);
    if (!text) return false;
    storage::Manifest::FromJson(*text, path);  // unreadable: an error, retried, never overwritten
    return true;
  }

  void Modified(const Snapshot& snapshot, const std::string& path) {
    Emit({UploaderEvent::Kind::kModified, snapshot.seq, snapshot.name, path});
  }

  // Each try waits for the launcher's go first: one that lost the leadership meanwhile (cut
  // off, frozen past the heartbeat timeout while a spare took rank 0) drops it, and nothing
  // reaches the destination after a newer leader's commits (review 13, F3).
  void Commit(uint64_t seq, storage::CommitRecord record, bool move_latest) {
    record.job_id = config_.job_id;
    RetryUntilDone(seq, record.name, [&] {
      Emit({UploaderEvent::Kind::kCommitReady, seq, record.name, ""});
      const Requests::Answer answer = requests_.AwaitAnswer(seq);
      if (answer == Requests::Answer::kDrop) return;
      // Asked again after a pause: the launcher reads node 0's table again (review 16: the
      // commit was dropped without a word, and drains waited for it until their deadline).
      if (answer == Requests::Answer::kExpired) {
        throw std::runtime_error("the launcher's go came after its lease ran out (a freeze, or a slow store)");
      }
      // A freeze between the record and `latest` outlasting the lease keeps `latest` as it is.
      destination_->Commit(record, move_latest, [&] { return requests_.LeaseHeld(); });
      Emit({UploaderEvent::Kind::kLatestPublished, seq, record.name, ""});
    });
  }

  template <typename Step>
  void RetryUntilDone(uint64_t seq, const std::string& name, Step step) {
    double delay = kFirstRetryS;
    for (int attempt = 1;; ++attempt) {
      try {
        step();
        return;
      } catch (const std::exception& error) {  // storage::DestinationError, or a staged file unreadable
        UploaderEvent event{UploaderEvent::Kind::kRetrying, seq, name, error.what()};
        event.attempt = attempt;
        event.retry_in_s = delay;
        Emit(event);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(int64_t(delay * 1000)));
      delay = std::min(delay * 2, kMaxRetryS);
    }
  }

  UploaderConfig config_;
  Requests& requests_;
  std::unique_ptr<storage::Destination> destination_;
  bool reads_back_ = true;
};

}  // namespace

int RunUploadWorker(const UploaderConfig& config, pid_t parent) {
  // Dies with the launcher (a restarted launcher resumes from the journal instead of racing
  // an orphaned uploader); ignores the terminal's and the platform's stop signals, which are
  // the launcher's to act on.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent > 0 && getppid() != parent) return 0;
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::signal(signal_number, SIG_IGN);
  setpriority(PRIO_PROCESS, 0, 10);
  syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, kIoPriorityLowestBestEffort);
  Requests requests;
  std::unique_ptr<Worker> worker;
  try {
    worker = std::make_unique<Worker>(config, requests);
  } catch (const std::exception& error) {
    std::cerr << "bt-launch upload-worker: " << error.what() << std::endl;
    return 65;
  }
  while (auto request = requests.Next()) {
    try {
      worker->Handle(*request);
    } catch (const std::exception& error) {
      std::cerr << "bt-launch upload-worker: bad request: " << error.what() << std::endl;
    }
  }
  return 0;
}

UploaderProcess::UploaderProcess(const std::string& binary, const UploaderConfig& config,
                                 const std::vector<std::string>& environ) {
  int requests[2];
  int events[2];
  if (pipe2(requests, O_CLOEXEC) != 0 || pipe2(events, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("cannot create the uploader's pipes: ") + std::strerror(errno));
  }
  std::vector<std::string> argv = {binary,         "upload-worker", "--destination", config.destination_uri,
                                   "--job-id",     config.job_id,   "--node-rank",   std::to_string(config.node_rank),
                                   "--parent-pid", std::to_string(getpid())};
  std::vector<char*> args = storage::CStringArray(argv);
  std::vector<char*> envp = storage::CStringArray(environ);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, requests[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, events[1], STDOUT_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t empty;
  sigemptyset(&empty);
  sigset_t all;
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setpgroup(&attributes, 0);  // its own group: never signalled with the training's
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  int error = posix_spawn(&pid_, binary.c_str(), &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(requests[0]);
  close(events[1]);
  requests_fd_ = requests[1];
  events_fd_ = events[0];
  if (error != 0) {
    close(requests_fd_);
    close(events_fd_);
    throw std::runtime_error("cannot start the uploader " + binary + ": " + std::strerror(error));
  }
  fcntl(events_fd_, F_SETFL, fcntl(events_fd_, F_GETFL) | O_NONBLOCK);
}

UploaderProcess::~UploaderProcess() { Stop(0); }

void UploaderProcess::Send(const std::string& line) {
  if (requests_fd_ < 0) return;
  const std::string text = line + "\n";
  for (size_t written = 0; written < text.size();) {
    ssize_t n = write(requests_fd_, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // the worker is gone: its exit shows up on the event pipe
    written += size_t(n);
  }
}

void UploaderProcess::Upload(const std::string& snapshot_path) {
  Send(nlohmann::json{{"op", "upload"}, {"snapshot", storage::BytesToJson(snapshot_path)}}.dump());
}

void UploaderProcess::Commit(uint64_t seq, const storage::CommitRecord& record, bool move_latest) {
  Send(nlohmann::json{{"op", "commit"}, {"seq", seq}, {"record", storage::BytesToJson(record.ToText())}, {"move_latest", move_latest}}.dump());
}

void UploaderProcess::AnswerCommit(uint64_t seq, bool go, std::chrono::milliseconds lease, int64_t asked_ns) {
  nlohmann::json answer = {{"op", "answer"}, {"seq", seq}, {"go", go}};
  if (lease.count() > 0) answer["until_ns"] = (asked_ns > 0 ? asked_ns : BootTimeNs()) + int64_t(lease.count()) * 1'000'000;
  Send(answer.dump());
}

std::vector<UploaderEvent> UploaderProcess::ReadEvents(bool& exited) {
  exited = false;
  char chunk[8192];
  while (events_fd_ >= 0) {
    ssize_t got = read(events_fd_, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;  // EAGAIN: nothing more for now
    if (got == 0) {
      exited = true;
      break;
    }
    buffer_.append(chunk, size_t(got));
  }
  std::vector<UploaderEvent> events;
  for (size_t newline; (newline = buffer_.find('\n')) != std::string::npos;) {
    nlohmann::json line = nlohmann::json::parse(buffer_.substr(0, newline), nullptr, false);
    buffer_.erase(0, newline + 1);
    if (auto event = EventFromLine(line)) events.push_back(std::move(*event));
  }
  return events;
}

void UploaderProcess::Stop(int wait_ms) {
  if (requests_fd_ >= 0) {
    close(requests_fd_);
    requests_fd_ = -1;
  }
  if (pid_ > 0) {
    auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
    while (waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {
        kill(-pid_, SIGKILL);  // its whole group: an rclone it runs goes with it
        waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }
  if (events_fd_ >= 0) {
    close(events_fd_);
    events_fd_ = -1;
  }
}

}  // namespace bt::checkpoint
