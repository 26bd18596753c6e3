// The job's stdout and stderr when the launcher's are regular files (`bt-launch run >
// train.log 2>&1`, Slurm's --output): the job writes to them itself, as it would without
// the launcher, and what it appends is its progress. Through the output relay every byte
// would cross a pipe: a `cat` into a file took 1.4-1.6x as long (docs/PERFORMANCE.md).
//
// Launchers write to the same file (their log lines; several launchers into one file in a
// local test): what was appended since the last look is read back, and only a line no
// launcher wrote (log::IsLauncherLine) is the job's. Only the first such line is read.
#pragma once

#include <sys/types.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace bt::launcher::watchdog {

// Whether the launcher's `destination` (its fd 1 or 2) is a regular file it can read back:
// then the job writes to it directly, and OutputFiles watches it.
bool LeftToTheJob(int destination);

// Used from one thread at a time.
class OutputFiles {
 public:
  // Opens for reading each of `destinations` (the launcher's fd 1 and 2) that is
  // LeftToTheJob, a file that both are once; only what is appended from now on counts.
  explicit OutputFiles(std::initializer_list<int> destinations = {1, 2});
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  bool empty() const { return files_.empty(); }
  // From now on, only what is appended after this counts (a new cycle).
  void Rebase();
  // Whether the job appended a line (or the start of one) to any of them since the last
  // call or Rebase.
  bool JobWrote();

 private:
  struct File {
    int fd = -1;        // read-only, its own offset: the job's is never moved
    dev_t device = 0;
    ino_t inode = 0;
    off_t seen = 0;     // judged up to here
  };
  bool JobWroteTo(File& file);

  std::vector<File> files_;
  std::string buffer_;  // what one look reads back
};

}  // namespace bt::launcher::watchdog
