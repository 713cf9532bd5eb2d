#include "zaya/ckpt/rank_save.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "zaya/ckpt/checksum.h"
#include "zaya/ckpt/json_strict.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::ckpt {
namespace {

using json = nlohmann::json;

constexpr const char* kChunkListFormat = "zaya-rank-chunks";

struct Resolved {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
};

// Fills in defaults (whole tensor) and checks the chunk lies inside its global tensor.
Resolved resolve(const SaveItem& it) {
  ZAYA_CHECK(it.tensor.defined(), "checkpoint save: tensor '", it.name, "' is undefined");
  Resolved r{it.global_shape, it.offsets};
  const int nd = it.tensor.ndim();
  if (r.global_shape.empty() && nd > 0) r.global_shape.assign(it.tensor.shape().begin(), it.tensor.shape().end());
  if (r.offsets.empty()) r.offsets.assign(r.global_shape.size(), 0);
  ZAYA_CHECK(static_cast<int>(r.global_shape.size()) == nd && static_cast<int>(r.offsets.size()) == nd,
             "checkpoint save: tensor '", it.name, "' has ", nd, " dims but global shape has ", r.global_shape.size(),
             " and offsets ", r.offsets.size());
  for (int d = 0; d < nd; ++d)
    ZAYA_CHECK(r.offsets[d] >= 0 && r.offsets[d] + it.tensor.size(d) <= r.global_shape[d], "checkpoint save: tensor '",
               it.name, "' chunk ", it.tensor.shape().str(), " at offset ", r.offsets[d], " in dim ", d,
               " lies outside its global extent ", r.global_shape[d]);
  return r;
}

[[noreturn]] void throw_errno(const char* op, const fs::path& path, int err) {
  throw Error(str(op, " failed: ", std::strerror(err)), {.file = path.string()});
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += str(i ? ", " : "", s[i]);
  return out + "]";
}

// Field access for the chunk list; every failure names the file and the field.
class ListParser {
 public:
  explicit ListParser(std::string what) : what_(std::move(what)) {}
  [[noreturn]] void fail(const std::string& msg, const std::string& field, const std::string& expected,
                         const std::string& found) const {
    throw Error(str("checkpoint chunk list: ", msg), {.file = what_, .field = field, .expected = expected, .found = found});
  }
  const json& get(const json& obj, const char* key, const std::string& path) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail("missing field", path + key, "present", "nothing");
    return *it;
  }
  void only_keys(const json& obj, std::initializer_list<const char*> keys, const std::string& path) const {
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return it.key() == k; }))
        fail("unknown field", path + it.key(), "one of the documented fields", it.key());
  }
  std::string string(const json& obj, const char* key, const std::string& path) const {
    const json& v = get(obj, key, path);
    if (!v.is_string()) fail("wrong type", path + key, "a string", json_brief(v));
    return v.get<std::string>();
  }
  int64_t integer(const json& v, const std::string& field) const {
    constexpr int64_t kMax = (int64_t{1} << 62) - 1;
    const bool ok = (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(kMax)) ||
                    (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= 0);
    if (!ok) fail("wrong type or out of range", field, "an integer in [0, 2^62)", json_brief(v));
    return v.get<int64_t>();
  }
  int64_t integer(const json& obj, const char* key, const std::string& path) const {
    return integer(get(obj, key, path), path + key);
  }
  std::vector<int64_t> int_list(const json& obj, const char* key, const std::string& path) const {
    const json& v = get(obj, key, path);
    if (!v.is_array()) fail("wrong type", path + key, "an array", json_brief(v));
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(integer(v[i], str(path, key, "[", i, "]")));
    return out;
  }

 private:
  std::string what_;
};

}  // namespace

std::string rank_file_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

std::string chunk_list_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank_%05d.chunks.json", rank);
  return buf;
}

std::string rank_error_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank_%05d.error.txt", rank);
  return buf;
}

RankChunks write_rank_file(const fs::path& dir, int rank, const std::vector<SaveItem>& items, bool single_thread) {
  const std::string fname = rank_file_name(rank);
  std::vector<StEntry> entries;
  std::vector<Resolved> resolved;
  std::vector<Tensor> host;  // device tensors are copied to the host first (keeps them alive)
  for (const SaveItem& it : items) {
    resolved.push_back(resolve(it));
    Tensor t = it.tensor.device() == Device::cpu ? it.tensor : it.tensor.to(Device::cpu);
    host.push_back(t);
    entries.push_back(st_entry(it.name, t));
  }
  // Checksums run on another thread while the file is written: CRC32C (~7 GB/s) would otherwise
  // add ~20% to a write at disk speed (~1.4 GB/s measured here). The forked child computes them
  // inline (before the write: same bytes, same result).
  auto all_crcs = [&entries] {
    std::vector<uint32_t> out;
    for (const auto& e : entries) out.push_back(crc32c(e.data, e.nbytes));
    return out;
  };
  const std::map<std::string, std::string> meta{{"format", "zaya-checkpoint"}, {"rank", std::to_string(rank)}};
  StWritten w;
  std::vector<uint32_t> checksums;
  if (single_thread) {
    checksums = all_crcs();
    w = write_safetensors(dir / fname, entries, meta);
  } else {
    auto crcs = std::async(std::launch::async, all_crcs);
    try {
      w = write_safetensors(dir / fname, entries, meta);
    } catch (...) {
      crcs.wait();  // it reads `entries`: let it finish before they go away
      throw;
    }
    checksums = crcs.get();
  }
  RankChunks rc;
  rc.rank = rank;
  rc.file = {.name = fname, .rank = rank, .bytes = w.file_bytes};
  for (size_t i = 0; i < items.size(); ++i) {
    Chunk c;
    c.file = fname;
    c.offsets = resolved[i].offsets;
    c.shape = entries[i].shape;
    c.byte_begin = w.ranges[i].first;
    c.byte_end = w.ranges[i].second;
    c.checksum = checksums[i];
    rc.items.push_back({items[i].name, entries[i].dtype, resolved[i].global_shape, std::move(c)});
    rc.tensor_bytes += entries[i].nbytes;
  }
  return rc;
}

std::string chunk_list_to_string(const RankChunks& rc, int64_t step, int world_size) {
  json items = json::array();
  for (const auto& it : rc.items)
    items.push_back({{"name", it.name}, {"dtype", it.dtype}, {"global_shape", it.global_shape},
                     {"offsets", it.chunk.offsets}, {"shape", it.chunk.shape}, {"byte_begin", it.chunk.byte_begin},
                     {"byte_end", it.chunk.byte_end}, {"checksum", format_checksum(it.chunk.checksum)}});
  const json j = {{"format", kChunkListFormat},
                  {"step", step},
                  {"world_size", world_size},
                  {"rank", rc.rank},
                  {"file", {{"name", rc.file.name}, {"bytes", rc.file.bytes}}},
                  {"tensor_bytes", rc.tensor_bytes},
                  {"items", items}};
  return j.dump(1, ' ', false, json::error_handler_t::strict) + "\n";
}

RankChunks parse_chunk_list(std::string_view text, const std::string& what, int64_t step, int world_size, int rank) {
  ListParser p(what);
  const json j = parse_json_strict(text, what);
  if (!j.is_object()) p.fail("not a JSON object", "", "an object", json_brief(j));
  p.only_keys(j, {"format", "step", "world_size", "rank", "file", "tensor_bytes", "items"}, "");
  const std::string format = p.string(j, "format", "");
  if (format != kChunkListFormat) p.fail("not a chunk list", "format", kChunkListFormat, format);
  // A list written for another step, world or rank is never this save's, however it got here.
  if (p.integer(j, "step", "") != step) p.fail("written for another save", "step", str(step), json_brief(j["step"]));
  if (p.integer(j, "world_size", "") != world_size)
    p.fail("written for another world size", "world_size", str(world_size), json_brief(j["world_size"]));
  if (p.integer(j, "rank", "") != rank) p.fail("written by another rank", "rank", str(rank), json_brief(j["rank"]));
  RankChunks rc;
  rc.rank = rank;
  const json& f = p.get(j, "file", "");
  if (!f.is_object()) p.fail("wrong type", "file", "an object", json_brief(f));
  p.only_keys(f, {"name", "bytes"}, "file.");
  rc.file.name = p.string(f, "name", "file.");
  if (rc.file.name != rank_file_name(rank)) p.fail("names another rank's file", "file.name", rank_file_name(rank), rc.file.name);
  rc.file.rank = rank;
  rc.file.bytes = static_cast<uint64_t>(p.integer(f, "bytes", "file."));
  rc.tensor_bytes = static_cast<uint64_t>(p.integer(j, "tensor_bytes", ""));
  const json& items = p.get(j, "items", "");
  if (!items.is_array()) p.fail("wrong type", "items", "an array", json_brief(items));
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string path = str("items[", i, "].");
    const json& ij = items[i];
    if (!ij.is_object()) p.fail("wrong type", path, "an object", json_brief(ij));
    p.only_keys(ij, {"name", "dtype", "global_shape", "offsets", "shape", "byte_begin", "byte_end", "checksum"}, path);
    RankChunks::Item it;
    it.name = p.string(ij, "name", path);
    it.dtype = p.string(ij, "dtype", path);
    it.global_shape = p.int_list(ij, "global_shape", path);
    it.chunk.file = rc.file.name;
    it.chunk.offsets = p.int_list(ij, "offsets", path);
    it.chunk.shape = p.int_list(ij, "shape", path);
    it.chunk.byte_begin = static_cast<uint64_t>(p.integer(ij, "byte_begin", path));
    it.chunk.byte_end = static_cast<uint64_t>(p.integer(ij, "byte_end", path));
    const std::string cs = p.string(ij, "checksum", path);
    if (!parse_checksum(cs, &it.chunk.checksum)) p.fail("malformed checksum", path + "checksum", "crc32c:<8 hex digits>", cs.substr(0, 40));
    rc.items.push_back(std::move(it));
  }
  return rc;
}

void write_chunk_list(const fs::path& dir, const RankChunks& rc, int64_t step, int world_size) {
  const std::string text = chunk_list_to_string(rc, step, world_size);
  const std::string name = chunk_list_name(rc.rank), tmp = name + ".tmp";
  // Everything through a descriptor of `dir`: rank 0 may rename the directory to step_N as soon as
  // the list appears, and a path-based fsync of the directory afterwards would then fail.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw_errno("open", dir, errno);
  try {
    const int fd = ::openat(dfd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw_errno("open", dir / tmp, errno);
    try {
      write_all(fd, text.data(), text.size(), dir / tmp);
      if (::fsync(fd) != 0) throw_errno("fsync", dir / tmp, errno);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw_errno("close", dir / tmp, errno);
    if (::renameat(dfd, tmp.c_str(), dfd, name.c_str()) != 0) throw_errno("rename", dir / tmp, errno);
  } catch (...) {
    ::close(dfd);
    throw;
  }
  ::close(dfd);
}

void write_rank_error(const fs::path& dir, int rank, const std::string& message) noexcept {
  try {
    write_file_atomic(dir / rank_error_name(rank), message.substr(0, 4000) + "\n");
  } catch (...) {  // the directory itself may be what failed; rank 0's timeout still names this rank
  }
}

std::vector<RankChunks> gather_chunk_lists(const fs::path& dir, int64_t step, int world_size, double timeout_s) {
  ZAYA_CHECK(world_size >= 1, "checkpoint save: world size must be >= 1, got ", world_size);
  ZAYA_CHECK(timeout_s > 0, "checkpoint save: the timeout for the other ranks' chunk lists must be > 0, got ", timeout_s);
  std::vector<RankChunks> out(static_cast<size_t>(world_size));
  std::set<int> missing;
  for (int r = 1; r < world_size; ++r) missing.insert(r);
  const auto t0 = std::chrono::steady_clock::now();
  auto poll = std::chrono::milliseconds(1);
  while (true) {
    for (auto it = missing.begin(); it != missing.end();) {
      const fs::path path = dir / chunk_list_name(*it);
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        if (fs::exists(dir / rank_error_name(*it), ec)) {
          std::string why = read_small_file(dir / rank_error_name(*it), 8192);
          while (!why.empty() && why.back() == '\n') why.pop_back();
          throw Error(str("checkpoint save of ", step_dir_name(step), ": rank ", *it, " failed to write its part (", why,
                          "); nothing was committed, `latest` still names the previous checkpoint"),
                      {.file = dir.string()});
        }
        ++it;
        continue;
      }
      RankChunks rc = parse_chunk_list(read_small_file(path, size_t{1} << 30), path.string(), step, world_size, *it);
      const fs::path file = dir / rc.file.name;
      const uint64_t size = fs::file_size(file, ec);
      if (ec || size != rc.file.bytes)
        throw Error("checkpoint save: a rank file's size differs from what its rank reported",
                    {.file = file.string(), .expected = str(rc.file.bytes, " bytes (", chunk_list_name(*it), ")"),
                     .found = ec ? ec.message() : str(size, " bytes")});
      out[static_cast<size_t>(*it)] = std::move(rc);
      it = missing.erase(it);
    }
    if (missing.empty()) return out;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited >= timeout_s) {
      std::string named, detail;
      for (int r : missing) {
        std::error_code ec;
        named += str(named.empty() ? "" : ", ", r);
        detail += str("\n  rank ", r, ": ",
                      fs::exists(dir / rank_file_name(r), ec)
                          ? "its rank file is there but its chunk list is not (it died or stalled after writing its data)"
                          : "neither its rank file nor its chunk list is there (it died or stalled before writing)");
      }
      throw Error(str("checkpoint save of ", step_dir_name(step), ": rank", missing.size() > 1 ? "s " : " ", named,
                      " did not report ", missing.size() > 1 ? "their" : "its", " chunks within ", timeout_s,
                      " s; nothing was committed, `latest` still names the previous checkpoint", detail),
                  {.file = dir.string()});
    }
    // Short polls first (the other ranks usually finish about when this one does), then at most
    // 50 ms: a stat per missing rank, negligible beside the write.
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, std::chrono::milliseconds(50));
  }
}

Manifest compose_manifest(int64_t step, int world_size, const nlohmann::json& state, const std::vector<RankChunks>& ranks,
                          const std::string& what) {
  ZAYA_CHECK(state.is_object(), "checkpoint save: state must be a JSON object");
  ZAYA_CHECK(!ranks.empty(), "checkpoint save: no ranks");
  ZAYA_CHECK(static_cast<int>(ranks.size()) == world_size, "checkpoint save: ", ranks.size(),
             " ranks' chunks for a world of ", world_size);
  Manifest m;
  m.step = step;
  m.world_size = world_size;
  m.state = state;
  std::map<std::string, int> first_rank;  // which rank set a tensor's dtype and shape
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankChunks& rc = ranks[r];
    ZAYA_CHECK(rc.rank == static_cast<int>(r), "checkpoint save: the chunks of rank ", rc.rank, " are at position ", r,
               "; every rank's chunks must be given in rank order");
    for (const auto& it : rc.items) {
      TensorEntry& te = m.tensors[it.name];
      if (te.chunks.empty()) {
        te.dtype = it.dtype;
        te.shape = it.global_shape;
        first_rank[it.name] = rc.rank;
      } else {
        ZAYA_CHECK(te.dtype == it.dtype && te.shape == it.global_shape, "checkpoint save: tensor '", it.name,
                   "' has different dtypes or global shapes on different ranks: ", te.dtype, " ", shape_str(te.shape),
                   " on rank ", first_rank[it.name], ", ", it.dtype, " ", shape_str(it.global_shape), " on rank ", rc.rank);
      }
      te.chunks.push_back(it.chunk);
    }
    m.files.push_back(rc.file);
  }
  // Self-check: the manifest must parse under the reader's rules (chunks tile every tensor), so a
  // save from ranks that do not cover a tensor fails here instead of committing.
  parse_manifest(manifest_to_string(m), what);
  return m;
}

fs::path prepare_step_dir(const fs::path& run_dir, int64_t step) {
  const std::string name = step_dir_name(step);
  const fs::path final_dir = run_dir / name;
  const fs::path tmp_dir = run_dir / (name + ".tmp");
  std::error_code ec;
  // A trainer never gets here with a newer checkpoint in its locked run directory (train/resume.h
  // refuses or rewinds at start); a save beside another writer, or a second save of one step, does.
  ZAYA_CHECK(!fs::exists(final_dir, ec), "checkpoint save: ", final_dir.string(),
             " already exists: another process is writing this run directory, or the run was resumed from an "
             "older checkpoint without `zaya train --resume STEP_DIR --rewind`");
  fs::create_directories(run_dir, ec);
  fs::remove_all(tmp_dir, ec);
  fs::create_directory(tmp_dir, ec);
  if (ec) throw Error(str("cannot create directory: ", ec.message()), {.file = tmp_dir.string()});
  return tmp_dir;
}

fs::path commit_step_dir(const fs::path& run_dir, const Manifest& m, const RetentionPolicy& retention, bool quiet) {
  const std::string name = step_dir_name(m.step);
  const fs::path final_dir = run_dir / name;
  const fs::path tmp_dir = run_dir / (name + ".tmp");
  write_file_atomic(tmp_dir / "manifest.json", manifest_to_string(m));
  // A committed checkpoint holds exactly what its manifest lists: the chunk lists (and anything a
  // failed attempt of a rank left) go before the directory becomes step_N.
  std::set<std::string> keep{"manifest.json"};
  for (const auto& f : m.files) keep.insert(f.name);
  std::vector<fs::path> extra;
  std::error_code lec;
  for (fs::directory_iterator it(tmp_dir, lec), end; !lec && it != end; it.increment(lec))
    if (!keep.count(it->path().filename().string())) extra.push_back(it->path());
  if (lec) throw Error(str("cannot list the directory: ", lec.message()), {.file = tmp_dir.string()});
  for (const auto& p : extra) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec) throw Error(str("cannot remove ", ec.message()), {.file = p.string()});
  }
  fsync_path(tmp_dir);
  atomic_rename(tmp_dir, final_dir);
  write_file_atomic(run_dir / "latest", name + "\n");
  for (int64_t s : apply_retention(run_dir, retention))
    if (!quiet) log_debug("checkpoint retention: deleted ", step_dir_name(s));
  return final_dir;
}

void wait_for_latest(const fs::path& run_dir, int64_t step, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  auto poll = std::chrono::milliseconds(1);
  std::string named = "nothing";
  while (true) {
    // `latest` is replaced by an atomic rename, so a read sees the old name or the new one.
    if (auto latest = read_latest(run_dir)) {
      named = latest->filename().string();
      if (parse_step_dir_name(named).value_or(-1) >= step) return;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= timeout_s)
      throw Error(str("checkpoint ", step_dir_name(step), " was not committed within ", timeout_s,
                      " s (rank 0 commits it and reports why it could not)"),
                  {.file = (run_dir / "latest").string(), .expected = str(step_dir_name(step), " or later"), .found = named});
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace zaya::ckpt
