// The job's stdout and stderr through the launcher, so that output counts as progress
// (issue 21): each stream the launcher may take over gets a pipe; the job writes into it
// as fd 1 or 2 and one thread forwards every byte to the launcher's own fd 1 or 2,
// unchanged and in order, noting watchdog::Progress whenever bytes arrive.
//
// Forwarding is line-buffered: everything up to the last newline read is written at once;
// a trailing partial line waits for its newline at most kPartialLineDelay (a progress bar,
// a prompt) or until kMaxPartialLine bytes are pending. So a line the job writes in pieces
// reaches the output whole, not cut by the other stream's lines or the launcher's log.
// The whole lines of a large chunk are spliced from the pipe to the destination rather
// than copied through the launcher: only where its lines end is read (output_relay.cpp).
//
// A stream whose destination is a terminal (`docker run -t`, an interactive `bt-launch
// run`) goes through a pseudo-terminal of the relay's own, with the real one's settings and
// size: the job still sees a terminal (colours, isatty, line buffering) and its output is
// progress. When stdout and stderr go to the same place (`2>&1 | tee`, one terminal) the
// job's fd 1 and 2 share one channel, so their lines stay in the order the job wrote them.
// A stream that is not open is left alone: the job inherits it. One that goes to a regular file is
// the job's to write, through a description of its own (`Options::files`,
// watchdog/output_files.h), whose offset tells the watchdog that the job wrote.
#pragma once

#include <pthread.h>
#include <spawn.h>

#include <poll.h>

#include <array>
#include <functional>
#include <string_view>
#include <chrono>
#include <cstddef>
#include <memory>

#include "launcher/watchdog/output_files.h"
#include "launcher/watchdog/progress.h"

namespace bt::launcher {

// How long a partial line (no newline yet) waits before it is written anyway.
inline constexpr std::chrono::milliseconds kPartialLineDelay{50};
// Pending bytes without a newline beyond which they are written anyway.
inline constexpr size_t kMaxPartialLine = 64 * 1024;
// Bytes read from a pipe at once (the buffer of each stream holds this plus a partial line).
inline constexpr size_t kRelayReadSize = 256 * 1024;
// What a pipe is grown to once the job writes fast (F_SETPIPE_SZ; the default 64 KiB makes
// a fast writer wait on the relay more often). Above /proc/sys/fs/pipe-max-size it is not.
inline constexpr int kRelayPipeSize = 1024 * 1024;
// After each read the pipes are left alone for as long as kRelaySmallRead (or a quarter of
// the smaller pipe) takes to arrive at the rate of that read, and at most this long, so that
// the next read takes many writes at once: one wake-up of the relay per write would cost
// more CPU than the job's own writes, whether the job writes a line at a time
// (PYTHONUNBUFFERED) or fast in small writes the relay keeps up with (`base64`, 4 KiB at a
// time). At that pace the pause never makes the job wait on a full pipe. A line that comes
// alone is still forwarded at once; it is the lines right behind it that wait.
inline constexpr std::chrono::microseconds kRelayCoalesceDelay{1000};
inline constexpr size_t kRelaySmallRead = 64 * 1024;
// After the last command, how long the relay waits for the pipes' end of file (every
// writer gone) before it forwards what is readable and stops: a process the launcher
// could not stop may hold them open forever.
inline constexpr std::chrono::milliseconds kRelayDrainBound{2000};

// Whether the launcher takes over the stream that goes to `destination` (its fd 1 or 2):
// it is open for writing (and not a file the job writes itself).
bool RelayTakesOver(int destination);

struct OutputRelayOptions {
  std::chrono::milliseconds partial_line_delay = kPartialLineDelay;
  size_t max_partial_line = kMaxPartialLine;
  // The job's own descriptions of the files among the destinations: those streams are not
  // taken over, the job's fd 1 or 2 is its description. Outlives the relay.
  const watchdog::OutputFiles* files = nullptr;
  // Sees every block of whole lines forwarded (the relay's thread; the goodput report's
  // step numbers, launcher.progress.step_pattern). Set, the relay reads every chunk: a line
  // spliced past it would never be seen.
  std::function<void(std::string_view lines)> on_lines;
};

// Used from one thread (the supervisor's); it runs one thread of its own.
class OutputRelay {
 public:
  using Options = OutputRelayOptions;

  // Creates the pipes of the streams it takes over. `stdout_destination` and
  // `stderr_destination` are where the streams go: the launcher's own fd 1 and 2.
  explicit OutputRelay(watchdog::Progress& progress, int stdout_destination = 1, int stderr_destination = 2,
                       Options options = {});
  ~OutputRelay();  // Finish(kRelayDrainBound) when not finished yet
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // Whether the stream that goes to fd 1 (`stream` 1) or fd 2 (2) is taken over.
  bool TakesOver(int stream) const;
  // The job's own description of the file that `stream` goes to, or -1 (Options::files).
  int JobsOwnFile(int stream) const;
  // The child's fd 1 and 2 become the pipes of the streams taken over, or the job's own
  // descriptions of its files. Until Finish.
  void AddToSpawn(posix_spawn_file_actions_t& actions) const;
  // The forwarding thread starts when the job first writes: a job that writes nothing
  // (`run -- /bin/true`) costs no thread, and a launcher that ends it waits on no thread
  // being scheduled. Until then the caller polls these (fd -1: nothing to watch) with its
  // own descriptors and calls Start once one is readable; the pipes hold what the job
  // writes meanwhile. Sync and Finish start it themselves when something waits.
  std::array<pollfd, 2> StartWhenReadable() const;
  void Start();  // once; none when nothing is taken over
  // Waits, at most `bound`, until what the pipes hold now and any partial line are
  // forwarded: after a command's processes are gone, its last output comes before the
  // launcher's next log line. Returns at once when the thread has nothing left.
  void Sync(std::chrono::milliseconds bound);
  // No more commands: the launcher's ends of the pipes are closed and everything is
  // forwarded until end of file on both pipes; when `bound` passes without it (a process
  // outside the launcher's reach holds a pipe), what is readable then is forwarded and the
  // pipes are closed. Returns once everything is forwarded (or, if the destination blocks,
  // a little after `bound`, giving up on it); the thread may still be ending then.
  void Finish(std::chrono::milliseconds bound = kRelayDrainBound);

  struct State;  // shared with the thread, which may outlive the relay (a blocked destination)

 private:
  void CannotRelay(const char* call, int error);
  void TakeOverNothing();
  void CloseChildEnds();

  std::shared_ptr<State> state_;
  pthread_t thread_{};
  bool running_ = false;  // the thread was started and not joined or given up on
  int child_ends_[2] = {-1, -1};  // the write ends, for the child's fd 1 and 2 (one for both: SameDestination)
  bool finished_ = false;
};

}  // namespace bt::launcher
