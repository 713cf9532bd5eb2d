// Fault injection for `zaya train --inject SPEC` and `train.inject = [...]` (docs/aegis.md,
// "Trainer side"): deliberate crashes, hangs, NaNs, stragglers, corrupt checkpoints and kills
// during a save, so a supervisor's detection and recovery can be tested on real failures.
//
// SPEC is KIND@KEY=VALUE[,KEY=VALUE...]:
//   kill@step=S[,rank=R]              SIGKILL itself at the end of step S
//   hang@step=S[,rank=R]              at the end of step S, sleep forever without heartbeats
//   nan@step=S[,rank=R][,steps=K]     poison one gradient element of steps S..S+K-1 (K default 1)
//                                     before their updates
//   slow@rank=R,factor=F[,step=S]     every step (from step S on, when given), sleep (F-1) x the
//                                     step's compute time (F >= 1)
//   corrupt-ckpt@step=S[,rank=R]      after the checkpoint of step S commits, flip bytes of its
//                                     rank file R (default 0); done by rank 0, which commits
//   kill-during-save@step=S[,rank=R]  SIGKILL itself while the checkpoint of step S is written,
//                                     after its rank file is written and before the commit
//   exit@step=S,code=C[,rank=R]       exit with code C at the end of step S
// rank defaults to every rank (corrupt-ckpt: rank file 0). Any spec may add every-attempt=1 or
// attempt=N.
//
// Each fault fires at most once per process. A fault with a step fires only when the run started
// (fresh or resumed) before that step (slow: from step S on, also in a run resumed past S), and any
// fault only on the first attempt of a supervised run (ZAYA_INJECT_ATTEMPT unset or 1) unless it
// says every-attempt=1 (every attempt) or attempt=N (attempt N only, so that several faults of one
// supervised run can fire one after another): a supervisor's restart must be able to get past the
// fault it is recovering from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zaya/core/tensor.h"

namespace zaya::train {

enum class FaultKind { kill, hang, nan, slow, corrupt_ckpt, kill_during_save, exit };

struct FaultSpec {
  FaultKind kind = FaultKind::kill;
  int64_t step = -1;  // -1: none (slow)
  int rank = -1;      // -1: every rank
  double factor = 1;  // slow
  int code = 0;       // exit
  int64_t steps = 1;  // nan: consecutive steps poisoned from `step`
  bool every_attempt = false;
  int attempt = 1;    // the supervised attempt it fires on (ignored with every_attempt)
  std::string text;  // the spec as given, for messages
};

// Throws zaya::Error naming the spec and what is wrong with it.
FaultSpec parse_fault_spec(const std::string& spec);

// ZAYA_INJECT_ATTEMPT: 1 when unset; a zaya::Error when it is not a positive integer.
int inject_attempt_from_env();

class FaultInjector {
 public:
  FaultInjector() = default;
  // The faults of `specs` that this rank may fire in a run that starts at `start_step` on
  // supervisor attempt `attempt`.
  FaultInjector(const std::vector<std::string>& specs, int rank, int64_t start_step, int attempt);

  bool empty() const { return armed_.empty(); }
  // The armed fault of `kind` for step `step`, disarmed as it is returned (fires once; nan with
  // steps=K: at each of its K steps, disarmed after the last); null if none.
  const FaultSpec* take(FaultKind kind, int64_t step);
  // slow: the factor step `step` of this rank is stretched by (1: none).
  double slow_factor(int64_t step) const;
  bool any_slow() const { return !slow_.empty(); }

 private:
  std::vector<FaultSpec> armed_;
  std::vector<bool> fired_;
  std::vector<FaultSpec> slow_;
};

// The fault actions that need no trainer state.
[[noreturn]] void kill_self();  // SIGKILL, as a crashed node looks to the rest
[[noreturn]] void hang_forever();
// kill-during-save: SIGKILL once `file` (this rank's file of the save in flight) exists, or after 30 s.
[[noreturn]] void kill_self_once_written(const std::string& file);
// nan: element `i` of the flat f32 gradient buffer `grads` becomes a quiet NaN.
void poison_gradient(const Tensor& grads, int64_t i);
// Flips bytes near the end of `file` (tensor data, not the header) so its checksum no longer matches.
void corrupt_file(const std::string& file);

}  // namespace zaya::train
