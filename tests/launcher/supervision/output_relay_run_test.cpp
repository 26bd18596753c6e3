// The job's output through the launcher (issue 21): real processes under a Supervisor
// given a watchdog::Progress (tests/bench/relay_run.cpp, `bt-launch run` reduced to its
// supervision), the launcher's stdout and stderr files, pipes or a terminal.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/pseudo_terminal.h"

#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kRelayRun = BT_RELAY_RUN_BINARY;

// Starts relay_run with `args`, its stdout and stderr on the given descriptors, stdin
// /dev/null, in a process group of its own (killed whole by Wait on timeout).
pid_t Start(const std::vector<std::string>& args, int out_fd, int err_fd) {
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);
    setpgid(0, 0);
    std::vector<char*> argv = {const_cast<char*>(kRelayRun.c_str())};
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(kRelayRun.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// The exit code, or nullopt when `bound` passed (the group is killed then).
std::optional<int> Wait(pid_t pid, std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(10ms);
  }
  kill(-pid, SIGKILL);  // nothing of the test outlives it
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int OpenForWriting(const std::string& path) { return open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); }

// Copies everything `source` gives to `path` until end of file, on a thread of its own: a
// container runtime's log pipe.
std::thread DrainInto(int source, const std::string& path) {
  return std::thread([source, path] {
    const int file = OpenForWriting(path);
    char buffer[1 << 16];
    for (ssize_t got; (got = read(source, buffer, sizeof buffer)) != 0;) {
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 || write(file, buffer, size_t(got)) != got) break;
    }
    close(file);
    close(source);
  });
}

// Runs `command` directly with stdout and stderr to files, or under relay_run (`relay`)
// with pipes drained into them: a file the launcher would leave to the job.
std::optional<int> RunToFiles(bool relay, const std::vector<std::string>& command, const std::string& out,
                              const std::string& err, std::chrono::milliseconds bound) {
  if (relay) {
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return std::nullopt;
    std::thread out_drain = DrainInto(out_pipe[0], out);
    std::thread err_drain = DrainInto(err_pipe[0], err);
    std::vector<std::string> args = {"--"};
    args.insert(args.end(), command.begin(), command.end());
    const pid_t pid = Start(args, out_pipe[1], err_pipe[1]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    const std::optional<int> code = Wait(pid, bound);
    out_drain.join();
    err_drain.join();
    return code;
  }
  const int out_fd = OpenForWriting(out);
  const int err_fd = OpenForWriting(err);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    setpgid(0, 0);
    std::vector<char*> argv;
    for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  return Wait(pid, bound);
}

size_t Lines(const std::string& text) { return size_t(std::count(text.begin(), text.end(), '\n')); }

// Writes `total` bytes of numbered lines, four in five writes to stdout, as fast as it can,
// in writes of 1 byte to 300 KB that end mid-line as often as not. Deterministic.
constexpr const char* kGenerator = R"(import os, sys
total = int(sys.argv[1])
sizes = [1, 7, 100, 4096, 65536, 300000, 13, 1000, 81920]
def lines(tag, start, count):
    return b"".join(b"%s%09d %s\n" % (tag, n, b"x" * (n * 7919 % 97)) for n in range(start, start + count))
streams = {1: [bytearray(), 0, b"o"], 2: [bytearray(), 0, b"e"]}
written = 0
k = 0
while written < total:
    fd = 2 if k % 5 == 4 else 1
    size = sizes[k % len(sizes)]
    k += 1
    stream = streams[fd]
    while len(stream[0]) < size:
        stream[0] += lines(stream[2], stream[1], 4000)
        stream[1] += 4000
    chunk = memoryview(bytes(stream[0][:size]))
    del stream[0][:size]
    while chunk:
        chunk = chunk[os.write(fd, chunk):]
    written += size
)";

TEST(OutputThroughTheLauncher, HundredMegabytesArriveUnchangedAndInOrder) {
  TempDir dir;
  const std::string generator = dir.Write("generate.py", kGenerator);
  const std::vector<std::string> job = {"python3", generator, "100000000"};
  ASSERT_EQ(RunToFiles(false, job, dir.path() + "/direct.out", dir.path() + "/direct.err", 90s), 0);
  ASSERT_EQ(RunToFiles(true, job, dir.path() + "/relayed.out", dir.path() + "/relayed.err", 90s), 0);
  const std::string direct_out = ReadFile(dir.path() + "/direct.out");
  const std::string relayed_out = ReadFile(dir.path() + "/relayed.out");
  const std::string direct_err = ReadFile(dir.path() + "/direct.err");
  const std::string relayed_err = ReadFile(dir.path() + "/relayed.err");
  EXPECT_GE(direct_out.size() + direct_err.size(), 100000000u);
  EXPECT_GT(Lines(direct_err), 100000u);
  EXPECT_EQ(Lines(relayed_out), Lines(direct_out));
  EXPECT_EQ(Lines(relayed_err), Lines(direct_err));
  EXPECT_EQ(std::hash<std::string>{}(relayed_out), std::hash<std::string>{}(direct_out));
  EXPECT_EQ(std::hash<std::string>{}(relayed_err), std::hash<std::string>{}(direct_err));
  EXPECT_TRUE(relayed_out == direct_out) << "stdout differs: " << relayed_out.size() << " bytes, expected " << direct_out.size();
  EXPECT_TRUE(relayed_err == direct_err) << "stderr differs: " << relayed_err.size() << " bytes, expected " << direct_err.size();
}

// `bt-launch run >> train.log`: the job's fd 1 is the file itself, and every byte lands
// after what the file held.
TEST(OutputThroughTheLauncher, AFileIsTheJobsOwnAndGetsEveryByte) {
  TempDir dir;
  std::string text;
  for (int n = 0; n < 200000; ++n) text += "line " + std::to_string(n) + " " + std::string(size_t(n % 97), 'x') + "\n";
  const std::string source = dir.Write("source", text);
  const std::string log = dir.path() + "/train.log";
  const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  ASSERT_EQ(write(out, "before\n", 7), 7);
  const pid_t pid = Start({"--", "sh", "-c", "readlink /proc/$$/fd/1 >&2; cat " + source}, out, out);
  close(out);
  ASSERT_EQ(Wait(pid, 30s), 0);
  const std::string written = ReadFile(log);
  EXPECT_TRUE(written == "before\n" + log + "\n" + text) << written.substr(0, 200);
}

TEST(OutputThroughTheLauncher, AwkwardBytesPassUnchanged) {
  TempDir dir;
  std::string binary;
  uint32_t state = 12345;
  for (int i = 0; i < 3 * 1024 * 1024; ++i) {
    state = state * 1664525u + 1013904223u;
    binary += char(state >> 24);  // NULs, lone \r and \n, bytes above 0x7f
  }
  const std::string first = binary + "\xff\xfe\xc3\x28 not UTF-8\n" + "10%\r20%\r30%\r" + std::string(1024 * 1024, 'y');
  const std::string last = "\nthe final line has no newline";
  const std::string err = std::string("\r\r\0\x01", 4) + "stderr without a newline";
  const std::string a = dir.Write("a", first), b = dir.Write("b", err), c = dir.Write("c", last);
  ASSERT_EQ(RunToFiles(true, {"sh", "-c", "cat " + a + "; cat " + b + " >&2; sleep 0.2; cat " + c},
                       dir.path() + "/out", dir.path() + "/err", 30s),
            0);
  EXPECT_TRUE(ReadFile(dir.path() + "/out") == first + last) << "stdout changed";
  EXPECT_TRUE(ReadFile(dir.path() + "/err") == err) << "stderr changed: " << ReadFile(dir.path() + "/err");
}

TEST(OutputThroughTheLauncher, APartialLineArrivesBeforeTheJobEnds) {
  LauncherProcess launcher({{"--", "sh", "-c", "printf abc; sleep 3; echo def"}, {}, {}, {}, 20s}, kRelayRun);
  const auto start = Clock::now();
  EXPECT_TRUE(launcher.WaitForOutput("abc", 2s)) << "a partial line waited for the job's end";
  EXPECT_LT(Clock::now() - start, 2500ms);
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "abcdef\n");
}

TEST(OutputThroughTheLauncher, ProgressIsSeenOnlyWhenTheJobWrites) {
  ProcessResult silent = RunLauncher({{"--log-level", "info", "--", "sh", "-c", "sleep 0.1"}, {}, {}, {}, 20s}, kRelayRun);
  EXPECT_EQ(silent.exit_code, 0);
  EXPECT_NE(silent.err.find("progress seen: no"), std::string::npos) << silent.err;
  ProcessResult writes = RunLauncher({{"--log-level", "info", "--", "sh", "-c", "echo hi >&2"}, {}, {}, {}, 20s}, kRelayRun);
  EXPECT_EQ(writes.exit_code, 0);
  EXPECT_NE(writes.err.find("progress seen: yes"), std::string::npos) << writes.err;
}

// A traceback's last line (even without its newline) is out before the launcher says how
// the command ended.
TEST(OutputThroughTheLauncher, TheJobsLastOutputComesBeforeTheLaunchersLinesAboutItsEnd) {
  ProcessResult result =
      RunLauncher({{"--", "sh", "-c", "printf 'Error: the last words' >&2; exit 4"}, {}, {}, {}, 20s}, kRelayRun);
  EXPECT_EQ(result.exit_code, 4);
  EXPECT_EQ(result.err.rfind("Error: the last words", 0), 0u) << result.err;
  EXPECT_NE(result.err.find("exited with code 4"), std::string::npos) << result.err;
}

// Processes that left the group with the pipes open: stopped with the job, and the
// launcher's end is bounded however they behave.
TEST(OutputThroughTheLauncher, AnEscapedProcessDoesNotHoldTheLauncher) {
  for (const std::string escaped : {"setsid sleep 100 &", "setsid sh -c 'trap \"\" TERM; exec sleep 100' &"}) {
    LauncherProcess launcher({{"--grace-ms", "500", "--", "sh", "-c", escaped + " echo started"}, {}, {}, {}, 30s}, kRelayRun);
    ProcessResult result = launcher.Finish();
    EXPECT_EQ(result.exit_code, 0) << escaped << ": " << result.err;
    EXPECT_EQ(result.out, "started\n");
    EXPECT_LT(result.elapsed, 5s) << escaped;
  }
}

// SIGTERM to the launcher while the job writes: the job's last line, printed as it
// handles TERM, is in the output, and nothing before it is missing.
TEST(OutputThroughTheLauncher, TheLastLineOfAStoppedJobIsKept) {
  TempDir dir;
  const std::string job = dir.Write("job.py", "import signal, sys, time\n"
                                              "stop = []\n"
                                              "signal.signal(signal.SIGTERM, lambda n, f: stop.append(n))\n"
                                              "n = 0\n"
                                              "while not stop:\n"
                                              "    print('line', n, 'x' * 200, flush=True)\n"
                                              "    n += 1\n"
                                              "    time.sleep(0.0005)\n"
                                              "print('last line after', n, flush=True)\n");
  LauncherProcess launcher({{"--", "python3", job}, {}, {}, {}, 30s}, kRelayRun);
  ASSERT_TRUE(launcher.WaitForOutput("line 200 ", 10s));
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const size_t last = result.out.rfind("last line after ");
  ASSERT_NE(last, std::string::npos) << result.out.substr(result.out.size() - std::min<size_t>(500, result.out.size()));
  EXPECT_EQ(result.out.back(), '\n');
  const int count = std::atoi(result.out.c_str() + last + 16);
  EXPECT_EQ(Lines(result.out), size_t(count) + 1) << "lines are missing";
  ASSERT_GT(last, 0u);
  const size_t previous = result.out.rfind('\n', last - 2) + 1;  // npos + 1 == 0: the first line
  EXPECT_EQ(result.out.substr(previous, last - previous), "line " + std::to_string(count - 1) + " " + std::string(200, 'x') + "\n");
}

// A terminal is relayed through a terminal of the relay's own: the job still sees one.
TEST(OutputThroughTheLauncher, AJobWhoseOutputIsATerminalStillSeesATerminal) {
  TempDir dir;
  PseudoTerminal pty;
  ASSERT_GE(pty.terminal, 0);
  const int master = pty.master;
  const int err = OpenForWriting(dir.path() + "/err");
  const pid_t pid = Start({"--", "sh", "-c",
                           "if [ -t 1 ]; then echo stdout-is-the-terminal; fi; "
                           "if [ -t 2 ]; then echo stderr-tty >&2; else echo stderr-not-a-terminal >&2; fi"},
                          pty.terminal, err);
  pty.CloseTerminal();
  close(err);
  std::string seen;
  char buffer[4096];
  const auto deadline = Clock::now() + 10s;
  while (seen.find("stdout-is-the-terminal") == std::string::npos && Clock::now() < deadline) {
    pollfd readable = {master, POLLIN, 0};
    if (poll(&readable, 1, 100) <= 0) continue;
    const ssize_t got = read(master, buffer, sizeof buffer);
    if (got <= 0) break;  // EIO: every holder of the terminal is gone
    seen.append(buffer, size_t(got));
  }
  EXPECT_EQ(Wait(pid, 10s), 0);
  EXPECT_NE(seen.find("stdout-is-the-terminal"), std::string::npos) << seen;
  EXPECT_EQ(ReadFile(dir.path() + "/err"), "stderr-not-a-terminal\n");
}

// The launcher's stdout is a pipe whose reader exits: the job's output is discarded, the
// job neither blocks nor gets SIGPIPE, the launcher does not hang, the code is the job's.
TEST(OutputThroughTheLauncher, AClosedDestinationStopsNeitherTheLauncherNorTheJob) {
  TempDir dir;
  int out[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  const int err = OpenForWriting(dir.path() + "/err");
  const pid_t pid = Start({"--", "sh", "-c", "echo first; seq 1 300000; echo \"seq exited $?\" >&2; exit 3"}, out[1], err);
  close(out[1]);
  close(err);
  std::string seen;
  char buffer[64];
  while (seen.find('\n') == std::string::npos) {
    pollfd readable = {out[0], POLLIN, 0};
    if (poll(&readable, 1, 10000) <= 0) break;
    const ssize_t got = read(out[0], buffer, sizeof buffer);
    if (got <= 0) break;
    seen.append(buffer, size_t(got));
  }
  close(out[0]);  // the reader goes away
  EXPECT_EQ(seen.substr(0, 6), "first\n");
  EXPECT_EQ(Wait(pid, 30s), 3) << ReadFile(dir.path() + "/err");
  const std::string log = ReadFile(dir.path() + "/err");
  EXPECT_NE(log.find("seq exited 0"), std::string::npos) << log;
  EXPECT_NE(log.find("the rest of it is discarded"), std::string::npos) << log;
}

}  // namespace
}  // namespace bt::testing
