// The job's stdout and stderr when the launcher's are regular files (`bt-launch run >
// train.log 2>&1`, Slurm's --output): the job writes to the file itself, as it would without
// the launcher. Through the output relay every byte would cross a pipe (a `cat` into a file
// took 1.4-1.6x as long, docs/PERFORMANCE.md).
//
// The job gets an open file description of its own for each such file (the file reopened
// through /proc/self/fd, O_APPEND): only the job's writes move that description's offset,
// so a move is the job's progress, whoever else appends to the file (the launcher's log
// lines, other launchers or jobs sharing it). The launcher's own description of the file is
// switched to O_APPEND too, so that neither writes over the other's lines.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>

namespace bt::launcher::watchdog {

// The descriptions are fixed at construction (the supervisor spawns with them); Rebase and
// JobWrote are the watch's, one thread at a time.
class OutputFiles {
 public:
  // For each of `stdout_destination` and `stderr_destination` (the launcher's fd 1 and 2)
  // that is a regular file open for writing, the job's own description; one for both
  // when both are the same file (as `2>&1` shares one). A file that cannot be reopened for
  // writing gets none: the relay takes that stream as it takes a pipe.
  explicit OutputFiles(int stdout_destination = 1, int stderr_destination = 2);
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  // The job's description for its fd `stream` (1 or 2), or -1 when that stream is no file.
  int JobDescription(int stream) const;
  // From now on, only what the job writes after this counts (a new cycle).
  void Rebase();
  // Whether the job wrote to any of its files since the last call or Rebase: through the
  // descriptions it was given, or, when those did not move, through descriptions of the same
  // files its processes opened themselves (`open("/dev/stdout")` by path, a logging
  // FileHandler on it), read from /proc/PID/fdinfo of the launcher's descendants.
  bool JobWrote();

 private:
  bool JobWroteThroughItsOwnOpens();

  int job_fds_[2] = {-1, -1};    // the same descriptor twice for one file
  off_t seen_[2] = {0, 0};       // each description's offset at the last look
  dev_t devices_[2] = {0, 0};    // the files (0, 0: none)
  ino_t inodes_[2] = {0, 0};
  // The offsets of the job's own descriptions of the files, by process and descriptor.
  std::map<std::pair<pid_t, int>, long long> opened_seen_;
  std::string launcher_executable_;  // /proc/self/exe, read once: its processes are not the job
};

}  // namespace bt::launcher::watchdog
