#include "zaya/dist/collective_math.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "zaya/core/error.h"

namespace zaya::dist {

std::string_view coll_name(Coll c) {
  switch (c) {
    case Coll::all_reduce: return "all_reduce";
    case Coll::reduce_scatter: return "reduce_scatter";
    case Coll::all_gather: return "all_gather";
    case Coll::broadcast: return "broadcast";
    case Coll::all_to_all: return "all_to_all";
    case Coll::reduce_scatter_v: return "reduce_scatter_v";
    case Coll::all_gather_v: return "all_gather_v";
  }
  return "?";
}

Coll fixed_count_form(Coll c) {
  if (c == Coll::reduce_scatter_v) return Coll::reduce_scatter;
  if (c == Coll::all_gather_v) return Coll::all_gather;
  return c;
}

std::vector<Coll> parse_colls(const std::string& name) {
  if (name == "all") return {std::begin(kAllColls), std::end(kAllColls)};
  for (Coll c : kAllColls)
    if (name == coll_name(c)) return {c};
  throw Error("unknown collective", {.field = "--op",
                                     .expected = "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, "
                                                 "reduce_scatter_v, all_gather_v or all",
                                     .found = name});
}

CollSizes coll_sizes(Coll c, size_t bytes, size_t type_size, int nranks) {
  const size_t n = static_cast<size_t>(nranks);
  const size_t count = bytes / type_size;
  CollSizes s;
  switch (fixed_count_form(c)) {
    case Coll::all_reduce:
    case Coll::broadcast:
      s.send_count = s.recv_count = s.count = count;
      break;
    case Coll::reduce_scatter:
      s.send_count = (count / n) * n;
      s.recv_count = s.count = count / n;
      break;
    case Coll::all_gather:
      s.send_count = s.count = count / n;
      s.recv_count = (count / n) * n;
      break;
    case Coll::all_to_all:
      s.send_count = s.recv_count = (count / n) * n;
      s.count = count / n;
      break;
    default: break;  // fixed_count_form returns no _v form
  }
  s.bytes = std::max(s.send_count, s.recv_count) * type_size;
  return s;
}

double bus_factor(Coll c, int nranks) {
  const double n = nranks;
  switch (fixed_count_form(c)) {
    case Coll::all_reduce: return 2.0 * (n - 1) / n;
    case Coll::reduce_scatter:
    case Coll::all_gather:
    case Coll::all_to_all: return (n - 1) / n;
    case Coll::broadcast: return 1.0;
    default: break;  // fixed_count_form returns no _v form
  }
  return 1.0;
}

uint64_t parse_size(const std::string& text, const std::string& flag) {
  auto bad = [&](const char* why) {
    return Error(str("invalid size: ", why), {.field = flag, .expected = "a byte count like 8, 64K, 64M or 1G",
                                              .found = "\"" + text + "\""});
  };
  if (text.empty()) throw bad("empty");
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(begin, &end);
  if (end == begin || errno != 0 || !std::isfinite(value)) throw bad("not a number");
  if (value < 0 || text[0] == '-') throw bad("negative");
  double unit = 1;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k") unit = 1024.0;
  else if (suffix == "M" || suffix == "m") unit = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") unit = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) throw bad("unknown suffix (K, M and G are powers of 1024)");
  double bytes = value * unit;
  if (bytes > 1e15) throw bad("too large");
  return static_cast<uint64_t>(bytes);
}

std::vector<uint64_t> sweep_sizes(uint64_t min_bytes, uint64_t max_bytes, uint64_t factor, uint64_t step) {
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes; s <= max_bytes; s = factor > 1 ? s * factor : s + step) {
    sizes.push_back(s);
    if ((factor > 1 && s == 0) || (factor <= 1 && step == 0)) break;  // would never grow
  }
  return sizes;
}

std::string format_time_us(double us) {
  char buf[64];
  if (us >= 10000.0) std::snprintf(buf, sizeof buf, "%7.0f", us);
  else if (us >= 100.0) std::snprintf(buf, sizeof buf, "%7.1f", us);
  else std::snprintf(buf, sizeof buf, "%7.2f", us);
  return buf;
}

}  // namespace zaya::dist
