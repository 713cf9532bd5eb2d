#include "zaya/ckpt/reader.h"

#include <optional>

#include <cstring>

#include "zaya/ckpt/checksum.h"
#include "zaya/ckpt/consistency.h"
#include "zaya/ckpt/fs_util.h"
#include "zaya/core/error.h"

namespace zaya::ckpt {

std::vector<CopyOp> plan_load(const TensorEntry& t, const std::vector<int64_t>& offsets,
                              const std::vector<int64_t>& shape, const std::string& name) {
  const size_t nd = t.shape.size();
  ZAYA_CHECK(offsets.size() == nd && shape.size() == nd, "checkpoint load: tensor '", name, "' has ", nd,
             " dims, the destination shard has ", shape.size(), " (offsets ", offsets.size(), ")");
  for (size_t d = 0; d < nd; ++d)
    ZAYA_CHECK(offsets[d] >= 0 && shape[d] >= 0 && offsets[d] + shape[d] <= t.shape[d], "checkpoint load: tensor '", name,
               "': destination shard [", offsets[d], ", ", offsets[d] + shape[d], ") in dim ", d,
               " lies outside the stored global extent ", t.shape[d]);
  std::vector<CopyOp> ops;
  for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
    const Chunk& c = t.chunks[ci];
    CopyOp op{ci, std::vector<int64_t>(nd), std::vector<int64_t>(nd)};
    bool empty = false;
    for (size_t d = 0; d < nd; ++d) {
      const int64_t lo = std::max(offsets[d], c.offsets[d]);
      const int64_t hi = std::min(offsets[d] + shape[d], c.offsets[d] + c.shape[d]);
      empty |= hi <= lo;
      op.offsets[d] = lo;
      op.shape[d] = std::max<int64_t>(hi - lo, 0);
    }
    if (!empty) ops.push_back(std::move(op));
  }
  return ops;
}

void copy_box(const std::byte* src, const std::vector<int64_t>& src_offsets, const std::vector<int64_t>& src_shape,
              std::byte* dst, const std::vector<int64_t>& dst_offsets, const std::vector<int64_t>& dst_shape,
              const CopyOp& op, size_t elem_size) {
  const size_t nd = op.shape.size();
  if (nd == 0) {  // a scalar: one element
    std::memcpy(dst, src, elem_size);
    return;
  }
  for (int64_t s : op.shape)
    if (s == 0) return;
  // Row-major strides in elements; the last dim is contiguous in both, so each innermost run of
  // the box is one memcpy.
  std::vector<int64_t> sstride(nd, 1), dstride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) {
    sstride[d - 1] = sstride[d] * src_shape[d];
    dstride[d - 1] = dstride[d] * dst_shape[d];
  }
  const size_t run = static_cast<size_t>(op.shape[nd - 1]) * elem_size;
  std::vector<int64_t> idx(nd, 0);  // position inside the box, the last dim stays 0
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < nd; ++d) {
      const int64_t g = op.offsets[d] + idx[d];
      s += (g - src_offsets[d]) * sstride[d];
      t += (g - dst_offsets[d]) * dstride[d];
    }
    std::memcpy(dst + t * elem_size, src + s * elem_size, run);
    // Advance the odometer over dims nd-2 .. 0.
    size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < op.shape[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (nd == 1) return;
  }
}

fs::path Checkpoint::resolve(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / "manifest.json", ec)) return dir;
  if (auto latest = read_latest(dir)) {
    if (!fs::is_regular_file(*latest / "manifest.json", ec))
      throw Error("`latest` names a checkpoint without manifest.json", {.file = (dir / "latest").string(),
                                                                        .found = latest->filename().string()});
    return *latest;
  }
  if (!fs::exists(dir, ec)) throw Error("no such directory", {.file = dir.string()});
  throw Error("not a checkpoint: neither manifest.json nor `latest` found", {.file = dir.string()});
}

Checkpoint::Checkpoint(const fs::path& dir) : dir_(resolve(dir)) {
  const fs::path mpath = dir_ / "manifest.json";
  manifest_ = parse_manifest(read_small_file(mpath, size_t{1} << 30), mpath.string());
}

const TensorEntry& Checkpoint::tensor(const std::string& name) const {
  auto it = manifest_.tensors.find(name);
  if (it == manifest_.tensors.end())
    throw Error("tensor not in checkpoint", {.file = (dir_ / "manifest.json").string(), .field = name});
  return it->second;
}

const SafetensorsFile& Checkpoint::file(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(name);
  if (it != files_.end()) return *it->second;
  const FileEntry* entry = nullptr;
  for (const auto& f : manifest_.files)
    if (f.name == name) entry = &f;
  ZAYA_ASSERT(entry != nullptr, "parse_manifest checks every chunk's file is listed");
  const fs::path path = dir_ / name;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("rank file named in the manifest is missing", {.file = path.string()});
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size != entry->bytes)
    throw Error("rank file has the wrong size (truncated or replaced?)",
                {.file = path.string(), .expected = str(entry->bytes, " bytes (manifest)"), .found = str(size, " bytes")});
  auto f = std::make_unique<SafetensorsFile>(path);
  const StHeader& h = f->header();
  // Cross-check both ways: each chunk in this file is in the header where the manifest says,
  // and each tensor in the header is in the manifest.
  for (const auto& [tname, t] : manifest_.tensors) {
    for (const auto& c : t.chunks) {
      if (c.file != name) continue;
      const StTensorInfo* info = h.find(tname);
      if (!info) throw Error("tensor listed in the manifest is missing from its rank file", {.file = path.string(), .field = tname});
      if (info->dtype != t.dtype || info->shape != c.shape || h.data_start + info->begin != c.byte_begin ||
          h.data_start + info->end != c.byte_end)
        throw Error("rank file header disagrees with the manifest", {.file = path.string(), .field = tname,
                    .expected = str(t.dtype, " bytes [", c.byte_begin, ", ", c.byte_end, ")"),
                    .found = str(info->dtype, " bytes [", h.data_start + info->begin, ", ", h.data_start + info->end, ")")});
    }
  }
  for (const auto& info : h.tensors) {
    auto mt = manifest_.tensors.find(info.name);
    bool listed = false;
    if (mt != manifest_.tensors.end())
      for (const auto& c : mt->second.chunks) listed |= c.file == name;
    if (!listed)
      throw Error("manifest is missing a tensor that the rank file holds", {.file = (dir_ / "manifest.json").string(),
                  .field = info.name, .expected = str("a chunk in ", name)});
  }
  return *(files_[name] = std::move(f));
}

void Checkpoint::check_chunk(const std::string& tname, size_t ci) const {
  const Chunk& c = tensor(tname).chunks[ci];
  const SafetensorsFile& f = file(c.file);
  auto bytes = f.raw(tname);
  const uint32_t got = crc32c(bytes.data(), bytes.size());
  if (got != c.checksum)
    throw Error("checksum mismatch (corrupt data)", {.file = f.path().string(), .field = tname,
                .expected = format_checksum(c.checksum), .found = format_checksum(got)});
}

VerifyReport Checkpoint::verify() const {
  VerifyReport r;
  for (std::string& p : step_problems(manifest_, dir_)) r.problems.push_back(std::move(p));
  for (std::string& p : model_config_problems(manifest_, dir_)) r.problems.push_back(std::move(p));
  for (const auto& fe : manifest_.files) {
    try {
      file(fe.name);
    } catch (const Error& e) {
      r.problems.push_back(e.what());
    }
  }
  for (const auto& [tname, t] : manifest_.tensors) {
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!files_.count(t.chunks[ci].file)) continue;  // its file failed above
      }
      try {
        check_chunk(tname, ci);
        r.bytes_checked += t.chunks[ci].byte_end - t.chunks[ci].byte_begin;
        ++r.chunks_checked;
      } catch (const Error& e) {
        r.problems.push_back(e.what());
      }
    }
  }
  return r;
}

void Checkpoint::load(const std::string& name, const Tensor& dst, const std::vector<int64_t>& offsets) const {
  const TensorEntry& t = tensor(name);
  ZAYA_CHECK(dst.defined(), "checkpoint load: no destination for '", name, "'");
  const std::string want = dtype_to_st(dst.dtype());
  // Across devices and precisions (a GPU run's bf16 weights into a CPU run's f32 ones, and back):
  // read the stored bytes into a host tensor of the stored dtype, then convert and copy.
  const bool floats = (want == "F32" || want == "BF16") && (t.dtype == "F32" || t.dtype == "BF16");
  if (dst.device() != Device::cpu || (want != t.dtype && floats)) {
    const std::optional<DType> stored = st_to_dtype(t.dtype);
    ZAYA_CHECK(stored.has_value() && (want == t.dtype || floats), "checkpoint load: tensor '", name, "' is stored as ",
               t.dtype, ", the destination is ", want);
    Tensor host = Tensor::empty(dst.shape(), *stored);
    load(name, host, offsets);
    if (*stored != dst.dtype()) {
      Tensor converted = Tensor::empty(dst.shape(), dst.dtype());
      const int64_t n = host.numel();
      if (dst.dtype() == DType::bf16) {
        const float* src = host.data<float>();
        bf16* out = converted.data<bf16>();
        for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(src[i]);  // round to nearest even, as training casts
      } else {
        const bf16* src = host.data<bf16>();
        float* out = converted.data<float>();
        for (int64_t i = 0; i < n; ++i) out[i] = to_float(src[i]);  // exact
      }
      host = converted;
    }
    Tensor(dst).copy_from(host);  // a handle to the same storage
    return;
  }
  ZAYA_CHECK(want == t.dtype, "checkpoint load: tensor '", name, "' is stored as ", t.dtype, ", the destination is ", want);
  std::vector<int64_t> shape(dst.shape().begin(), dst.shape().end());
  std::vector<int64_t> off = offsets.empty() ? std::vector<int64_t>(shape.size(), 0) : offsets;
  const std::vector<CopyOp> ops = plan_load(t, off, shape, name);
  // The chunks tile the tensor (parse_manifest), so the intersections tile the shard.
  for (const CopyOp& op : ops) {
    const Chunk& c = t.chunks[op.chunk];
    if (verify_on_load) {
      bool done;
      {
        std::lock_guard<std::mutex> lock(mu_);
        done = verified_[{name, op.chunk}];
      }
      if (!done) {
        check_chunk(name, op.chunk);
        std::lock_guard<std::mutex> lock(mu_);
        verified_[{name, op.chunk}] = true;
      }
    }
    auto src = file(c.file).raw(name);
    copy_box(src.data(), c.offsets, c.shape, static_cast<std::byte*>(dst.raw()), off, shape, op, dtype_size(dst.dtype()));
  }
}

Tensor Checkpoint::load_full(const std::string& name) const {
  const TensorEntry& t = tensor(name);
  return load_box(name, std::vector<int64_t>(t.shape.size(), 0), t.shape);
}

Tensor Checkpoint::load_box(const std::string& name, const std::vector<int64_t>& offsets,
                            const std::vector<int64_t>& shape) const {
  const TensorEntry& t = tensor(name);
  auto dt = st_to_dtype(t.dtype);
  if (!dt)
    throw Error("dtype cannot be read as a zaya tensor", {.file = dir_.string(), .field = name,
                                                          .expected = "BF16, F32, I32, I64 or U8", .found = t.dtype});
  ZAYA_CHECK(t.shape.size() <= static_cast<size_t>(kMaxDims), "checkpoint load: tensor '", name, "' has ", t.shape.size(),
             " dims, zaya tensors hold at most ", kMaxDims);
  // The box must lie inside the global shape, and every file holding a chunk of it is opened (and
  // cross-checked) before allocating: the shape comes from the manifest, and only once the files
  // confirm the chunks' byte ranges is its size trusted.
  for (const CopyOp& op : plan_load(t, offsets, shape, name)) file(t.chunks[op.chunk].file);
  Tensor out = Tensor::empty(Shape::of(shape), *dt);
  load(name, out, offsets);
  return out;
}

namespace {

// Empty when the checkpoint in `dir` is complete and every checksum matches; else its first problem.
std::string first_problem(const fs::path& dir) {
  try {
    VerifyReport r = Checkpoint(dir).verify();
    return r.ok() ? std::string() : r.problems.front();
  } catch (const Error& e) {  // no manifest, or one that does not parse
    return e.what();
  }
}

}  // namespace

ResumePoint find_resume_point(const fs::path& where) {
  std::error_code ec;
  if (!fs::is_directory(where, ec)) throw Error("cannot resume: no such directory", {.file = where.string()});
  ResumePoint p;
  if (fs::is_regular_file(where / "manifest.json", ec)) {
    const std::string problem = first_problem(where);
    if (!problem.empty()) throw Error(str("cannot resume from this checkpoint: it fails verification: ", problem),
                                      {.file = where.string()});
    p.dir = where;
    p.step = Checkpoint(where).manifest().step;
    return p;
  }
  std::vector<int64_t> steps = list_steps(where);
  if (steps.empty())
    throw Error("cannot resume: no checkpoint (step_NNNNNNN directory) in this directory", {.file = where.string()});
  std::string tried;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const fs::path dir = where / step_dir_name(*it);
    const std::string problem = first_problem(dir);
    if (problem.empty()) {
      p.dir = dir;
      p.step = *it;
      return p;
    }
    p.rejected.push_back({*it, problem});
    tried += str("\n  ", dir.filename().string(), ": ", problem);
  }
  throw Error(str("cannot resume: no checkpoint in this run directory verifies:", tried), {.file = where.string()});
}

}  // namespace zaya::ckpt
