#include "zaya/train/resume.h"

#include <vector>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/reader.h"
#include "zaya/core/log.h"

namespace zaya::train {
namespace fs = std::filesystem;
namespace {

bool same_directory(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  const bool same = fs::equivalent(a, b, ec);
  return !ec && same;
}

std::string step_names(const std::vector<int64_t>& steps) {
  std::string s;
  for (size_t i = 0; i < steps.size(); ++i) s += (i ? ", " : "") + ckpt::step_dir_name(steps[i]);
  return s;
}

// What `latest` names, or "" when there is none; a damaged `latest` does not stop a resume either.
std::string latest_name(const fs::path& run_dir) {
  try {
    if (auto l = ckpt::read_latest(run_dir)) return l->filename().string();
  } catch (const Error& e) {
    return str("something unreadable (", e.what(), ")");
  }
  return "";
}

}  // namespace

fs::path prepare_resume(const fs::path& out_dir, const std::string& resume, bool rewind) {
  const fs::path where = resume == "latest" ? out_dir : fs::path(resume);
  const ckpt::ResumePoint p = ckpt::find_resume_point(where);
  const std::string chosen = p.dir.filename().string();
  // Only this run's own directory (whose lock is held) is changed.
  const bool own = same_directory(p.dir.parent_path(), out_dir);
  for (const auto& r : p.rejected)
    log_warn("resume: skipping ", (where / ckpt::step_dir_name(r.step)).string(), ", which fails verification: ",
             r.problem);
  if (own && !p.rejected.empty()) {
    std::vector<int64_t> steps;
    for (const auto& r : p.rejected) steps.push_back(r.step);
    const fs::path folder = ckpt::move_steps_aside(out_dir, steps, "rejected");
    log_warn("resume: moved the checkpoints that fail verification into ", folder.string(),
             " (kept for inspection), so that this run can save those steps again");
  }

  std::vector<int64_t> newer;
  for (int64_t s : ckpt::list_steps(out_dir))
    if (s > p.step) newer.push_back(s);
  if (!newer.empty() && !rewind)
    throw Error(str("resuming from ", p.dir.string(), " (step ", p.step, ") would train over the newer checkpoints ",
                    step_names(newer), " of ", out_dir.string(),
                    ". To continue from the newest instead, resume with plain --resume. To go back to step ", p.step,
                    ", run the same command with `--resume ", resume, " --rewind`, which moves ", step_names(newer),
                    " aside into ", (out_dir / "rewound-<time>").string(), "/ (kept, not deleted)"));
  if (!newer.empty()) {
    // `latest` first, then the newer steps aside (as ckpt::rewind_to does): a kill in between
    // leaves `latest` naming a checkpoint that is still there.
    if (own) {
      ckpt::rewind_to(out_dir, p.step);
    } else {  // another directory's checkpoint: `latest` names this run's newest one that stays
      std::vector<int64_t> kept;
      for (int64_t s : ckpt::list_steps(out_dir))
        if (s <= p.step) kept.push_back(s);
      if (kept.empty())
        fs::remove(out_dir / "latest");
      else
        ckpt::write_file_atomic(out_dir / "latest", ckpt::step_dir_name(kept.back()) + "\n");
      ckpt::move_steps_aside(out_dir, newer, "rewound");
    }
    log_warn("--rewind: moved ", step_names(newer), " into ", (out_dir / "rewound-<time>").string(),
             " (kept); continuing from step ", p.step);
  } else if (rewind) {
    log_info("--rewind: ", out_dir.string(), " holds no checkpoint newer than step ", p.step, "; nothing to move");
  }

  const std::string latest = latest_name(out_dir);
  if (own && latest != chosen) {
    if (!latest.empty())
      log_warn("resume: `latest` names ", latest, ", but ", chosen, " is the ",
               same_directory(where, out_dir) ? "newest checkpoint that verifies" : "checkpoint asked for",
               ": resuming from ", chosen, " and pointing `latest` at it");
    ckpt::write_file_atomic(out_dir / "latest", chosen + "\n");
  }
  return p.dir;
}

}  // namespace zaya::train
