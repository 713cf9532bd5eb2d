#include "zaya/aegis/supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "zaya/aegis/heartbeat.h"
#include "zaya/aegis/job.h"
#include "zaya/aegis/recovery.h"
#include "zaya/aegis/run_state.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/core/error.h"

namespace zaya::aegis {
namespace fs = std::filesystem;
namespace {

void say(const std::string& line) { std::cerr << "aegis: " << line << std::endl; }

std::string seconds(double s) { return str(std::round(s * 10) / 10, " s"); }

// The goodput report: productive training time over the supervised wall time, MTTR per class.
nlohmann::json goodput_report(const fs::path& out_dir, const SupervisorState& st) {
  std::map<std::string, std::pair<double, int>> recover;  // class -> (sum, count)
  std::map<std::string, int> counts;
  for (const Incident& i : read_incidents(out_dir)) {
    ++counts[i.cls];
    if (i.time_to_recover_s) {
      recover[i.cls].first += *i.time_to_recover_s;
      ++recover[i.cls].second;
    }
  }
  nlohmann::json mttr = nlohmann::json::object();
  for (const auto& [cls, sc] : recover) mttr[cls] = sc.first / sc.second;
  return {{"status", st.status},
          {"wall_s", st.wall_s},
          {"productive_s", st.productive_s},
          {"goodput", st.wall_s > 0 ? st.productive_s / st.wall_s : 0.0},
          {"attempts", st.attempts},
          {"restarts", st.restarts},
          {"incidents", counts},
          {"mttr_s", mttr},
          {"steps_recomputed", st.steps_recomputed},
          {"last_step", st.high_water_step},
          {"skip_windows", st.to_json()["skip_windows"]},
          {"excluded_hosts", st.excluded_hosts}};
}

class Supervisor {
 public:
  explicit Supervisor(const SupervisorOptions& o) : o_(o), out_(o.run_dir) {}

  int run() {
    fs::create_directories(aegis_dir(out_));
    st_ = load_state(out_);
    started_ = unix_now();
    wall_base_ = st_.wall_s;
    if (o_.hosts_file) all_hosts_ = read_hosts(*o_.hosts_file);
    end_orphan_job();
    if (st_.attempts > 0)
      say(str("picking up the run from ", (aegis_dir(out_) / "state.json").string(), ": ", st_.attempts,
              " attempts, ", st_.restarts, " restarts so far, ", st_.skip_windows.size(), " skipped data windows, ",
              st_.excluded_hosts.size(), " excluded hosts"));
    st_.status = "running";

    RestartPlan plan = first_plan();
    for (;;) {
      report_rejected(plan);
      if (plan.start_over) set_aside_for_start_over();
      const std::vector<std::string> cmd = build_command(o_.command, plan, st_.skip_windows, active_hosts());
      const int64_t resume_step = plan.resume ? plan.resume_step : -1;
      const int64_t high_water_before = st_.high_water_step;
      const Outcome r = run_attempt(cmd, resume_step);
      if (r.kind == Outcome::finished) {
        st_.consecutive_failures = 0;
        return finish("finished", 0);
      }
      if (r.kind == Outcome::stopped) return finish("stopped", 128 + r.signal);
      const Detection& d = r.detection;
      Incident inc;
      inc.time = d.detected_at;
      inc.cls = class_name(d.cls);
      inc.evidence = d.evidence;
      inc.attempt = st_.attempts;
      inc.rank = d.rank;
      inc.host = host_of(d.rank, r.beats);
      inc.failed_step = d.step >= 0 ? d.step : r.max_step;
      inc.time_to_detect_s = d.last_sign_of_life > 0 ? std::max(0.0, d.detected_at - d.last_sign_of_life) : 0;
      flush_pending(std::nullopt);  // an earlier failure whose recovery never reached a step
      say(str(inc.cls, " on attempt ", st_.attempts, ": ", inc.evidence));

      if (d.cls == FailureClass::config_error) {
        inc.action = "gave up: a configuration error is not retried";
        append_incident(out_, inc);
        return give_up("the job reported a configuration error (exit 2): " + inc.evidence, 2);
      }
      if (st_.restarts >= o_.max_restarts) {
        inc.action = str("gave up: the restart budget (", o_.max_restarts, ") is spent");
        append_incident(out_, inc);
        return give_up(inc.action, 1);
      }
      std::string action;
      if (!all_hosts_.empty() && !inc.host.empty() && d.cls != FailureClass::nonfinite &&
          d.cls != FailureClass::loss_spike) {
        const int n = ++st_.host_failures[inc.host];
        if (n >= o_.exclude_after && active_hosts().size() > 1 &&
            std::find(st_.excluded_hosts.begin(), st_.excluded_hosts.end(), inc.host) == st_.excluded_hosts.end()) {
          st_.excluded_hosts.push_back(inc.host);
          action += str("excluded host ", inc.host, " after ", n, " failures; ");
        }
      }
      const bool step_back = d.cls == FailureClass::nonfinite || d.cls == FailureClass::loss_spike;
      plan = plan_restart(out_, step_back, inc.failed_step);
      if (plan.skip && std::find(st_.skip_windows.begin(), st_.skip_windows.end(), *plan.skip) == st_.skip_windows.end())
        st_.skip_windows.push_back(*plan.skip);
      // An attempt that got beyond every earlier one made progress: the back-off starts over.
      if (r.max_step > high_water_before || st_.consecutive_failures == 0)
        st_.consecutive_failures = 1;
      else
        ++st_.consecutive_failures;
      const double delay =
          std::min(o_.backoff_max_s, o_.backoff_s * std::pow(2.0, std::max(0, st_.consecutive_failures - 1)));
      action += plan.resume ? str("restart from ", plan.resume->filename().string(), plan.rewind ? " (--rewind)" : "")
                            : std::string("restart from the beginning (no checkpoint verifies)");
      if (plan.skip) action += str(", skipping samples ", plan.skip->arg());
      if (!plan.note.empty()) action += str(" (", plan.note, ")");
      action += str(", after a back-off of ", seconds(delay));
      inc.action = action;
      inc.resume_step = plan.resume ? plan.resume_step : 0;
      inc.steps_lost = std::max<int64_t>(0, inc.failed_step - inc.resume_step);
      st_.pending = inc;
      ++st_.restarts;
      save();
      say(action);
      if (!sleep_unless_stopped(delay)) return finish("stopped", 128 + o_.stop_signal->load());
    }
  }

 private:
  struct Outcome {
    enum Kind { finished, failed, stopped } kind = failed;
    Detection detection;
    int signal = 0;
    int64_t max_step = -1;
    std::map<int, Heartbeat> beats;
  };

  std::vector<Host> active_hosts() const {
    std::vector<Host> h;
    for (const Host& x : all_hosts_)
      if (std::find(st_.excluded_hosts.begin(), st_.excluded_hosts.end(), x.name) == st_.excluded_hosts.end())
        h.push_back(x);
    return h;
  }

  std::string host_of(int rank, const std::map<int, Heartbeat>& beats) const {
    if (rank < 0) return "";
    if (!all_hosts_.empty()) return host_of_rank(last_hosts_, rank);
    const auto it = beats.find(rank);
    return it == beats.end() ? "" : it->second.host;
  }

  bool stop_requested() const { return o_.stop_signal && o_.stop_signal->load() != 0; }

  bool sleep_unless_stopped(double s) {
    const double until = unix_now() + s;
    while (unix_now() < until) {
      if (stop_requested()) return false;
      ::usleep(50000);
    }
    return !stop_requested();
  }

  void save() {
    st_.wall_s = wall_base_ + (unix_now() - started_);
    save_state(out_, st_);
  }

  // A job left running by a supervisor that was killed: end it before launching another.
  void end_orphan_job() {
    if (st_.job_session <= 0) return;
    const auto left = session_members(static_cast<pid_t>(st_.job_session));
    if (!left.empty()) {
      say(str("ending ", left.size(), " processes of the job a previous supervisor left running (session ",
              st_.job_session, ")"));
      for (pid_t p : left) ::kill(p, SIGKILL);
      for (int i = 0; i < 100 && !session_members(static_cast<pid_t>(st_.job_session)).empty(); ++i) ::usleep(50000);
    }
    st_.job_session = 0;
  }

  // The first launch of this supervisor: a pending restart's checkpoint, else the newest that
  // verifies when the run has any (a run that is not new continues), else the command as given.
  RestartPlan first_plan() {
    bool user_resume = false;
    for (const auto& a : o_.command) user_resume |= a == "--resume" || a.rfind("--resume=", 0) == 0;
    if (ckpt::list_steps(out_).empty()) return {};
    if (user_resume && st_.attempts == 0) return {};
    RestartPlan plan = plan_restart(out_, false, -1);
    if (st_.pending && st_.pending->resume_step > 0 && plan.resume_step > st_.pending->resume_step) {
      const fs::path dir = out_ / ckpt::step_dir_name(st_.pending->resume_step);
      if (fs::exists(dir)) {  // the rewind the failure asked for
        plan.resume = dir;
        plan.resume_step = st_.pending->resume_step;
        plan.rewind = true;
      }
    }
    return plan;
  }

  // A restart from the beginning in a run that holds checkpoints (none verifies, or a NaN before
  // the second one): zaya train refuses to start over in such a directory, so they are moved
  // aside into rewound-<time>/ (kept, never deleted) and `latest`, which only names one of them,
  // is removed. Safe to repeat after a supervisor killed half-way.
  void set_aside_for_start_over() {
    const std::vector<int64_t> steps = ckpt::list_steps(out_);
    if (!steps.empty()) {
      const fs::path where = ckpt::move_steps_aside(out_, steps, "rewound");
      say(str("starting over: moved ", steps.size(), " checkpoints of the run into ", where.string(), " (kept)"));
    }
    std::error_code ec;
    fs::remove(out_ / "latest", ec);
  }

  void report_rejected(const RestartPlan& plan) {
    for (const auto& r : plan.rejected) {
      Incident inc;
      inc.time = unix_now();
      inc.cls = class_name(FailureClass::corrupt_checkpoint);
      inc.evidence = str(ckpt::step_dir_name(r.step), " fails verification: ", r.problem);
      inc.action = str("skipped and kept (zaya train moves it aside, never deletes it); resuming from ",
                       plan.resume ? plan.resume->filename().string() : std::string("the beginning"));
      inc.attempt = st_.attempts + 1;
      inc.failed_step = r.step;
      inc.resume_step = plan.resume ? plan.resume_step : 0;
      inc.steps_lost = std::max<int64_t>(0, r.step - inc.resume_step);
      inc.time_to_recover_s = 0;
      append_incident(out_, inc);
      say(inc.cls + ": " + inc.evidence);
    }
  }

  // Writes the pending incident with its recovery time (none: the restart never got to a step).
  void flush_pending(std::optional<double> recovered_at) {
    if (!st_.pending) return;
    Incident inc = *st_.pending;
    if (recovered_at) inc.time_to_recover_s = std::max(0.0, *recovered_at - inc.time);
    append_incident(out_, inc);
    if (recovered_at) say(str("recovered from the ", inc.cls, " in ", seconds(*inc.time_to_recover_s)));
    st_.pending.reset();
    save();
  }

  Outcome run_attempt(const std::vector<std::string>& cmd, int64_t resume_step) {
    ++st_.attempts;
    last_hosts_ = active_hosts();
    const fs::path log_path = aegis_dir(out_) / str("attempt_", st_.attempts, ".log");
    std::ofstream log(log_path, std::ios::app);
    const double launched = unix_now();
    last_launch_ = launched;
    say(str("attempt ", st_.attempts, ": ", shell_join(cmd), " (output: ", log_path.string(), ")"));
    MonitorOptions mo = o_.monitor;
    mo.detection_margin_s = 2 * o_.poll_s;
    // A job known to write heartbeats that writes none by the start-up floor is hung in start-up.
    if (mo.startup_timeout_s <= 0 && st_.heartbeats_seen) mo.startup_timeout_s = mo.hang_phase_floor_s;
    AttemptMonitor mon(mo, launched);
    mon.set_process_state(local_process_state);
    Job job(cmd, {"ZAYA_INJECT_ATTEMPT=" + std::to_string(st_.attempts)});
    st_.job_session = job.pid();
    save();
    auto on_line = [&](const std::string& line) { mon.scan_line(line); };
    auto on_chunk = [&](const char* p, size_t n) {
      log.write(p, static_cast<std::streamsize>(n));
      log.flush();
      if (o_.echo_output) std::cout.write(p, static_cast<std::streamsize>(n)).flush();
    };
    Outcome out;
    double next_progress = launched + o_.progress_every_s;
    bool straggler_reported = false;
    std::optional<Detection> detection;
    double fatal_seen_at = 0;
    for (;;) {
      const bool exited = job.poll(o_.poll_s, on_line, on_chunk);
      const double now = unix_now();
      const auto beats = read_heartbeats(out_, launched);
      detection = mon.observe(beats, now);
      if (st_.pending && mon.max_step() > resume_step) flush_pending(now);
      if (mon.straggler() && !straggler_reported) {
        straggler_reported = true;
        detection = straggler_incident(*mon.straggler(), beats);
      }
      if (o_.progress_every_s > 0 && now >= next_progress && beats.empty()) {
        next_progress = now + o_.progress_every_s;
        say(str("attempt ", st_.attempts, ": running for ", seconds(now - launched), ", no heartbeat yet"));
      } else if (o_.progress_every_s > 0 && now >= next_progress) {
        next_progress = now + o_.progress_every_s;
        const Heartbeat& h = beats.begin()->second;
        say(str("attempt ", st_.attempts, ": step ", h.step, " (", h.phase, ")",
                h.loss ? str(", loss ", *h.loss) : std::string(), h.step_time ? str(", ", *h.step_time, " s/step") : std::string(),
                ", ", beats.size(), " ranks reporting"));
      }
      if (stop_requested()) {
        say(str("stopping: forwarding SIGTERM to the job, up to ", seconds(o_.stop_grace_s), " for it to save and stop"));
        job.terminate(o_.stop_grace_s, on_line, on_chunk);
        end_attempt(mon, resume_step, false);
        out.kind = Outcome::stopped;
        out.signal = o_.stop_signal->load();
        return out;
      }
      if (mon.hints().fatal && fatal_seen_at == 0) fatal_seen_at = now;
      if (!detection && !exited && fatal_seen_at > 0 && now - fatal_seen_at > o_.exit_grace_s) {
        say(str("the job reported a fatal error ", seconds(now - fatal_seen_at),
                " ago and has not exited (a stopped or hung process holds it): killing it"));
        job.kill_all(on_line, on_chunk);
        detection = mon.classify_exit(job.status(), unix_now());
        break;
      }
      if (detection && !exited) {
        job.kill_all(on_line, on_chunk);  // a hung or diverged job has nothing worth saving
        say(str("killed the job (session ", job.pid(), ") after a ", class_name(detection->cls)));
        break;
      }
      if (exited) {
        job.kill_all(on_line, on_chunk);  // ranks the launcher left behind
        mon.observe(read_heartbeats(out_, launched), unix_now());
        const int status = job.status();
        if (status == 0 && mon.final_phase() != "stopping") {
          // Without heartbeats the first new step is not seen: the relaunch is when recovery ended.
          if (st_.pending) flush_pending(mon.saw_heartbeats() ? unix_now() : last_launch_);
          end_attempt(mon, resume_step, true);
          out.kind = Outcome::finished;
          return out;
        }
        detection = mon.classify_exit(status, unix_now());
        break;
      }
    }
    end_attempt(mon, resume_step, false);
    out.detection = *detection;
    out.max_step = mon.max_step();
    out.beats = mon.last();
    return out;
  }

  // A straggler is an incident; with --exclude-stragglers and hosts, also a reason to restart.
  std::optional<Detection> straggler_incident(const Detection& d, const std::map<int, Heartbeat>& beats) {
    const std::string host = host_of(d.rank, beats);
    const bool restart = o_.exclude_stragglers && !all_hosts_.empty() && !host.empty() && active_hosts().size() > 1;
    if (restart) {
      st_.host_failures[host] = std::max(st_.host_failures[host], o_.exclude_after - 1);
      return d;
    }
    Incident inc;
    inc.time = d.detected_at;
    inc.cls = class_name(d.cls);
    inc.evidence = d.evidence;
    inc.action = "none (reported; --exclude-stragglers with --hosts restarts without its host)";
    inc.attempt = st_.attempts;
    inc.rank = d.rank;
    inc.host = host;
    inc.failed_step = d.step;
    append_incident(out_, inc);
    say("straggler: " + d.evidence);
    return std::nullopt;
  }

  // Goodput bookkeeping: training time on steps never computed before is productive; steps at or
  // below the high-water mark were computed again. Without heartbeats a finished attempt's wall
  // time counts (nothing finer is known).
  void end_attempt(const AttemptMonitor& mon, int64_t resume_step, bool finished) {
    st_.job_session = 0;
    st_.heartbeats_seen |= mon.saw_heartbeats();
    if (mon.saw_heartbeats()) {
      st_.productive_s += mon.productive_time_after(std::max(st_.high_water_step, resume_step));
      if (mon.max_step() > resume_step)
        st_.steps_recomputed += std::max<int64_t>(0, std::min(mon.max_step(), st_.high_water_step) - std::max<int64_t>(resume_step, 0));
      st_.high_water_step = std::max(st_.high_water_step, mon.max_step());
    } else if (finished) {
      st_.productive_s += unix_now() - last_launch_;
    }
    save();
  }

  int finish(const std::string& status, int code) {
    st_.status = status;
    save();
    const nlohmann::json g = goodput_report(out_, st_);
    std::ofstream(aegis_dir(out_) / "goodput.json") << g.dump(2) << "\n";
    say(str(status == "finished" ? "the run finished" : "supervisor " + status, ": goodput ",
            std::round(g["goodput"].get<double>() * 1000) / 10, "% (", seconds(st_.productive_s), " productive of ",
            seconds(st_.wall_s), "), ", st_.attempts, " attempts, ", st_.steps_recomputed, " steps recomputed, MTTR ",
            g["mttr_s"].dump(), "; report: ", (aegis_dir(out_) / "goodput.json").string()));
    return code;
  }

  int give_up(const std::string& why, int code) {
    std::map<std::string, int> counts;
    for (const Incident& i : read_incidents(out_)) ++counts[i.cls];
    std::string classes;
    for (const auto& [c, n] : counts) classes += str(classes.empty() ? "" : ", ", n, " x ", c);
    const RestartPlan last_good = plan_restart(out_, false, -1);
    say(str("GIVING UP after ", st_.attempts, " attempts (", st_.restarts, " restarts): ", why));
    say(str("incidents: ", classes.empty() ? "none" : classes, "; see ", (aegis_dir(out_) / "incidents.jsonl").string()));
    say(last_good.resume ? str("the last good checkpoint is ", last_good.resume->string(), " (it verifies)")
                         : std::string("no checkpoint of the run verifies"));
    return finish("gave-up", code);
  }

  const SupervisorOptions& o_;
  fs::path out_;
  SupervisorState st_;
  std::vector<Host> all_hosts_, last_hosts_;
  double started_ = 0, wall_base_ = 0, last_launch_ = 0;
};

}  // namespace

int supervise(const SupervisorOptions& opts) {
  ZAYA_CHECK(!opts.command.empty(), "zaya supervise: no launch command: give it after --");
  ZAYA_CHECK(opts.max_restarts >= 0, "--max-restarts must be >= 0, got ", opts.max_restarts);
  ZAYA_CHECK(opts.backoff_s >= 0 && opts.backoff_max_s >= 0, "--backoff and --backoff-max must be >= 0");
  ZAYA_CHECK(opts.exclude_after >= 1, "--exclude-after must be >= 1, got ", opts.exclude_after);
  Supervisor s(opts);
  return s.run();
}

}  // namespace zaya::aegis
