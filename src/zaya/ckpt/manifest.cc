#include "zaya/ckpt/manifest.h"

#include <algorithm>
#include <set>

#include "zaya/ckpt/checksum.h"
#include "zaya/ckpt/json_strict.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/error.h"

namespace zaya::ckpt {
namespace {

using json = nlohmann::json;

class Parser {
 public:
  explicit Parser(std::string what) : what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& msg, const std::string& field, const std::string& expected,
                         const std::string& found) const {
    throw Error(msg, {.file = what_, .field = field, .expected = expected, .found = found});
  }

  const json& get(const json& obj, const char* key, const std::string& path) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail("missing field", path + key, "present", "nothing");
    return *it;
  }
  void only_keys(const json& obj, std::initializer_list<const char*> keys, const std::string& path) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool known = false;
      for (const char* k : keys) known |= it.key() == k;
      if (!known) fail("unknown field", path + it.key(), "one of the documented fields", it.key());
    }
  }
  const json& object(const json& obj, const char* key, const std::string& path) const {
    const json& v = get(obj, key, path);
    if (!v.is_object()) fail("wrong type", path + key, "an object", json_brief(v));
    return v;
  }
  const json& array(const json& obj, const char* key, const std::string& path) const {
    const json& v = get(obj, key, path);
    if (!v.is_array()) fail("wrong type", path + key, "an array", json_brief(v));
    return v;
  }
  std::string string(const json& obj, const char* key, const std::string& path) const {
    const json& v = get(obj, key, path);
    if (!v.is_string()) fail("wrong type", path + key, "a string", json_brief(v));
    return v.get<std::string>();
  }
  // Integers in [lo, 2^62): small enough that offset + size below cannot overflow int64.
  int64_t integer(const json& v, const std::string& field, int64_t lo) const {
    constexpr int64_t kMax = (int64_t{1} << 62) - 1;
    bool ok = v.is_number_integer() || v.is_number_unsigned();
    if (ok && v.is_number_unsigned()) ok = v.get<uint64_t>() <= static_cast<uint64_t>(kMax);
    if (ok && !v.is_number_unsigned()) ok = v.get<int64_t>() >= lo && v.get<int64_t>() <= kMax;
    if (!ok) fail("wrong type or out of range", field, str("an integer in [", lo, ", 2^62)"), json_brief(v));
    return v.get<int64_t>();
  }
  int64_t integer(const json& obj, const char* key, const std::string& path, int64_t lo) const {
    return integer(get(obj, key, path), path + key, lo);
  }
  std::vector<int64_t> int_list(const json& obj, const char* key, const std::string& path) const {
    const json& v = array(obj, key, path);
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(integer(v[i], str(path, key, "[", i, "]"), 0));
    return out;
  }

 private:
  std::string what_;
};

// The product of dims, or UINT64_MAX if it passes 2^62 (no real tensor is that large).
uint64_t numel_saturating(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    if (static_cast<uint64_t>(d) > (uint64_t{1} << 62) / n) return UINT64_MAX;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

bool boxes_overlap(const Chunk& a, const Chunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.shape[d] <= b.offsets[d] || b.offsets[d] + b.shape[d] <= a.offsets[d]) return false;
  }
  return true;
}

std::string box_str(const Chunk& c) {
  std::string s = "[";
  for (size_t d = 0; d < c.offsets.size(); ++d)
    s += str(d ? ", " : "", c.offsets[d], ":", c.offsets[d] + c.shape[d]);
  return s + "]";
}

}  // namespace

uint64_t shape_numel(const std::vector<int64_t>& shape) {
  uint64_t n = numel_saturating(shape);
  ZAYA_CHECK(n != UINT64_MAX, "tensor shape too large");
  return n;
}

json manifest_to_json(const Manifest& m) {
  json files = json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}});
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json chunks = json::array();
    for (const auto& c : t.chunks)
      chunks.push_back({{"file", c.file}, {"offsets", c.offsets}, {"shape", c.shape}, {"byte_begin", c.byte_begin},
                        {"byte_end", c.byte_end}, {"checksum", format_checksum(c.checksum)}});
    tensors[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"chunks", chunks}};
  }
  return {{"format_version", m.format_version}, {"step", m.step}, {"world", {{"size", m.world_size}}},
          {"files", files}, {"tensors", tensors}, {"state", m.state}};
}

std::string manifest_to_string(const Manifest& m) {
  return manifest_to_json(m).dump(1, ' ', false, json::error_handler_t::strict) + "\n";
}

Manifest parse_manifest(std::string_view text, const std::string& what) {
  Parser p(what);
  json j = parse_json_strict(text, what);
  if (!j.is_object()) p.fail("manifest is not a JSON object", "", "an object", json_brief(j));
  p.only_keys(j, {"format_version", "step", "world", "files", "tensors", "state"}, "");
  Manifest m;
  m.format_version = static_cast<int>(p.integer(j, "format_version", "", 0));
  if (m.format_version != kManifestFormatVersion)
    p.fail("unsupported manifest format version", "format_version", str(kManifestFormatVersion), str(m.format_version));
  m.step = p.integer(j, "step", "", 0);
  const json& world = p.object(j, "world", "");
  // The world object may grow (tensor/pipeline layout); only its size is required now.
  m.world_size = static_cast<int>(std::min<int64_t>(p.integer(world, "size", "world.", 1), 1 << 30));

  const json& files = p.array(j, "files", "");
  std::set<std::string> file_names;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = str("files[", i, "].");
    if (!files[i].is_object()) p.fail("wrong type", path, "an object", json_brief(files[i]));
    p.only_keys(files[i], {"name", "rank", "bytes"}, path);
    FileEntry f;
    f.name = p.string(files[i], "name", path);
    // A file name is a plain name inside the checkpoint directory: never a path out of it.
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." || f.name == "..")
      p.fail("file name must be a plain name inside the checkpoint directory", path + "name", "e.g. rank_00000.safetensors", f.name);
    f.rank = static_cast<int>(std::min<int64_t>(p.integer(files[i], "rank", path, 0), 1 << 30));
    f.bytes = static_cast<uint64_t>(p.integer(files[i], "bytes", path, 0));
    if (!file_names.insert(f.name).second) p.fail("file listed twice", path + "name", "unique names", f.name);
    m.files.push_back(f);
  }

  const json& tensors = p.object(j, "tensors", "");
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const std::string tpath = "tensors." + it.key() + ".";
    const json& tj = it.value();
    if (!tj.is_object()) p.fail("wrong type", "tensors." + it.key(), "an object", json_brief(tj));
    p.only_keys(tj, {"dtype", "shape", "chunks"}, tpath);
    TensorEntry t;
    t.dtype = p.string(tj, "dtype", tpath);
    const size_t esize = st_dtype_size(t.dtype);
    if (esize == 0) p.fail("unknown dtype", tpath + "dtype", "a safetensors dtype (F32, BF16, ...)", t.dtype);
    t.shape = p.int_list(tj, "shape", tpath);
    const uint64_t numel = numel_saturating(t.shape);
    if (numel == UINT64_MAX) p.fail("tensor too large", tpath + "shape", "at most 2^62 elements", json_brief(tj["shape"]));
    const json& chunks = p.array(tj, "chunks", tpath);
    uint64_t covered = 0;
    std::set<std::string> chunk_files;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const std::string cpath = str(tpath, "chunks[", ci, "].");
      const json& cj = chunks[ci];
      if (!cj.is_object()) p.fail("wrong type", cpath, "an object", json_brief(cj));
      p.only_keys(cj, {"file", "offsets", "shape", "byte_begin", "byte_end", "checksum"}, cpath);
      Chunk c;
      c.file = p.string(cj, "file", cpath);
      if (!file_names.count(c.file)) p.fail("chunk names a file not listed in `files`", cpath + "file", "a listed file", c.file);
      if (!chunk_files.insert(c.file).second)
        p.fail("two chunks of one tensor in the same file", cpath + "file", "at most one chunk per file", c.file);
      c.offsets = p.int_list(cj, "offsets", cpath);
      c.shape = p.int_list(cj, "shape", cpath);
      if (c.offsets.size() != t.shape.size() || c.shape.size() != t.shape.size())
        p.fail("chunk rank differs from the tensor's", cpath + "offsets", str(t.shape.size(), " dims"),
               str(c.offsets.size(), " offsets and ", c.shape.size(), " dims"));
      for (size_t d = 0; d < t.shape.size(); ++d)
        if (c.offsets[d] + c.shape[d] > t.shape[d])
          p.fail("chunk lies outside the tensor's global shape", cpath + "offsets", str("offset + size <= ", t.shape[d], " in dim ", d),
                 str(c.offsets[d], " + ", c.shape[d]));
      c.byte_begin = static_cast<uint64_t>(p.integer(cj, "byte_begin", cpath, 0));
      c.byte_end = static_cast<uint64_t>(p.integer(cj, "byte_end", cpath, 0));
      const uint64_t cnumel = numel_saturating(c.shape);  // <= numel: the chunk is inside the tensor
      if (c.byte_end < c.byte_begin || c.byte_end - c.byte_begin != cnumel * esize)
        p.fail("chunk byte range does not match its shape and dtype", cpath + "byte_end",
               str(cnumel * esize, " bytes"), str("[", c.byte_begin, ", ", c.byte_end, ")"));
      std::string cs = p.string(cj, "checksum", cpath);
      if (!parse_checksum(cs, &c.checksum)) p.fail("malformed checksum", cpath + "checksum", "crc32c:<8 hex digits>", cs.substr(0, 40));
      for (size_t k = 0; k < t.chunks.size(); ++k)
        if (cnumel > 0 && numel_saturating(t.chunks[k].shape) > 0 && boxes_overlap(c, t.chunks[k]))
          p.fail("chunks overlap", cpath + "offsets", str("disjoint from chunk ", k, " ", box_str(t.chunks[k])), box_str(c));
      covered += cnumel;
      t.chunks.push_back(std::move(c));
    }
    // Disjoint boxes inside the tensor whose volumes add up to the tensor's volume cover it.
    if (covered != numel)
      p.fail("chunks do not cover the tensor (a hole: a rank file or chunk is missing)", tpath + "chunks",
             str(numel, " elements"), str(covered, " elements"));
    m.tensors.emplace(it.key(), std::move(t));
  }
  auto st = j.find("state");
  if (st == j.end()) p.fail("missing field", "state", "an object", "nothing");
  if (!st->is_object()) p.fail("wrong type", "state", "an object", json_brief(*st));
  m.state = *st;
  return m;
}

}  // namespace zaya::ckpt
