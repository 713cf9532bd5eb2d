#include "zaya/aegis/heartbeat.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace zaya::aegis {
namespace fs = std::filesystem;
namespace {

std::optional<double> number_or_null(const nlohmann::json& j, const char* key) {
  const auto& v = j.at(key);
  if (v.is_number()) return v.get<double>();
  return std::nullopt;
}

}  // namespace

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::optional<Heartbeat> parse_heartbeat(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  try {
    Heartbeat h;
    h.rank = j.at("rank").get<int>();
    h.world = j.at("world").get<int>();
    h.pid = j.at("pid").get<int64_t>();
    h.host = j.at("host").get<std::string>();
    h.seq = j.at("seq").get<int64_t>();
    h.step = j.at("step").get<int64_t>();
    h.phase = j.at("phase").get<std::string>();
    h.time = j.at("time").get<double>();
    h.loss = number_or_null(j, "loss");
    h.grad_norm = number_or_null(j, "grad_norm");
    h.step_time = number_or_null(j, "step_time");
    if (j.contains("busy_time")) h.busy_time = number_or_null(j, "busy_time");
    h.nonfinite = j.at("nonfinite").get<bool>();
    if (j.at("error").is_string()) h.error = j.at("error").get<std::string>();
    return h;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a key missing or of the wrong type: not a contract heartbeat
  }
}

std::map<int, Heartbeat> read_heartbeats(const fs::path& out_dir, double since) {
  std::map<int, Heartbeat> beats;
  std::error_code ec;
  for (fs::directory_iterator it(out_dir / "heartbeat", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank_", 0) != 0 || it->path().extension() != ".json") continue;
    std::ifstream in(it->path());
    std::stringstream text;
    text << in.rdbuf();
    if (auto h = parse_heartbeat(text.str()); h && h->time >= since) beats[h->rank] = *h;
  }
  return beats;
}

}  // namespace zaya::aegis
