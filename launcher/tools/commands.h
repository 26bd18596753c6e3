// The subcommands besides `run` (launch.h), doctor and bench: env, rendezvous, fabric and
// checkpoints prepare the job as `run` does, then inspect or serve one part of it instead
// of running the training; upload-worker is the uploader process the checkpoint agent starts.
#pragma once

#include "launcher/cli.h"

namespace bt::launcher {

// `env`: the environment the job would get, as shell exports or JSON.
int EnvSubcommand(const CliOptions& cli);
// `rendezvous`: joins (or serves, with --serve), prints the roster and the fabric plan.
int RendezvousSubcommand(const CliOptions& cli);
// `checkpoints`: the committed checkpoints of a job, per rank; --verify re-hashes them.
int CheckpointsSubcommand(const CliOptions& cli);
// `bt-launch report`: the HTML picture of a job from its goodput.json (--input, or the one node 0
// uploaded beside the job's checkpoints). 65 when that file is corrupt or truncated.
int ReportSubcommand(const CliOptions& cli);
// `upload-worker`: the uploader process the checkpoint agent starts (checkpoint/uploader.h).
int UploadWorkerSubcommand(const CliOptions& cli);
// `fabric`: this node's RDMA devices and the NCCL variables it would export.
int FabricSubcommand(const CliOptions& cli);

}  // namespace bt::launcher
