#include "zaya/aegis/recovery.h"

#include <algorithm>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/error.h"
#include "zaya/train/run_config.h"

namespace zaya::aegis {
namespace fs = std::filesystem;
namespace {

struct Point {
  int64_t step;
  std::optional<int64_t> next_sample;
};

std::optional<int64_t> next_sample_of(const ckpt::Checkpoint& c) {
  const auto& s = c.manifest().state;
  if (s.contains("data_loader_next_sample") && s["data_loader_next_sample"].is_number_integer())
    return s["data_loader_next_sample"].get<int64_t>();
  return std::nullopt;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

}  // namespace

RestartPlan plan_restart(const fs::path& out_dir, bool step_back, int64_t failing_step) {
  RestartPlan plan;
  std::vector<int64_t> steps = ckpt::list_steps(out_dir);
  std::reverse(steps.begin(), steps.end());
  std::vector<Point> good;  // newest first
  for (int64_t s : steps) {
    const fs::path dir = out_dir / ckpt::step_dir_name(s);
    std::string problem;
    std::optional<int64_t> next;
    try {
      ckpt::Checkpoint c(dir);
      const ckpt::VerifyReport r = c.verify();
      if (r.ok())
        next = next_sample_of(c);
      else
        problem = r.problems.front();
    } catch (const Error& e) {
      problem = e.what();
    }
    if (!problem.empty()) {
      if (good.empty()) plan.rejected.push_back({s, problem});
      continue;
    }
    good.push_back({s, next});
    if (good.size() == (step_back ? 2u : 1u)) break;
  }
  const size_t pick = step_back ? 1 : 0;
  if (good.size() > pick) {
    plan.resume = out_dir / ckpt::step_dir_name(good[pick].step);
    plan.resume_step = good[pick].step;
  }
  for (int64_t s : steps) plan.rewind |= s > plan.resume_step;
  plan.start_over = !plan.resume;
  if (!step_back || failing_step < 0) return plan;

  // The global batch in samples per step, from the checkpoints' loader positions.
  std::optional<int64_t> batch;
  if (good.size() == 2 && good[0].next_sample && good[1].next_sample && good[0].step > good[1].step)
    batch = (*good[0].next_sample - *good[1].next_sample) / (good[0].step - good[1].step);
  else if (!good.empty() && good[0].next_sample && good[0].step > 0)
    batch = *good[0].next_sample / good[0].step;
  if (!batch || *batch <= 0) {
    plan.note = "no checkpoint records the loader position, so the data window to skip is unknown";
    return plan;
  }
  const int64_t from_step = plan.resume ? plan.resume_step : 0;
  const int64_t from_sample = plan.resume ? good[pick].next_sample.value_or(0) : 0;
  const int64_t last_step = std::max(failing_step + 1, from_step + 1);
  plan.skip = SkipWindow{from_sample, from_sample + (last_step - from_step) * *batch};
  return plan;
}

std::vector<std::string> build_command(const std::vector<std::string>& base, const RestartPlan& plan,
                                       const std::vector<SkipWindow>& windows, const std::vector<Host>& hosts) {
  std::string host_list;
  int np = 0;
  for (const Host& h : hosts) {
    host_list += (host_list.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
    np += h.slots;
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < base.size(); ++i) {
    std::string a = base[i];
    if (plan.resume && (a == "--resume" || a == "--rewind")) {
      if (a == "--resume" && i + 1 < base.size() && base[i + 1].rfind("-", 0) != 0) ++i;  // its value
      continue;
    }
    if (plan.resume && a.rfind("--resume=", 0) == 0) continue;
    if (!hosts.empty()) {
      replace_all(a, "{hosts}", host_list);
      replace_all(a, "{np}", std::to_string(np));
    }
    out.push_back(a);
  }
  if (plan.resume) {
    out.push_back("--resume");
    out.push_back(plan.resume->string());
    if (plan.rewind) out.push_back("--rewind");
  }
  for (const SkipWindow& w : windows) {
    out.push_back("--skip-samples");
    out.push_back(w.arg());
  }
  return out;
}

fs::path run_dir_of_command(const std::vector<std::string>& command) {
  std::string config;
  std::vector<std::string> sets;
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string& a = command[i];
    const bool has_next = i + 1 < command.size();
    if (a == "--config" && has_next) config = command[++i];
    else if (a.rfind("--config=", 0) == 0) config = a.substr(9);
    else if (a == "--set" && has_next) sets.push_back(command[++i]);
    else if (a.rfind("--set=", 0) == 0) sets.push_back(a.substr(6));
  }
  ZAYA_CHECK(!config.empty(), "zaya supervise: the launch command '", shell_join(command),
             "' names no --config, so its run directory is unknown: give it with --run-dir DIR");
  return train::load_run_config(config, sets).train.out_dir;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) {
    const bool plain = !a.empty() && a.find_first_of(" \t\n'\"$`\\|&;<>(){}*?!#~") == std::string::npos;
    std::string q = a;
    replace_all(q, "'", "'\\''");
    s += (s.empty() ? "" : " ") + (plain ? a : "'" + q + "'");
  }
  return s;
}

}  // namespace zaya::aegis
