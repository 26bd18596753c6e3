#include "storage/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace bt::storage {
namespace {

// The child's side between fork and exec: async-signal-safe calls only (the parent may have
// threads). Never returns; on failure the errno goes to `error_fd` (close-on-exec, so the
// parent reads nothing when exec succeeded).
[[noreturn]] void ExecTiedToParent(pid_t parent, char* const* args, char* const* envp, int out_fd, int err_fd,
                                   int error_fd) {
  // SIGKILL whenever the thread that started it dies: the uploader SIGKILLed at the drain
  // deadline left its rclone running, reparented to init, with the S3 keys in its environment.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // it died before the line above took effect
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  const int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
      dup2(err_fd, STDERR_FILENO) < 0) {
    const int error = errno;
    [[maybe_unused]] ssize_t ignored = write(error_fd, &error, sizeof error);
    _exit(127);
  }
  execvpe(args[0], args, envp);
  const int error = errno;
  [[maybe_unused]] ssize_t ignored = write(error_fd, &error, sizeof error);
  _exit(127);
}

// Forks and execs `args` with exactly `envp`, stdout and stderr to the given pipes. Returns
// the pid, or -1 with `spawn_error` set.
pid_t SpawnTiedToParent(char* const* args, char* const* envp, int out_fd, int err_fd, int& spawn_error) {
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    spawn_error = errno;
    return -1;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) ExecTiedToParent(parent, args, envp, out_fd, err_fd, error_pipe[1]);
  close(error_pipe[1]);
  if (pid < 0) {
    spawn_error = errno;
    close(error_pipe[0]);
    return -1;
  }
  int child_error = 0;
  ssize_t got;
  while ((got = read(error_pipe[0], &child_error, sizeof child_error)) < 0 && errno == EINTR) {
  }
  close(error_pipe[0]);
  if (got <= 0) return pid;
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  spawn_error = child_error;
  return -1;
}

}  // namespace

std::vector<char*> CStringArray(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const auto& text : strings) pointers.push_back(const_cast<char*>(text.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, const std::vector<std::string>& environ,
                         const std::function<void(const std::string&)>& on_stderr_line,
                         const std::function<void()>& every_second) {
  ProcessResult result;
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return {127, "", std::strerror(errno)};
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return {127, "", std::strerror(errno)};
  }
  std::vector<char*> args = CStringArray(argv);
  std::vector<char*> envp = CStringArray(environ);

  int spawn_error = 0;
  const pid_t pid = SpawnTiedToParent(args.data(), envp.data(), out[1], err[1], spawn_error);
  close(out[1]);
  close(err[1]);
  if (spawn_error != 0) {
    close(out[0]);
    close(err[0]);
    return {127, "", std::string("cannot run ") + argv[0] + ": " + std::strerror(spawn_error)};
  }

  std::string stderr_buffer;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_count = 2;
  char buffer[16384];
  auto last_tick = std::chrono::steady_clock::now();
  while (open_count > 0) {
    if (poll(fds, 2, every_second ? 1000 : -1) < 0 && errno != EINTR) break;
    if (every_second && std::chrono::steady_clock::now() - last_tick >= std::chrono::seconds(1)) {
      last_tick = std::chrono::steady_clock::now();
      try {
        every_second();
      } catch (...) {
        kill(pid, SIGKILL);
        for (const pollfd& entry : fds) {
          if (entry.fd >= 0) close(entry.fd);
        }
        while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        throw;
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = read(fds[i].fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
        continue;
      }
      if (i == 0) {
        result.output.append(buffer, size_t(got));
        continue;
      }
      stderr_buffer.append(buffer, size_t(got));
      for (size_t newline; (newline = stderr_buffer.find('\n')) != std::string::npos;) {
        on_stderr_line(stderr_buffer.substr(0, newline));
        stderr_buffer.erase(0, newline + 1);
      }
    }
  }
  if (!stderr_buffer.empty()) on_stderr_line(stderr_buffer);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string FindOnPath(const std::string& program) {
  const char* path = getenv("PATH");
  std::istringstream directories(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string directory; std::getline(directories, directory, ':');) {
    const std::string candidate = (directory.empty() ? "." : directory) + "/" + program;
    struct stat info {};
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string CurrentExecutable() {
  char path[4096];
  ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
  if (length <= 0) return "bt-launch";
  path[length] = '\0';
  return path;
}

}  // namespace bt::storage
