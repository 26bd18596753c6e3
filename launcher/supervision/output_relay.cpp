#include "launcher/supervision/output_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <linux/kcmp.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include <spdlog/spdlog.h>

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// After Finish's bound, how long a destination that accepts nothing more may hold the
// thread before the launcher stops waiting for it.
constexpr std::chrono::milliseconds kBlockedDestinationGrace{1000};
// How often a write that waits on a non-blocking destination (EAGAIN) looks whether the
// launcher gave up on it.
constexpr int kWritableWaitMs = 100;
// The thread's stack: its frames are small; spdlog's formatting is the deepest.
constexpr size_t kRelayThreadStack = 256 * 1024;
// A read this large grows the pipe to kRelayPipeSize.
constexpr size_t kGrowAfterRead = 16 * 1024;
// What a chunk must hold to be spliced (SpliceLines): below it, reading it costs less than
// the calls that find its line ends.
constexpr size_t kSpliceMin = 64 * 1024;
// How far from a chunk's start and end a line end is looked for (the bytes the relay reads
// of a spliced chunk); a chunk whose last line is longer takes the buffer's way.
constexpr size_t kLineEndPeek = 4096;
static_assert(kSpliceMin >= 2 * kLineEndPeek, "a chunk's first and last kLineEndPeek bytes must not overlap");

const char* StreamName(int number) { return number == 1 ? "stdout" : "stderr"; }

// A pipe end must not take fd 0, 1 or 2 (a launcher started with one of them closed):
// the child's dup2 onto that number, and the launcher's own writes there, would be wrong.
int AboveStandard(int fd) {
  if (fd < 0 || fd > 2) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  return moved;
}

}  // namespace

bool RelayTakesOver(int destination) {
  const int flags = fcntl(destination, F_GETFL);
  return flags >= 0 && (flags & O_ACCMODE) != O_RDONLY;
}

struct OutputRelay::State {
  struct Stream {
    int number = 0;        // 1 or 2: which of the job's streams
    int source = -1;       // the pipe's read end (non-blocking); closed with the State
    bool open = false;     // not at its end yet (the thread's)
    int destination = -1;  // the launcher's fd 1 or 2
    std::unique_ptr<char[]> buffer;
    size_t pending = 0;    // bytes held at the buffer's start: a line without its newline yet
    Clock::time_point pending_since;  // when the first of them arrived
    bool broken = false;   // the destination is gone: what comes is read and discarded
    bool warned = false;
    size_t pipe_size = 0;  // what the pipe holds (0: not asked yet); grown once the job writes fast
    bool grown = false;
    bool terminal = false;  // the source is a pseudo-terminal's master: EIO is its end of file
    // Whether whole lines are spliced to the destination (SpliceLines): only to a pipe, asked
    // at the first large chunk; off too once a splice failed.
    enum class Splicing { kUnknown, kOn, kOff } splicing = Splicing::kUnknown;
  };

  State(watchdog::Progress& progress, Options options)
      : progress(progress), options(std::move(options)), splice_off(this->options.on_lines != nullptr) {}
  ~State() {
    for (auto& stream : streams) {
      if (stream.source >= 0) close(stream.source);
    }
    for (int fd : {wake, scratch[0], scratch[1], discard}) {
      if (fd >= 0) close(fd);
    }
  }

  size_t capacity() const { return kRelayReadSize + options.max_partial_line; }

  watchdog::Progress& progress;
  const Options options;
  Stream streams[2];
  int wake = -1;  // eventfd: a Sync or the Finish was asked for
  // The thread's, made at the first chunk spliced: a pipe that holds a copy of a chunk
  // (tee) while its line ends are looked for, and /dev/null to drop what is not looked at.
  int scratch[2] = {-1, -1};
  int discard = -1;
  bool splice_off;  // they could not be made, or misbehaved, or lines are observed: every stream reads

  std::mutex mutex;
  std::condition_variable changed;
  uint64_t sync_requested = 0;
  uint64_t sync_done = 0;
  bool finish_requested = false;
  Clock::time_point finish_deadline;
  bool ended = false;
  // Set when the launcher stops waiting for the thread: the thread frees it at its end (the
  // State's last owner may be the thread then).
  std::shared_ptr<State>* self = nullptr;
  std::atomic<bool> abandoned{false};  // the launcher no longer waits: drop what cannot be written
  // Set when Finish lets the thread go: `progress` is the caller's, and may be gone by the
  // time a write blocked on a destination that reads nothing fails and the thread reads on.
  std::atomic<bool> let_go{false};
  // Set before each read, cleared once what was read is written and no partial line waits:
  // with the pipes empty too, a Sync has nothing to wait for.
  std::atomic<bool> busy{false};
};

namespace {

using State = OutputRelay::State;
using Stream = State::Stream;

// Every byte, whatever the destination does: partial writes and EINTR are resumed, EAGAIN
// (a non-blocking destination) is waited out with poll. A destination that fails drops
// this chunk; one that is gone (EPIPE, EBADF) drops the rest too. Said once a stream.
void WriteAll(State& state, Stream& stream, const char* data, size_t size) {
  while (size > 0 && !stream.broken && !state.abandoned.load()) {
    const ssize_t written = write(stream.destination, data, size);
    if (written > 0) {
      data += written;
      size -= size_t(written);
      continue;
    }
    const int error = written < 0 ? errno : EIO;
    if (error == EINTR) continue;
    if (error == EAGAIN || error == EWOULDBLOCK) {
      if (state.abandoned.load()) return;
      pollfd writable = {stream.destination, POLLOUT, 0};
      poll(&writable, 1, kWritableWaitMs);
      continue;
    }
    stream.broken = error == EPIPE || error == EBADF || error == EINVAL;
    if (!stream.warned) {
      stream.warned = true;
      if (stream.broken) {
        spdlog::warn("the job's {} cannot be written to the launcher's fd {} ({}): the rest of it is discarded; the job "
                     "goes on", StreamName(stream.number), stream.number, std::strerror(error));
      } else {
        spdlog::warn("writing the job's {} to the launcher's fd {} failed ({}): {} bytes lost (said once)",
                     StreamName(stream.number), stream.number, std::strerror(error), size);
      }
    }
    return;
  }
}

void FlushPending(State& state, Stream& stream) {
  if (stream.pending == 0) return;
  WriteAll(state, stream, stream.buffer.get(), stream.pending);
  stream.pending = 0;
}

// `count` new bytes behind the pending ones: up to the last newline goes out now, the rest
// waits (see the header) unless it is too long already.
void Consume(State& state, Stream& stream, size_t count, Clock::time_point now) {
  char* buffer = stream.buffer.get();
  const size_t total = stream.pending + count;
  const void* newline = memrchr(buffer + stream.pending, '\n', count);
  if (newline != nullptr) {
    const size_t through = size_t(static_cast<const char*>(newline) - buffer) + 1;
    WriteAll(state, stream, buffer, through);
    if (state.options.on_lines) state.options.on_lines(std::string_view(buffer, through));
    stream.pending = total - through;
    if (stream.pending > 0) {
      std::memmove(buffer, buffer + through, stream.pending);
      stream.pending_since = now;
    }
  } else {
    if (stream.pending == 0) stream.pending_since = now;
    stream.pending = total;
  }
  if (stream.pending >= state.options.max_partial_line) FlushPending(state, stream);
}

void EndSource(State& state, Stream& stream) {
  FlushPending(state, stream);
  stream.open = false;
}

// Allocated at the first read, not value-initialised: a job that writes nothing (or little)
// costs no buffer (or only the pages it touched).
char* Buffer(const State& state, Stream& stream) {
  if (!stream.buffer) stream.buffer.reset(new char[state.capacity()]);
  return stream.buffer.get();
}

// `count` bytes came from the job: that is progress. A job that writes this much at once gets
// a pipe that holds more (F_SETPIPE_SZ is best effort: /proc/sys/fs/pipe-max-size), so that
// it waits less on the relay. The pipe's size is asked here, on the relay's thread, not when
// the pipe is made: `run` pays for no call that only a job with output needs.
void Arrived(State& state, Stream& stream, size_t count, Clock::time_point now) {
  if (!state.let_go.load()) state.progress.Note(now);
  if (stream.pipe_size == 0) stream.pipe_size = size_t(std::max(4096, fcntl(stream.source, F_GETPIPE_SZ)));
  if (stream.grown || count < kGrowAfterRead) return;
  stream.grown = true;
  const int grown = fcntl(stream.source, F_SETPIPE_SZ, kRelayPipeSize);
  if (grown > 0) stream.pipe_size = size_t(grown);
}

// One read, at most `limit` bytes: the count read, 0 at end of file (the stream is ended
// then) or when nothing is there.
size_t ReadOnce(State& state, Stream& stream, size_t limit) {
  char* buffer = Buffer(state, stream);
  const size_t room = std::min(limit, state.capacity() - stream.pending);
  state.busy.store(true);
  const ssize_t got = read(stream.source, buffer + stream.pending, room);
  if (got > 0) {
    const auto now = Clock::now();
    Arrived(state, stream, size_t(got), now);
    Consume(state, stream, size_t(got), now);
    return size_t(got);
  }
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  // A pseudo-terminal's master says EIO once no one holds its terminal: the end of file.
  if (got < 0 && !(errno == EIO && stream.terminal)) spdlog::warn("reading the job's {} failed ({}); forwarding it ends", StreamName(stream.number), std::strerror(errno));
  EndSource(state, stream);
  return 0;
}

// Splicing. A job that writes fast (100 MB of logs, a `cat`) pays for the relay's copies:
// read from the pipe, written again. When the destination is a pipe (a container's log),
// the bytes of a chunk of at least kSpliceMin that are whole lines move from the job's pipe
// to it inside the kernel instead (splice(2) hands over the pages, no copy), and the relay
// reads only where the chunk's lines end: a copy of the chunk (tee(2), no bytes copied)
// whose first and last kLineEndPeek bytes it reads. Every write still ends at a line end, so
// lines stay whole; a held partial line goes out with its end in one write, and the chunk's
// own partial line is held as a read would hold it. A file is written from the buffer: a
// splice into it holds the job's pipe locked while the file system takes the bytes, and a
// job that writes fast waited on that lock (1.8x the direct run's time against 1.3x).

// Exactly `count` bytes of `fd`, a pipe that holds at least that many.
bool ReadExactly(int fd, char* into, size_t count) {
  while (count > 0) {
    const ssize_t got = read(fd, into, count);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    into += got;
    count -= size_t(got);
  }
  return true;
}

// `count` bytes of the scratch pipe dropped unread (/dev/null takes a splice without a copy).
bool DropScratch(State& state, size_t count) {
  while (count > 0) {
    const ssize_t dropped = splice(state.scratch[0], nullptr, state.discard, nullptr, count, SPLICE_F_NONBLOCK);
    if (dropped < 0 && errno == EINTR) continue;
    if (dropped <= 0) return false;
    count -= size_t(dropped);
  }
  return true;
}

// Splicing ends for every stream: the scratch pipe may hold bytes of a chunk that are no
// longer the pipe's first, and would be taken for the next chunk's.
void TurnSplicingOff(State& state) {
  state.splice_off = true;
  for (int& fd : state.scratch) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

// The scratch pipe (as large as the job's, or tee copies less) and /dev/null, made once.
bool SplicingReady(State& state) {
  if (state.splice_off) return false;
  if (state.discard >= 0) return true;
  if (pipe2(state.scratch, O_CLOEXEC | O_NONBLOCK) != 0) {
    state.splice_off = true;
    return false;
  }
  fcntl(state.scratch[1], F_SETPIPE_SZ, kRelayPipeSize);
  state.discard = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (state.discard < 0) TurnSplicingOff(state);
  return state.discard >= 0;
}

struct LineEnds {
  size_t chunk = 0;  // the pipe's first bytes they were found in
  size_t first = 0;  // just past the chunk's first newline; 0 when no partial line is held
  size_t last = 0;   // just past its last newline
};

// Where the first `available` bytes of the stream's pipe have their line ends, from a copy
// that leaves the pipe as it is: the first newline matters only to a held partial line.
// None when the chunk is small or the newlines are too far from its ends.
std::optional<LineEnds> FindLineEnds(State& state, const Stream& stream, size_t available) {
  const ssize_t teed = tee(stream.source, state.scratch[1], available, SPLICE_F_NONBLOCK);
  if (teed <= 0) return std::nullopt;
  const size_t chunk = size_t(teed);
  if (chunk < kSpliceMin) {
    if (!DropScratch(state, chunk)) TurnSplicingOff(state);
    return std::nullopt;
  }
  char head[kLineEndPeek];
  char tail[kLineEndPeek];
  const bool held = stream.pending > 0;
  const bool peeked = (!held || ReadExactly(state.scratch[0], head, sizeof head)) &&
                      DropScratch(state, chunk - sizeof tail - (held ? sizeof head : 0)) &&
                      ReadExactly(state.scratch[0], tail, sizeof tail);
  if (!peeked) {
    TurnSplicingOff(state);
    return std::nullopt;
  }
  const char* first = held ? static_cast<const char*>(memchr(head, '\n', sizeof head)) : nullptr;
  const char* last = static_cast<const char*>(memrchr(tail, '\n', sizeof tail));
  if ((held && first == nullptr) || last == nullptr) return std::nullopt;
  LineEnds ends;
  ends.chunk = chunk;
  ends.first = held ? size_t(first - head) + 1 : 0;
  ends.last = chunk - sizeof tail + size_t(last - tail) + 1;
  return ends;
}

// Moves `count` bytes from the stream's pipe to its destination; returns how many moved.
// A destination that is full is waited for as WriteAll waits. One that fails is not
// spliced to again: what it did not take is read, and WriteAll says what fails.
size_t SpliceOut(State& state, Stream& stream, size_t count) {
  size_t moved = 0;
  while (moved < count && !state.abandoned.load()) {
    const ssize_t got = splice(stream.source, nullptr, stream.destination, nullptr, count - moved, SPLICE_F_MOVE);
    if (got > 0) {
      moved += size_t(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    // The job's pipe is non-blocking, which makes the splice non-blocking as a whole: a
    // destination without room says EAGAIN. One with room that still says it is left.
    pollfd writable = {stream.destination, POLLOUT, 0};
    if (got < 0 && errno == EAGAIN && poll(&writable, 1, 0) == 0) {
      poll(&writable, 1, kWritableWaitMs);
      continue;
    }
    stream.splicing = Stream::Splicing::kOff;
    break;
  }
  return moved;
}

// Whether the stream's destination is a pipe, asked once (on the relay's thread).
bool SplicesTo(Stream& stream) {
  if (stream.splicing == Stream::Splicing::kUnknown) {
    struct stat info {};
    const bool pipe = fstat(stream.destination, &info) == 0 && S_ISFIFO(info.st_mode);
    stream.splicing = pipe ? Stream::Splicing::kOn : Stream::Splicing::kOff;
  }
  return stream.splicing == Stream::Splicing::kOn;
}

// The destination stopped taking a splice part of the way into a chunk (it said EAGAIN with
// room, or failed; splicing is off for it now), maybe in the middle of a line: the rest of
// the chunk's lines, `count` bytes the pipe holds, is written from the buffer before anything
// else, or the other stream's next line lands inside that one (CI, under load: stderr's
// "e990" inside a stdout line). False when the pipe could not be read.
bool WriteRestOfLines(State& state, Stream& stream, size_t count) {
  char* buffer = Buffer(state, stream);
  while (count > 0) {
    const size_t piece = std::min(count, state.capacity());
    if (!ReadExactly(stream.source, buffer, piece)) return false;
    WriteAll(state, stream, buffer, piece);
    count -= piece;
  }
  return true;
}

// Up to `limit` bytes the stream's pipe holds, forwarded by splicing whole lines (see
// above): the count taken from the pipe, 0 when this chunk is for ReadOnce.
size_t SpliceLines(State& state, Stream& stream, size_t limit) {
  if (stream.broken || !SplicesTo(stream) || !SplicingReady(state)) return 0;
  int available = 0;
  if (ioctl(stream.source, FIONREAD, &available) != 0 || size_t(available) < kSpliceMin) return 0;
  const std::optional<LineEnds> ends = FindLineEnds(state, stream, std::min(limit, size_t(available)));
  if (!ends) return 0;
  char* buffer = Buffer(state, stream);
  state.busy.store(true);
  const auto now = Clock::now();
  Arrived(state, stream, ends->chunk, now);
  if (ends->first > 0) {
    // The held partial line and its end, in one write.
    if (!ReadExactly(stream.source, buffer + stream.pending, ends->first)) return 0;
    WriteAll(state, stream, buffer, stream.pending + ends->first);
    stream.pending = 0;
  }
  const size_t through = ends->first + SpliceOut(state, stream, ends->last - ends->first);
  if (through < ends->last && !WriteRestOfLines(state, stream, ends->last - through)) return through;
  // The chunk's own partial line is held, as Consume holds one.
  stream.pending = ends->chunk - ends->last;
  stream.pending_since = now;
  if (!ReadExactly(stream.source, buffer, stream.pending)) stream.pending = 0;
  if (stream.pending >= state.options.max_partial_line) FlushPending(state, stream);
  return ends->chunk;
}

// Up to `limit` bytes the stream's pipe holds, spliced or read: the count taken.
size_t TakeAvailable(State& state, Stream& stream, size_t limit) {
  if (const size_t spliced = SpliceLines(state, stream, limit)) return spliced;
  return ReadOnce(state, stream, limit);
}

// Forwards what the pipes hold now, and no more: a writer that never stops cannot keep
// this going.
void ForwardWhatIsThere(State& state) {
  for (auto& stream : state.streams) {
    if (!stream.open) continue;
    int available = 0;
    if (ioctl(stream.source, FIONREAD, &available) != 0) available = 0;
    while (available > 0 && stream.open) {
      const size_t got = TakeAvailable(state, stream, size_t(available));
      if (got == 0) break;
      available -= int(got);
    }
    FlushPending(state, stream);
  }
}

bool AllEnded(const State& state) { return !state.streams[0].open && !state.streams[1].open; }

// What may arrive during kRelayCoalesceDelay (see the header): a quarter of the smaller
// pipe, so that a writer that keeps its pace while the relay waits never fills it.
size_t SmallRead(const State& state) {
  size_t small = kRelaySmallRead;
  for (const auto& stream : state.streams) {
    if (stream.open && stream.pipe_size > 0) small = std::min(small, stream.pipe_size / 4);
  }
  return small;
}

// How long the pipes are left alone after `got` bytes were taken `since` the previous take:
// the time SmallRead takes to arrive at that rate, at most kRelayCoalesceDelay. A slow
// writer's lines are then taken many at once, a fast writer's (one that the relay keeps up
// with, one small write at a time) in chunks large enough to splice, and at the same pace
// neither fills a pipe meanwhile.
Clock::duration QuietFor(const State& state, size_t got, Clock::duration since) {
  const auto since_ns = uint64_t(std::max<int64_t>(1, std::chrono::nanoseconds(since).count()));
  const uint64_t fill_ns = SmallRead(state) * since_ns / std::max<size_t>(got, 1);
  return std::min<Clock::duration>(std::chrono::nanoseconds(fill_ns), kRelayCoalesceDelay);
}

void Forward(State& state) {
  uint64_t synced = 0;
  Clock::time_point quiet_until;  // the pipes are not read before (kRelayCoalesceDelay)
  Clock::time_point last_take = Clock::now();
  while (!state.abandoned.load()) {
    uint64_t sync_target = 0;
    bool finishing = false;
    Clock::time_point deadline;
    {
      std::lock_guard lock(state.mutex);
      sync_target = state.sync_requested;
      finishing = state.finish_requested;
      deadline = state.finish_deadline;
    }
    if (sync_target > synced) {
      ForwardWhatIsThere(state);
      state.busy.store(false);  // nothing read is left unwritten, no partial line waits
      synced = sync_target;
      std::lock_guard lock(state.mutex);
      state.sync_done = synced;
      state.changed.notify_all();
    }
    auto now = Clock::now();
    if (AllEnded(state)) return;
    if (finishing && now >= deadline) {
      ForwardWhatIsThere(state);
      return;
    }

    std::optional<Clock::time_point> wake_at;
    if (finishing) wake_at = deadline;
    const bool quiet = now < quiet_until;
    if (quiet) wake_at = wake_at ? std::min(*wake_at, quiet_until) : quiet_until;
    for (const auto& stream : state.streams) {
      if (stream.pending == 0) continue;
      const auto due = stream.pending_since + state.options.partial_line_delay;
      if (!wake_at || due < *wake_at) wake_at = due;
    }
    timespec timeout{};
    if (wake_at) {
      const int64_t left = std::clamp<int64_t>(std::chrono::nanoseconds(*wake_at - now).count(), 0, 60'000'000'000);
      timeout = {time_t(left / 1'000'000'000), long(left % 1'000'000'000)};
    }
    pollfd fds[3] = {{state.wake, POLLIN, 0},
                     {state.streams[0].open && !quiet ? state.streams[0].source : -1, POLLIN, 0},
                     {state.streams[1].open && !quiet ? state.streams[1].source : -1, POLLIN, 0}};
    if (ppoll(fds, 3, wake_at ? &timeout : nullptr, nullptr) < 0 && errno != EINTR) {
      throw std::system_error(errno, std::generic_category(), "ppoll");
    }
    if (fds[0].revents & POLLIN) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t ignored = read(state.wake, &count, sizeof count);
    }
    size_t got = 0;
    for (int i = 0; i < 2; ++i) {
      if (!state.streams[i].open) continue;
      if (fds[i + 1].revents & POLLIN) {
        got += TakeAvailable(state, state.streams[i], kRelayPipeSize);
      } else if (fds[i + 1].revents & (POLLHUP | POLLERR)) {
        EndSource(state, state.streams[i]);  // no writer and nothing left: no buffer needed to see it
      }
    }
    now = Clock::now();
    if (got > 0) {
      quiet_until = now + QuietFor(state, got, now - last_take);
      last_take = now;
    }
    for (auto& stream : state.streams) {
      if (stream.pending > 0 && now >= stream.pending_since + state.options.partial_line_delay) {
        FlushPending(state, stream);
      }
    }
    state.busy.store(state.streams[0].pending > 0 || state.streams[1].pending > 0);
  }
}

// The thread's start routine. It owns no memory (a thread that frees gets a malloc arena
// of its own, which costs the launch of every job); `state` outlives it (Finish).
void* RelayThread(void* argument) {
  State* state = static_cast<State*>(argument);
  // Every signal goes to the launcher's other threads; SIGPIPE, directed at this thread by
  // a write to a closed destination, stays pending here and the write fails with EPIPE.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, nullptr);
  for (int failures = 0;; ++failures) {
    try {
      Forward(*state);
      break;
    } catch (const std::exception& error) {
      spdlog::error("forwarding the job's output: {}; going on", error.what());
    } catch (...) {
      spdlog::error("forwarding the job's output: unknown error; going on");
    }
    // A failure that repeats must not spin a core: the pipes fill and the job waits instead.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1000, 10 << std::min(failures, 6))));
  }
  if (!state->abandoned.load()) {
    for (auto& stream : state->streams) {
      if (stream.open) EndSource(*state, stream);
    }
  }
  std::shared_ptr<State>* self = nullptr;
  {
    std::lock_guard lock(state->mutex);
    state->ended = true;
    self = state->self;
    state->changed.notify_all();
  }
  delete self;  // may end the State: nothing of it is used after
  return nullptr;
}

void Wake(const State& state) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t ignored = write(state.wake, &one, sizeof one);
}

// Nothing read and not yet written, nothing in the pipes. The pipes are looked at first:
// when they are empty because the thread read them, it set `busy` before that read.
bool NothingToForward(const State& state) {
  for (const auto& stream : state.streams) {
    int available = 0;
    if (stream.source >= 0 && (ioctl(stream.source, FIONREAD, &available) != 0 || available > 0)) return false;
  }
  return !state.busy.load();
}

// Every writer of the pipes is gone and nothing is left in them (poll: hang-up, no data).
bool PipesAtEnd(const State& state) {
  for (const auto& stream : state.streams) {
    if (stream.source < 0) continue;
    pollfd hangup = {stream.source, POLLIN, 0};
    if (poll(&hangup, 1, 0) != 1 || (hangup.revents & POLLIN) || !(hangup.revents & POLLHUP)) return false;
  }
  return true;
}

// A channel from the job to the relay: the job writes into `job_end`, the relay reads
// `relay_end` (non-blocking; the job's end blocks).
struct Channel {
  int relay_end = -1;
  int job_end = -1;
  bool terminal = false;
};

void CloseChannel(Channel& channel) {
  if (channel.relay_end >= 0) close(channel.relay_end);
  if (channel.job_end >= 0) close(channel.job_end);
  channel = {};
}

// Both ends above fd 2, the relay's non-blocking; closed and invalid when either failed.
Channel Settled(Channel channel) {
  channel.relay_end = AboveStandard(channel.relay_end);
  channel.job_end = AboveStandard(channel.job_end);
  if (channel.relay_end < 0 || channel.job_end < 0) {
    CloseChannel(channel);
    return channel;
  }
  fcntl(channel.relay_end, F_SETFL, fcntl(channel.relay_end, F_GETFL) | O_NONBLOCK);
  return channel;
}

Channel OpenPipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  return Settled({fds[0], fds[1], false});
}

// A pseudo-terminal of the relay's own, for a destination that is a terminal: the job still
// sees a terminal (isatty, colours, line buffering, the same size) and the relay sees what it
// writes. Its output processing is off, so the bytes reach the real terminal as the job
// wrote them and that terminal's own processing (\n to \r\n) applies once.
Channel OpenTerminalLike(int terminal) {
  Channel channel;
  channel.terminal = true;
  channel.relay_end = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  char name[128];
  if (channel.relay_end < 0 || grantpt(channel.relay_end) != 0 || unlockpt(channel.relay_end) != 0 ||
      ptsname_r(channel.relay_end, name, sizeof name) != 0) {
    CloseChannel(channel);
    return channel;
  }
  channel.job_end = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (channel.job_end < 0) {
    CloseChannel(channel);
    return channel;
  }
  termios settings{};
  if (tcgetattr(terminal, &settings) != 0) tcgetattr(channel.job_end, &settings);
  settings.c_oflag &= ~tcflag_t(OPOST);
  tcsetattr(channel.job_end, TCSANOW, &settings);
  winsize size{};
  if (ioctl(terminal, TIOCGWINSZ, &size) == 0) ioctl(channel.job_end, TIOCSWINSZ, &size);
  return Settled(channel);
}

// Whether the launcher's fd 1 and 2 are one stream (`2>&1 | tee`, one terminal for both):
// the job's two streams are then one too, its lines in the order it wrote them, cut where it
// cut them, as without the launcher. One open file description (kcmp), or, where kcmp is
// not allowed (a container's seccomp), the same pipe or device; a terminal is one stream
// however it was opened. Two descriptions of one pipe (a FIFO opened twice) stay two
// streams whose lines arrive whole.
bool SameDestination(int first, int second) {
  struct stat a {}, b {};
  if (fstat(first, &a) != 0 || fstat(second, &b) != 0) return false;
  if (a.st_dev != b.st_dev || a.st_ino != b.st_ino || a.st_rdev != b.st_rdev) return false;
  if (isatty(first) != 0) return true;
  const pid_t self = getpid();
  const long same = syscall(SYS_kcmp, self, self, KCMP_FILE, first, second);
  return same == 0 || (same < 0 && errno != EBADF);
}

}  // namespace

OutputRelay::OutputRelay(watchdog::Progress& progress, int stdout_destination, int stderr_destination, Options options)
    : state_(std::make_shared<State>(progress, options)) {
  const int destinations[2] = {stdout_destination, stderr_destination};
  for (int i = 0; i < 2; ++i) {
    Stream& stream = state_->streams[i];
    stream.number = i + 1;
    stream.destination = destinations[i];
    if (options.files != nullptr && options.files->JobDescription(i + 1) >= 0) continue;  // the job writes its file itself
    if (!RelayTakesOver(destinations[i])) continue;
    // Two pipes would be read one after the other: stderr's lines would pass stdout's.
    if (i == 1 && child_ends_[0] >= 0 && SameDestination(destinations[0], destinations[1])) {
      child_ends_[1] = child_ends_[0];
      continue;
    }
    const bool terminal = isatty(destinations[i]) != 0;
    Channel channel = terminal ? OpenTerminalLike(destinations[i]) : OpenPipe();
    if (channel.relay_end < 0) {
      spdlog::warn("cannot relay the job's {} ({}: {}); it writes to the launcher's directly", StreamName(i + 1),
                   terminal ? "pseudo-terminal" : "pipe", std::strerror(errno));
      continue;
    }
    stream.source = channel.relay_end;
    stream.terminal = channel.terminal;
    stream.open = true;
    child_ends_[i] = channel.job_end;
  }
}

OutputRelay::~OutputRelay() { Finish(); }

void OutputRelay::TakeOverNothing() {
  CloseChildEnds();
  for (int i = 0; i < 2; ++i) {
    if (state_->streams[i].source >= 0) close(state_->streams[i].source);
    state_->streams[i].source = -1;
    state_->streams[i].open = false;
  }
}

// Once each: stdout and stderr may share one.
void OutputRelay::CloseChildEnds() {
  if (child_ends_[0] >= 0) close(child_ends_[0]);
  if (child_ends_[1] >= 0 && child_ends_[1] != child_ends_[0]) close(child_ends_[1]);
  child_ends_[0] = child_ends_[1] = -1;
}

void OutputRelay::Start() {
  if (running_ || (state_->streams[0].source < 0 && state_->streams[1].source < 0)) return;
  // The thread's wake-up (Sync, Finish) is made with the thread: a job that writes nothing
  // needs neither.
  if (state_->wake < 0) state_->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (state_->wake < 0) {
    CannotRelay("eventfd", errno);
    return;
  }
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setstacksize(&attributes, kRelayThreadStack);
  const int error = pthread_create(&thread_, &attributes, RelayThread, state_.get());
  pthread_attr_destroy(&attributes);
  running_ = error == 0;
  if (!running_) CannotRelay("pthread_create", error);
}

// Unlikely (no descriptor or thread to be had): a job that already writes into the pipes
// would block on them, so the launcher's ends close and later commands inherit the launcher's.
void OutputRelay::CannotRelay(const char* call, int error) {
  spdlog::error("cannot start relaying the job's output ({}: {}); its output to the launcher is lost", call,
                std::strerror(error));
  TakeOverNothing();
}

int OutputRelay::JobsOwnFile(int stream) const {
  const watchdog::OutputFiles* files = state_->options.files;
  return files != nullptr && !finished_ ? files->JobDescription(stream) : -1;
}

bool OutputRelay::TakesOver(int stream) const {
  return (stream == 1 || stream == 2) && !finished_ && child_ends_[stream - 1] >= 0;
}

void OutputRelay::AddToSpawn(posix_spawn_file_actions_t& actions) const {
  for (int i = 0; i < 2; ++i) {
    // dup2 clears close-on-exec on the copy; the original closes at exec.
    if (TakesOver(i + 1)) {
      posix_spawn_file_actions_adddup2(&actions, child_ends_[i], i + 1);
    } else if (const int file = JobsOwnFile(i + 1); file >= 0) {
      posix_spawn_file_actions_adddup2(&actions, file, i + 1);
    }
  }
}

std::array<pollfd, 2> OutputRelay::StartWhenReadable() const {
  std::array<pollfd, 2> fds = {pollfd{-1, POLLIN, 0}, pollfd{-1, POLLIN, 0}};
  if (running_ || finished_) return fds;
  for (int i = 0; i < 2; ++i) fds[i].fd = state_->streams[i].source;
  return fds;
}

void OutputRelay::Sync(std::chrono::milliseconds bound) {
  if (finished_ || NothingToForward(*state_)) return;
  Start();
  if (!running_) return;
  std::unique_lock lock(state_->mutex);
  const uint64_t ticket = ++state_->sync_requested;
  Wake(*state_);
  state_->changed.wait_for(lock, bound, [&] { return state_->sync_done >= ticket || state_->ended; });
}

void OutputRelay::Finish(std::chrono::milliseconds bound) {
  if (finished_) return;
  finished_ = true;
  CloseChildEnds();  // only the job's processes hold the pipes now: their exit is the end of file
  // No thread yet: none is needed when the job wrote nothing and every writer is gone.
  if (!running_ && PipesAtEnd(*state_)) return;
  Start();
  if (!running_) return;
  running_ = false;
  std::unique_lock lock(state_->mutex);
  state_->finish_requested = true;
  state_->finish_deadline = Clock::now() + bound;
  Wake(*state_);
  // The common end: everything forwarded, every writer gone. The thread has only to see the
  // end of file and stop: the launcher does not wait for it to be scheduled.
  bool let_go = !state_->ended && NothingToForward(*state_) && PipesAtEnd(*state_);
  if (!let_go) {
    auto ended = [&] { return state_->ended; };
    if (!state_->changed.wait_for(lock, bound + kBlockedDestinationGrace, ended)) {
      state_->abandoned = true;
      Wake(*state_);
      state_->changed.wait_for(lock, kBlockedDestinationGrace, ended);
    }
    if (!state_->ended) {
      // Blocked in a write that nothing reads: it ends when the write does (or with the launcher).
      spdlog::warn("the launcher's output accepts nothing more: the job's last output may be lost");
      let_go = true;
    }
  }
  if (let_go) {
    state_->let_go = true;
    state_->self = new std::shared_ptr<State>(state_);
    lock.unlock();
    pthread_detach(thread_);
    return;
  }
  lock.unlock();
  pthread_join(thread_, nullptr);
  for (auto& stream : state_->streams) {  // a writer still there gets EPIPE from now on
    if (stream.source >= 0) close(stream.source);
    stream.source = -1;
  }
}

}  // namespace bt::launcher
