#include "tests/support/launcher_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace bt::testing {

using Clock = std::chrono::steady_clock;

LauncherProcess::LauncherProcess(const LaunchSpec& spec, const std::string& binary)
    : start_(Clock::now()), timeout_(spec.timeout) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    if (spec.output_file) {
      const int file = open(spec.output_file->c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (file < 0) _exit(125);
      dup2(file, STDOUT_FILENO);
      dup2(file, STDERR_FILENO);
    } else {
      dup2(out_pipe[1], STDOUT_FILENO);
      dup2(err_pipe[1], STDERR_FILENO);
    }
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    setpgid(0, 0);  // so Finish() can kill everything the launcher left behind
    for (const auto& name : spec.unset_env) unsetenv(name.c_str());
    for (const auto& [name, value] : spec.set_env) setenv(name.c_str(), value.c_str(), 1);
    if (spec.run_as_uid && (setgid(*spec.run_as_uid) != 0 || setuid(*spec.run_as_uid) != 0)) _exit(126);
    std::vector<char*> argv = {const_cast<char*>(binary.c_str())};
    for (const auto& arg : spec.args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  out_fd_ = out_pipe[0];
  err_fd_ = err_pipe[0];
}

LauncherProcess::~LauncherProcess() {
  if (!finished_) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    Finish();
  }
}

bool LauncherProcess::Pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (out_fd_ < 0 && err_fd_ < 0) return false;
  poll(fds, 2, timeout_ms);
  char buffer[65536];
  for (int i = 0; i < 2; ++i) {
    int& fd = i == 0 ? out_fd_ : err_fd_;
    if (fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t got = read(fd, buffer, sizeof buffer);
    if (got > 0) {
      (i == 0 ? result_.out : result_.err).append(buffer, size_t(got));
    } else {
      close(fd);
      fd = -1;
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool LauncherProcess::WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (result_.out.find(text) != std::string::npos) return true;
    if (!Pump(20)) return result_.out.find(text) != std::string::npos;
  }
  return false;
}

bool LauncherProcess::WaitForLog(const std::string& text, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (result_.err.find(text) != std::string::npos) return true;
    if (!Pump(20)) return result_.err.find(text) != std::string::npos;
  }
  return false;
}

void LauncherProcess::Signal(int signal_number) { kill(pid_, signal_number); }

ProcessResult LauncherProcess::Finish() {
  if (finished_) return result_;
  auto deadline = start_ + timeout_;
  int status = 0;
  while (true) {
    pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (Clock::now() >= deadline && !result_.timed_out) {
      result_.timed_out = true;
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
    }
    if (!Pump(20)) usleep(5000);
  }
  result_.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_);
  // A process the launcher left behind (its training, after the launcher was SIGKILLed)
  // may hold the pipes open: read what is there, but not until it exits.
  auto drain_deadline = Clock::now() + std::chrono::milliseconds(500);
  while (Clock::now() < drain_deadline && Pump(50)) {
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
  out_fd_ = err_fd_ = -1;
  kill(-pid_, SIGKILL);  // nothing of the test may outlive it
  result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  finished_ = true;
  return result_;
}

ProcessResult RunLauncher(const LaunchSpec& spec, const std::string& binary) {
  LauncherProcess process(spec, binary);
  return process.Finish();
}

namespace {

// /proc/PID/stat: "pid (comm) state ppid ..."; comm may contain spaces and ')'.
bool ReadStat(pid_t pid, char& state, pid_t& parent) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(file, line)) return false;
  auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 2));
  rest >> state >> parent;
  return bool(rest);
}

std::vector<pid_t> ChildrenMatching(pid_t parent, bool zombies_only) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  while (dirent* entry = readdir(proc)) {
    pid_t pid = std::atoi(entry->d_name);
    char state = 0;
    pid_t ppid = 0;
    if (pid <= 0 || !ReadStat(pid, state, ppid)) continue;
    if (ppid == parent && (!zombies_only || state == 'Z')) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

}  // namespace

std::vector<pid_t> ZombieChildrenOf(pid_t parent) { return ChildrenMatching(parent, true); }
std::vector<pid_t> ChildrenOf(pid_t parent) { return ChildrenMatching(parent, false); }

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  return std::string((std::istreambuf_iterator<char>(file)), {});
}

void WriteFile(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
}

// Below the kernel's ephemeral range (32768-60999): a port taken from that range can be
// some client's source port by the time the test's leader binds it. Spread by pid, so the
// tests ctest runs side by side rarely try the same one; never the same twice in a process.
uint16_t FreePort() {
  static uint32_t next = 0;
  for (int attempt = 0; attempt < 400; ++attempt) {
    const uint16_t port = uint16_t(20000 + (uint32_t(getpid()) * 7919u + next++ * 104729u) % 12000u);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    close(fd);
    if (free) return port;
  }
  throw std::runtime_error("no free port in [20000, 32000)");
}

TempDir::TempDir() {
  char pattern[] = "/tmp/bt-launch-test-XXXXXX";
  if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
  chmod(path_.c_str(), 0777);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::Write(const std::string& name, const std::string& content) const {
  std::string path = path_ + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << content;
  return path;
}

}  // namespace bt::testing
