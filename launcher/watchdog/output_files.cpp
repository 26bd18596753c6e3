#include "launcher/watchdog/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string_view>

#include "launcher/log.h"

namespace bt::launcher::watchdog {
namespace {

// What one look reads back at most: the first line that is the job's ends it, so this
// bounds only a burst of the launchers' own lines (node 0's hang summary), read over
// several looks.
constexpr size_t kReadBack = 256 * 1024;

// A descriptor of its own that reads `destination`'s file, or -1 when it is not a regular
// file open for writing, or cannot be read back (a file the launcher may only write).
int OpenReadBack(int destination) {
  struct stat info {};
  if (fstat(destination, &info) != 0 || !S_ISREG(info.st_mode)) return -1;
  const int flags = fcntl(destination, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY) return -1;
  // /proc/self/fd/N opens the very file, even one renamed or unlinked since.
  const std::string link = "/proc/self/fd/" + std::to_string(destination);
  return open(link.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
}

}  // namespace

bool LeftToTheJob(int destination) {
  const int fd = OpenReadBack(destination);
  if (fd < 0) return false;
  close(fd);
  return true;
}

OutputFiles::OutputFiles(std::initializer_list<int> destinations) {
  for (int destination : destinations) {
    const int fd = OpenReadBack(destination);
    if (fd < 0) continue;
    struct stat info {};
    const bool known = fstat(fd, &info) != 0 || std::any_of(files_.begin(), files_.end(), [&](const File& file) {
                         return file.device == info.st_dev && file.inode == info.st_ino;
                       });
    if (known) {
      close(fd);
      continue;
    }
    files_.push_back({fd, info.st_dev, info.st_ino, info.st_size});
  }
}

OutputFiles::~OutputFiles() {
  for (const File& file : files_) close(file.fd);
}

void OutputFiles::Rebase() {
  for (File& file : files_) {
    struct stat info {};
    if (fstat(file.fd, &info) == 0) file.seen = info.st_size;
  }
}

bool OutputFiles::JobWrote() {
  bool wrote = false;
  for (File& file : files_) wrote = JobWroteTo(file) || wrote;  // every file's `seen` moves on
  return wrote;
}

bool OutputFiles::JobWroteTo(File& file) {
  struct stat info {};
  if (fstat(file.fd, &info) != 0) return false;
  // Truncated (logrotate's copytruncate, `: > train.log`): all it holds now is new.
  if (info.st_size < file.seen) file.seen = 0;
  if (info.st_size == file.seen) return false;
  buffer_.resize(size_t(std::min<off_t>(info.st_size - file.seen, kReadBack)));
  const ssize_t got = pread(file.fd, buffer_.data(), buffer_.size(), file.seen);
  if (got <= 0) return false;
  const std::string_view data(buffer_.data(), size_t(got));
  const bool cut = file.seen + got < info.st_size;  // more follows than one look reads
  for (size_t start = 0; start < data.size();) {
    const size_t newline = data.find('\n', start);
    if (newline == std::string_view::npos) {
      // A line with no newline yet: a launcher's line seen in part (its one write not fully
      // copied in yet) is judged again at the next look, as is one a cut look ends in;
      // the job's is progress now (a progress bar redrawn with \r never ends its line).
      const std::string_view rest = data.substr(start);
      const bool longer_than_a_look = cut && start == 0;  // judged by its start alone
      if (!longer_than_a_look && (cut || log::MayBecomeLauncherLine(rest))) {
        file.seen += off_t(start);
        return false;
      }
      file.seen = info.st_size;
      return !log::MayBecomeLauncherLine(rest);
    }
    // One line of the job's is enough: the rest is not read (a job that writes fast is
    // judged by a few KiB a look, however far it ran ahead).
    if (!log::IsLauncherLine(data.substr(start, newline - start))) {
      file.seen = info.st_size;
      return true;
    }
    start = newline + 1;
  }
  file.seen += got;
  return false;
}

}  // namespace bt::launcher::watchdog
