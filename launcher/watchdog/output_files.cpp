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

// The launcher's own description of the file appends from now on: writing at its own
// offset, it would write over the lines the job appends through its description.
bool Append(int destination) {
  const int flags = fcntl(destination, F_GETFL);
  return flags >= 0 && fcntl(destination, F_SETFL, flags | O_APPEND) == 0;
}

// A description of `destination`'s file of the job's own, appending, or -1 when it cannot.
// /proc/self/fd/N opens the very file, even one renamed or unlinked since.
int OpenForTheJob(int destination) {
  const std::string link = "/proc/self/fd/" + std::to_string(destination);
  const int fd = open(link.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY);
  if (fd >= 0 && !Append(destination)) {
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
  // `2>&1` shares one description; `>f 2>f` opens two, and both must append.
  if (err_file && job_fds_[0] >= 0 && out.device == err.device && out.inode == err.inode) {
    if (Append(stderr_destination)) job_fds_[1] = job_fds_[0];
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
