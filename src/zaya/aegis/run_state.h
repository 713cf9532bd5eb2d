// What the supervisor remembers across its own restarts (<out_dir>/aegis/state.json), the incident
// log (<out_dir>/aegis/incidents.jsonl) and the hosts list (docs/aegis.md, "Incident log").
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zaya::aegis {

// A global sample index range [begin, end) the loader skips (`zaya train --skip-samples A:B`).
struct SkipWindow {
  int64_t begin = 0, end = 0;
  std::string arg() const { return std::to_string(begin) + ":" + std::to_string(end); }
  bool operator==(const SkipWindow&) const = default;
};

struct Incident {
  double time = 0;           // unix seconds of the detection
  std::string cls;           // class_name()
  std::string evidence;
  std::string action;
  int attempt = 0;
  int rank = -1;
  std::string host;
  int64_t failed_step = -1;  // the newest step reached (or reported failing)
  int64_t resume_step = -1;  // the checkpoint step the next attempt resumed from (-1: start over / none)
  int64_t steps_lost = 0;    // failed_step - resume_step: steps computed again
  double time_to_detect_s = 0;   // detection - the newest heartbeat before it (the exit itself for crashes)
  std::optional<double> time_to_recover_s;  // detection - the next attempt's first new training step
  nlohmann::json to_json() const;
  static Incident from_json(const nlohmann::json& j);
};

struct SupervisorState {
  int attempts = 0;              // launches so far (ZAYA_INJECT_ATTEMPT of the last one)
  int restarts = 0;              // launches after a failure: counted against the restart budget
  int consecutive_failures = 0;  // failures since the last attempt that made progress (the back-off exponent)
  int64_t high_water_step = -1;  // the newest step any attempt reached
  std::vector<SkipWindow> skip_windows;
  std::vector<std::string> excluded_hosts;
  std::map<std::string, int> host_failures;
  std::optional<Incident> pending;  // detected, waiting for the next attempt's first step to measure recovery
  bool heartbeats_seen = false;  // some attempt wrote heartbeats: a later one that writes none by the start floor hangs
  int64_t job_session = 0;       // the running job's session id (setsid), to end an orphan after a supervisor kill
  double productive_s = 0;       // training time on steps never computed before
  double wall_s = 0;             // supervised wall time of every supervisor run so far
  int64_t steps_recomputed = 0;
  std::string status = "running";  // running, finished, gave-up
  nlohmann::json to_json() const;
  static SupervisorState from_json(const nlohmann::json& j);
};

std::filesystem::path aegis_dir(const std::filesystem::path& out_dir);
// Absent file: a fresh state. A malformed one is a zaya::Error naming it.
SupervisorState load_state(const std::filesystem::path& out_dir);
void save_state(const std::filesystem::path& out_dir, const SupervisorState& s);  // atomic
void append_incident(const std::filesystem::path& out_dir, const Incident& i);
std::vector<Incident> read_incidents(const std::filesystem::path& out_dir);

// --hosts FILE: one host per line, "name", "name slots=N", "name:N" or "name N" (slots default 1);
// '#' starts a comment. Throws a zaya::Error naming the file and line of anything else.
struct Host {
  std::string name;
  int slots = 1;
};
std::vector<Host> read_hosts(const std::filesystem::path& file);
// The host of `rank` when ranks fill hosts in order, slots of the first host first (mpirun's
// default by-slot mapping of --host a:2,b:2). "" when the rank is beyond every slot.
std::string host_of_rank(const std::vector<Host>& hosts, int rank);

}  // namespace zaya::aegis
