#include "zaya/train/fault_inject.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::train {
namespace {

const char* kFormats =
    "kill@step=S[,rank=R], hang@step=S[,rank=R], nan@step=S[,rank=R][,steps=K], slow@rank=R,factor=F[,step=S], "
    "corrupt-ckpt@step=S[,rank=R], kill-during-save@step=S[,rank=R] or exit@step=S,code=C[,rank=R], "
    "each with an optional ,every-attempt=1 or ,attempt=N";

[[noreturn]] void bad(const std::string& spec, const std::string& what) {
  throw Error(str("--inject \"", spec, "\": ", what, " (expected ", kFormats, ")"));
}

int64_t parse_int(const std::string& spec, const std::string& key, const std::string& v) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size()) bad(spec, str(key, " = \"", v, "\" is not an integer"));
  return x;
}

}  // namespace

FaultSpec parse_fault_spec(const std::string& spec) {
  FaultSpec f;
  f.text = spec;
  const size_t at = spec.find('@');
  if (at == std::string::npos) bad(spec, "no '@' after the kind");
  const std::string kind = spec.substr(0, at);
  if (kind == "kill")
    f.kind = FaultKind::kill;
  else if (kind == "hang")
    f.kind = FaultKind::hang;
  else if (kind == "nan")
    f.kind = FaultKind::nan;
  else if (kind == "slow")
    f.kind = FaultKind::slow;
  else if (kind == "corrupt-ckpt")
    f.kind = FaultKind::corrupt_ckpt;
  else if (kind == "kill-during-save")
    f.kind = FaultKind::kill_during_save;
  else if (kind == "exit")
    f.kind = FaultKind::exit;
  else
    bad(spec, str("unknown kind \"", kind, "\""));
  bool has_code = false, has_factor = false, has_attempt = false;
  std::string rest = spec.substr(at + 1);
  if (rest.empty()) bad(spec, "no KEY=VALUE after '@'");
  size_t pos = 0;
  while (pos <= rest.size()) {
    const size_t comma = std::min(rest.find(',', pos), rest.size());
    const std::string kv = rest.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) bad(spec, str("\"", kv, "\" is not KEY=VALUE"));
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "step") {
      f.step = parse_int(spec, key, value);
      if (f.step < 1) bad(spec, "step must be >= 1 (steps count from 1)");
    } else if (key == "rank") {
      const int64_t r = parse_int(spec, key, value);
      if (r < 0) bad(spec, "rank must be >= 0");
      f.rank = static_cast<int>(r);
    } else if (key == "code" && f.kind == FaultKind::exit) {
      const int64_t c = parse_int(spec, key, value);
      if (c < 0 || c > 255) bad(spec, "code must be 0..255");
      f.code = static_cast<int>(c);
      has_code = true;
    } else if (key == "steps" && f.kind == FaultKind::nan) {
      f.steps = parse_int(spec, key, value);
      if (f.steps < 1) bad(spec, "steps must be >= 1");
    } else if (key == "factor" && f.kind == FaultKind::slow) {
      char* end = nullptr;
      f.factor = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(f.factor >= 1) || f.factor > 1e6)
        bad(spec, "factor must be a number >= 1");
      has_factor = true;
    } else if (key == "every-attempt") {
      if (value != "0" && value != "1") bad(spec, "every-attempt must be 0 or 1");
      f.every_attempt = value == "1";
    } else if (key == "attempt") {
      const int64_t a = parse_int(spec, key, value);
      if (a < 1 || a > 1000000) bad(spec, "attempt must be >= 1 (attempts count from 1)");
      f.attempt = static_cast<int>(a);
      has_attempt = true;
    } else {
      bad(spec, str("key \"", key, "\" does not apply to ", kind));
    }
  }
  if (has_attempt && f.every_attempt) bad(spec, "attempt=N and every-attempt=1 contradict each other");
  if (f.kind == FaultKind::slow) {
    if (f.rank < 0) bad(spec, "slow needs rank=R");
    if (!has_factor) bad(spec, "slow needs factor=F");
  } else if (f.step < 0) {
    bad(spec, str(kind, " needs step=S"));
  }
  if (f.kind == FaultKind::exit && !has_code) bad(spec, "exit needs code=C");
  return f;
}

int inject_attempt_from_env() {
  const char* v = std::getenv("ZAYA_INJECT_ATTEMPT");
  if (v == nullptr || *v == '\0') return 1;
  char* end = nullptr;
  const long a = std::strtol(v, &end, 10);
  if (*end != '\0' || a < 1)
    throw Error(str("ZAYA_INJECT_ATTEMPT = \"", v, "\": expected the attempt number, 1 or more"));
  return static_cast<int>(a);
}

FaultInjector::FaultInjector(const std::vector<std::string>& specs, int rank, int64_t start_step,
                             int attempt) {
  for (const std::string& s : specs) {
    FaultSpec f = parse_fault_spec(s);
    if (!f.every_attempt && attempt != f.attempt) continue;
    if (f.kind != FaultKind::slow && f.step >= 0 && start_step >= f.step) continue;
    // corrupt-ckpt's rank names the rank file; rank 0 commits and so corrupts.
    const int actor = f.kind == FaultKind::corrupt_ckpt ? 0 : f.rank;
    if (actor >= 0 && actor != rank) continue;
    if (f.kind == FaultKind::slow) {
      log_warn("fault injection armed: this rank's steps slowed ", f.factor, "x",
               f.step >= 0 ? str(" from step ", f.step) : std::string());
      slow_.push_back(f);
      continue;
    }
    log_warn("fault injection armed: ", f.text);
    armed_.push_back(f);
  }
  fired_.assign(armed_.size(), false);
}

double FaultInjector::slow_factor(int64_t step) const {
  double f = 1;
  for (const FaultSpec& s : slow_)
    if (step >= s.step) f *= s.factor;
  return f;
}

const FaultSpec* FaultInjector::take(FaultKind kind, int64_t step) {
  for (size_t i = 0; i < armed_.size(); ++i)
    if (!fired_[i] && armed_[i].kind == kind && armed_[i].step <= step &&
        step < armed_[i].step + armed_[i].steps) {
      fired_[i] = step == armed_[i].step + armed_[i].steps - 1;
      log_warn("fault injection fires at step ", step, ": ", armed_[i].text);
      return &armed_[i];
    }
  return nullptr;
}

void kill_self() {
  std::fflush(nullptr);
  ::raise(SIGKILL);
  std::abort();  // unreachable: SIGKILL cannot be caught
}

void hang_forever() {
  std::fflush(nullptr);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void kill_self_once_written(const std::string& file) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::error_code ec;
  while (!std::filesystem::exists(file, ec) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  kill_self();
}

void poison_gradient(const Tensor& grads, int64_t i) {
  ZAYA_CHECK(grads.dtype() == DType::f32 && i >= 0 && i < grads.numel(), "fault injection: gradient element ",
             i, " is not in the f32 buffer of ", grads.numel());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  grads.window(i, Shape{1}).copy_from(Tensor::borrow(const_cast<float*>(&nan), Shape{1}, DType::f32));
}

void corrupt_file(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ZAYA_CHECK(f.good(), "fault injection: cannot open ", file, " to corrupt it");
  f.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(f.tellg());
  const int64_t n = std::min<int64_t>(16, size);
  std::string bytes(static_cast<size_t>(n), '\0');
  f.seekg(size - n);
  f.read(bytes.data(), n);
  for (char& c : bytes) c = static_cast<char>(~c);
  f.seekp(size - n);
  f.write(bytes.data(), n);
  ZAYA_CHECK(f.good(), "fault injection: cannot write ", file);
}

}  // namespace zaya::train
