#include "zaya/aegis/monitor.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "zaya/core/error.h"

namespace zaya::aegis {
namespace {

bool final_phase_name(const std::string& phase) { return phase == "done" || phase == "stopping" || phase == "failed"; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::string signal_text(int status) {
  const int sig = status - 128;
  const char* name = sig == 9 ? "SIGKILL" : sig == 6 ? "SIGABRT" : sig == 11 ? "SIGSEGV" : sig == 15 ? "SIGTERM"
                   : sig == 7 ? "SIGBUS" : sig == 2 ? "SIGINT" : nullptr;
  return name ? str("killed by signal ", sig, " (", name, ")") : str("killed by signal ", sig);
}

}  // namespace

std::string class_name(FailureClass c) {
  switch (c) {
    case FailureClass::crash: return "crash";
    case FailureClass::config_error: return "config-error";
    case FailureClass::hang: return "hang";
    case FailureClass::collective_timeout: return "collective-timeout";
    case FailureClass::oom: return "oom";
    case FailureClass::nonfinite: return "nonfinite";
    case FailureClass::loss_spike: return "loss-spike";
    case FailureClass::straggler: return "straggler";
    case FailureClass::hardware: return "hardware";
    case FailureClass::ckpt_save: return "ckpt-save";
    case FailureClass::corrupt_checkpoint: return "corrupt-checkpoint";
    case FailureClass::preempted: return "preempted";
  }
  return "unknown";
}

void LogHints::scan(const std::string& line) {
  static const std::regex oom(R"(std::bad_alloc|out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|oom-kill)",
                              std::regex::icase);
  // NVIDIA's kernel driver spells "NVRM: Xid (PCI:...): 79, ..." exactly; ECC wording varies.
  static const std::regex xid(R"(NVRM:|\bXid \()");
  static const std::regex ecc(R"(\bECC\b.*error|uncorrectable ECC|fallen off the bus)", std::regex::icase);
  static const std::regex timeout(R"(timed out after [^:]*: ranks? (\d+))");
  static const std::regex launcher(
      R"(mpirun noticed that process rank (\d+)|Process name: \[\[\d+,\d+\],(\d+)\]|srun: error: \S+: tasks? (\d+))");
  std::smatch m;
  if (launcher_rank < 0 && std::regex_search(line, m, launcher))
    for (size_t g = 1; g <= 3; ++g)
      if (m[g].matched) launcher_rank = std::stoi(m[g].str());
  if (line.find("zaya: error:") != std::string::npos || line.find("zaya: internal error:") != std::string::npos)
    fatal = true;
  if (exec_failed_line.empty() && line.rfind("zaya supervise: cannot execute ", 0) == 0) exec_failed_line = line;
  if (error_line.empty() && line.find("error:") != std::string::npos) error_line = line.substr(0, 400);
  if (oom_line.empty() && std::regex_search(line, oom)) {
    oom_line = line;
    fatal = true;
  }
  if (hardware_line.empty() && (std::regex_search(line, xid) || std::regex_search(line, ecc))) hardware_line = line;
  if (collective_timeout_line.empty() && line.find("timed out after") != std::string::npos &&
      (line.find("never arrived") != std::string::npos || line.find("has not issued it") != std::string::npos)) {
    collective_timeout_line = line;
    fatal = true;
    if (std::regex_search(line, m, timeout)) missing_rank = std::stoi(m[1].str());
  }
}

Detection AttemptMonitor::make(FailureClass c, std::string evidence, int rank, int64_t step, double now) const {
  Detection d;
  d.cls = c;
  d.evidence = std::move(evidence);
  d.rank = rank;
  d.step = step;
  d.detected_at = now;
  for (const auto& [r, h] : last_) d.last_sign_of_life = std::max(d.last_sign_of_life, h.time);
  return d;
}

double AttemptMonitor::median_step_time() const {
  const size_t n = std::min<size_t>(step_times_.size(), 50);
  return median(std::vector<double>(step_times_.end() - static_cast<std::ptrdiff_t>(n), step_times_.end()));
}

double AttemptMonitor::hang_timeout(const std::string& phase) const {
  const double base =
      opts_.hang_timeout_s > 0
          ? opts_.hang_timeout_s
          : std::max(0.5, std::max(opts_.hang_min_s, 2 * median_step_time() + 10) - opts_.detection_margin_s);
  return phase == "train" ? base : std::max(base, opts_.hang_phase_floor_s);
}

std::optional<Detection> AttemptMonitor::observe(const std::map<int, Heartbeat>& beats, double now) {
  if (beats.empty()) {
    if (opts_.startup_timeout_s > 0 && now - launched_at_ > opts_.startup_timeout_s)
      return make(FailureClass::hang, str("no heartbeat within ", opts_.startup_timeout_s, " s of the launch"), -1, -1,
                  now);
    return std::nullopt;
  }
  int world = 0;
  for (const auto& [r, h] : beats) {
    world = std::max(world, h.world);
    RankProgress& p = ranks_[r];
    if (h.seq != p.seq) {
      p.seq = h.seq;
      p.progressed_at = now;
    }
    if (h.phase != "start") max_step_ = std::max(max_step_, h.step);
    if (h.phase == "train") {
      if (first_step_ < 0) {
        first_step_ = h.step;
        first_train_time_ = now;
      }
    }
    if (h.nonfinite && !nonfinite_seen_) {
      nonfinite_seen_ = true;
      nonfinite_ = make(FailureClass::nonfinite,
                        str("rank ", r, " reported a non-finite loss or gradient norm at step ", h.step), r, h.step, now);
    }
  }
  last_ = beats;
  const Heartbeat& h0 = beats.begin()->second;
  if (h0.phase == "train" && h0.step > last_loss_step_) {
    last_loss_step_ = h0.step;
    if (h0.step_time) step_times_.push_back(*h0.step_time);
    if (auto spike = check_spike(h0, now)) return spike;
  }
  check_straggler(beats, now);

  // A hang: some rank past its timeout. In a synchronous job one hung rank soon stalls the others
  // inside a collective, and the one waiting may pass its timeout first (its last beat can be older
  // than the hung rank's), so the rank to blame is a stopped process when one can be seen among all
  // the ranks, else the one that went quiet first.
  int blamed = -1;
  bool blamed_stopped = false;
  for (const auto& [r, p] : ranks_) {
    const auto it = beats.find(r);
    if (it == beats.end() || final_phase_name(it->second.phase)) continue;
    if (now - p.progressed_at <= hang_timeout(it->second.phase)) continue;
    if (blamed < 0 || p.progressed_at < ranks_[blamed].progressed_at) blamed = r;
  }
  if (blamed >= 0 && process_state_) {
    for (const auto& [r, p] : ranks_) {
      const auto it = beats.find(r);
      if (it == beats.end() || final_phase_name(it->second.phase)) continue;
      if (process_state_(it->second.host, it->second.pid) == 'T') {
        blamed = r;
        blamed_stopped = true;
        break;
      }
    }
  }
  if (blamed >= 0) {
    const Heartbeat& h = beats.at(blamed);
    const double quiet = now - ranks_[blamed].progressed_at;
    return make(FailureClass::hang,
                str("rank ", blamed, " (host ", h.host, ", pid ", h.pid, blamed_stopped ? ", stopped (SIGSTOP)" : "",
                    ") made no progress for ", static_cast<int64_t>(quiet), " s in phase '", h.phase, "' at step ",
                    h.step, " (timeout ", hang_timeout(h.phase), " s)"),
                blamed, h.step, now);
  }
  // A rank that never wrote a heartbeat while the others did: hung or dead before its first.
  for (int r = 0; r < world; ++r)
    if (!ranks_.count(r) && now - launched_at_ > std::max(opts_.hang_phase_floor_s, hang_timeout("start")))
      return make(FailureClass::hang, str("rank ", r, " of ", world, " wrote no heartbeat since the launch"), r, -1, now);
  return std::nullopt;
}

std::optional<Detection> AttemptMonitor::check_spike(const Heartbeat& h, double now) {
  if (!h.loss) return std::nullopt;
  const double loss = *h.loss;
  std::optional<Detection> found;
  if (static_cast<int>(losses_.size()) >= opts_.spike_min_history) {
    double mean = 0, var = 0;
    for (double l : losses_) mean += l;
    mean /= static_cast<double>(losses_.size());
    for (double l : losses_) var += (l - mean) * (l - mean);
    const double sd = std::sqrt(var / static_cast<double>(losses_.size()));
    if (loss > mean + opts_.spike_z * sd && loss > opts_.spike_ratio * mean)
      found = make(FailureClass::loss_spike,
                   str("loss ", loss, " at step ", h.step, " against a running mean ", mean, " (std ", sd, ") of the ",
                       losses_.size(), " steps before"),
                   h.rank, h.step, now);
  }
  losses_.push_back(loss);
  if (static_cast<int>(losses_.size()) > opts_.spike_window) losses_.erase(losses_.begin());
  return found;
}

void AttemptMonitor::check_straggler(const std::map<int, Heartbeat>& beats, double now) {
  if (straggler_ || beats.size() < 2) return;
  // The rank's own time when the trainer reports it: a straggler's peers wait for it inside their
  // collectives, so their step_time is its step_time too.
  const auto own = [](const Heartbeat& h) { return h.busy_time ? h.busy_time : h.step_time; };
  for (const auto& [r, h] : beats) {
    if (h.phase != "train" || !own(h) || h.step <= slow_step_[r]) continue;
    slow_step_[r] = h.step;
    std::vector<double> others;
    for (const auto& [o, g] : beats)
      if (o != r && g.phase == "train" && own(g)) others.push_back(*own(g));
    if (others.empty()) continue;
    const double med = median(others), mine = *own(h);
    RankProgress& p = ranks_[r];
    p.slow_in_a_row = (med > 0 && mine >= opts_.straggler_factor * med) ? p.slow_in_a_row + 1 : 0;
    if (p.slow_in_a_row >= opts_.straggler_steps) {
      straggler_ = make(FailureClass::straggler,
                        str("rank ", r, " (host ", h.host, ") took ", mine, " s per step", h.busy_time ? " of its own work" : "",
                            ", >= ", opts_.straggler_factor, " x the others' median ", med, " s, for ", p.slow_in_a_row,
                            " steps in a row"),
                        r, h.step, now);
      return;
    }
  }
}

double AttemptMonitor::productive_time_after(int64_t after) const {
  return static_cast<double>(std::max<int64_t>(0, max_step_ - after)) * median_step_time();
}

std::string AttemptMonitor::final_phase() const { return last_.empty() ? "" : last_.begin()->second.phase; }

Detection AttemptMonitor::classify_exit(int status, double now) const {
  // The rank a collective timeout names, else the one the launcher names, else the one that went
  // silent first (the others then fail waiting for it).
  int blamed = hints_.missing_rank >= 0 ? hints_.missing_rank : hints_.launcher_rank;
  std::string failed_error;
  double oldest = 0;
  for (const auto& [r, h] : last_) {
    if (h.phase == "failed" && failed_error.empty() && !h.error.empty()) failed_error = str("; rank ", r, ": ", h.error);
    if (blamed < 0 && !final_phase_name(h.phase) && (oldest == 0 || h.time < oldest)) {
      oldest = h.time;
      blamed = r;
    }
  }
  const std::string code = status >= 128 ? signal_text(status) : str("exit code ", status);
  if (failed_error.empty() && !hints_.error_line.empty()) failed_error = "; " + hints_.error_line;
  if (!hints_.exec_failed_line.empty() && status == 127)  // a wrong launch command: no retry helps
    return make(FailureClass::config_error, code + ": " + hints_.exec_failed_line, -1, max_step_, now);
  if (!hints_.collective_timeout_line.empty())
    return make(FailureClass::collective_timeout, code + ": " + hints_.collective_timeout_line, blamed, max_step_, now);
  if (!hints_.hardware_line.empty())
    return make(FailureClass::hardware, code + ": " + hints_.hardware_line, blamed, max_step_, now);
  if (!hints_.oom_line.empty()) return make(FailureClass::oom, code + ": " + hints_.oom_line, blamed, max_step_, now);
  if (status == 4 || (nonfinite_seen_ && status != 0)) {
    Detection d = nonfinite_seen_ ? *nonfinite_ : make(FailureClass::nonfinite, "", blamed, max_step_, now);
    d.detected_at = now;
    d.evidence = code + (nonfinite_seen_ ? ": " + nonfinite_->evidence : ": the trainer stopped on a non-finite loss or gradient norm") + failed_error;
    return d;
  }
  if (status == 0) return make(FailureClass::preempted, "exit code 0 after a stop requested by a signal (final phase 'stopping')", -1, max_step_, now);
  if (status == 2) return make(FailureClass::config_error, code + " (bad input or configuration)" + failed_error, blamed, max_step_, now);
  if (status == 3) return make(FailureClass::collective_timeout, code + " (a collective timed out)" + failed_error, blamed, max_step_, now);
  if (status == 5) return make(FailureClass::ckpt_save, code + " (a checkpoint save failed)" + failed_error, blamed, max_step_, now);
  return make(FailureClass::crash, code + failed_error, blamed, max_step_, now);
}

}  // namespace zaya::aegis
