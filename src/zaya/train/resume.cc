#include "zaya/train/resume.h"

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

}  // namespace

fs::path prepare_resume(const fs::path& out_dir, const std::string& resume) {
  const fs::path where = resume == "latest" ? out_dir : fs::path(resume);
  const ckpt::ResumePoint p = ckpt::find_resume_point(where);
  const std::string chosen = p.dir.filename().string();
  for (const auto& r : p.rejected)
    log_warn("resume: skipping ", (where / ckpt::step_dir_name(r.step)).string(), ", which fails verification: ",
             r.problem);
  // Only this run's own directory (whose lock we hold) is changed.
  if (!same_directory(p.dir.parent_path(), out_dir)) return p.dir;
  if (!p.rejected.empty()) {
    std::vector<int64_t> steps;
    for (const auto& r : p.rejected) steps.push_back(r.step);
    const fs::path folder = ckpt::move_steps_aside(out_dir, steps, "rejected");
    log_warn("resume: moved the checkpoints that fail verification into ", folder.string(),
             " (kept for inspection), so that this run can save those steps again");
  }
  std::string latest;
  try {
    if (auto l = ckpt::read_latest(out_dir)) latest = l->filename().string();
  } catch (const Error& e) {  // a damaged `latest` does not stop a resume either
    latest = str("something unreadable (", e.what(), ")");
  }
  if (latest != chosen) {
    if (!latest.empty())
      log_warn("resume: `latest` names ", latest, ", but ", chosen, " is the ",
               same_directory(where, out_dir) ? "newest checkpoint that verifies" : "checkpoint asked for",
               ": resuming from ", chosen, " and pointing `latest` at it");
    ckpt::write_file_atomic(out_dir / "latest", chosen + "\n");
  }
  return p.dir;
}

}  // namespace zaya::train
