#include "launcher/supervision/signals.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace bt::launcher {

const std::vector<int>& ForwardedSignals() {
  static const std::vector<int> signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  return signals;
}

bool StartsShutdown(int signal_number) {
  return signal_number == SIGTERM || signal_number == SIGINT || signal_number == SIGQUIT;
}

SignalRouter::SignalRouter() {
  sigemptyset(&routed_);
  for (int signal_number : ForwardedSignals()) sigaddset(&routed_, signal_number);
  sigaddset(&routed_, SIGCHLD);
  // SIGTTOU: handing the terminal to the job's group (tcsetpgrp) from a background
  // group would otherwise stop the launcher.
  sigaddset(&routed_, SIGTTOU);
  if (pthread_sigmask(SIG_BLOCK, &routed_, &original_mask_) != 0) {
    throw std::runtime_error("pthread_sigmask failed");
  }
  fd_ = signalfd(-1, &routed_, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(std::string("signalfd failed: ") + std::strerror(errno));
}

SignalRouter::~SignalRouter() {
  if (fd_ >= 0) close(fd_);
}

std::optional<int> SignalRouter::Take() {
  signalfd_siginfo info{};
  ssize_t got = read(fd_, &info, sizeof info);
  if (got != ssize_t(sizeof info)) return std::nullopt;
  return int(info.ssi_signo);
}

std::optional<int> SignalRouter::TakeShutdownRequest() {
  std::optional<int> shutdown;
  while (auto signal_number = Take()) {
    if (!shutdown && StartsShutdown(*signal_number)) shutdown = signal_number;
  }
  return shutdown;
}

}  // namespace bt::launcher
