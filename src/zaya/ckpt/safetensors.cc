#include "zaya/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/json_strict.h"
#include "zaya/core/error.h"

namespace zaya::ckpt {
namespace {

struct DTypeName {
  std::string_view name;
  size_t size;
};
// The dtypes the safetensors package defines with whole-byte elements. (F4 / F6 pack several
// elements per byte; no checkpoint we read uses them, so they are rejected as unknown.)
constexpr DTypeName kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8},
};

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// A JSON integer in [0, 2^63): anything else (negative, fractional, huge) is malformed here.
bool as_u63(const nlohmann::json& v, uint64_t* out) {
  if (!v.is_number_unsigned() && !v.is_number_integer()) return false;
  if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0) return false;
  uint64_t u = v.get<uint64_t>();
  if (u >= (uint64_t{1} << 63)) return false;
  *out = u;
  return true;
}

}  // namespace

size_t st_dtype_size(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.size;
  return 0;
}

std::optional<DType> st_to_dtype(std::string_view name) {
  if (name == "F32") return DType::f32;
  if (name == "BF16") return DType::bf16;
  if (name == "I32") return DType::i32;
  if (name == "I64") return DType::i64;
  if (name == "U8") return DType::u8;
  if (name == "F64") return DType::f64;
  return std::nullopt;
}

std::string dtype_to_st(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::f64: return "F64";
  }
  ZAYA_ASSERT(false, "unknown DType");
}

const StTensorInfo* StHeader::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

StHeader parse_safetensors(std::span<const std::byte> bytes, const std::string& what) {
  auto fail = [&](const std::string& msg, const std::string& field, const std::string& expected,
                  const std::string& found) -> Error {
    return Error(msg, {.file = what, .field = field, .expected = expected, .found = found});
  };
  const uint64_t size = bytes.size();
  if (size < 8) throw fail("file too short for a safetensors header", "header length", "at least 8 bytes", str(size, " bytes"));
  StHeader h;
  h.header_bytes = read_le64(bytes.data());
  if (h.header_bytes > kMaxHeaderBytes)
    throw fail("header length too large", "header length", str("at most ", kMaxHeaderBytes), str(h.header_bytes));
  if (h.header_bytes > size - 8)
    throw fail("header length runs past the end of the file (truncated file?)", "header length",
               str("at most ", size - 8, " (file size - 8)"), str(h.header_bytes));
  if (h.header_bytes < 2)
    throw fail("header too short to be a JSON object", "header", "'{...}'", str(h.header_bytes, " bytes"));
  h.data_start = 8 + h.header_bytes;
  h.data_bytes = size - h.data_start;
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), h.header_bytes);
  if (text[0] != '{')
    throw fail("header is not a JSON object", "header", "first byte '{'",
               str("byte 0x", std::hex, static_cast<int>(static_cast<uint8_t>(text[0]))));
  nlohmann::json j = parse_json_strict(text, what);
  if (!j.is_object()) throw fail("header is not a JSON object", "header", "an object", json_brief(j));

  h.tensors.reserve(j.size());  // bounded by the header's length, which was checked above
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("__metadata__ must be an object", name, "{\"key\": \"value\"}", json_brief(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw fail("__metadata__ values must be strings", "__metadata__." + m.key(), "a string", json_brief(m.value()));
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) throw fail("tensor entry must be an object", name, "{dtype, shape, data_offsets}", json_brief(v));
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        throw fail("unknown field in tensor entry", name + "." + f.key(), "dtype, shape, data_offsets", f.key());
    StTensorInfo t;
    t.name = name;
    auto d = v.find("dtype");
    if (d == v.end() || !d->is_string()) throw fail("missing or non-string dtype", name + ".dtype", "a dtype name", d == v.end() ? "nothing" : json_brief(*d));
    t.dtype = d->get<std::string>();
    const size_t esize = st_dtype_size(t.dtype);
    if (esize == 0) throw fail("unknown dtype", name + ".dtype", "BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, F8_*", "'" + t.dtype.substr(0, 32) + "'");
    auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) throw fail("missing or non-array shape", name + ".shape", "an array of integers", s == v.end() ? "nothing" : json_brief(*s));
    // numel * esize must equal the byte range, which is at most the file size: reject a product
    // that exceeds it as soon as it does, so it can never overflow.
    bool has_zero = false;
    for (const auto& dim : *s) {
      uint64_t n;
      if (!as_u63(dim, &n)) throw fail("shape entries must be non-negative integers", name + ".shape", "integers >= 0", json_brief(*s));
      t.shape.push_back(static_cast<int64_t>(n));
      has_zero |= n == 0;
    }
    // Overflow-checked product; a shape whose byte size passes 2^64 saturates (and cannot match).
    uint64_t expect_bytes = has_zero ? 0 : esize;
    for (size_t i = 0; i < t.shape.size() && expect_bytes != 0 && expect_bytes != UINT64_MAX; ++i)
      if (__builtin_mul_overflow(expect_bytes, static_cast<uint64_t>(t.shape[i]), &expect_bytes)) expect_bytes = UINT64_MAX;
    auto o = v.find("data_offsets");
    uint64_t b, e;
    if (o == v.end() || !o->is_array() || o->size() != 2 || !as_u63((*o)[0], &b) || !as_u63((*o)[1], &e))
      throw fail("data_offsets must be [begin, end] integers", name + ".data_offsets", "[begin, end]", o == v.end() ? "nothing" : json_brief(*o));
    if (b > e || e > h.data_bytes)
      throw fail("data_offsets out of range (past the data buffer: truncated file?)", name + ".data_offsets",
                 str("0 <= begin <= end <= ", h.data_bytes, " (data buffer size)"), str("[", b, ", ", e, "]"));
    t.begin = b;
    t.end = e;
    if (expect_bytes != t.nbytes())
      throw fail("shape x dtype size does not match the byte range", name,
                 str(expect_bytes == UINT64_MAX ? std::string("more than 2^64") : str(expect_bytes), " bytes from shape and ", t.dtype),
                 str(t.nbytes(), " bytes in data_offsets"));
    h.tensors.push_back(std::move(t));
  }
  // Sorted by offset, the ranges must tile [0, data_bytes): each begins where the previous ended.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const auto& t : h.tensors) {
    if (t.begin < pos) throw fail("tensor data overlaps the previous tensor", t.name + ".data_offsets", str("begin >= ", pos), str(t.begin));
    if (t.begin > pos) throw fail("hole in the data buffer before tensor", t.name + ".data_offsets", str("begin == ", pos), str(t.begin));
    pos = t.end;
  }
  if (pos != h.data_bytes)
    throw fail("data buffer size does not match the tensors (trailing bytes or truncated file)", "data buffer",
               str(pos, " bytes"), str(h.data_bytes, " bytes"));
  return h;
}

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(str("cannot open: ", std::strerror(errno)), {.file = path.string()});
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(str("cannot stat: ", std::strerror(err)), {.file = path.string()});
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("not a regular file", {.file = path.string()});
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    ptr_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (ptr_ == MAP_FAILED) {
      int err = errno;
      ptr_ = nullptr;
      ::close(fd);
      throw Error(str("mmap failed: ", std::strerror(err)), {.file = path.string()});
    }
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), ptr_(o.ptr_), size_(o.size_) {
  o.ptr_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (ptr_) ::munmap(ptr_, size_);
    path_ = std::move(o.path_);
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.ptr_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (ptr_) ::munmap(ptr_, size_);
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : file_(path), header_(parse_safetensors(file_.bytes(), path.string())) {}

std::span<const std::byte> SafetensorsFile::raw(std::string_view name) const {
  const StTensorInfo* t = header_.find(name);
  if (!t) throw Error("no such tensor in file", {.file = path().string(), .field = std::string(name)});
  return file_.bytes().subspan(header_.data_start + t->begin, t->nbytes());
}

Tensor SafetensorsFile::read(std::string_view name) const {
  const StTensorInfo* t = header_.find(name);
  if (!t) throw Error("no such tensor in file", {.file = path().string(), .field = std::string(name)});
  auto dt = st_to_dtype(t->dtype);
  if (!dt)
    throw Error("dtype cannot be read as a zaya tensor", {.file = path().string(), .field = t->name,
                                                          .expected = "BF16, F32, I32, I64 or U8", .found = t->dtype});
  if (t->shape.size() > static_cast<size_t>(kMaxDims))
    throw Error("too many dimensions for a zaya tensor", {.file = path().string(), .field = t->name,
                                                         .expected = str("at most ", kMaxDims), .found = str(t->shape.size())});
  Tensor out = Tensor::empty(Shape::of(t->shape), *dt);
  auto src = raw(name);
  if (!src.empty()) std::memcpy(out.raw(), src.data(), src.size());
  return out;
}

StWritten write_safetensors(const std::filesystem::path& path, const std::vector<StEntry>& entries,
                            const std::map<std::string, std::string>& metadata, bool sync) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  StWritten out;
  uint64_t pos = 0;
  for (const auto& e : entries) {
    const size_t esize = st_dtype_size(e.dtype);
    ZAYA_CHECK(esize != 0, "safetensors write: tensor '", e.name, "' has unknown dtype '", e.dtype, "'");
    ZAYA_CHECK(e.name != "__metadata__" && !header.contains(e.name), "safetensors write: tensor name '", e.name,
               "' is reserved or used twice");
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      ZAYA_CHECK(d >= 0, "safetensors write: tensor '", e.name, "' has a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    ZAYA_CHECK(numel * esize == e.nbytes, "safetensors write: tensor '", e.name, "' has ", e.nbytes,
               " bytes, its shape and dtype need ", numel * esize);
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {pos, pos + e.nbytes}}};
    out.ranges.push_back({pos, pos + e.nbytes});
    pos += e.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {
    throw Error(str("cannot encode header (tensor names must be UTF-8): ", ex.what()), {.file = path.string()});
  }
  // Pad with spaces so the data buffer starts at a multiple of 8 (8-byte length + header).
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  out.data_start = 8 + text.size();
  for (auto& r : out.ranges) {
    r.first += out.data_start;
    r.second += out.data_start;
  }
  out.file_bytes = out.data_start + pos;

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(str("cannot create: ", std::strerror(errno)), {.file = path.string()});
  try {
    unsigned char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    std::string head(reinterpret_cast<char*>(len), 8);
    head += text;
    write_all(fd, head.data(), head.size(), path);
    for (const auto& e : entries)
      if (e.nbytes > 0) write_all(fd, e.data, e.nbytes, path);
    if (sync && ::fsync(fd) != 0) throw Error(str("fsync failed: ", std::strerror(errno)), {.file = path.string()});
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error(str("close failed: ", std::strerror(errno)), {.file = path.string()});
  return out;
}

StEntry st_entry(const std::string& name, const Tensor& t) {
  ZAYA_CHECK(t.device() == Device::cpu, "safetensors write: tensor '", name, "' must be on the CPU");
  std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  return StEntry{.name = name, .dtype = dtype_to_st(t.dtype()), .shape = shape, .data = t.raw(), .nbytes = t.nbytes()};
}

}  // namespace zaya::ckpt
