// The uploader: a separate process (`bt-launch upload-worker`), in its own process group
// (a signal to the training's group, or a SIGKILLed training, cannot reach it), at low CPU
// and I/O priority, so the training never waits on it. It takes one checkpoint at a time
// from the agent, hashes the staged files into the manifest, uploads the data, then the
// manifest, and answers with one JSON event a line. Retries with capped backoff until the
// agent stops it: a destination that stays down is reported on every attempt.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "storage/commit_record.h"

namespace bt::checkpoint {

// CLOCK_BOOTTIME in ns: one clock for the launcher and its worker (one host), running
// through a freeze (SIGSTOP, a cgroup freeze), which a lease must count.
int64_t LeaseClockNs();

struct UploaderConfig {
  std::string destination_uri;
  std::string job_id;
  int node_rank = 0;
};

struct UploaderEvent {
  // kCommitReady: a commit's versions are uploaded and its record is about to be written: the
  // worker waits for AnswerCommit before each try (a fence: the launcher may no longer be the
  // one that commits, and must say so before anything reaches the destination).
  enum class Kind { kProgress, kUploaded, kRetrying, kModified, kLatestPublished, kCommitReady } kind;
  uint64_t seq = 0;         // the snapshot's journal number
  std::string name;         // the checkpoint
  std::string message;      // kRetrying: the error; kModified: the file that changed
  uint64_t bytes_done = 0;  // kProgress
  uint64_t bytes_total = 0;
  int attempt = 0;          // kRetrying
  double retry_in_s = 0;
};

// The launcher's side of the worker.
class UploaderProcess {
 public:
  // Starts `binary upload-worker ...` with exactly `environ` (rclone's credentials and
  // nothing else). Throws std::runtime_error when it cannot be started.
  UploaderProcess(const std::string& binary, const UploaderConfig& config, const std::vector<std::string>& environ);
  ~UploaderProcess();
  UploaderProcess(const UploaderProcess&) = delete;
  UploaderProcess& operator=(const UploaderProcess&) = delete;

  int fd() const { return events_fd_; }  // readable when events (or its exit) are pending
  pid_t pid() const { return pid_; }
  // Queues the snapshot described by the file `snapshot_path` (Snapshot::ToJson).
  void Upload(const std::string& snapshot_path);
  // Makes `record`'s versions current (storage::Destination::Commit); answered by
  // kLatestPublished with `seq`, the journal number of this node's version.
  void Commit(uint64_t seq, const storage::CommitRecord& record, bool move_latest);
  // The answer to kCommitReady for `seq`: write it (`go`), or drop it (never written). A
  // `lease` above 0: the write must start within it, counted from `asked_ns` (LeaseClockNs,
  // taken before the launcher asked whether it still may), or it is dropped.
  void AnswerCommit(uint64_t seq, bool go, std::chrono::milliseconds lease = std::chrono::milliseconds{0},
                    int64_t asked_ns = 0);
  // Every complete event line read so far; sets `exited` when the worker has gone away.
  std::vector<UploaderEvent> ReadEvents(bool& exited);
  // Closes its input and waits for it to exit, SIGKILL after `wait_ms`.
  void Stop(int wait_ms);

 private:
  void Send(const std::string& line);
  pid_t pid_ = -1;
  int requests_fd_ = -1;
  int events_fd_ = -1;
  std::string buffer_;
};

// The worker's main: reads requests on stdin until it closes. Returns the exit code.
int RunUploadWorker(const UploaderConfig& config, pid_t parent);

}  // namespace bt::checkpoint
