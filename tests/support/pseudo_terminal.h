// A pseudo-terminal for tests that need a stream which is a terminal (isatty).
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

namespace bt::testing {

// Both ends, closed by the destructor; `terminal` is -1 when one could not be opened.
struct PseudoTerminal {
  PseudoTerminal() {
    master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) return;
    terminal = open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  }
  ~PseudoTerminal() {
    if (terminal >= 0) close(terminal);
    if (master >= 0) close(master);
  }
  // The test's own hold on the terminal end (a reader of `master` then sees EIO once every
  // other holder is gone).
  void CloseTerminal() {
    if (terminal >= 0) close(terminal);
    terminal = -1;
  }
  PseudoTerminal(const PseudoTerminal&) = delete;
  PseudoTerminal& operator=(const PseudoTerminal&) = delete;

  int master = -1;
  int terminal = -1;
};

}  // namespace bt::testing
