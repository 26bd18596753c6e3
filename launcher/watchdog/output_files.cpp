#include "launcher/watchdog/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace bt::launcher::watchdog {
namespace {

struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
};

// `destination`'s file when it is a regular file open for writing.
bool WritableFile(int destination, FileIdentity& identity) {
  struct stat info {};
  if (fstat(destination, &info) != 0 || !S_ISREG(info.st_mode)) return false;
  const int flags = fcntl(destination, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY) return false;
  identity = {info.st_dev, info.st_ino};
  return true;
}

// A description of `destination`'s file of the job's own, appending; the launcher's own
// then appends too (a launcher writing at its own offset would write over the job's lines).
// /proc/self/fd/N opens the very file, even one renamed or unlinked since. -1 when it cannot.
int OpenForTheJob(int destination) {
  const std::string link = "/proc/self/fd/" + std::to_string(destination);
  const int fd = open(link.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return -1;
  const int flags = fcntl(destination, F_GETFL);
  if (flags < 0 || fcntl(destination, F_SETFL, flags | O_APPEND) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

off_t Offset(int fd) { return fd < 0 ? 0 : lseek(fd, 0, SEEK_CUR); }

}  // namespace

OutputFiles::OutputFiles(int stdout_destination, int stderr_destination) {
  FileIdentity out{}, err{};
  const bool out_file = WritableFile(stdout_destination, out);
  const bool err_file = WritableFile(stderr_destination, err);
  if (out_file) job_fds_[0] = OpenForTheJob(stdout_destination);
  if (err_file && out_file && out.device == err.device && out.inode == err.inode) {
    job_fds_[1] = job_fds_[0];
  } else if (err_file) {
    job_fds_[1] = OpenForTheJob(stderr_destination);
  }
}

OutputFiles::~OutputFiles() {
  if (job_fds_[0] >= 0) close(job_fds_[0]);
  if (job_fds_[1] >= 0 && job_fds_[1] != job_fds_[0]) close(job_fds_[1]);
}

int OutputFiles::JobDescription(int stream) const { return stream == 1 || stream == 2 ? job_fds_[stream - 1] : -1; }

void OutputFiles::Rebase() {
  for (int i = 0; i < 2; ++i) seen_[i] = Offset(job_fds_[i]);
}

bool OutputFiles::JobWrote() {
  bool wrote = false;
  for (int i = 0; i < 2; ++i) {
    const off_t now = Offset(job_fds_[i]);
    // Changed, not grown: after a truncation (copytruncate) the next append lands lower.
    if (now == seen_[i]) continue;
    seen_[i] = now;
    wrote = true;
  }
  return wrote;
}

}  // namespace bt::launcher::watchdog
