// cuDNN's fused SDPA through cudnn-frontend (attention_cudnn.h says what and why). Compiled in every
// CUDA build; without cudnn-frontend's headers (ZAYA_HAVE_CUDNN_FRONTEND undefined) available()
// says so and the attention fronts run the reference kernels.
//
// Layout: cuDNN names the dims [b, h, s, d] and takes any strides, so zaya's [B, T, heads, hd] rows
// are passed as they are, strides {T·heads·hd, hd, heads·hd, 1}; its softmax statistics (the
// row log-sum-exp of the scaled scores, natural log, fp32 [b, h, s, 1]) are zaya's lse [B, nq, T].
// GQA: k and v have nkv heads, cuDNN maps q head h to kv head ⌊h·nkv/nq⌋, zaya's ⌊h/G⌋.
#include "zaya/ops/cuda/attention_cudnn.h"

#include <string>

#if defined(ZAYA_HAVE_CUDNN_FRONTEND)

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "zaya/core/cuda_context.h"
#include "zaya/core/dtype.h"
#include "zaya/core/error.h"

// cudnn-frontend's handle on libcudnn when it loads cuDNN at run time (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING):
// zaya's binaries then start on machines without cuDNN, which only lose this path.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace zaya::ops::cuda::cudnn_sdpa {
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

// Loads libcudnn once per process; "" when it loaded, else why not.
const std::string& load_error() {
  static const std::string error = [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      if (void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) {
        fe::cudnn_dlhandle = h;
        try {
          const size_t version = fe::detail::get_backend_version();
          if (version < 90000) return str("the cuDNN found (", name, ", version ", version, ") is older than 9.0");
          return std::string();
        } catch (const std::exception& e) {
          return str("libcudnn loaded but cudnnGetVersion failed: ", e.what());
        }
      }
    }
    const char* err = dlerror();
    return str("libcudnn.so.9 could not be loaded (", err ? err : "not found", ")");
  }();
  return error;
}

// The calling thread's cuDNN handle, on its device context's stream, and its graphs by shape. The
// handle lives as long as the process: destroying it from a thread-local destructor would race the
// device context's own teardown (its stream) at exit, and a process holds one per compute thread.
struct ThreadState {
  cudnnHandle_t handle = nullptr;
  // (backward?, B, T, nq, nkv, hd) → the built graph and its workspace bytes.
  std::map<std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t>,
           std::pair<std::shared_ptr<fe::graph::Graph>, int64_t>>
      graphs;
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  if (!state.handle) {
    zaya::cuda::DeviceContext& ctx = zaya::cuda::current();
    if (fe::detail::create_handle(&state.handle) != CUDNN_STATUS_SUCCESS)
      throw Error("attention (cuDNN): cudnnCreate failed");
    fe::detail::set_stream(state.handle, static_cast<cudaStream_t>(ctx.stream()));
  }
  return state;
}

void check(fe::error_object e, const char* what) {
  if (e.is_bad()) throw Error(str("attention (cuDNN): ", what, " failed: ", e.get_message()));
}

std::shared_ptr<fe::graph::Tensor_attributes> rows_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                          int64_t B, int64_t T, int64_t heads, int64_t hd) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, heads, T, hd})
                      .set_stride({T * heads * hd, hd, heads * hd, 1}));
}
void mark_rows_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int64_t B, int64_t T,
                      int64_t heads, int64_t hd) {
  t->set_output(true).set_uid(uid).set_dim({B, heads, T, hd}).set_stride({T * heads * hd, hd, heads * hd, 1});
}

float scale_of(int64_t hd) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))); }

// The graph of one direction and shape, described but not built; for a GPU of compute capability
// sm_version, or (0) the current device's, which the frontend asks for as it adds the attention node.
std::shared_ptr<fe::graph::Graph> describe_graph(bool backward, int64_t B, int64_t T, int64_t nq, int64_t nkv,
                                                 int64_t hd, int sm_version = 0) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = rows_tensor(*g, "q", kQ, B, T, nq, hd);
  auto k = rows_tensor(*g, "k", kK, B, T, nkv, hd);
  auto v = rows_tensor(*g, "v", kV, B, T, nkv, hd);
  if (!backward) {
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_causal_mask(true)
                    .set_attn_scale(scale_of(hd));
    auto [o, stats] = g->sdpa(q, k, v, opts);
    mark_rows_output(o, kO, B, T, nq, hd);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT)
        .set_dim({B, nq, T, 1}).set_stride({nq * T, T, 1, 1});
  } else {
    auto o = rows_tensor(*g, "o", kO, B, T, nq, hd);
    auto dO = rows_tensor(*g, "dO", kdO, B, T, nq, hd);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({B, nq, T, 1})
                               .set_stride({nq * T, T, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_causal_mask(true)
                    .set_attn_scale(scale_of(hd)).set_deterministic_algorithm(true);
    auto [dQ, dK, dV] = g->sdpa_backward(q, k, v, o, dO, stats, opts);
    mark_rows_output(dQ, kdQ, B, T, nq, hd);
    mark_rows_output(dK, kdK, B, T, nkv, hd);
    mark_rows_output(dV, kdV, B, T, nkv, hd);
  }
  return g;
}

// The graph for one direction and shape, built on first use (cuDNN's heuristics mode A, its first
// working plan) and kept for the thread's life.
std::pair<std::shared_ptr<fe::graph::Graph>, int64_t>& graph_for(bool backward, int64_t B, int64_t T, int64_t nq,
                                                                  int64_t nkv, int64_t hd) {
  ThreadState& st = thread_state();
  auto key = std::make_tuple(backward, B, T, nq, nkv, hd);
  if (auto it = st.graphs.find(key); it != st.graphs.end()) return it->second;
  auto g = describe_graph(backward, B, T, nq, nkv, hd);
  check(g->build(st.handle, {fe::HeurMode_t::A}),
        backward ? "building the backward graph" : "building the forward graph");
  int64_t workspace = 0;
  check(g->get_workspace_size(workspace), "get_workspace_size");
  return st.graphs.emplace(key, std::make_pair(g, workspace)).first->second;
}

// Byte offsets into one scratch allocation, each 256-byte aligned.
struct Carve {
  size_t used = 0;
  size_t take(size_t bytes) {
    const size_t at = used;
    used += (bytes + 255) / 256 * 256;
    return at;
  }
};

void execute(std::shared_ptr<fe::graph::Graph>& g, std::unordered_map<int64_t, void*>& pack, void* workspace) {
  check(g->execute(thread_state().handle, pack, workspace), "execute");
}

}  // namespace

std::string validate_graphs(int sm_version, int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  if (!load_error().empty()) return load_error();
  for (bool backward : {false, true}) {
    auto g = describe_graph(backward, B, T, nq, nkv, hd, sm_version);
    fe::error_object e = g->validate();
    if (e.is_bad()) return str(backward ? "backward" : "forward", " graph: ", e.get_message());
  }
  return std::string();
}

bool available(std::string* why) {
  static const std::string probe_error = []() -> std::string {
    if (!load_error().empty()) return load_error();
    try {
      zaya::cuda::current();
      // Small graphs of both directions must build: cuDNN has engines for this GPU, its deterministic
      // backward among them. Otherwise the fronts keep the reference kernels.
      graph_for(false, 1, 128, 2, 1, 128);
      graph_for(true, 1, 128, 2, 1, 128);
      return std::string();
    } catch (const std::exception& e) {
      return e.what();
    }
  }();
  if (why) *why = probe_error;
  return probe_error.empty();
}

void forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
             int64_t nq, int64_t nkv, int64_t hd) {
  auto& [graph, workspace] = graph_for(false, B, T, nq, nkv, hd);
  zaya::cuda::DeviceContext& ctx = zaya::cuda::current();
  const int64_t nqe = B * T * nq * hd, nke = B * T * nkv * hd;
  Carve c;
  const size_t oq = c.take(nqe * 2), ok = c.take(nke * 2), ov = c.take(nke * 2), oo = c.take(nqe * 2);
  const size_t ow = c.take(static_cast<size_t>(workspace));
  auto* base = static_cast<char*>(ctx.scratch(c.used));
  void* stream = ctx.stream();
  to_bf16(base + oq, q, nqe, stream);
  to_bf16(base + ok, k, nke, stream);
  to_bf16(base + ov, v, nke, stream);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, base + oq}, {kK, base + ok}, {kV, base + ov}, {kO, base + oo}, {kStats, lse}};
  execute(graph, pack, base + ow);
  to_f32(out, base + oo, nqe, stream);
}

void backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
              const float* out, const float* lse, int64_t B, int64_t T, int64_t nq, int64_t nkv, int64_t hd) {
  auto& [graph, workspace] = graph_for(true, B, T, nq, nkv, hd);
  zaya::cuda::DeviceContext& ctx = zaya::cuda::current();
  const int64_t nqe = B * T * nq * hd, nke = B * T * nkv * hd;
  Carve c;
  const size_t oq = c.take(nqe * 2), ok = c.take(nke * 2), ov = c.take(nke * 2), oo = c.take(nqe * 2);
  const size_t odo = c.take(nqe * 2), odq = c.take(nqe * 2), odk = c.take(nke * 2), odv = c.take(nke * 2);
  const size_t ow = c.take(static_cast<size_t>(workspace));
  auto* base = static_cast<char*>(ctx.scratch(c.used));
  void* stream = ctx.stream();
  to_bf16(base + oq, q, nqe, stream);
  to_bf16(base + ok, k, nke, stream);
  to_bf16(base + ov, v, nke, stream);
  to_bf16(base + oo, out, nqe, stream);
  to_bf16(base + odo, dout, nqe, stream);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, base + oq},   {kK, base + ok},   {kV, base + ov},   {kO, base + oo},
      {kdO, base + odo}, {kdQ, base + odq}, {kdK, base + odk}, {kdV, base + odv},
      {kStats, const_cast<float*>(lse)}};
  execute(graph, pack, base + ow);
  to_f32(dq, base + odq, nqe, stream);
  to_f32(dk, base + odk, nke, stream);
  to_f32(dv, base + odv, nke, stream);
}

}  // namespace zaya::ops::cuda::cudnn_sdpa

#else  // no cudnn-frontend headers in this build

#include "zaya/core/error.h"

namespace zaya::ops::cuda::cudnn_sdpa {

namespace {
constexpr const char* kNotBuilt =
    "this zaya was built without cudnn-frontend's headers (scripts/venv.sh installs nvidia-cudnn-frontend; "
    "reconfigure the cuda preset)";
}

bool available(std::string* why) {
  if (why) *why = kNotBuilt;
  return false;
}
std::string validate_graphs(int, int64_t, int64_t, int64_t, int64_t, int64_t) { return kNotBuilt; }
void forward(float*, float*, const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
             int64_t) {
  throw Error(str("attention (cuDNN): ", kNotBuilt));
}
void backward(float*, float*, float*, const float*, const float*, const float*, const float*, const float*,
              const float*, int64_t, int64_t, int64_t, int64_t, int64_t) {
  throw Error(str("attention (cuDNN): ", kNotBuilt));
}

}  // namespace zaya::ops::cuda::cudnn_sdpa

#endif
