#include "storage/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>

namespace bt::storage {

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

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  int spawn_error = posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
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

std::string CurrentExecutable() {
  char path[4096];
  ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
  if (length <= 0) return "bt-launch";
  path[length] = '\0';
  return path;
}

}  // namespace bt::storage
