#include "checkpoint/agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "checkpoint/journal.h"
#include "checkpoint/layout.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/tree.h"
#include "checkpoint/uploader.h"
#include "checkpoint/watcher.h"
#include "storage/bounded_call.h"
#include "storage/commit_record.h"
#include "storage/durable_file.h"
#include "storage/paths.h"

namespace bt::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

// Node 0's declaration reaches a follower whose shards of that name may still be appearing
// (there is no barrier after a DeepSpeed or HF save): a name absent this long has no part here.
constexpr std::chrono::seconds kAbsentPartGrace{2};
// A follower's part of a save resumed after a restart is that save only if nothing in it was
// written after node 0's part was complete, give or take this: the store's round trips
// between node 0's declaration and the follower's reading of it, and mtime granularity. Far
// less than the time between two saves, or a later save written over the part would pass.
constexpr int64_t kResumedPartSlackNs = 500'000'000;
constexpr std::chrono::milliseconds kBoardInterval{250};
constexpr std::chrono::milliseconds kMinEvaluationGap{5};
constexpr std::chrono::seconds kProgressLogEvery{5};
constexpr std::chrono::seconds kRetryLogEvery{30};
constexpr std::chrono::seconds kUploaderRestartGap{5};
constexpr int kUploaderStopWaitMs = 2000;
constexpr std::chrono::seconds kCycleChangeWait{10};
constexpr std::chrono::seconds kHandoffRetryGap{5};

std::chrono::milliseconds Millis(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

int64_t WallNanos() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}


int64_t NewestMtimeNs(const Candidate& candidate) {
  int64_t newest = 0;
  for (const FileEntry& file : candidate.files) newest = std::max(newest, file.mtime_ns);
  return newest;
}

const char* MethodSummary(const Snapshot& snapshot) {
  bool linked = false;
  bool reflinked = false;
  for (const auto& file : snapshot.files) {
    linked |= file.method == StagingMethod::kHardlink;
    reflinked |= file.method == StagingMethod::kReflink;
  }
  return reflinked ? "reflinks" : linked ? "hard links" : "copies";
}

}  // namespace

std::string StateDirectory(const std::string& checkpoint_dir) { return checkpoint_dir + "/.bt-checkpoint"; }

class CheckpointAgent::Impl {
 public:
  explicit Impl(AgentOptions options)
      : options_(std::move(options)),
        state_dir_(StateDirectory(options_.checkpoint_dir)),
        staging_root_(state_dir_ + "/staging"),
        journal_((storage::MakeDirectories(staging_root_), state_dir_ + "/journal.jsonl")) {
    journal_.SetScope(options_.job_id, options_.destination.uri);
    current_cycle_ = options_.incarnation;
    applied_cycle_ = current_cycle_;
    if (options_.commit_gate) options_.commit_gate->EnterCycle(current_cycle_);
    load_exclusion_ = LoadExclusion();
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
    StartUploader();
    LeaveWhatWasOnDiskAlone();
    RecordStart();
    Resume();
    watcher_ = std::make_unique<TreeWatcher>(options_.checkpoint_dir, options_.settings.watch, options_.settings.marker);
    if (watcher_->polling()) {
      spdlog::info("checkpoints: scanning {} every {} s ({})", options_.checkpoint_dir, options_.settings.poll_interval_s,
                   watcher_->polling_reason());
    }
    spdlog::info("checkpoints: watching {} ({}), uploading to {} as {}/rank-{}/", options_.checkpoint_dir,
                 watcher_->polling() ? "polling" : "inotify", options_.destination.uri, options_.job_id,
                 options_.node_rank);
    thread_ = std::thread([this] { RunGuarded(); });
  }

  ~Impl() {
    if (thread_.joinable()) Drain(false, Clock::now());
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  DrainResult Drain(bool training_succeeded, Clock::time_point deadline, LeaderLoss leader_loss = {}) {
    {
      std::lock_guard lock(mutex_);
      drain_deadline_ = deadline;
      leader_loss_ = std::move(leader_loss);
      training_succeeded_ = training_succeeded;
      training_ended_ns_ = WallNanos();
    }
    uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = write(wake_fd_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    return result_;
  }

  DrainResult HandOver(Clock::time_point deadline) {
    handing_over_ = true;
    return Drain(false, deadline);
  }

  // Waits (a bounded time) until the agent's thread took the cycle: the last cycle's parts
  // must be judged as that cycle's before the next training writes anything.
  void BeginCycle(int64_t cycle) {
    std::unique_lock lock(mutex_);
    if (cycle <= applied_cycle_ || !running_) return;
    requested_cycle_ = cycle;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = write(wake_fd_, &one, sizeof one);
    cycle_applied_.wait_for(lock, kCycleChangeWait, [&] { return applied_cycle_ >= cycle || !running_; });
  }

  void RestartDecided(int64_t cycle) {
    std::lock_guard lock(mutex_);
    sealed_through_ = std::max(sealed_through_, cycle - 1);
  }

  CheckpointStats Stats() const {
    CheckpointStats stats;
    stats.committed = committed_parts_.load(std::memory_order_relaxed);
    stats.failed = abandoned_parts_.load(std::memory_order_relaxed);
    stats.in_flight = in_flight_parts_.load(std::memory_order_relaxed);
    stats.bytes_uploaded = bytes_uploaded_.load(std::memory_order_relaxed);
    stats.upload_seconds = double(upload_ns_.load(std::memory_order_relaxed)) / 1e9;
    return stats;
  }

 private:
  enum class Stage { kQueued, kUploaded, kCommitted };
  struct Version {
    uint64_t seq = 0;
    std::string name;
    std::string version_id;  // Snapshot::VersionId: where it is uploaded
    int64_t cycle = 0;       // the restart cycle whose training wrote it (a resumed one: this launcher's first)
    // The declaration it answers: node 0's own, or (a follower) the one it was reported for.
    std::optional<uint64_t> declaration;
    std::string answers;  // a follower's: the save it answers (Snapshot::answers), "" if none yet
    std::string fingerprint;  // of the files it was taken from (Snapshot::fingerprint)
    // Without a board: a save of the job's run before this launcher started, committed under
    // its own name only (LeaveWhatWasOnDiskAlone).
    bool from_last_run = false;
    bool moves_latest = false;  // its commit was asked to move `latest` (SendCommit)
    int64_t newest_mtime_ns = 0;  // node 0's: when its part was complete (a resumed declaration says)
    std::string snapshot_path;
    std::string staging_dir;
    Stage stage = Stage::kQueued;
    uint64_t bytes_total = 0;
    uint64_t bytes_done = 0;
    std::string last_error;
    Clock::time_point queued_at;
    Clock::time_point last_progress_log;
    Clock::time_point last_retry_log;
    storage::CommitRecord commit;  // what Commit sends (again, to a restarted uploader)
  };

  bool is_leader() const { return options_.node_rank == 0; }
  // Where version `seq` is staged; RemoveStaleStaging reads the seq back from the name.
  std::string StagingDir(uint64_t seq) const { return staging_root_ + "/" + std::to_string(seq); }

  void StartUploader() {
    UploaderConfig config{options_.destination.uri, options_.job_id, options_.node_rank};
    uploader_ = std::make_unique<UploaderProcess>(options_.uploader_binary, config, UploaderEnvironment());
  }

  // rclone's environment with TMPDIR in the job's state directory: the temporaries of an
  // uploader (or rclone) killed mid-write stay inside the job, and are removed here before
  // each start, instead of accumulating in /tmp.
  std::vector<std::string> UploaderEnvironment() {
    const std::string scratch = state_dir_ + "/tmp";
    storage::RemoveTree(scratch);
    storage::MakeDirectories(scratch);
    std::vector<std::string> environ;
    for (const std::string& entry : options_.uploader_environ) {
      if (!entry.starts_with("TMPDIR=")) environ.push_back(entry);
    }
    environ.push_back("TMPDIR=" + scratch);
    return environ;
  }

  // A checkpoint on disk before this launcher started, on a volume a launcher of this job
  // started on before (a platform retry, a replaced pod), was written by the job's last run,
  // and the training resumes from `latest`, read before this agent started: committing that
  // save as `latest` now would move `latest` past what the training resumed from, and the
  // training's own saves would move it back (review 4, F3).
  // With other nodes, it is never a part of a save declared from now on: the cycle numbers
  // start again, so an old part of a name would answer a new save of it and mix two saves in
  // one commit (soak seeds 17, 73). Its present state counts as handled; a save of it written
  // again (new files, new fingerprint) is new. What the journal resumed is settled by
  // Resume() (DeclareResumed, AnswerResumed), which runs after this.
  // Without a board, this node's save is whole: it is uploaded and committed under its own
  // name (it may be the only copy left), and `latest` stays where the job resumed.
  // A volume no launcher of this job started on is the job's first: what it holds is uploaded.
  void LeaveWhatWasOnDiskAlone() {
    if (!options_.resume_point_read || !journal_.StartedBefore()) return;
    size_t left = 0;
    for (const Candidate& candidate : CandidatesOnDisk()) {
      const std::string fingerprint = Fingerprint(candidate);
      if (journal_.Reached(candidate.name, fingerprint, HandoffState::kCommitted)) continue;
      ++left;
      if (options_.board) {
        handled_[candidate.name] = fingerprint;
      } else {
        last_run_on_disk_[candidate.name] = fingerprint;
      }
    }
    if (left == 0) return;
    if (options_.board) {
      spdlog::info("checkpoints: {} checkpoint(s) on disk from before this launcher started are not committed: the job "
                   "resumes from `latest` and saves them anew", left);
      return;
    }
    spdlog::info("checkpoints: {} checkpoint(s) on disk from before this launcher started are committed under their own "
                 "names once complete; `latest` stays what the job resumed from", left);
  }

  // A start is journaled so that a retry of this job tells the last run's saves from a
  // first start's (LeaveWhatWasOnDiskAlone). A full disk refuses it: it is tried again at
  // every evaluation until written (review 5, R5-3), warned about once.
  void RecordStart() {
    if (start_recorded_) return;
    try {
      journal_.RecordStart();
      start_recorded_ = true;
    } catch (const std::runtime_error& error) {
      if (start_record_warned_) return;
      start_record_warned_ = true;
      spdlog::warn("checkpoints: cannot journal this launcher's start ({}); tried again until there is room: a retry "
                   "before then would take the checkpoints on disk for a first start's", error.what());
    }
  }

  // What a killed launcher left: snapshots still to upload, uploads still to commit, and
  // staging directories that no record needs any more. With other nodes, the commits still
  // open are settled before any training starts (DeclareResumed, AnswerResumed).
  void Resume() {
    std::set<std::string> keep;
    std::map<uint64_t, Snapshot> resumed;
    for (const JournalEntry& entry : journal_.Unfinished()) {
      // A version is staged in StagingDir(seq) (Handoff), whatever directory the record
      // names: the volume may be mounted elsewhere now, and a record naming a directory
      // outside would have it uploaded, then removed as staging.
      Snapshot snapshot = *entry.snapshot;
      snapshot.staging_dir = StagingDir(entry.seq);
      if (entry.state == HandoffState::kSnapshotted && access(snapshot.staging_dir.c_str(), F_OK) != 0) {
        journal_.Record(entry.seq, entry.name, HandoffState::kAbandoned, "its staging directory is gone");
        continue;
      }
      Version version;
      version.seq = entry.seq;
      version.name = entry.name;
      version.version_id = snapshot.VersionId();
      version.cycle = current_cycle_;
      version.answers = snapshot.answers;
      version.fingerprint = snapshot.fingerprint;
      version.from_last_run = !options_.board && options_.resume_point_read;
      version.newest_mtime_ns = snapshot.NewestMtimeNs();
      version.staging_dir = snapshot.staging_dir;
      version.snapshot_path = snapshot.staging_dir + ".snapshot.json";
      version.bytes_total = snapshot.total_bytes;
      version.stage = entry.state == HandoffState::kSnapshotted ? Stage::kQueued : Stage::kUploaded;
      version.queued_at = Clock::now();
      handled_[entry.name] = snapshot.fingerprint;
      keep.insert(std::to_string(entry.seq));
      spdlog::info("checkpoints: resuming {} from the journal ({})", entry.name, HandoffStateName(entry.state));
      versions_[entry.seq] = std::move(version);
      resumed.emplace(entry.seq, std::move(snapshot));
    }
    RemoveStaleStaging(keep);
    if (options_.board && is_leader() && options_.resume_point_read) return AbandonResumed();
    if (options_.board && is_leader()) DropReplacedResumed(resumed);
    for (const auto& [seq, version] : versions_) {
      if (version.stage != Stage::kQueued) continue;
      WriteSnapshotFile(resumed.at(seq), version.snapshot_path);
      uploader_->Upload(version.snapshot_path);
    }
    if (!options_.board) return;
    if (is_leader()) return DeclareResumed();
    AnswerResumed();
  }

  // Node 0: of each name only the newest version not committed yet is declared again, and not
  // if the training has since written that checkpoint again (the followers' parts of this
  // save are then likely written over too, and the later save replaces it).
  void DropReplacedResumed(const std::map<uint64_t, Snapshot>& resumed) {
    if (versions_.empty()) return;  // the usual start: no scan
    std::map<std::string, uint64_t> newest;
    for (const auto& [seq, version] : versions_) newest[version.name] = seq;
    std::map<std::string, Candidate> on_disk;
    for (Candidate& candidate : CandidatesOnDisk()) {
      on_disk.emplace(candidate.name, std::move(candidate));
    }
    for (auto it = versions_.begin(); it != versions_.end();) {
      Version& version = it->second;
      auto disk = on_disk.find(version.name);
      std::string replaced;
      if (newest[version.name] != version.seq) {
        replaced = "superseded by a later save of " + version.name;
      } else if (disk != on_disk.end() && !resumed.at(version.seq).Holds(disk->second)) {
        replaced = version.name + " was written again on disk before this save was committed";
      }
      if (replaced.empty()) {
        ++it;
        continue;
      }
      spdlog::info("checkpoints: not committing the save of {} resumed from the journal: {}", version.name, replaced);
      journal_.Record(version.seq, version.name, HandoffState::kAbandoned, replaced);
      RemoveStaging(version);
      it = versions_.erase(it);
    }
  }

  void DeclareResumed() {
    const int64_t now_ns = WallNanos();
    BoardCall([&] {
      for (auto& [seq, version] : versions_) {
        const int64_t age_ns = std::max<int64_t>(0, now_ns - version.newest_mtime_ns);
        version.declaration = options_.board->Declare({0, version.name, version.version_id, version.cycle, age_ns});
      }
      options_.board->FinishResumedDeclarations();
    });
  }

  // Node 0, when the launcher read the job's resume point (`latest`) before this agent
  // started (AgentOptions::resume_point_read): what the last run left uncommitted is
  // abandoned, never committed. Every node's training starts from that resume point; a save
  // of the last run committed now would make `latest` newer than what the training resumes
  // from, and the training's own saves would then move `latest` back (soak finding F4).
  // Nothing declares these saves, so the followers drop their parts of them (AnswerResumed).
  void AbandonResumed() {
    for (const auto& [seq, version] : versions_) {
      const std::string why = "the job resumes from the `latest` committed before this launcher started";
      spdlog::info("checkpoints: not committing the save of {} resumed from the journal: {}", version.name, why);
      journal_.Record(seq, version.name, HandoffState::kAbandoned, why);
      RemoveStaging(version);
    }
    versions_.clear();
    BoardCall([&] { options_.board->FinishResumedDeclarations(); });
  }

  // A follower, before its training starts: node 0's resumed declarations are answered with
  // the part journaled for that very save; else with the part on disk as the last run left
  // it (journaled already, or judged now), if nothing in it was written after node 0's part
  // was complete; otherwise the part is lost (a later save was written over it) and node 0
  // commits nothing of that save. The launcher waited for node 0 to declare them.
  void AnswerResumed() {
    bool declared = false;
    BoardCall([&] {
      declared = options_.board->ResumedDeclared();
      if (!declared) return;
      for (const CommitBoard::Declaration& declaration : options_.board->DeclaredSince(0)) {
        Register(declaration);
        if (!declaration.resumed_age_ns || !unanswered_.contains(declaration.number)) continue;
        if (options_.board->GetOutcome(declaration.number) != CommitBoard::Outcome::kPending) {
          unanswered_.erase(declaration.number);  // settled already
        }
      }
    });
    if (!declared) {
      spdlog::warn("checkpoints: node 0 did not declare the saves it resumed in time; they are answered as they come");
      return;
    }
    const uint64_t first_new_seq = journal_.NextSeq();
    AnswerDeclarations();  // the parts journaled for those very saves
    BindUntouchedResumed();
    Evaluate(false);
    for (const auto& [number, declaration] : std::map(unanswered_)) {
      if (!declaration.resumed_age_ns || BoundVersion(number) != nullptr) continue;
      spdlog::warn("checkpoints: this node's part of the save of {} that node 0 resumed is not complete on disk; "
                   "that save cannot be committed", declaration.name);
      AnswerWithout(number, PartKind::kLost);
    }
    // What the journal held and no resumed declaration took answers nothing any more: a save
    // node 0 committed, replaced or abandoned before or at the restart (a retried job
    // commits nothing of the last run), or a part of a name it declared again. Kept, it would
    // answer a later save of its name (soak seed 17: a part of the last run in a new commit).
    for (auto it = versions_.begin(); it != versions_.end();) {
      const Version& version = it->second;
      const bool left = it->first < first_new_seq && !version.declaration &&
                        (options_.resume_point_read || !version.answers.empty() || declared_.contains(version.name));
      if (!left) {
        ++it;
        continue;
      }
      spdlog::info("checkpoints: {}: this node's upload from before the restart answers no save node 0 declared "
                   "again (committed or replaced before the restart)", version.name);
      it = versions_.erase(it);
    }
  }

  // A resumed declaration with no part journaled for it takes a journaled part of no save in
  // particular (complete on its own, bound only in memory before) when the disk still holds
  // exactly that part and it was written before node 0's part was complete.
  void BindUntouchedResumed() {
    std::map<std::string, std::string> on_disk;  // name → fingerprint
    bool scanned = false;
    for (const auto& [number, declaration] : std::map(unanswered_)) {
      if (!declaration.resumed_age_ns || BoundVersion(number) != nullptr) continue;
      if (!scanned) {
        for (const Candidate& candidate : CandidatesOnDisk()) {
          on_disk[candidate.name] = Fingerprint(candidate);
        }
        scanned = true;
      }
      for (auto& [seq, version] : versions_) {
        if (version.name != declaration.name || version.declaration || !version.answers.empty()) continue;
        if (on_disk[version.name] != version.fingerprint) continue;
        if (!WrittenBeforeResumedSave(version.newest_mtime_ns, declaration)) continue;
        BindTo(version, declaration);
        break;
      }
    }
    AnswerDeclarations();  // those already uploaded
  }

  std::vector<Candidate> CandidatesOnDisk() const {
    return FindCandidates(ScanCheckpoints(), options_.checkpoint_dir,
                          options_.settings.marker);
  }

  // Nothing of a resumed save's part here may be newer than node 0's part, give or take.
  bool WrittenBeforeResumedSave(int64_t newest_write_ns, const CommitBoard::Declaration& declaration) const {
    return newest_write_ns <= resumed_read_ns_ - *declaration.resumed_age_ns + kResumedPartSlackNs;
  }

  void RemoveStaleStaging(const std::set<std::string>& keep) {
    DIR* dir = opendir(staging_root_.c_str());
    if (dir == nullptr) return;
    std::vector<std::string> stale;
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      std::string seq = name.substr(0, name.find('.'));
      if (!keep.contains(seq)) stale.push_back(staging_root_ + "/" + name);
    }
    closedir(dir);
    for (const auto& path : stale) storage::RemoveTree(path);
  }

  // An exception leaving a std::thread calls std::terminate: the launcher (PID 1) would
  // abort and take the supervision of the training with it. Whatever escapes the loop stops
  // the checkpoint handoff only, and the drain reports it.
  void RunGuarded() {
    try {
      Run();
    } catch (const std::exception& error) {
      StopOnError(error.what());
    } catch (...) {
      StopOnError("an unknown error");
    }
    std::lock_guard lock(mutex_);
    running_ = false;
    cycle_applied_.notify_all();
  }

  std::optional<int64_t> TakeRequestedCycle() {
    std::lock_guard lock(mutex_);
    return std::exchange(requested_cycle_, std::nullopt);
  }

  // The last cycle's training is stopped and the next one's has not started: what the last
  // cycle left is judged now, as that cycle's, and (a follower) its open saves are answered
  // from it. Node 0's rule learns that the job moved on.
  void OnNewCycle(int64_t cycle) {
    if (cycle > current_cycle_) {
      Evaluate(false);
      if (options_.commit_gate) options_.commit_gate->EnterCycle(cycle);
      if (options_.board && is_leader()) BoardCall([&] { options_.board->Restart(cycle); });
      if (options_.board && !is_leader()) {
        SyncBoard();
        AnswerEarlierCycles();
      }
      spdlog::info("checkpoints: cycle {} starts; saves of cycle {} are answered with what it left", cycle, current_cycle_);
      current_cycle_ = cycle;
    }
    std::lock_guard lock(mutex_);
    applied_cycle_ = std::max(applied_cycle_, cycle);
    cycle_applied_.notify_all();
  }

  // A follower, between two cycles: each open save with no part of its cycle here is
  // answered while the disk still shows what its cycle left: no part when its name is absent,
  // lost when a part of it stands there that never became complete.
  void AnswerEarlierCycles() {
    for (const auto& [number, declaration] : std::map(unanswered_)) {
      if (BoundVersion(number) != nullptr || PairableVersion(declaration) != nullptr) continue;  // answered once uploaded
      struct stat path {};
      const bool present = lstat(storage::JoinPath(options_.checkpoint_dir, declaration.name).c_str(), &path) == 0;
      if (!present) {
        AnswerWithout(number, AbsentPart(declaration.name), declaration.cycle);
        continue;
      }
      spdlog::warn("checkpoints: this node's part of {} (cycle {}) was not complete when the cycle ended; that save "
                   "cannot be committed", declaration.name, declaration.cycle);
      AnswerWithout(number, PartKind::kLost, declaration.cycle);
    }
  }

  // BT_LOAD_CHECKPOINT_DIR's part of this node, relative to the checkpoint root, when it lies
  // inside it: what the launcher loads there is never a checkpoint of this run.
  std::string LoadExclusion() const {
    if (options_.load_dir.empty()) return "";
    std::error_code error;
    const std::filesystem::path root = std::filesystem::weakly_canonical(options_.checkpoint_dir, error);
    const std::filesystem::path load = std::filesystem::weakly_canonical(options_.load_dir, error);
    if (error) return "";
    std::string relative = load.lexically_relative(root).generic_string();
    if (relative.empty() || relative.starts_with("..")) return "";
    // The same folder: loads go to its rank-<r>/, the rest is the training's.
    if (relative == ".") return "rank-" + std::to_string(options_.node_rank);
    return relative;
  }

  DirectoryTree ScanCheckpoints() const {
    DirectoryTree tree = ScanTree(options_.checkpoint_dir, options_.settings.marker);
    if (load_exclusion_.empty()) return tree;
    auto loaded = [&](const std::string& path) {
      return path == load_exclusion_ || path.starts_with(load_exclusion_ + "/");
    };
    std::erase_if(tree.files, [&](const FileEntry& file) { return loaded(file.path); });
    std::erase_if(tree.directories, loaded);
    std::erase_if(tree.symlinks, loaded);
    return tree;
  }

  void StopOnError(const std::string& what) {
    spdlog::error("checkpoints: the checkpoint handoff stopped on an internal error ({}); the training goes on, "
                  "but no further checkpoint is uploaded by this launcher", what);
    result_ = DrainResult{false, "the checkpoint handoff stopped on an internal error: " + what};
  }

  void Run() {
    bool draining = false;
    bool declarations_closed = false;
    auto last_evaluation = Clock::time_point{};
    auto evaluation_gap = kMinEvaluationGap;
    auto next_board = Clock::now();
    auto last_drain_log = Clock::now();
    bool want_evaluation = true;
    // A file that can end a checkpoint is judged after the shortest pause, not the pacing
    // that keeps a burst of writes from costing more than a third of a core.
    bool last_write_seen = false;
    auto Pause = [&] { return last_write_seen ? kMinEvaluationGap : evaluation_gap; };
    while (true) {
      CountInFlight();
      auto now = Clock::now();
      auto scan_every = Millis(watcher_->polling() ? options_.settings.poll_interval_s : options_.settings.scan_interval_s);
      auto next = std::min(last_evaluation + scan_every, options_.board ? next_board : Clock::time_point::max());
      if (want_evaluation) next = std::min(next, last_evaluation + Pause());
      if (draining) next = std::min(next, now + kBoardInterval);
      next = std::min(next, NextHandoffRetry());
      // Rounded up: rounded down, the last fraction of a millisecond before a due evaluation
      // became a run of poll(0) calls, a busy loop beside the training.
      int timeout = int(std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(next - now).count()));
      pollfd fds[3] = {{wake_fd_, POLLIN, 0}, {uploader_ ? uploader_->fd() : -1, POLLIN, 0}, {watcher_->fd(), POLLIN, 0}};
      poll(fds, 3, timeout);
      if (fds[0].revents & POLLIN) {
        uint64_t count;
        [[maybe_unused]] ssize_t ignored = read(wake_fd_, &count, sizeof count);
      }
      if (!draining && DrainRequested()) {
        draining = true;
        want_evaluation = true;
        last_evaluation = {};
        spdlog::info("checkpoints: the training has ended; committing what is complete (drain deadline in {} s)",
                     std::chrono::duration_cast<std::chrono::seconds>(drain_deadline_ - Clock::now()).count());
        if (options_.board && is_leader() && !handing_over_) BoardCall([&] { options_.board->StartDrain(); });
      }
      if ((fds[2].revents & POLLIN) && watcher_->ReadEvents()) {
        want_evaluation = true;
        last_write_seen = last_write_seen || watcher_->saw_last_write();
      }
      if (fds[1].revents & (POLLIN | POLLHUP)) HandleUploaderEvents();
      if (auto cycle = TakeRequestedCycle()) OnNewCycle(*cycle);
      now = Clock::now();
      if (now >= NextHandoffRetry()) want_evaluation = true;
      bool scan_due = now >= last_evaluation + scan_every;
      // Handing over, nothing new is handed off: its cycles are sealed, no save of them commits.
      if (!handing_over_ && (scan_due || (want_evaluation && now >= last_evaluation + Pause()))) {
        const Clock::duration judging = Evaluate(draining);
        PostponeRetriesNotTaken();
        evaluation_gap = std::max<std::chrono::milliseconds>(kMinEvaluationGap,
                                                              std::chrono::duration_cast<std::chrono::milliseconds>(2 * judging));
        last_evaluation = Clock::now();
        want_evaluation = false;
        last_write_seen = false;
      }
      if (options_.board && Clock::now() >= next_board) {
        // Not while a complete checkpoint still waits to be handed off (a full disk): node 0
        // would declare it after the followers left, and none could answer it (soak seed 166).
        if (draining && is_leader() && !handing_over_ && !declarations_closed && failed_handoffs_.empty()) {
          declarations_closed = true;
          BoardCall([&] { options_.board->CloseDeclarations(); });
        }
        if (SyncBoard()) want_evaluation = true;
        next_board = Clock::now() + kBoardInterval;
      }
      if (!options_.board) CommitLocally();
      if (!uploader_) RestartUploaderIfDue();
      if (!draining) continue;
      if (options_.board) DropSealedOnDrain();
      if (LeaderLost() && OwnUploadsDone()) break;
      if (Settled(declarations_closed)) break;
      if (Clock::now() >= drain_deadline_) break;
      if (Clock::now() - last_drain_log >= kProgressLogEvery) {
        LogDrainProgress();
        last_drain_log = Clock::now();
      }
    }
    result_ = Summarize();
    if (uploader_) uploader_->Stop(kUploaderStopWaitMs);
  }

  // The job ends (a SIGTERM while a restart's barrier waited) after a restart's decision
  // sealed a cycle: no save of that cycle can commit any more, unless node 0 had begun its
  // commit before the decision (then it is publishing, and is waited for). Node 0 abandons
  // the rest; a follower drops a part still uploading (no commit can take it: node 0 began
  // none without it). Without this the drain waited drain_timeout_s for them and failed
  // (review 6, R6-4).
  void DropSealedOnDrain() {
    for (auto it = versions_.begin(); it != versions_.end();) {
      const Version& version = it->second;
      const bool sealed = version.stage != Stage::kCommitted && !publishing_.contains(it->first) && Sealed(version.cycle);
      if (!sealed || (!is_leader() && version.stage != Stage::kQueued)) {
        ++it;
        continue;
      }
      const std::string why = "a restart's decision sealed cycle " + std::to_string(version.cycle) +
                              " and the job ended before the next cycle: no save of it commits";
      if (is_leader() && version.declaration) {
        spdlog::info("checkpoints: not committing {}: {}", version.name, why);
        JournalRecord(version.seq, version.name, HandoffState::kAbandoned, why);
        BoardCall([&] { options_.board->SetOutcome(*version.declaration, CommitBoard::Outcome::kAbandoned); });
      } else {
        JournalRecord(version.seq, version.name, HandoffState::kAbandoned, why);
      }
      RemoveStaging(version);
      it = versions_.erase(it);
    }
  }

  bool DrainRequested() {
    std::lock_guard lock(mutex_);
    return training_ended_ns_.has_value();
  }

  // One pass over the tree: every candidate whose current version has not been handed off
  // yet is judged, and handed off when complete. Returns the time spent judging: what a
  // burst of writes would repeat, and what paces the next pass. Snapshots are left out, or
  // a checkpoint saved right after a handoff would wait twice that handoff's time.
  Clock::duration Evaluate(bool draining) {
    const auto started = Clock::now();
    RecordStart();
    Clock::duration handing_off{};
    const std::string& root = options_.checkpoint_dir;
    DirectoryTree tree = ScanCheckpoints();
    WarnAboutSymlinks(tree);
    std::vector<Candidate> candidates = FindCandidates(tree, root, options_.settings.marker);
    std::optional<std::set<std::string>> writers;
    JudgeContext context;
    context.now_ns = WallNanos();
    context.quiet_period_ns = int64_t(options_.settings.quiet_period_s * 1e9);
    if (draining) {
      std::lock_guard lock(mutex_);
      context.training_ended_ns = training_ended_ns_;
      context.training_succeeded = training_succeeded_;
    }
    std::set<std::string> present;
    std::map<std::string, std::string> fingerprints;  // of every candidate on disk now
    for (const Candidate& candidate : candidates) {
      present.insert(candidate.name);
      const std::string fingerprint = Fingerprint(candidate);
      fingerprints[candidate.name] = fingerprint;
      auto handled = handled_.find(candidate.name);
      if (handled != handled_.end() && handled->second == fingerprint) continue;
      if (journal_.Reached(candidate.name, fingerprint, HandoffState::kSnapshotted)) {
        handled_[candidate.name] = fingerprint;
        continue;
      }
      if (journal_.HoldsMoreThan(candidate)) continue;  // being deleted: nothing new to upload
      if (WaitingToRetry(candidate.name, fingerprint)) continue;
      if (auto owner = journal_.CommittedByAnotherJob(candidate.name, fingerprint)) {
        handled_[candidate.name] = fingerprint;
        spdlog::info("checkpoints: {} was committed by job {} from this volume; not uploaded again as {}'s", candidate.name,
                     *owner, options_.job_id);
        continue;
      }
      context.declared_by_leader = AwaitedDeclaration(candidate.name) != nullptr;
      if (!candidate.marked && !context.declared_by_leader && candidate.layout != Layout::kQuiet) {
        if (draining) NoteIncomplete(candidate.name, "waiting for " + candidate.waiting_for);
        continue;
      }
      if (!writers) writers = OpenWriters(root);
      Verdict verdict = Judge(candidate, root, *writers, context);
      if (!verdict.complete) {
        if (draining) NoteIncomplete(candidate.name, verdict.reason);
        continue;
      }
      const auto handoff_started = Clock::now();
      Handoff(candidate, verdict, fingerprint);
      handing_off += Clock::now() - handoff_started;
    }
    ForgetFailedHandoffsOfRemoved(present);
    if (draining) AnswerSavesWithNoNewPart(fingerprints);
    std::map<uint64_t, PartKind> without_part;
    for (const auto& [number, declaration] : unanswered_) {
      const bool taken = BoundVersion(number) != nullptr || PairableVersion(declaration) != nullptr;
      if (!taken && declaration.cycle < current_cycle_) {
        // A save of an earlier cycle with no part of that cycle here: what is on disk now is
        // this cycle's, so the part is lost (AnswerEarlierCycles answered what it could).
        without_part[number] = PartKind::kLost;
        continue;
      }
      if (present.contains(declaration.name) || taken) {
        absent_since_.erase(number);
        continue;
      }
      if (declaration.resumed_age_ns) {
        without_part[number] = AbsentResumedPart(declaration);
        continue;
      }
      auto [it, inserted] = absent_since_.emplace(number, Clock::now());
      if (Clock::now() - it->second >= kAbsentPartGrace || draining) without_part[number] = AbsentPart(declaration.name);
    }
    for (const auto& [number, answer] : without_part) AnswerWithout(number, answer);
    return Clock::now() - started - handing_off;
  }

  // A follower at its drain (its training has ended: its files are final): a save of a name
  // whose part here is unchanged since the version that answered an earlier save of that
  // name has no part of this node, and never will: answered lost. Node 0 wrote its own part
  // again (a file rewritten after the part was complete) and declared a second save; this
  // node's part, written once, had answered the first, nothing else ever would, and both
  // drains waited drain_timeout_s (review 12). Never answered with that earlier part: node
  // 0's new part with this node's old one would be a checkpoint no training wrote. Not while
  // the training runs: the part may be being written again for that very save.
  void AnswerSavesWithNoNewPart(const std::map<std::string, std::string>& fingerprints) {
    if (!options_.board || is_leader()) return;
    for (const auto& [number, declaration] : std::map(unanswered_)) {
      if (declaration.cycle != current_cycle_ || BoundVersion(number) != nullptr) continue;
      auto on_disk = fingerprints.find(declaration.name);
      if (on_disk == fingerprints.end() || PairableVersion(declaration) != nullptr) continue;
      const bool answered_before = std::any_of(versions_.begin(), versions_.end(), [&](const auto& entry) {
        const Version& version = entry.second;
        return version.name == declaration.name && version.cycle == declaration.cycle && version.declaration &&
               *version.declaration < number && version.fingerprint == on_disk->second;
      });
      if (!answered_before) continue;
      spdlog::warn("checkpoints: node 0 saved {} again, but this node's part is the one that answered the save "
                   "before, and its training has ended: that save cannot be committed",
                   declaration.name);
      AnswerWithout(number, PartKind::kLost);
    }
  }

  // No part of `name` on disk: this node holds none, unless its part was complete here and
  // removed before it could be handed off (review 4, F2: answered "no part", node 0
  // committed that save without this rank's shard).
  PartKind AbsentPart(const std::string& name) {
    if (lost_parts_.contains(name)) {
      spdlog::warn("checkpoints: this node's part of {} was complete but removed before it could be handed off; that "
                   "save cannot be committed", name);
      return PartKind::kLost;
    }
    spdlog::info("checkpoints: node 0 saved {}; this node holds no part of it", name);
    return PartKind::kNoPart;
  }

  // No part of a resumed save on disk. This node never had one, unless it once recorded a
  // part of that name (deleted since), or what stands at its path now (a directory emptied
  // to be written again) changed after node 0's part was complete.
  PartKind AbsentResumedPart(const CommitBoard::Declaration& declaration) {
    struct stat path {};
    const bool exists = lstat(storage::JoinPath(options_.checkpoint_dir, declaration.name).c_str(), &path) == 0;
    const bool gone = exists ? !WrittenBeforeResumedSave(int64_t(path.st_mtim.tv_sec) * 1'000'000'000 + path.st_mtim.tv_nsec,
                                                         declaration)
                             : journal_.Knows(declaration.name);
    if (!gone) {
      spdlog::info("checkpoints: node 0 resumed {}; this node holds no part of it", declaration.name);
      return PartKind::kNoPart;
    }
    spdlog::warn("checkpoints: this node's part of the save of {} that node 0 resumed is gone (deleted or being "
                 "written again); that save cannot be committed", declaration.name);
    return PartKind::kLost;
  }

  void NoteIncomplete(const std::string& name, const std::string& reason) {
    if (!incomplete_noted_.insert(name).second) return;
    spdlog::warn("checkpoints: {} is not complete and will not be uploaded: {}", name, reason);
  }

  void WarnAboutSymlinks(const DirectoryTree& tree) {
    for (const std::string& link : tree.symlinks) {
      if (!warned_symlinks_.insert(link).second) continue;
      spdlog::warn("checkpoints: {} is a symbolic link; links are not followed and not uploaded "
                   "(write checkpoints as real files inside {})", link, options_.checkpoint_dir);
    }
    for (const std::string& problem : tree.unreadable) {
      if (warned_symlinks_.insert(problem).second) spdlog::warn("checkpoints: cannot list {}", problem);
    }
  }

  // A checkpoint the destination cannot carry whole is not uploaded in part: the drain then
  // reports it as not committed rather than `latest` naming files its manifest does not hold.
  bool RefusedByDestination(const Candidate& candidate, const std::string& fingerprint) {
    std::vector<std::string> paths;
    for (const FileEntry& file : candidate.files) paths.push_back(file.path);
    auto problem = storage::UncarriableName(options_.destination, candidate.name, paths);
    if (!problem) return false;
    handled_[candidate.name] = fingerprint;
    refused_ = NotUploaded{journal_.NextSeq(), candidate.name, *problem};
    spdlog::error("checkpoints: {} is complete but is not uploaded to {}: {}; rename the file to have it uploaded",
                  candidate.name, options_.destination.uri, *problem);
    return true;
  }

  void Handoff(const Candidate& candidate, const Verdict& verdict, const std::string& fingerprint) {
    if (RefusedByDestination(candidate, fingerprint)) return;
    std::optional<CommitBoard::Declaration> awaited;
    if (const CommitBoard::Declaration* first = AwaitedDeclaration(candidate.name)) awaited = *first;
    if (awaited && awaited->resumed_age_ns && !WrittenBeforeResumedSave(NewestMtimeNs(candidate), *awaited)) {
      handled_[candidate.name] = fingerprint;
      spdlog::warn("checkpoints: this node's part of the save of {} that node 0 resumed was written again since; "
                   "that save cannot be committed", candidate.name);
      AnswerWithout(awaited->number, PartKind::kLost);
      return;
    }
    const auto started = Clock::now();
    const uint64_t seq = journal_.NextSeq();
    const std::string staging = StagingDir(seq);
    Snapshot snapshot;
    try {
      snapshot = TakeSnapshot(options_.checkpoint_dir, candidate, staging, seq);
      if (awaited) snapshot.answers = awaited->save;
    } catch (const SnapshotChanged& changed) {
      spdlog::debug("checkpoints: {} changed while it was snapshotted ({}); waiting until it is stable", candidate.name,
                    changed.what());
      return;
    } catch (const std::runtime_error& error) {
      storage::RemoveTree(staging);
      return HandoffFailed(candidate.name, fingerprint, std::string("cannot snapshot it: ") + error.what());
    }
    // One record for "complete" and "snapshotted": a crash between the two leaves nothing
    // to resume anyway, the checkpoint is judged again from the directory. It is made durable
    // once the upload is queued: its fdatasync took up to 60 ms on a busy disk, and a crash
    // before it returns leaves what a crash before the record leaves (the stale staging
    // directory and snapshot file are removed at start).
    const std::string snapshot_path = staging + ".snapshot.json";
    try {
      WriteSnapshotFile(snapshot, snapshot_path);
      journal_.Append(seq, candidate.name, HandoffState::kSnapshotted, verdict.reason, snapshot);
    } catch (const std::runtime_error& error) {
      storage::RemoveTree(staging);
      unlink(snapshot_path.c_str());
      return HandoffFailed(candidate.name, fingerprint, std::string("cannot record it: ") + error.what());
    }
    failed_handoffs_.erase(candidate.name);
    lost_parts_.erase(candidate.name);
    Version version;
    version.seq = seq;
    version.name = candidate.name;
    version.version_id = snapshot.VersionId();
    version.cycle = current_cycle_;
    version.answers = snapshot.answers;
    version.fingerprint = fingerprint;
    version.from_last_run = LeftByLastRun(candidate.name, fingerprint);
    version.newest_mtime_ns = snapshot.NewestMtimeNs();
    version.staging_dir = staging;
    version.snapshot_path = snapshot_path;
    version.bytes_total = snapshot.total_bytes;
    version.queued_at = Clock::now();
    if (uploader_) uploader_->Upload(version.snapshot_path);
    versions_[seq] = version;
    handled_[candidate.name] = fingerprint;
    incomplete_noted_.erase(candidate.name);
    if (options_.on_handoff) options_.on_handoff(candidate.name);
    const auto queued_in = Clock::now() - started;
    KeepInJournal([&] { journal_.Sync(); });
    spdlog::info("checkpoints: {} is complete ({}, {}): {} files, {}; snapshotted as {} and queued in {:.1f} ms",
                 candidate.name, LayoutName(candidate.layout), verdict.reason, snapshot.files.size(),
                 storage::FormatBytes(snapshot.total_bytes), MethodSummary(snapshot),
                 std::chrono::duration<double, std::milli>(queued_in).count());
    if (!options_.board) return;
    if (is_leader()) return Declare(versions_[seq]);
    if (awaited) AnswerDeclarations();  // binds it now: its snapshot record already names the save
  }

  // Whether this state of `name` is what the job's last run left on disk (without a board).
  bool LeftByLastRun(const std::string& name, const std::string& fingerprint) const {
    auto left = last_run_on_disk_.find(name);
    return left != last_run_on_disk_.end() && left->second == fingerprint;
  }

  // A complete checkpoint that could not be snapshotted or recorded (the disk full, defects
  // 28/29): judged again after a pause, so that it is handed off once there is room, and
  // reported by the drain while it is not.
  void HandoffFailed(const std::string& name, const std::string& fingerprint, const std::string& reason) {
    auto failed = failed_handoffs_.find(name);
    const bool first = failed == failed_handoffs_.end();
    const uint64_t seq = first ? journal_.NextSeq() : failed->second.seq;
    failed_handoffs_[name] = FailedHandoff{fingerprint, reason, Clock::now() + kHandoffRetryGap, seq};
    if (first) {
      spdlog::error("checkpoints: {} is complete but was not handed off: {}; trying again every {} s", name, reason,
                    kHandoffRetryGap.count());
    }
  }

  // Whether `name`, as it is now, waits for its next try.
  // A handoff that failed (the disk full) is judged again once its pause is over, not at the
  // next scan (scan_interval_s), which may come after the drain's deadline: the checkpoint
  // then counted as lost though there was room again (soak seed 5).
  Clock::time_point NextHandoffRetry() const {
    Clock::time_point next = Clock::time_point::max();
    for (const auto& [name, failed] : failed_handoffs_) next = std::min(next, failed.retry_at);
    return next;
  }

  // A checkpoint whose handoff failed (the disk full when it completed) and that the training
  // has since removed (its rotation) can never be handed off: it stops being retried, and
  // is the job's lost checkpoint only while no newer one is handed off (soak seed 5: 74
  // though later ones were committed). A save node 0 declares of it is answered lost.
  void ForgetFailedHandoffsOfRemoved(const std::set<std::string>& present) {
    std::vector<std::string> removed;
    for (const auto& [name, failed] : failed_handoffs_) {
      if (!present.contains(name)) removed.push_back(name);
    }
    for (const std::string& name : removed) ForgetFailedHandoff(name, "it was removed before it could be handed off");
  }

  // The part this failed handoff was complete with is gone for good (removed, or its files
  // changed: a rotation deleting it file by file, a save started over it): a save node 0
  // declares of the name is answered lost until a later handoff of it succeeds (review 5,
  // R5-1: a scan mid-deletion forgot it, and node 0 committed without this rank's shard).
  void ForgetFailedHandoff(const std::string& name, const std::string& why) {
    auto failed = failed_handoffs_.find(name);
    if (failed == failed_handoffs_.end()) return;
    spdlog::warn("checkpoints: {}: {} ({}); this version is not uploaded", name, why, failed->second.reason);
    lost_parts_.insert(name);
    if (!lost_handoff_ || failed->second.seq >= lost_handoff_->seq) {
      lost_handoff_ = NotUploaded{failed->second.seq, name, why + " (" + failed->second.reason + ")"};
    }
    failed_handoffs_.erase(failed);
  }

  // A failed handoff the evaluation did not try again (its checkpoint deleted, or not judged
  // complete now) waits another pause: a retry time left in the past would wake the loop at
  // once, again and again.
  void PostponeRetriesNotTaken() {
    const auto now = Clock::now();
    for (auto& [name, failed] : failed_handoffs_) {
      if (failed.retry_at <= now) failed.retry_at = now + kHandoffRetryGap;
    }
  }

  bool WaitingToRetry(const std::string& name, const std::string& fingerprint) {
    auto failed = failed_handoffs_.find(name);
    if (failed == failed_handoffs_.end()) return false;
    if (failed->second.fingerprint != fingerprint) {  // written again, or being deleted: judged afresh
      ForgetFailedHandoff(name, "its files changed before it could be handed off");
      return false;
    }
    return Clock::now() < failed->second.retry_at;
  }

  // A state change the journal could not keep (the disk full): the version goes on in memory;
  // a launcher restarted on this volume resumes it from its state before, which is safe
  // (uploaded again, or committed again).
  void JournalRecord(uint64_t seq, const std::string& name, HandoffState state, const std::string& detail = "") {
    KeepInJournal([&] { journal_.Record(seq, name, state, detail); });
    CountForStats(state);
  }

  // Every change of a part's state goes through the journal: the counters follow it there.
  void CountForStats(HandoffState state) {
    if (state == HandoffState::kCommitted) committed_parts_.fetch_add(1, std::memory_order_relaxed);
    if (state == HandoffState::kAbandoned) abandoned_parts_.fetch_add(1, std::memory_order_relaxed);
  }

  // Once per turn of the agent's loop (every part handed off, committed or dropped in a turn
  // is counted at the next): versions_ is the agent thread's alone.
  void CountInFlight() {
    uint64_t in_flight = 0;
    for (const auto& [seq, version] : versions_) in_flight += version.stage != Stage::kCommitted;
    in_flight_parts_.store(in_flight, std::memory_order_relaxed);
  }

  // `write` to the journal; a failure (the disk full) is warned about, never thrown.
  template <typename Write>
  void KeepInJournal(Write write) {
    try {
      write();
    } catch (const std::runtime_error& error) {
      WarnJournal(error.what());
    }
  }

  void WarnJournal(const std::string& what) {
    if (Clock::now() - last_journal_warning_ < kRetryLogEvery) return;
    last_journal_warning_ = Clock::now();
    spdlog::warn("checkpoints: {}; uploads go on, a restart on this volume may upload again what this record was for",
                 what);
  }

  // Node 0: every version it hands off is declared, each time.
  void Declare(Version& version) {
    BoardCall([&] { version.declaration = options_.board->Declare({0, version.name, version.version_id, version.cycle, {}}); });
  }

  // Every write checked, through close: an ofstream's buffered text met the full disk only as
  // it was destroyed, unchecked, and the uploader got an empty request it could never read
  // (the version then waited for ever). Not synced: a launcher restarted after a crash writes
  // it again from the journal's record (Resume).
  static void WriteSnapshotFile(const Snapshot& snapshot, const std::string& path) {
    storage::FileDescriptor file(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!file.valid()) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
    storage::WriteAll(file.get(), snapshot.ToJson().dump(), path);
    if (file.Close() != 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  }

  void HandleUploaderEvents() {
    bool exited = false;
    for (const UploaderEvent& event : uploader_->ReadEvents(exited)) OnEvent(event);
    if (!exited) return;
    spdlog::error("checkpoints: the uploader process exited unexpectedly; restarting it");
    uploader_.reset();
    uploader_exited_ = Clock::now();
  }

  void RestartUploaderIfDue() {
    if (Clock::now() - uploader_exited_ < kUploaderRestartGap) return;
    try {
      StartUploader();
    } catch (const std::runtime_error& error) {
      spdlog::error("checkpoints: {}", error.what());
      uploader_exited_ = Clock::now();
      return;
    }
    // Every request the dead uploader held is asked again: uploads not yet done, and `latest`
    // for versions whose publication it never answered (it may have died mid-write).
    for (auto& [seq, version] : versions_) {
      if (version.stage == Stage::kQueued) uploader_->Upload(version.snapshot_path);
      if (publishing_.contains(seq)) SendCommit(version);
    }
  }

  Version* Find(uint64_t seq) {
    auto it = versions_.find(seq);
    return it == versions_.end() ? nullptr : &it->second;
  }

  void OnEvent(const UploaderEvent& event) {
    using Kind = UploaderEvent::Kind;
    Version* version = Find(event.seq);
    if (version == nullptr) return;
    switch (event.kind) {
      case Kind::kProgress: return OnProgress(*version, event);
      case Kind::kRetrying: return OnRetrying(*version, event);
      case Kind::kModified: return OnModified(*version, event);
      case Kind::kUploaded: return OnUploaded(*version);
      case Kind::kLatestPublished: return OnCommitWritten(*version);
      case Kind::kCommitReady: return AnswerCommitReady(*version);
    }
  }

  void OnProgress(Version& version, const UploaderEvent& event) {
    version.bytes_done = event.bytes_done;
    if (Clock::now() - version.last_progress_log < kProgressLogEvery) return;
    version.last_progress_log = Clock::now();
    double seconds = std::chrono::duration<double>(Clock::now() - version.queued_at).count();
    spdlog::info("checkpoints: uploading {}: {} of {} ({}/s)", version.name, storage::FormatBytes(event.bytes_done),
                 storage::FormatBytes(event.bytes_total), storage::FormatBytes(uint64_t(double(event.bytes_done) / std::max(seconds, 1e-3))));
  }

  void OnRetrying(Version& version, const UploaderEvent& event) {
    version.last_error = event.message;
    last_destination_error_ = event.message;
    if (event.attempt > 1 && Clock::now() - version.last_retry_log < kRetryLogEvery) return;
    version.last_retry_log = Clock::now();
    spdlog::warn("checkpoints: cannot upload {} to {} (attempt {}): {}; retrying in {:.0f} s", version.name,
                 options_.destination.uri, event.attempt, event.message, event.retry_in_s);
  }

  // The training rewrote a file of a checkpoint it had finished: that version is not what
  // the manifest would describe. Drop it and judge the checkpoint again from scratch.
  void OnModified(Version& version, const UploaderEvent& event) {
    spdlog::warn("checkpoints: {} was modified after it was declared complete ({} changed); this version is not "
                 "uploaded as committed, the checkpoint is judged again", version.name, event.message);
    JournalRecord(version.seq, version.name, HandoffState::kAbandoned, "modified after completion: " + event.message);
    // Node 0's declaration of this version can never commit; a follower's drain waits for
    // its outcome (AwaitsLeadersOutcome). A save judged complete again is declared anew.
    if (is_leader() && options_.board && version.declaration) {
      BoardCall([&] { options_.board->SetOutcome(*version.declaration, CommitBoard::Outcome::kAbandoned); });
    }
    RemoveStaging(version);
    handled_.erase(version.name);
    versions_.erase(version.seq);
  }

  void OnUploaded(Version& version) {
    version.stage = Stage::kUploaded;
    version.bytes_done = version.bytes_total;
    JournalRecord(version.seq, version.name, HandoffState::kUploaded);
    const auto took = Clock::now() - version.queued_at;
    bytes_uploaded_.fetch_add(version.bytes_total, std::memory_order_relaxed);
    upload_ns_.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()), std::memory_order_relaxed);
    double seconds = std::chrono::duration<double>(took).count();
    spdlog::info("checkpoints: uploaded {} ({} in {:.1f} s)", version.name, storage::FormatBytes(version.bytes_total), seconds);
    RemoveStaging(version);
  }

  void RemoveStaging(const Version& version) {
    storage::RemoveTree(version.staging_dir);
    unlink(version.snapshot_path.c_str());
  }

  // A follower's version that can answer `declaration`: the one snapshotted for that save;
  // else the newest of its name snapshotted after the one that answered the previous
  // declaration and for no save in particular, so a second save is never answered with the first.
  // A save resumed after a restart takes only the part snapshotted for it (AnswerResumed).
  Version* PairableVersion(const CommitBoard::Declaration& declaration) {
    Version* newest = nullptr;
    const uint64_t after = last_paired_seq_[declaration.name];
    for (auto& [seq, version] : versions_) {
      if (version.name != declaration.name || version.declaration) continue;
      if (version.cycle != declaration.cycle) continue;  // a part of another cycle is never that save's
      if (version.answers == declaration.save) return &version;
      if (seq > after && version.answers.empty() && !declaration.resumed_age_ns) newest = &version;
    }
    return newest;
  }

  // Each declaration in order is bound to a version as soon as one can answer it (the
  // newest there is when the declaration is seen: a save that comes later belongs to a later
  // declaration), and answered once that version is uploaded; with none by Evaluate when
  // the name has no part here.
  void AnswerDeclarations() {
    for (auto it = unanswered_.begin(); it != unanswered_.end();) {
      const CommitBoard::Declaration declaration = it++->second;
      Version* version = BoundVersion(declaration.number);
      if (version == nullptr) version = Bind(declaration);
      if (version == nullptr || version->stage == Stage::kQueued) continue;
      AnswerWith(declaration.number, *version);
    }
  }

  Version* BoundVersion(uint64_t declaration) {
    for (auto& [seq, version] : versions_) {
      if (version.declaration == declaration) return &version;
    }
    return nullptr;
  }

  Version* Bind(const CommitBoard::Declaration& declaration) {
    Version* version = PairableVersion(declaration);
    if (version != nullptr) BindTo(*version, declaration);
    return version;
  }

  // The binding is journaled (once): after a restart the version answers that save only.
  void BindTo(Version& version, const CommitBoard::Declaration& declaration) {
    version.declaration = declaration.number;
    if (version.answers.empty()) {
      version.answers = declaration.save;
      KeepInJournal([&] { journal_.RecordAnswers(version.seq, declaration.save); });
    }
    DropSuperseded(declaration.name, last_paired_seq_[declaration.name], version.seq);
    last_paired_seq_[declaration.name] = std::max(last_paired_seq_[declaration.name], version.seq);
  }

  // The first declaration of `name` no version answers yet. A follower judges its part of
  // `name` by node 0's word only while there is one: a part being written again for a later
  // save is not complete because an earlier save of that name was.
  const CommitBoard::Declaration* AwaitedDeclaration(const std::string& name) {
    for (const auto& [number, declaration] : unanswered_) {
      if (declaration.cycle != current_cycle_) continue;  // an earlier cycle's save: never a part written now
      if (declaration.name == name && BoundVersion(number) == nullptr) return &declaration;
    }
    return nullptr;
  }

  // Versions of `name` between two that answered declarations answer none: a later save
  // replaced them before node 0 declared one, so nothing will ever commit them.
  void DropSuperseded(const std::string& name, uint64_t after, uint64_t before) {
    for (auto it = versions_.begin(); it != versions_.end();) {
      Version& version = it->second;
      const bool superseded = version.name == name && version.seq > after && version.seq < before &&
                              !version.declaration && version.stage != Stage::kCommitted;
      if (!superseded) {
        ++it;
        continue;
      }
      JournalRecord(version.seq, version.name, HandoffState::kAbandoned, "superseded by a later save of " + name);
      it = versions_.erase(it);
    }
  }

  // This launcher's one answer for its rank: the version it uploaded for that save, with the
  // cycle it was written in.
  void AnswerWith(uint64_t declaration, const Version& version) {
    if (!unanswered_.erase(declaration)) return;
    answered_[declaration] = PartKind::kVersion;
    BoardCall([&] { options_.board->ReportPart(declaration, PartKind::kVersion, version.version_id, version.cycle); });
  }

  // "No part" or "lost", as seen in the current cycle (unless `cycle` says which one the
  // disk was seen in: the end of the save's own cycle).
  void AnswerWithout(uint64_t declaration, PartKind kind, std::optional<int64_t> cycle = std::nullopt) {
    if (!unanswered_.erase(declaration)) return;
    answered_[declaration] = kind;
    BoardCall([&] { options_.board->ReportPart(declaration, kind, "", cycle.value_or(current_cycle_)); });
  }

  // Single node: uploaded is committed once `latest` names it (or a newer one).
  void CommitLocally() {
    for (auto& [seq, version] : versions_) {
      if (version.stage == Stage::kUploaded && !publishing_.contains(seq)) CommitAlone(version);
    }
  }

  // Without a board: this node's part alone. One node's record says its save (one rank);
  // the mpi backend's node 0 cannot know the others' parts, so its record says nothing of them.
  void CommitAlone(Version& version) {
    if (!options_.publish_latest) {  // the mpi backend's followers: node 0 commits
      MarkCommitted(version);
      return;
    }
    storage::CommitRecord record;
    record.parts[options_.node_rank] = version.version_id;
    if (options_.node_count == 1) {
      record.rank_count = 1;
      record.part_cycles[options_.node_rank] = version.cycle;
    }
    SendRecord(version, RecordNaming(version, std::move(record)));
  }

  // Node 0 with a board: the record of the save the rule committed, every rank's answer in it.
  storage::CommitRecord RecordOfAnswers(const Version& version, const SaveState& save) const {
    storage::CommitRecord record;
    record.rank_count = options_.node_count;
    for (const auto& [rank, part] : save.answers) {
      if (part.kind == PartKind::kNoPart) {
        record.no_part.insert(rank);
        continue;
      }
      record.parts[rank] = part.version;
      record.part_cycles[rank] = part.cycle;
    }
    record.parts[options_.node_rank] = version.version_id;
    record.part_cycles[options_.node_rank] = version.cycle;
    return RecordNaming(version, std::move(record));
  }

  // `record` (its parts) as the commit of `version`'s save: the job, the name, the save.
  storage::CommitRecord RecordNaming(const Version& version, storage::CommitRecord record) const {
    record.job_id = options_.job_id;
    record.name = version.name;
    record.save = version.version_id;
    record.cycle = version.cycle;
    return record;
  }

  void SendRecord(Version& version, storage::CommitRecord record) {
    version.commit = std::move(record);
    publishing_.insert(version.seq);
    SendCommit(version);
  }

  // `latest` only moves forward: a version handed off before one whose commit was already
  // asked for, a save of the last run, or one whose files are older than those of the
  // version that last moved it (its handoff waited for room on a full disk while newer saves
  // committed: soak seed 1028, `latest` moved back from step-17 to step-9) is made current
  // under its own name only (the uploader writes in order).
  void SendCommit(Version& version) {
    version.moves_latest = !version.from_last_run && version.seq >= latest_requested_seq_ &&
                           version.newest_mtime_ns >= latest_requested_mtime_ns_;
    if (!version.from_last_run) latest_requested_seq_ = std::max(latest_requested_seq_, version.seq);
    if (version.moves_latest) latest_requested_mtime_ns_ = version.newest_mtime_ns;
    if (uploader_) uploader_->Commit(version.seq, version.commit, version.moves_latest);
  }

  // The uploader is about to write `version`'s commit. A leader on a spare asks node 0's table
  // whether it still may (a restart after its launcher was lost revoked it, and a frozen or
  // cut-off launcher cannot reach the store): a commit written after a newer leader's would
  // move `latest` back (review 13, F3). Node 0's own commits are its to write while the job runs.
  // The lease counts from before the question: node 0's "yes" may be read only after a
  // freeze outlasting it (node 0 took this launcher for lost meanwhile; review 15, F2).
  void AnswerCommitReady(Version& version) {
    if (!publishing_.contains(version.seq) || !uploader_) return;
    const int64_t asked_ns = LeaseClockNs();
    bool go = true;
    if (options_.commits_through_board && version.declaration) {
      go = false;
      BoardCall([&] { go = options_.board->CommitStillBegun(*version.declaration, version.cycle); });
    }
    uploader_->AnswerCommit(version.seq, go,
                            options_.commits_through_board ? options_.commit_lease : std::chrono::milliseconds{0},
                            asked_ns);
    if (go) return;
    publishing_.erase(version.seq);
    AbandonSave(version.seq, "this node may no longer write its commit: a restart revoked it (this launcher was taken "
                             "for lost), or node 0's store is out of reach");
  }

  void OnCommitWritten(Version& version) {
    if (!publishing_.erase(version.seq)) return;
    const bool moved_latest = version.moves_latest && version.seq > published_seq_;
    if (!version.from_last_run) published_seq_ = std::max(published_seq_, version.seq);
    // Node 0's newest commit is known before the gate hears this one is written: a restart
    // decision waiting on the gate then reads it, not the one before (review 3, D1: the
    // board call in MarkCommitted waits on the server thread that is deciding).
    if (moved_latest && options_.on_latest) options_.on_latest(version.commit);
    if (options_.commit_gate) options_.commit_gate->Finished(version.seq);
    if (options_.commits_through_board && version.declaration) {
      BoardCall([&] { options_.board->CommitWritten(*version.declaration, version.commit, moved_latest); });
    }
    MarkCommitted(version);
    const std::string where = moved_latest           ? options_.destination.uri + "/" + options_.job_id + "/latest names it"
                              : version.from_last_run ? "a save of the run before this launcher started; `latest` stays "
                                                        "what the job resumed from"
                                                      : "a newer checkpoint stays `latest`";
    spdlog::info("checkpoints: committed {}: {} (version {})", version.name, where, version.version_id);
  }

  void MarkCommitted(Version& version) {
    if (version.stage == Stage::kCommitted) return;
    version.stage = Stage::kCommitted;
    JournalRecord(version.seq, version.name, HandoffState::kCommitted);
    if (options_.board && is_leader() && version.declaration) {
      BoardCall([&] { options_.board->SetOutcome(*version.declaration, CommitBoard::Outcome::kCommitted); });
    }
  }

  // Returns whether new names were declared (a follower then judges them).
  bool SyncBoard() {
    bool new_names = false;
    BoardCall([&] {
      if (is_leader()) return CommitAnsweredVersions();
      for (const auto& declaration : options_.board->DeclaredSince(declarations_seen_)) {
        Register(declaration);
        new_names = true;
      }
      AnswerDeclarations();
      CommitFollowerVersions();
    });
    return new_names;
  }

  void Register(const CommitBoard::Declaration& declaration) {
    if (declaration.resumed_age_ns && resumed_read_ns_ == 0) resumed_read_ns_ = WallNanos();
    declarations_seen_ = declaration.number + 1;
    declared_.insert(declaration.name);
    declared_order_.push_back(declaration);
    unanswered_[declaration.number] = declaration;
    if (declaration.cycle < options_.incarnation) {
      spdlog::info("checkpoints: {} was declared (cycle {}) before this launcher replaced the lost one (cycle {}): "
                   "this node's part of that save is lost", declaration.name, declaration.cycle, options_.incarnation);
      AnswerWithout(declaration.number, PartKind::kLost);
    }
  }

  // Node 0: each uploaded version is decided by the commit rule on what every launcher
  // answered for its save: committed with the versions they answered, or abandoned (a part
  // lost, a rank replaced before it answered, a later save of the name committed first).
  void CommitAnsweredVersions() {
    std::optional<std::vector<int>> absent;  // node 0's server asked once a pass, for a pending save only
    for (auto& [seq, version] : versions_) {
      if (version.stage == Stage::kCommitted) continue;
      if (!version.declaration) Declare(version);
      if (version.stage != Stage::kUploaded || publishing_.contains(seq) || !version.declaration) continue;
      const uint64_t declaration = *version.declaration;
      if (answered_.emplace(declaration, PartKind::kVersion).second) {  // node 0's own part is one of them
        options_.board->ReportPart(declaration, PartKind::kVersion, version.version_id, version.cycle);
      }
      const std::optional<SaveState> save = options_.board->Decide(declaration);
      if (!save) continue;
      if (save->decision == Decision::kPending) {
        if (!absent) absent = options_.absent_ranks ? options_.absent_ranks() : std::vector<int>{};
        const std::string lost = UnansweredOf(*save, *absent);
        if (lost.empty()) continue;
        AbandonSave(seq, "the launcher of node(s) " + lost + " is gone and had not answered: its part can never come");
        return;  // versions_ changed under the loop; the next pass goes on
      }
      if (save->decision == Decision::kCommit) {
        // Not before the last leader's commits are all written or revoked (a rank 0 moved).
        if (options_.commits_through_board && !options_.board->PredecessorHandedOver()) continue;
        storage::CommitRecord record = RecordOfAnswers(version, *save);
        if (!BeginCommit(version, record)) {
          AbandonSave(seq, "node 0 decided a restart after cycle " + std::to_string(version.cycle) +
                               " before this save was committed (the next cycle resumes from the commit before it)");
          return;  // versions_ changed under the loop; the next pass goes on
        }
        SendRecord(version, std::move(record));
        continue;
      }
      AbandonSave(seq, save->why);
      return;  // versions_ changed under the loop; the next pass goes on
    }
  }

  // Node 0: the ranks of `absent` (their launcher gone) a pending save still waits for ("" when
  // none): the save can never commit, and the drain would wait drain_timeout_s for nothing.
  static std::string UnansweredOf(const SaveState& save, const std::vector<int>& absent) {
    std::string ranks;
    for (int rank : absent) {
      if (save.answers.contains(rank)) continue;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
    }
    return ranks;
  }

  // Node 0: a save of a cycle that a restart's decision sealed never starts committing; one
  // begun before the decision is waited for by it, or named by it (CommitGate).
  bool BeginCommit(const Version& version, const storage::CommitRecord& record) {
    if (options_.commits_through_board) {
      return !Sealed(version.cycle) && options_.board->BeginCommit(*version.declaration, version.cycle, record);
    }
    return !options_.commit_gate || options_.commit_gate->TryBegin(version.seq, version.cycle, record);
  }

  void AbandonSave(uint64_t seq, const std::string& why) {
    Version& version = versions_.at(seq);
    spdlog::warn("checkpoints: the save of {} (cycle {}) is not committed: {}", version.name, version.cycle, why);
    if (!newest_abandoned_ || seq > newest_abandoned_->seq) newest_abandoned_ = AbandonedSave{seq, version.name, version.cycle, why};
    JournalRecord(seq, version.name, HandoffState::kAbandoned, why);
    BoardCall([&] { options_.board->SetOutcome(*version.declaration, CommitBoard::Outcome::kAbandoned); });
    RemoveStaging(version);
    versions_.erase(seq);
  }

  // A follower's version is committed when node 0 committed the declaration it answered,
  // and dropped when node 0 abandoned it; a version of a name node 0 never declared is this
  // node's own.
  void CommitFollowerVersions() {
    for (auto it = versions_.begin(); it != versions_.end();) {
      Version& version = it->second;
      const bool own = !declared_.contains(version.name);
      const auto outcome = version.stage != Stage::kUploaded || own || !version.declaration
                               ? CommitBoard::Outcome::kPending
                               : options_.board->GetOutcome(*version.declaration);
      if (outcome == CommitBoard::Outcome::kAbandoned) {
        JournalRecord(version.seq, version.name, HandoffState::kAbandoned, "node 0 did not commit this save");
        it = versions_.erase(it);
        continue;
      }
      if (version.stage == Stage::kUploaded && (own || outcome == CommitBoard::Outcome::kCommitted)) {
        version.stage = Stage::kCommitted;
        JournalRecord(version.seq, version.name, HandoffState::kCommitted);
      }
      ++it;
    }
  }

  template <typename Call>
  void BoardCall(Call call) {
    if (board_error_) return;
    try {
      call();
    } catch (const std::exception& error) {
      board_error_ = error.what();
      spdlog::error("checkpoints: the cross-node commit cannot reach the rendezvous store ({}); uploads go on, but "
                    "`latest` cannot be agreed on", error.what());
    }
  }

  // Whether node 0 is lost (LeaderLoss): the first time it is, the drain's deadline comes
  // down to the upload bound, and the log says why the drain ends early.
  bool LeaderLost() {
    if (leader_lost_since_) return true;
    if (!leader_loss_.lost || !leader_loss_.lost()) return false;
    leader_lost_since_ = Clock::now();
    std::lock_guard lock(mutex_);
    drain_deadline_ = std::min(drain_deadline_, *leader_lost_since_ + leader_loss_.upload_bound);
    spdlog::warn("checkpoints: node 0 is lost, so nothing can be committed: waiting only for this node's own uploads, "
                 "at most {} s (the journal keeps them for a restarted launcher)",
                 std::chrono::duration_cast<std::chrono::seconds>(drain_deadline_ - Clock::now()).count());
    return true;
  }

  bool OwnUploadsDone() const {
    for (const auto& [seq, version] : versions_) {
      if (version.stage == Stage::kQueued) return false;
    }
    return true;
  }

  bool Settled(bool declarations_closed) {
    if (!failed_handoffs_.empty()) return false;  // tried again until the deadline
    if (options_.board && !is_leader() && !board_error_) return FollowerSettled();
    // Cut off from node 0's store, a follower learns nothing more by waiting: once its own
    // uploads are done, the commit records at the destination say what node 0 committed.
    if (options_.board && !is_leader()) return OwnUploadsDone();
    for (const auto& [seq, version] : versions_) {
      if (version.stage != Stage::kCommitted) return false;
    }
    if (!options_.board || board_error_ || handing_over_) return true;
    return declarations_closed;
  }

  // A follower: node 0 has said no more names are coming, each of them is answered, and its
  // versions are committed; an uploaded version of a declared name that no declaration took
  // (a part of an earlier cycle, a save node 0 never declared) can no longer be, and waits
  // for nothing.
  bool FollowerSettled() {
    bool closed = false;
    BoardCall([&] {
      leader_draining_seen_ = leader_draining_seen_ || options_.board->LeaderDraining();
      closed = options_.board->DeclarationsClosed();
      if (!closed) return;
      declarations_closed_seen_ = true;
      // Node 0 may have declared a last save just before it closed, after this node's last
      // look: read them once more now that no more can come, or this node leaves with that
      // save unanswered and it never commits (soak seed 167, only node 0 saving).
      for (const auto& declaration : options_.board->DeclaredSince(declarations_seen_)) Register(declaration);
      AnswerDeclarations();
    });
    if (board_error_) return true;
    const bool answered = AnsweredAllUnsealed();
    if (closed && answered) {
      for (auto it = versions_.begin(); it != versions_.end();) {
        const Version& version = it->second;
        if (version.stage != Stage::kUploaded || version.declaration || !declared_.contains(version.name)) {
          ++it;
          continue;
        }
        JournalRecord(version.seq, version.name, HandoffState::kAbandoned, "no save of node 0 took this part");
        it = versions_.erase(it);
      }
    }
    for (const auto& [seq, version] : versions_) {
      if (version.stage != Stage::kCommitted) return false;
    }
    return closed && answered && !AwaitsLeadersOutcome();
  }

  // Whether this node answered every save it still can: one of a cycle a restart's decision
  // sealed needs no answer while the job ends (node 0 commits none; review 6, R6-4).
  bool AnsweredAllUnsealed() {
    return std::all_of(unanswered_.begin(), unanswered_.end(),
                       [this](const auto& entry) { return Sealed(entry.second.cycle); });
  }

  // A follower that answered node 0's newest save with "no part" has nothing of its own to
  // wait for, but its drain reports that save: it waits until node 0 committed or abandoned
  // it, or it reports success for a save node 0 abandons a moment later (review 5, R5-2,
  // seen in CI: the follower read the outcome before node 0 set it).
  bool AwaitsLeadersOutcome() {
    const CommitBoard::Declaration* newest = NewestDeclarationNotSealed();
    if (newest == nullptr || Sealed(newest->cycle)) return false;
    auto answer = answered_.find(newest->number);
    if (answer == answered_.end() || answer->second != PartKind::kNoPart) return false;
    bool pending = false;
    BoardCall([&] { pending = options_.board->GetOutcome(newest->number) == CommitBoard::Outcome::kPending; });
    return pending && !board_error_;
  }

  void LogDrainProgress() {
    uint64_t left = 0;
    size_t pending = 0;
    for (const auto& [seq, version] : versions_) {
      if (version.stage == Stage::kCommitted) continue;
      ++pending;
      left += version.bytes_total - std::min(version.bytes_done, version.bytes_total);
    }
    spdlog::info("checkpoints: draining: {} checkpoint(s) not committed yet, {} left to upload, {} s before the "
                 "deadline", pending, storage::FormatBytes(left),
                 std::chrono::duration_cast<std::chrono::seconds>(drain_deadline_ - Clock::now()).count());
  }

  // A follower's drain judges node 0's newest declaration, except one of an earlier cycle
  // that node 0 abandoned after this node answered it with its part: a restart's decision
  // sealed that save, the cycle after it resumed from the commit before it, and its part
  // here may be gone. A save of this cycle that node 0 abandoned is judged (review 4, F1: a
  // node lost before it answered the last saves left them uncommitted, and every node
  // reported its drain committed).
  // A save of a sealed cycle this node never answered (its part still uploading when the job
  // ended at the barrier) is not judged either: node 0 abandons it (review 6, R6-4).
  const CommitBoard::Declaration* NewestDeclarationNotSealed() {
    for (auto it = declared_order_.rbegin(); it != declared_order_.rend(); ++it) {
      auto answer = answered_.find(it->number);
      const bool answered_with_part = answer != answered_.end() && answer->second == PartKind::kVersion;
      if (!answered_with_part && answer != answered_.end()) return &*it;
      if (!Sealed(it->cycle)) return &*it;
      if (!AbandonedByLeader(it->number)) return &*it;
    }
    return nullptr;
  }

  // Whether a restart's decision ended `cycle`: the next cycle began here, or node 0 decided
  // the restart and the job ended before it began.
  bool Sealed(int64_t cycle) {
    std::lock_guard lock(mutex_);
    return cycle < current_cycle_ || cycle <= sealed_through_;
  }

  bool AbandonedByLeader(uint64_t declaration) { return LeadersOutcome(declaration) == CommitBoard::Outcome::kAbandoned; }

  // Node 0's outcome of a declaration; kPending when it cannot be read (the store is gone):
  // unknown, never taken for a commit (review 6, R6-3).
  CommitBoard::Outcome LeadersOutcome(uint64_t declaration) {
    try {
      return options_.board->GetOutcome(declaration);
    } catch (const std::exception&) {
      return CommitBoard::Outcome::kPending;
    }
  }

  // Whether no version kept here was handed off at or after journal number `seq`: a refused
  // or lost checkpoint (whose number a later handoff takes) or an abandoned save is then
  // the newest, and the drain reports it.
  bool NothingHandedOffSince(uint64_t seq) const { return versions_.empty() || seq > versions_.rbegin()->first; }

  // Node 0: the newest save of this cycle it did not commit, when nothing handed off after it
  // was (a restart sealed the saves of earlier cycles; a later version supersedes it).
  std::optional<DrainResult> NewestSaveAbandoned() {
    if (!newest_abandoned_ || Sealed(newest_abandoned_->cycle)) return std::nullopt;
    if (!NothingHandedOffSince(newest_abandoned_->seq)) return std::nullopt;
    return DrainResult{false, "checkpoint " + newest_abandoned_->name + " was not committed: " + newest_abandoned_->why};
  }

  static constexpr std::chrono::milliseconds kDestinationReadAtLeast{1000};
  static constexpr std::chrono::milliseconds kDestinationReadAtMost{10000};
  static constexpr const char* kReadFromRecord = "its commit record at the destination says so: node 0 could not be reached";

  // A follower cut off from node 0's store cannot hear whether node 0 committed a save; the
  // save's commit record at the destination says it (soak seed 3088: node 0 committed the
  // last save, the follower partitioned a moment later exited 74 while the others exited 0).
  // nullopt when the follower can hear node 0, or the record cannot be read.
  // The read is bounded (review 9, F2: a partition that cut node 0 off often cuts the object
  // store too, and rclone's own retries held the follower's exit 40 s past its drain): what is
  // left of the drain's deadline, at least kDestinationReadAtLeast, at most kDestinationReadAtMost.
  std::optional<storage::CommitRecord> CommitAtDestination(const std::string& name) {
    if (!options_.board || is_leader() || (!board_error_ && !leader_lost_since_)) return std::nullopt;
    auto record = std::make_shared<std::optional<storage::CommitRecord>>();
    auto error = std::make_shared<std::string>();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(drain_deadline_ - Clock::now());
    const auto bound = std::clamp(left, kDestinationReadAtLeast, kDestinationReadAtMost);
    const bool answered = storage::FinishesWithin(bound, [spec = options_.destination, job = options_.job_id, name, record, error] {
      try {
        *record = storage::ReadCommit(*storage::OpenDestination(spec), job, name);
      } catch (const std::exception& failure) {
        *error = failure.what();
      }
    });
    if (!answered || !error->empty()) {
      spdlog::warn("checkpoints: cannot read the commit record of {} at {}: {}", name, options_.destination.uri,
                   answered ? *error : "no answer within " + std::to_string(bound.count()) + " ms");
      return std::nullopt;
    }
    return *record;
  }

  // The record names this node's uploaded version: committed with its part. Only a part: a
  // node that answered "no part" cannot tell from the destination whether node 0 saved
  // something newer after it was cut off (review 6, R6-3), and stays unknown.
  bool CommittedWithThisPart(const Version& version) {
    const std::optional<storage::CommitRecord> record = CommitAtDestination(version.name);
    if (!record) return false;
    auto part = record->parts.find(options_.node_rank);
    if (part == record->parts.end() || part->second != version.version_id) return false;
    auto cycle = record->part_cycles.find(options_.node_rank);
    return cycle == record->part_cycles.end() || cycle->second == version.cycle;
  }

  // Whether the newest complete checkpoint reached the destination and `latest`: on a
  // follower, node 0's newest declaration; else this node's newest handoff.
  DrainResult Summarize() {
    std::string target;
    std::optional<uint64_t> target_declaration;
    int64_t target_cycle = current_cycle_;
    if (options_.board && !is_leader() && !declared_order_.empty()) {
      if (const CommitBoard::Declaration* newest = NewestDeclarationNotSealed()) {
        target = newest->name;
        target_declaration = newest->number;
        target_cycle = newest->cycle;
      }
    } else if (!versions_.empty()) {
      target = versions_.rbegin()->second.name;
    }
    // A refusal after the newest handed-off version (a later one takes the refused seq).
    if (refused_ && NothingHandedOffSince(refused_->seq)) {
      return {false, "checkpoint " + refused_->name + " was not uploaded: " + refused_->reason};
    }
    if (!failed_handoffs_.empty()) {
      const auto& [name, failed] = *failed_handoffs_.begin();
      return {false, "checkpoint " + name + " is complete but was not uploaded: " + failed.reason};
    }
    const bool follower = options_.board && !is_leader();
    // Node 0 drains but never said its last save was declared (its own handoff still waited, a
    // full disk): a save newer than `target` may be the job's last, and this node cannot say it
    // committed (review 6, R6-2: the followers exited 0 while node 0 exited 74). A node 0 still
    // training when this node's drain ends (uneven ends) is judged as before: by its newest
    // declaration (review 8, N2).
    if (follower && !board_error_ && !leader_lost_since_ && leader_draining_seen_ && !declarations_closed_seen_) {
      return {false, "node 0 had not finished declaring its saves by this node's drain deadline (its own last "
                     "checkpoint was not handed off yet): the job's last checkpoint is not known to be committed"};
    }
    if (lost_handoff_ && !follower && NothingHandedOffSince(lost_handoff_->seq)) {
      return {false, "checkpoint " + lost_handoff_->name + " was not uploaded: " + lost_handoff_->reason};
    }
    if (options_.board && is_leader()) {
      if (auto abandoned = NewestSaveAbandoned()) return *abandoned;
    }
    if (target.empty()) return {true, "no complete checkpoint to commit"};
    const Version* newest = nullptr;
    for (const auto& [seq, version] : versions_) {
      if (version.name == target) newest = &version;
    }
    if (target_declaration) {
      auto answer = answered_.find(*target_declaration);
      if (answer != answered_.end() && answer->second == PartKind::kNoPart) {
        if (!Sealed(target_cycle) && AbandonedByLeader(*target_declaration)) {
          return {false, "the save of " + target + " was not committed: node 0 abandoned it (another node's part never "
                         "came); this node holds no part of it"};
        }
        if (!Sealed(target_cycle) && LeadersOutcome(*target_declaration) == CommitBoard::Outcome::kPending) {
          return {false, "the save of " + target + " is not known to be committed: node 0 had not committed it " +
                         (board_error_ || leader_lost_since_ ? "when it could no longer be reached" : "by the drain deadline") +
                         "; this node holds no part of it"};
        }
        return {true, "this node holds no part of checkpoint " + target};
      }
      if (answer != answered_.end() && answer->second == PartKind::kLost) {
        // A launcher that took this rank later (a replacement, a spare) finds the save
        // committed by the launchers before it (review 15, F5: it said "not committed").
        if (LeadersOutcome(*target_declaration) == CommitBoard::Outcome::kCommitted) {
          return {true, "checkpoint " + target + " committed (this node's part of it was saved before this launcher "
                        "took the rank)"};
        }
        if (Sealed(target_cycle)) return {true, "the save of " + target + " was not committed: this node's part of it was lost in a restart"};
        return {false, "the save of " + target + " was not committed: this node's part of it was written over or "
                       "removed before it was handed off"};
      }
      if (answer != answered_.end() && answer->second == PartKind::kVersion && AbandonedByLeader(*target_declaration)) {
        return {false, "the save of " + target + " was not committed: node 0 abandoned it (another node's part never "
                       "came); this node's part was uploaded"};
      }
    }
    if (newest == nullptr) {
      return {false, "checkpoint " + target + " (complete on node 0) was not uploaded from this node: its part here "
                     "never became complete"};
    }
    const Version& version = *newest;
    if (version.stage == Stage::kCommitted) {
      const std::string what = options_.board && !is_leader() ? "this node's part of checkpoint " : "checkpoint ";
      return {true, what + version.name + " committed to " + options_.destination.uri};
    }
    if (version.stage == Stage::kUploaded && CommittedWithThisPart(version)) {
      return {true, "this node's part of checkpoint " + version.name + " committed to " + options_.destination.uri + " (" +
                        kReadFromRecord + ")"};
    }
    std::string reason;
    if (version.stage == Stage::kQueued) {
      const std::string& error = version.last_error.empty() ? last_destination_error_ : version.last_error;
      reason = error.empty()
                   ? "upload not finished (" + storage::FormatBytes(version.bytes_done) + " of " + storage::FormatBytes(version.bytes_total) + ")"
                   : options_.destination.uri + " unavailable: " + error;
    } else if (board_error_) {
      reason = "uploaded, but the cross-node commit failed: " + *board_error_;
    } else if (options_.board && is_leader()) {
      std::vector<int> missing;
      if (version.declaration) {
        BoardCall([&] {
          if (auto save = options_.board->Decide(*version.declaration)) {
            for (int rank = 0; rank < options_.node_count; ++rank) {
              if (!save->answers.contains(rank)) missing.push_back(rank);
            }
          }
        });
      }
      std::string ranks;
      for (int rank : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
      reason = missing.empty() ? "`latest` could not be written" : "node(s) " + ranks + " did not upload their parts";
    } else {
      reason = options_.board ? "uploaded, but node 0 has not committed it" : "`latest` could not be written";
    }
    if (leader_lost_since_) {
      return {false, "checkpoint " + version.name + " was not committed: the connection to node 0 is gone (" + reason +
                         "); this node's journal keeps its part for a restarted launcher"};
    }
    return {false, "checkpoint " + version.name + " was not committed before the drain deadline: " + reason};
  }

  AgentOptions options_;
  std::string state_dir_;
  std::string staging_root_;
  HandoffJournal journal_;
  std::unique_ptr<TreeWatcher> watcher_;
  std::unique_ptr<UploaderProcess> uploader_;
  Clock::time_point uploader_exited_;
  std::map<std::string, std::string> handled_;  // name → fingerprint of the version handed off
  std::map<std::string, std::string> last_run_on_disk_;  // name → fingerprint (LeaveWhatWasOnDiskAlone, no board)
  std::map<uint64_t, Version> versions_;
  std::set<uint64_t> publishing_;
  bool declarations_closed_seen_ = false;  // a follower: node 0 said no more saves are coming
  bool leader_draining_seen_ = false;      // a follower: node 0's training had ended
  uint64_t published_seq_ = 0;
  uint64_t latest_requested_seq_ = 0;
  int64_t latest_requested_mtime_ns_ = 0;  // newest_mtime_ns of the version that last moved `latest`
  std::set<std::string> declared_;  // names node 0 declared (a follower)
  std::vector<CommitBoard::Declaration> declared_order_;
  uint64_t declarations_seen_ = 0;
  std::map<uint64_t, CommitBoard::Declaration> unanswered_;  // by number
  std::map<uint64_t, PartKind> answered_;          // declaration → what this node answered
  std::map<std::string, uint64_t> last_paired_seq_;  // name → the version that answered last
  std::map<uint64_t, Clock::time_point> absent_since_;
  std::set<std::string> incomplete_noted_;
  std::set<std::string> warned_symlinks_;
  std::string load_exclusion_;  // LoadExclusion()
  struct FailedHandoff {
    std::string fingerprint;
    std::string reason;
    Clock::time_point retry_at;
    uint64_t seq = 0;  // the journal's next number at the first failure: versions from it on are later
  };
  std::map<std::string, FailedHandoff> failed_handoffs_;  // by name
  Clock::time_point last_journal_warning_;
  std::optional<std::string> board_error_;
  int64_t current_cycle_ = 0;  // the restart cycle whose training runs (or ran last)
  std::optional<int64_t> requested_cycle_;  // BeginCycle's, for the agent's thread (mutex_)
  int64_t applied_cycle_ = -1;              // the newest the agent's thread took (mutex_)
  bool running_ = true;                     // the agent's thread runs (mutex_)
  bool start_recorded_ = false;             // RecordStart()
  bool start_record_warned_ = false;
  int64_t sealed_through_ = -1;             // a restart's decision sealed the saves of this cycle and before (mutex_)
  std::condition_variable cycle_applied_;
  int64_t resumed_read_ns_ = 0;  // when a follower first read one of node 0's resumed declarations
  std::string last_destination_error_;
  int wake_fd_ = -1;
  std::mutex mutex_;
  // Stats(): written on the agent's thread only.
  std::atomic<uint64_t> committed_parts_{0};
  std::atomic<uint64_t> abandoned_parts_{0};
  std::atomic<uint64_t> in_flight_parts_{0};
  std::atomic<uint64_t> bytes_uploaded_{0};
  std::atomic<uint64_t> upload_ns_{0};
  Clock::time_point drain_deadline_ = Clock::time_point::max();
  LeaderLoss leader_loss_;
  std::optional<Clock::time_point> leader_lost_since_;  // when the drain first saw node 0 lost
  bool training_succeeded_ = false;
  std::atomic<bool> handing_over_{false};  // HandOver: node 0's rank moved, its declarations stay open
  std::optional<int64_t> training_ended_ns_;
  std::thread thread_;
  DrainResult result_;
  struct NotUploaded {
    uint64_t seq = 0;  // the journal number it would have had
    std::string name;
    std::string reason;
  };
  std::optional<NotUploaded> refused_;
  std::optional<NotUploaded> lost_handoff_;       // the newest complete checkpoint removed before its handoff
  std::set<std::string> lost_parts_;          // names whose complete part was removed before its handoff
  struct AbandonedSave {
    uint64_t seq = 0;
    std::string name;
    int64_t cycle = 0;
    std::string why;
  };
  std::optional<AbandonedSave> newest_abandoned_;  // node 0: the newest save it did not commit
};

CheckpointAgent::CheckpointAgent(AgentOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
CheckpointAgent::~CheckpointAgent() = default;

DrainResult CheckpointAgent::Drain(bool training_succeeded, std::chrono::steady_clock::time_point deadline,
                                   LeaderLoss leader_loss) {
  return impl_->Drain(training_succeeded, deadline, std::move(leader_loss));
}

void CheckpointAgent::BeginCycle(int64_t cycle) { impl_->BeginCycle(cycle); }

DrainResult CheckpointAgent::HandOver(std::chrono::steady_clock::time_point deadline) { return impl_->HandOver(deadline); }

void CheckpointAgent::RestartDecided(int64_t cycle) { impl_->RestartDecided(cycle); }

CheckpointStats CheckpointAgent::Stats() const { return impl_->Stats(); }

}  // namespace bt::checkpoint
