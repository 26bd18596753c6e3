// OutputRelay in this process, with real children: what it takes over, progress, line
// buffering, destinations that block or fill, and the bound on its end.
#include "launcher/supervision/output_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/pseudo_terminal.h"

namespace bt::launcher {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::PseudoTerminal;

struct Pipe {
  Pipe() {
    if (pipe2(fds, O_CLOEXEC) != 0) std::abort();
  }
  ~Pipe() {
    CloseRead();
    CloseWrite();
  }
  void CloseRead() {
    if (fds[0] >= 0) close(fds[0]);
    fds[0] = -1;
  }
  void CloseWrite() {
    if (fds[1] >= 0) close(fds[1]);
    fds[1] = -1;
  }
  int read_end() const { return fds[0]; }
  int write_end() const { return fds[1]; }
  int fds[2] = {-1, -1};
};

// A named pipe with two write descriptions of its own (`> fifo 2> fifo`): one destination
// that is two streams, unlike one description twice (`2>&1`).
struct TwiceOpenedFifo {
  TwiceOpenedFifo() {
    path = "/tmp/bt-relay-fifo-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    if (mkfifo(path.c_str(), 0600) != 0) std::abort();
    read_end = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    writes[0] = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    writes[1] = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    fcntl(read_end, F_SETFL, O_RDONLY);
    unlink(path.c_str());
  }
  ~TwiceOpenedFifo() {
    CloseWrites();
    if (read_end >= 0) close(read_end);
  }
  void CloseWrites() {
    for (int& fd : writes) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }
  static inline int counter = 0;
  std::string path;
  int read_end = -1;
  int writes[2] = {-1, -1};
};

// Reads what `fd` has within `wait` (until nothing came for that long, or end of file).
std::string ReadFor(int fd, std::chrono::milliseconds wait) {
  std::string text;
  char buffer[65536];
  while (true) {
    pollfd readable = {fd, POLLIN, 0};
    if (poll(&readable, 1, int(wait.count())) <= 0) return text;
    const ssize_t got = read(fd, buffer, sizeof buffer);
    if (got <= 0) return text;
    text.append(buffer, size_t(got));
  }
}

// Reads until `text` is in what was read or `timeout` passes.
bool ReadUntil(int fd, std::string& seen, const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char buffer[65536];
  while (seen.find(text) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd readable = {fd, POLLIN, 0};
    if (poll(&readable, 1, int(left)) <= 0) continue;
    const ssize_t got = read(fd, buffer, sizeof buffer);
    if (got <= 0) return seen.find(text) != std::string::npos;
    seen.append(buffer, size_t(got));
  }
  return true;
}

// The shell starts with no signal blocked: an earlier test of this binary may have left
// SIGCHLD blocked in this thread (a SignalRouter), and a shell that inherits that never
// wakes from `wait` (dash's sigsuspend keeps the inherited mask).
pid_t SpawnShell(OutputRelay& relay, const std::string& script) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  relay.AddToSpawn(actions);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid = -1;
  const int error = posix_spawn(&pid, "/bin/sh", &actions, &attributes, const_cast<char**>(argv), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  relay.Start();
  if (error != 0) ADD_FAILURE() << "posix_spawn: " << error;
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string TempPath(const std::string& name) {
  return std::string("/tmp/bt-relay-test-") + std::to_string(getpid()) + "-" + name;
}

// Everything `fd` gives until end of file, `pause` after each read (a slow reader).
std::string ReadToEnd(int fd, std::chrono::microseconds pause = {}) {
  std::string text;
  char buffer[65536];
  for (ssize_t got; (got = read(fd, buffer, sizeof buffer)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    text.append(buffer, size_t(got));
    std::this_thread::sleep_for(pause);
  }
  return text;
}

// `count` lines "<tag><n> <filler>\n" of 8 to 200 bytes, written to a file: a job `cat`s it
// in 128 KiB writes that end mid-line, the relay's large chunks.
std::string WriteNumberedLines(const std::string& path, char tag, int count) {
  std::string text;
  for (int n = 0; n < count; ++n) text += tag + std::to_string(n) + " " + std::string(size_t(n * 7919 % 193), 'x') + "\n";
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr || std::fwrite(text.data(), 1, text.size(), file) != text.size()) ADD_FAILURE() << "cannot write " << path;
  if (file != nullptr) std::fclose(file);
  return text;
}

// The lines of `text` that start with `tag`, in order.
std::string LinesTagged(const std::string& text, char tag) {
  std::string lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    end = end == std::string::npos ? text.size() : end + 1;
    if (text[start] == tag) lines.append(text, start, end - start);
    start = end;
  }
  return lines;
}

TEST(RelayTakesOver, PipesFilesDevicesAndTerminalsButNotClosedDescriptors) {
  Pipe pipe;
  EXPECT_TRUE(RelayTakesOver(pipe.write_end()));
  EXPECT_FALSE(RelayTakesOver(pipe.read_end())) << "a read-only descriptor cannot be written";
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  EXPECT_TRUE(RelayTakesOver(null));
  close(null);
  EXPECT_FALSE(RelayTakesOver(null)) << "closed";
  EXPECT_FALSE(RelayTakesOver(-1));
  PseudoTerminal pty;
  ASSERT_GE(pty.terminal, 0);
  EXPECT_TRUE(RelayTakesOver(pty.terminal)) << "through a terminal of the relay's own";
}

// `docker run -t`, `tty: true`: the launcher's output is a terminal. The job still writes to
// a terminal (isatty, its size), whose output the relay forwards and notes as progress;
// the real terminal's own output processing applies once (\n becomes \r\n there only).
TEST(OutputRelay, ATerminalIsRelayedThroughATerminalOfItsOwnAndItsOutputIsProgress) {
  PseudoTerminal pty;
  ASSERT_GE(pty.terminal, 0);
  winsize size{};
  size.ws_row = 33;
  size.ws_col = 111;
  ASSERT_EQ(ioctl(pty.terminal, TIOCSWINSZ, &size), 0);
  Pipe err;
  watchdog::Progress progress;
  OutputRelay relay(progress, pty.terminal, err.write_end());
  EXPECT_TRUE(relay.TakesOver(1));
  EXPECT_TRUE(relay.TakesOver(2));
  const pid_t child = SpawnShell(relay, "if [ -t 1 ]; then echo tty; fi; stty size <&1; one=$(readlink /proc/$$/fd/1); echo \"$one\" >&2");
  EXPECT_EQ(WaitExit(child), 0);
  relay.Finish(2s);
  err.CloseWrite();
  EXPECT_TRUE(progress.seen());
  std::string seen;
  EXPECT_TRUE(ReadUntil(pty.master, seen, "tty\r\n33 111\r\n", 5s)) << seen;
  const std::string job_terminal = ReadFor(err.read_end(), 1s);
  char real[256] = {};
  ASSERT_GT(readlink(("/proc/self/fd/" + std::to_string(pty.terminal)).c_str(), real, sizeof real - 1), 0);
  EXPECT_EQ(job_terminal.rfind("/dev/pts/", 0), 0u) << job_terminal;
  EXPECT_NE(job_terminal, std::string(real) + "\n") << "the job writes to the relay's terminal, not the real one";
}

TEST(OutputRelay, ForwardsBothStreamsAndNotesProgressOnlyWhenTheJobWrites) {
  Pipe out, err;
  watchdog::Progress progress;
  OutputRelay relay(progress, out.write_end(), err.write_end());
  ASSERT_TRUE(relay.TakesOver(1));
  ASSERT_TRUE(relay.TakesOver(2));
  const auto start = Clock::now();
  const pid_t child = SpawnShell(relay, "sleep 0.6; echo out; echo err >&2; sleep 1.2; echo done");
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(progress.seen()) << "the job has written nothing yet";
  std::string seen;
  ASSERT_TRUE(ReadUntil(out.read_end(), seen, "out\n", 5s));
  ASSERT_TRUE(progress.seen());
  const auto written = progress.last();
  EXPECT_GE(written - start, 500ms);
  std::this_thread::sleep_for(200ms);  // the stderr line is noted too, at about the same time
  const auto noted = progress.last();
  EXPECT_LT(noted - written, 300ms);
  std::this_thread::sleep_for(500ms);  // the job is silent now
  EXPECT_EQ(progress.last(), noted) << "progress noted while the job wrote nothing";
  ASSERT_TRUE(ReadUntil(out.read_end(), seen, "done\n", 5s));
  EXPECT_GT(progress.last(), noted);
  EXPECT_EQ(WaitExit(child), 0);
  relay.Finish(2s);
  out.CloseWrite();
  err.CloseWrite();
  EXPECT_EQ(seen + ReadFor(out.read_end(), 200ms), "out\ndone\n");
  EXPECT_EQ(ReadFor(err.read_end(), 200ms), "err\n");
}

// Two streams into one destination (a container's log): a line written in pieces arrives
// whole, not cut by the other stream's line that came between its pieces.
TEST(OutputRelay, ALineWrittenInPiecesArrivesWhole) {
  TwiceOpenedFifo both;
  watchdog::Progress progress;
  OutputRelay relay(progress, both.writes[0], both.writes[1], {.partial_line_delay = 1500ms});
  const pid_t child = SpawnShell(relay, "printf 'out-a'; sleep 0.1; echo ERR >&2; sleep 0.1; echo out-b");
  EXPECT_EQ(WaitExit(child), 0);
  relay.Sync(2s);
  relay.Finish(2s);
  both.CloseWrites();
  EXPECT_EQ(ReadFor(both.read_end, 500ms), "ERR\nout-aout-b\n");
}

TEST(OutputRelay, APartialLineIsWrittenAfterTheDelayNotAtTheJobsEnd) {
  Pipe out;
  watchdog::Progress progress;
  OutputRelay relay(progress, out.write_end(), STDERR_FILENO);
  const auto start = Clock::now();
  const pid_t child = SpawnShell(relay, "printf 'abc'; exec sleep 3");
  std::string seen;
  ASSERT_TRUE(ReadUntil(out.read_end(), seen, "abc", 2500ms)) << "a partial line waited for the job's end";
  EXPECT_LT(Clock::now() - start, 1500ms);
  // A progress bar: pieces without a newline keep arriving, each within the delay.
  kill(child, SIGKILL);
  WaitExit(child);
  const pid_t bar = SpawnShell(relay, "for p in 10 20 30; do printf '\\r%s%%' $p; sleep 0.4; done; echo");
  ASSERT_TRUE(ReadUntil(out.read_end(), seen, "\r20%", 2s));
  EXPECT_EQ(seen, "abc\r10%\r20%") << "the bar arrived with its pieces, not later";
  EXPECT_EQ(WaitExit(bar), 0);
  relay.Finish(2s);
  out.CloseWrite();
  EXPECT_EQ(seen + ReadFor(out.read_end(), 200ms), "abc\r10%\r20%\r30%\n");
}

// A destination the launcher was given non-blocking (a pipe another process set
// O_NONBLOCK on) that fills: the relay waits for room, drops nothing, does not spin.
TEST(OutputRelay, ANonBlockingDestinationThatFillsLosesNothing) {
  Pipe out;
  fcntl(out.write_end(), F_SETFL, fcntl(out.write_end(), F_GETFL) | O_NONBLOCK);
  watchdog::Progress progress;
  OutputRelay relay(progress, out.write_end(), STDERR_FILENO);
  const pid_t child = SpawnShell(relay, "seq 1 600000");  // ~4 MB, far beyond what the pipes hold
  std::this_thread::sleep_for(500ms);                     // the destination is full by now
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(500ms);
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  const auto cpu = [](const rusage& usage) {
    return usage.ru_utime.tv_sec * 1000000L + usage.ru_utime.tv_usec + usage.ru_stime.tv_sec * 1000000L + usage.ru_stime.tv_usec;
  };
  EXPECT_LT(cpu(after) - cpu(before), 100000) << "the relay spins on EAGAIN";
  std::string seen;
  ASSERT_TRUE(ReadUntil(out.read_end(), seen, "\n600000\n", 20s));
  EXPECT_EQ(WaitExit(child), 0);
  relay.Finish(2s);
  out.CloseWrite();
  seen += ReadFor(out.read_end(), 200ms);
  std::string expected;
  for (int i = 1; i <= 600000; ++i) expected += std::to_string(i) + "\n";
  EXPECT_TRUE(seen == expected) << "got " << seen.size() << " bytes, expected " << expected.size();
}

// A job that writes fast (large chunks, which the relay splices) on stdout while its
// stderr writes lines into the same destination: every line arrives whole, each stream's
// in order, none lost. The destination is read slowly, so that the job's output piles up
// in its pipe while the relay waits for room: the relay takes it in large chunks.
TEST(OutputRelay, LargeChunksArriveWithEveryLineWhole) {
  const std::string path = TempPath("lines");
  const std::string out_lines = WriteNumberedLines(path, 'o', 100000);  // ~10 MB
  std::string err_lines;
  for (int n = 1; n <= 3000; ++n) err_lines += "e" + std::to_string(n) + "\n";
  TwiceOpenedFifo both;
  std::string seen;
  std::thread reader([&] { seen = ReadToEnd(both.read_end, 200us); });
  {
    watchdog::Progress progress;
    OutputRelay relay(progress, both.writes[0], both.writes[1]);
    const pid_t child = SpawnShell(relay, "cat " + path + " & n=1; while [ $n -le 3000 ]; do echo e$n >&2; n=$((n+1)); done; wait");
    EXPECT_EQ(WaitExit(child), 0);
    relay.Finish(2s);
  }
  both.CloseWrites();
  reader.join();
  std::remove(path.c_str());
  EXPECT_EQ(seen.size(), out_lines.size() + err_lines.size());
  EXPECT_TRUE(LinesTagged(seen, 'o') == out_lines) << "stdout's lines were cut, reordered or lost";
  EXPECT_EQ(LinesTagged(seen, 'e'), err_lines);
}

// `2>&1 | ...`: the launcher's stdout and stderr are one pipe. The job's two streams share
// one channel, so 800 alternating lines arrive in the order they were written.
TEST(OutputRelay, StdoutAndStderrToOnePipeStayInTheOrderWritten) {
  Pipe both;
  watchdog::Progress progress;
  OutputRelay relay(progress, both.write_end(), both.write_end());
  ASSERT_TRUE(relay.TakesOver(1));
  ASSERT_TRUE(relay.TakesOver(2));
  std::string expected;
  for (int n = 0; n < 400; ++n) expected += "o" + std::to_string(n) + "\ne" + std::to_string(n) + "\n";
  std::string seen;
  std::thread reader([&] { seen = ReadToEnd(both.read_end()); });
  const pid_t child = SpawnShell(relay, "i=0; while [ $i -lt 400 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done");
  EXPECT_EQ(WaitExit(child), 0);
  relay.Finish(2s);
  both.CloseWrite();
  reader.join();
  EXPECT_TRUE(seen == expected) << "lines reordered or lost: " << seen.size() << " bytes of " << expected.size();
}

// A file with the job's own description (Options::files) is not taken over: the job's fd 1
// is that description; the other stream's pipe is still relayed.
TEST(OutputRelay, AFileTheJobWritesItselfIsNotTakenOver) {
  const std::string destination = TempPath("file-destination");
  const int fd = open(destination.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  Pipe err;
  watchdog::OutputFiles files(fd, err.write_end());
  OutputRelay::Options options;
  options.files = &files;
  watchdog::Progress progress;
  {
    OutputRelay relay(progress, fd, err.write_end(), options);
    EXPECT_FALSE(relay.TakesOver(1));
    EXPECT_EQ(relay.JobsOwnFile(1), files.JobDescription(1));
    EXPECT_TRUE(relay.TakesOver(2));
    const pid_t child = SpawnShell(relay, "echo to-the-file; echo relayed >&2");
    EXPECT_EQ(WaitExit(child), 0);
    relay.Finish(2s);
  }
  err.CloseWrite();
  EXPECT_EQ(ReadFor(err.read_end(), 1s), "relayed\n");
  EXPECT_TRUE(files.JobWrote());
  const int written = open(destination.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(ReadToEnd(written), "to-the-file\n");
  close(written);
  close(fd);
  std::remove(destination.c_str());
}

// A process out of the launcher's reach keeps the pipe open: Finish forwards what was
// written and returns after its bound.
TEST(OutputRelay, FinishIsBoundedWhenAProcessKeepsThePipeOpen) {
  Pipe out;
  watchdog::Progress progress;
  OutputRelay relay(progress, out.write_end(), STDERR_FILENO);
  const std::string pid_file = TempPath("holder.pid");
  const pid_t child = SpawnShell(relay, "setsid sh -c 'echo $$ > " + pid_file + "; exec sleep 30' & printf 'last words'");
  EXPECT_EQ(WaitExit(child), 0);
  std::this_thread::sleep_for(200ms);
  const auto start = Clock::now();
  relay.Finish(700ms);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 600ms) << "the relay stopped before its bound while a writer was alive";
  EXPECT_LT(took, 2500ms);
  out.CloseWrite();
  EXPECT_EQ(ReadFor(out.read_end(), 200ms), "last words");
  FILE* file = std::fopen(pid_file.c_str(), "r");
  ASSERT_NE(file, nullptr);
  int holder = 0;
  ASSERT_EQ(std::fscanf(file, "%d", &holder), 1);
  std::fclose(file);
  std::remove(pid_file.c_str());
  kill(holder, SIGKILL);
}

// A destination that accepts nothing (a reader that stopped reading): the job waits on it,
// as it would without the launcher, but the launcher's end is bounded.
TEST(OutputRelay, ADestinationThatAcceptsNothingDoesNotHoldFinish) {
  Pipe out;  // blocking, and never read while the relay runs
  watchdog::Progress progress;
  OutputRelay relay(progress, out.write_end(), STDERR_FILENO);
  const pid_t child = SpawnShell(relay, "exec head -c 5000000 /dev/zero");
  std::this_thread::sleep_for(500ms);  // the relay blocks in a write, the job on the full pipe
  kill(child, SIGKILL);
  WaitExit(child);
  const auto start = Clock::now();
  relay.Finish(300ms);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 4s);
  out.CloseRead();  // the relay's blocked write fails (EPIPE) and its thread ends
  // The let-go thread is detached: it must be done before this process's statics are
  // destroyed (on a loaded machine it ran into them at exit: SIGSEGV after the test passed).
  std::this_thread::sleep_for(1s);
}

// The destination is gone (its reader exited): the job's output is read and discarded,
// so the job neither blocks nor dies of SIGPIPE, and neither does this process.
TEST(OutputRelay, AClosedDestinationDoesNotBlockTheJob) {
  Pipe out;
  out.CloseRead();
  watchdog::Progress progress;
  OutputRelay relay(progress, out.write_end(), STDERR_FILENO);
  const auto start = Clock::now();
  const pid_t child = SpawnShell(relay, "seq 1 300000; exit 3");
  EXPECT_EQ(WaitExit(child), 3);
  EXPECT_LT(Clock::now() - start, 10s);
  relay.Finish(2s);
  EXPECT_TRUE(progress.seen());
}

// The thread starts at the job's first output (the supervisor polls StartWhenReadable).
TEST(OutputRelay, TheThreadStartsWhenTheJobFirstWrites) {
  Pipe out;
  watchdog::Progress progress;
  {
    OutputRelay relay(progress, out.write_end(), -1);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    relay.AddToSpawn(actions);
    const char* argv[] = {"/bin/sh", "-c", "sleep 0.3; echo first; sleep 0.3; echo second", nullptr};
    pid_t child = -1;
    ASSERT_EQ(posix_spawn(&child, "/bin/sh", &actions, nullptr, const_cast<char**>(argv), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    auto fds = relay.StartWhenReadable();
    EXPECT_GE(fds[0].fd, 0);
    EXPECT_EQ(fds[1].fd, -1) << "stderr (no destination) is not taken over";
    ASSERT_EQ(poll(fds.data(), 2, 5000), 1);
    EXPECT_FALSE(progress.seen()) << "nothing forwards before Start";
    relay.Start();
    EXPECT_EQ(relay.StartWhenReadable()[0].fd, -1) << "started: nothing to watch";
    std::string seen;
    EXPECT_TRUE(ReadUntil(out.read_end(), seen, "first\nsecond\n", 5s)) << seen;
    EXPECT_TRUE(progress.seen());
    EXPECT_EQ(WaitExit(child), 0);
    relay.Finish(2s);
  }
  // A job that writes nothing: no thread, and Finish has nothing to wait for.
  OutputRelay relay(progress, out.write_end(), -1);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  relay.AddToSpawn(actions);
  const char* argv[] = {"/bin/true", nullptr};
  pid_t child = -1;
  ASSERT_EQ(posix_spawn(&child, "/bin/true", &actions, nullptr, const_cast<char**>(argv), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(WaitExit(child), 0);
  const auto start = Clock::now();
  relay.Sync(2s);
  relay.Finish(2s);
  EXPECT_LT(Clock::now() - start, 1s);  // neither waited out its 2 s (a busy machine may preempt this thread)
}

TEST(OutputRelay, NothingTakenOverMeansNoPipes) {
  watchdog::Progress progress;
  OutputRelay relay(progress, -1, -1);
  EXPECT_FALSE(relay.TakesOver(1));
  EXPECT_FALSE(relay.TakesOver(2));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  relay.AddToSpawn(actions);
  posix_spawn_file_actions_destroy(&actions);
  relay.Sync(1s);
  relay.Finish(1s);
}

}  // namespace
}  // namespace bt::launcher
