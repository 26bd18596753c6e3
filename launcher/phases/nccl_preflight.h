// The opt-in NCCL preflight (launcher.fabric.nccl_preflight; docs/FABRIC.md): one
// all-reduce over every GPU of every node before the training starts, bus bandwidth by
// the nccl-tests formula, exit 69 naming the slowest node below min_busbw_gbps.
// NCCL and the CUDA runtime are loaded with dlopen in a child process (`bt-launch
// nccl-preflight-worker`), so PID 1 never holds a CUDA context. Without GPUs or without
// NCCL it is SKIPPED on every node with the reason.
#pragma once

#include <functional>

#include "env/environment.h"
#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/cli.h"
#include "launcher/supervision/peers.h"

namespace bt::launcher {

// `environment` is the job's (the NCCL variables the fabric phase chose included).
// `check_stop` runs every second while the worker has not answered, and throws to stop.
void RunNcclPreflight(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                      const env::JobEnvironment& environment, const std::function<void()>& check_stop);

// The child: speaks the line protocol on stdin/stdout described in nccl_preflight.cpp.
int NcclPreflightWorker(const CliOptions& cli);

// nccl-tests' all-reduce bus bandwidth: algbw x 2(n-1)/n, GB/s with GB = 1e9.
double AllReduceBusBandwidth(double bytes, double seconds, int ranks);

}  // namespace bt::launcher
