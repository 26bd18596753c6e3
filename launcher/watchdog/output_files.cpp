#include "launcher/watchdog/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "launcher/supervision/proc_table.h"

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

// The offset ("pos:") of process `pid`'s descriptor `fd`, or -1.
long long DescriptorOffset(pid_t pid, const std::string& fd) {
  std::ifstream info("/proc/" + std::to_string(pid) + "/fdinfo/" + fd);
  std::string name;
  long long position = -1;
  if (info >> name >> position && name == "pos:") return position;
  return -1;
}

}  // namespace

OutputFiles::OutputFiles(int stdout_destination, int stderr_destination) {
  FileIdentity out{}, err{};
  const bool out_file = WritableFile(stdout_destination, out);
  const bool err_file = WritableFile(stderr_destination, err);
  if (out_file) job_fds_[0] = OpenForTheJob(stdout_destination);
  if (out_file) devices_[0] = out.device, inodes_[0] = out.inode;
  if (err_file) devices_[1] = err.device, inodes_[1] = err.inode;
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
  opened_seen_.clear();
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
  return wrote || JobWroteThroughItsOwnOpens();
}

// A description the job opened itself is seen once before its moves count: a first look
// cannot tell old writes from new ones. The launcher's helpers (the same program) are not
// the job. Only looked at while the job's given descriptions are still: one pass over the
// job's descriptors a tick.
bool OutputFiles::JobWroteThroughItsOwnOpens() {
  if (job_fds_[0] < 0 && job_fds_[1] < 0) return false;
  if (launcher_executable_.empty()) {
    std::error_code unreadable;
    launcher_executable_ = std::filesystem::read_symlink("/proc/self/exe", unreadable).string();
  }
  std::error_code error;
  std::map<std::pair<pid_t, int>, long long> now;
  bool wrote = false;
  for (const pid_t pid : DescendantsOf(getpid(), launcher_executable_)) {
    const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
    for (const auto& entry : std::filesystem::directory_iterator(fds, error)) {
      struct stat info {};
      if (stat(entry.path().c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
      const bool ours = (info.st_dev == devices_[0] && info.st_ino == inodes_[0] && job_fds_[0] >= 0) ||
                        (info.st_dev == devices_[1] && info.st_ino == inodes_[1] && job_fds_[1] >= 0);
      if (!ours) continue;
      const std::string fd = entry.path().filename().string();
      const long long position = DescriptorOffset(pid, fd);
      const std::pair<pid_t, int> key{pid, std::atoi(fd.c_str())};
      now[key] = position;
      auto before = opened_seen_.find(key);
      if (before != opened_seen_.end() && before->second != position) wrote = true;
    }
  }
  opened_seen_ = std::move(now);
  return wrote;
}

}  // namespace bt::launcher::watchdog
