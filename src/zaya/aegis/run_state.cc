#include "zaya/aegis/run_state.h"

#include <fstream>
#include <sstream>

#include "zaya/ckpt/fs_util.h"
#include "zaya/core/error.h"

namespace zaya::aegis {
namespace fs = std::filesystem;

nlohmann::json Incident::to_json() const {
  nlohmann::json j = {{"time", time},
                      {"class", cls},
                      {"evidence", evidence},
                      {"action", action},
                      {"attempt", attempt},
                      {"rank", rank},
                      {"host", host},
                      {"failed_step", failed_step},
                      {"resume_step", resume_step},
                      {"steps_lost", steps_lost},
                      {"time_to_detect_s", time_to_detect_s}};
  j["time_to_recover_s"] = time_to_recover_s ? nlohmann::json(*time_to_recover_s) : nlohmann::json(nullptr);
  return j;
}

Incident Incident::from_json(const nlohmann::json& j) {
  Incident i;
  i.time = j.at("time").get<double>();
  i.cls = j.at("class").get<std::string>();
  i.evidence = j.at("evidence").get<std::string>();
  i.action = j.at("action").get<std::string>();
  i.attempt = j.at("attempt").get<int>();
  i.rank = j.at("rank").get<int>();
  i.host = j.at("host").get<std::string>();
  i.failed_step = j.at("failed_step").get<int64_t>();
  i.resume_step = j.at("resume_step").get<int64_t>();
  i.steps_lost = j.at("steps_lost").get<int64_t>();
  i.time_to_detect_s = j.at("time_to_detect_s").get<double>();
  if (j.at("time_to_recover_s").is_number()) i.time_to_recover_s = j.at("time_to_recover_s").get<double>();
  return i;
}

nlohmann::json SupervisorState::to_json() const {
  nlohmann::json windows = nlohmann::json::array();
  for (const auto& w : skip_windows) windows.push_back({w.begin, w.end});
  return {{"format", "zaya-aegis-1"},
          {"attempts", attempts},
          {"restarts", restarts},
          {"consecutive_failures", consecutive_failures},
          {"high_water_step", high_water_step},
          {"skip_windows", windows},
          {"excluded_hosts", excluded_hosts},
          {"host_failures", host_failures},
          {"pending_incident", pending ? pending->to_json() : nlohmann::json(nullptr)},
          {"heartbeats_seen", heartbeats_seen},
          {"job_session", job_session},
          {"productive_s", productive_s},
          {"wall_s", wall_s},
          {"steps_recomputed", steps_recomputed},
          {"status", status}};
}

SupervisorState SupervisorState::from_json(const nlohmann::json& j) {
  SupervisorState s;
  s.attempts = j.at("attempts").get<int>();
  s.restarts = j.at("restarts").get<int>();
  s.consecutive_failures = j.at("consecutive_failures").get<int>();
  s.high_water_step = j.at("high_water_step").get<int64_t>();
  for (const auto& w : j.at("skip_windows")) s.skip_windows.push_back({w.at(0).get<int64_t>(), w.at(1).get<int64_t>()});
  s.excluded_hosts = j.at("excluded_hosts").get<std::vector<std::string>>();
  s.host_failures = j.at("host_failures").get<std::map<std::string, int>>();
  if (!j.at("pending_incident").is_null()) s.pending = Incident::from_json(j.at("pending_incident"));
  s.heartbeats_seen = j.at("heartbeats_seen").get<bool>();
  s.job_session = j.at("job_session").get<int64_t>();
  s.productive_s = j.at("productive_s").get<double>();
  s.wall_s = j.at("wall_s").get<double>();
  s.steps_recomputed = j.at("steps_recomputed").get<int64_t>();
  s.status = j.at("status").get<std::string>();
  return s;
}

fs::path aegis_dir(const fs::path& out_dir) { return out_dir / "aegis"; }

SupervisorState load_state(const fs::path& out_dir) {
  const fs::path file = aegis_dir(out_dir) / "state.json";
  if (!fs::exists(file)) return {};
  try {
    return SupervisorState::from_json(nlohmann::json::parse(ckpt::read_small_file(file)));
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(file.string(), ": not a supervisor state (", e.what(),
                    "); move it aside to start the supervisor's records afresh"));
  }
}

void save_state(const fs::path& out_dir, const SupervisorState& s) {
  fs::create_directories(aegis_dir(out_dir));
  ckpt::write_file_atomic(aegis_dir(out_dir) / "state.json", s.to_json().dump(2) + "\n");
}

void append_incident(const fs::path& out_dir, const Incident& i) {
  fs::create_directories(aegis_dir(out_dir));
  std::ofstream out(aegis_dir(out_dir) / "incidents.jsonl", std::ios::app);
  out << i.to_json().dump() << "\n";
  ZAYA_CHECK(out.good(), "cannot append to ", (aegis_dir(out_dir) / "incidents.jsonl").string());
}

std::vector<Incident> read_incidents(const fs::path& out_dir) {
  std::vector<Incident> all;
  std::ifstream in(aegis_dir(out_dir) / "incidents.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) all.push_back(Incident::from_json(nlohmann::json::parse(line)));
  return all;
}

std::vector<Host> read_hosts(const fs::path& file) {
  std::ifstream in(file);
  ZAYA_CHECK(in.good(), "--hosts ", file.string(), ": cannot read the file");
  std::vector<Host> hosts;
  int lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    for (char& c : line)
      if (c == ':' || c == '\t') c = ' ';
    std::istringstream words(line);
    Host h;
    if (!(words >> h.name)) continue;
    std::string slots;
    if (words >> slots) {
      if (slots.rfind("slots=", 0) == 0) slots.erase(0, 6);
      try {
        size_t used = 0;
        h.slots = std::stoi(slots, &used);
        if (used != slots.size() || h.slots < 1) throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw Error(str("--hosts ", file.string(), " line ", lineno, ": expected 'name', 'name slots=N', 'name:N' or ",
                        "'name N' with N >= 1, found '", line, "'"));
      }
    }
    std::string extra;
    ZAYA_CHECK(!(words >> extra), "--hosts ", file.string(), " line ", lineno, ": unexpected '", extra, "' after the slots");
    hosts.push_back(h);
  }
  ZAYA_CHECK(!hosts.empty(), "--hosts ", file.string(), ": no host listed");
  return hosts;
}

std::string host_of_rank(const std::vector<Host>& hosts, int rank) {
  int first = 0;
  for (const Host& h : hosts) {
    if (rank >= first && rank < first + h.slots) return h.name;
    first += h.slots;
  }
  return "";
}

}  // namespace zaya::aegis
