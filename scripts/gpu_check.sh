#!/usr/bin/env bash
# The GPU half of the test suite and the cuBLASLt GEMM table, run on a lent GPU machine.
#
# CI machines have no GPU, so the CUDA tests skip there. This script runs them where a GPU is:
#
#   scripts/gpu_check.sh pack          on the build machine: bundles build/cuda's test_core,
#                                      test_ops, test_bench, test_dist, test_model, test_train,
#                                      zaya and op-benchmark binaries with the
#                                      shared libraries a bare CUDA image lacks (Open MPI's plugins
#                                      and help texts among them), into build/gpu_check/
#   scripts/gpu_check.sh run [OUTDIR]  on the GPU machine: unpacks them and runs the CUDA
#                                      tests (the device context; the CUDA op kernels against
#                                      the CPU ops: docs/cuda.md; the whole model and training
#                                      on the GPU against the CPU), the CUDA GEMM op benchmark
#                                      (bench_ops_gemm_cuda: ZAYA1-base's dense and expert GEMMs
#                                      in FLOP/s), the NCCL backend's tests and
#                                      `zaya bench collectives --backend nccl` (a world of one:
#                                      MPI as a singleton), `zaya sysinfo`, `zaya bench gemm --backend cuda` over
#                                      ZAYA1-base's training GEMMs (bf16 and f32) with its experts
#                                      op at 1-256 tokens per call (the profile's experts_table,
#                                      which prices decode's experts: docs/sizing.md), the demo model's
#                                      training step on the GPU (`bench step`), the checkpoint
#                                      stall from device tensors (`bench ckpt --device cuda`), a short
#                                      gpu-train (8 layers, few steps, the compilation bounded;
#                                      its tables and result line appended to sysinfo.txt, from
#                                      which `benchmarks/gpu_train.py --replot` makes the plot) and the op
#                                      benchmarks (bench_ops_*_cuda: attention, CCA, RoPE, routing,
#                                      permutation, the fused loss); logs and the
#                                      hardware profile go to OUTDIR
#   scripts/gpu_check.sh tests [OUTDIR]
#                                      the same without sysinfo and the GEMM tables, the NCCL
#                                      benchmark up to 128 MB instead of 1 GB
#   scripts/gpu_check.sh gpu-train [LAYERS [MICRO_BATCH [OUTDIR]]]
#                                      on the GPU machine: benchmarks/gpu_train.py, zaya's
#                                      training step on a ZAYA1-base-shaped model of LAYERS
#                                      layers (default 8) against transformers' ZayaForCausalLM
#                                      eager and under torch.compile on the same GPU (the
#                                      pinned transformers from .whl/ when carried): OUTDIR gets
#                                      gpu_train.{json,md}, gpu_train_step.png and the log
#                                      gpu_train.txt (docs/train.md, "Benchmark against PyTorch")
#   scripts/gpu_check.sh decode-calibration [OUTDIR]
#                                      on the GPU machine: the decode model against `zaya generate
#                                      --device cuda` (benchmarks/decode_calibration.sh with DEVICE=cuda
#                                      on ZAYA1-base at batches 1, 8, 32; the bandwidth is the card's
#                                      datasheet figure unless MEMBW is set); summary.txt,
#                                      predicted.txt, measured.txt and profile.json go to OUTDIR
#   scripts/gpu_check.sh model-vs-hf THREADS ROUNDS [OUTDIR]
#                                      on the GPU machine: benchmarks/model_vs_hf.py on its
#                                      CPU (a second machine for issue #4's ratio),
#                                      with the machine's own torch and the pinned
#                                      transformers (from a wheel in .whl/ when carried), then
#                                      zaya's step split by part (--sections), all appended
#                                      to OUTDIR/model_vs_hf-tTHREADS.txt (the device tool
#                                      brings back at most 8 files: run it again into the same
#                                      OUTDIR rather than into new ones)
#
# The binaries are built with -march=native, so the GPU machine's CPU must have this one's
# vector extensions; `run` prints both machines' flags first, for when a test binary dies on an
# illegal instruction (zaya itself names any missing extension and exits 2). Results: docs/results/gpu-check.md and docs/results/model-cpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
pack_dir=build/gpu_check
# The vector extensions the -march=native binaries may use, as this machine reports them.
cpu_flags() { grep -o -w -e avx512f -e avx512_bf16 -e amx_tile /proc/cpuinfo | sort -u | tr '\n' ' '; }
# The transformers that scripts/requirements.txt pins, from its wheel when one was carried
# (pip download --no-deps --only-binary=:all: -d .whl transformers==PIN); else the machine's.
use_pinned_transformers() {
  local pin
  pin=$(sed -n 's/^transformers==//p' scripts/requirements.txt)
  if compgen -G ".whl/transformers-$pin-*.whl" >/dev/null; then
    python3 -m pip install -q --no-deps --target /tmp/zaya_hf ".whl/transformers-$pin-"*.whl
    export PYTHONPATH="/tmp/zaya_hf:${PYTHONPATH:-}"
  fi
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
}

case "${1:-}" in
pack)
  bins=(build/cuda/zaya build/cuda/tests/test_core build/cuda/tests/test_ops build/cuda/tests/test_bench
        build/cuda/tests/test_dist build/cuda/tests/test_model build/cuda/tests/test_train
        build/cuda/benchmarks/bench_ops_gemm_cuda
        build/cuda/benchmarks/bench_ops_moe_loss_cuda build/cuda/benchmarks/bench_ops_attention_cuda)
  for f in "${bins[@]}"; do
    [[ -x "$f" ]] || { echo "gpu_check: $f is missing: build the CUDA preset first (cmake --preset cuda && cmake --build build/cuda)" >&2; exit 1; }
  done
  rm -rf "$pack_dir" && mkdir -p "$pack_dir/libs"
  cp "${bins[@]}" "$pack_dir/"
  # Open MPI loads its components (ess, pml, btl, ...) as plugins from its own folder and its error
  # texts from a data folder; `run` points it at these copies (the image has no MPI).
  mpi_plugins=$(ompi_info --path libdir --parsable | sed -n 's/^path:libdir://p')/openmpi3
  [[ -d "$mpi_plugins" ]] || { echo "gpu_check: no Open MPI plugin folder at $mpi_plugins" >&2; exit 1; }
  mkdir -p "$pack_dir/libs/openmpi" && cp -L "$mpi_plugins"/*.so "$pack_dir/libs/openmpi/"
  cp -rL "$(ompi_info --path pkgdatadir --parsable | sed -n 's/^path:pkgdatadir://p')" "$pack_dir/libs/openmpi-data"
  # Everything these link except glibc, libstdc++ and CUDA's own libraries (the image has those).
  ldd "${bins[@]}" "$pack_dir"/libs/openmpi/*.so | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -e '/cuda' -e '/libc\.so' -e '/libm\.so' -e '/libdl\.so' -e '/libpthread\.so' \
      -e '/librt\.so' -e '/libstdc++' -e '/libgcc_s' |
    while read -r lib; do cp -L "$lib" "$pack_dir/libs/"; done
  cpu_flags > "$pack_dir/build_cpu_flags.txt"
  # The binaries go into the archive too: uncompressed they would leave little of the 64 MiB a
  # device run may carry.
  names=(); for f in "${bins[@]}"; do names+=("$(basename "$f")"); done
  tar -C "$pack_dir" -cJf "$pack_dir/libs.tar.xz" libs "${names[@]}" &&
    rm -rf "$pack_dir/libs" && (cd "$pack_dir" && rm -f "${names[@]}")
  du -sh "$pack_dir"
  ;;
run | tests | model-vs-hf | gpu-train | decode-calibration)
  [[ -f "$pack_dir/libs.tar.xz" ]] || { echo "gpu_check: no $pack_dir/libs.tar.xz: run '$0 pack' where the CUDA build is, and carry $pack_dir" >&2; exit 1; }
  [[ -d "$pack_dir/libs" ]] || tar -C "$pack_dir" -xJf "$pack_dir/libs.tar.xz"
  export LD_LIBRARY_PATH="$PWD/$pack_dir/libs:${LD_LIBRARY_PATH:-}"
  ;;&
run | tests)
  out="${2:-${OUT:-/tmp/gpu_check}}"
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/nvidia-smi.txt"
  echo "build machine's flags: $(cat "$pack_dir/build_cpu_flags.txt")"
  echo "this machine's flags:  $(cpu_flags)"
  status=0
  "$pack_dir/test_core" --gtest_filter='CudaRuntime.*:CudaContext.*:Philox.*:Tensor.*' 2>&1 | tee "$out/tests.txt" || status=1
  # The CUDA op kernels against the CPU ops (tests/ops/test_*_cuda.cc), their shared per-element
  # math, and the fronts' device checks (which skip their no-GPU halves here).
  "$pack_dir/test_ops" --gtest_filter='DenseCuda.*:ScaleBiasCuda.*:EdaCuda.*:MoeCuda.*:MoeSkipCuda.*:MoeSkipDevice.*:CrossEntropyCuda.*:ElementwiseMath.*:LossMath.*:DenseDevice.*:RouterStateDevice.*:MoeDevice.*:CrossEntropyDevice.*:SequenceMath.*:RopeCuda.*:CcaCuda.*:AttentionCuda.*:AttentionAtCuda.*:*AttentionPrefixOnDevice.*:RopeDevice.*:CcaDevice.*:AttentionDevice.*' \
    2>&1 | tee -a "$out/tests.txt" || status=1
  # The GEMM, linear, experts, optimizer, Newton–Schulz and copy kernels against the CPU ops
  # (tests/ops/test_{gemm,experts,optim}_cuda.cc) and their fronts' device checks.
  "$pack_dir/test_ops" --gtest_filter='GemmCuda.*:LinearCuda.*:ExpertsCuda.*:OptimCuda.*:NewtonSchulzCuda.*:CopyCuda.*:OptimMath.*:CublasLtMapping.*:GemmDevice.*:ExpertsDevice.*:NewtonSchulzDevice.*:OptimOpsDevice.*:CopyBlock.*' \
    2>&1 | tee -a "$out/tests.txt" || status=1
  # The GEMM ops at ZAYA1-base's shapes in FLOP/s (dense, one expert, 16 experts grouped, the experts op).
  # The whole model, then the trainer, on the GPU against the CPU (fp32, TF32 off).
  "$pack_dir/test_model" --gtest_filter='ModelDevice.*:Bf16WeightStorage.*OnTheDevice:Bf16Activations.*OnTheDevice' 2>&1 | tee -a "$out/tests.txt" || status=1
  "$pack_dir/test_train" --gtest_filter='TrainDevice.*' 2>&1 | tee -a "$out/tests.txt" || status=1
  "$pack_dir/bench_ops_gemm_cuda" --benchmark_min_time=0.2 2>&1 | tee -a "$out/ops_bench.txt" || status=1
  "$pack_dir/test_bench" --gtest_filter='GemmBench.*:ExpertsBench.TimesTheExpertsOpOnTheDevice' 2>&1 | tee -a "$out/tests.txt" || status=1
  # The NCCL backend in a world of one: MPI as an isolated singleton (no daemon; the tests start it
  # in a child process of their own), its plugins and texts from the pack. NcclWorld.* includes the
  # compute stream's wait for a collective (check_compute_stream_wait); HostWaitOnTheDevice.* is the
  # hook of a host wait through the real cudaMemcpy path.
  export OMPI_MCA_mca_base_component_path="$PWD/$pack_dir/libs/openmpi" OPAL_PKGDATADIR="$PWD/$pack_dir/libs/openmpi-data"
  export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$pack_dir/test_dist" --gtest_filter='LocalCommunicator.*:MpiWorldOfOne.*:NcclWorld.*:WaitOnComputeStream.*:HostWaitOnTheDevice.*' 2>&1 |
    tee -a "$out/tests.txt" || status=1
  # The prefetched parameter gather over NCCL: the compute stream waits for it, its wait measured.
  "$pack_dir/test_train" --gtest_filter='ParamGatherWaitNccl.*' 2>&1 | tee -a "$out/tests.txt" || status=1
  # `tests` stops at 128 MB: up to 1 GB the two passes ran past 150-170 s limits (earlier runs).
  max_bytes=1G && [[ "$1" == tests ]] && max_bytes=128M
  for dtype in float bfloat16; do  # one file for both: the device tool brings back 8 files at most
    "$pack_dir/zaya" bench collectives --backend nccl --op all --dtype "$dtype" -b 8 -e "$max_bytes" -f 8 -n 20 -w 5 \
      2>&1 | tee -a "$out/nccl.txt" || status=1
  done
  ;;&
tests)
  exit $status
  ;;
run)
  "$pack_dir/zaya" sysinfo 2>&1 | tee "$out/sysinfo.txt" || status=1
  # Training steps of the demo model on the GPU (forward + backward), f32 and bf16 GEMM inputs.
  for dtype in f32 bf16; do
    "$pack_dir/zaya" bench step --init-config configs/demo.toml --seed 1 --device cuda --gemm-dtype "$dtype" \
      --steps 20 --batch 8 --seq 512 2>&1 | tee -a "$out/sysinfo.txt" || status=1
  done
  # A GPU run's checkpoint stall against its synchronous save: the async writer's device-to-host
  # copy into page-locked staging (docs/train.md, "Training on a GPU").
  "$pack_dir/zaya" bench ckpt --device cuda --size 2GiB --snapshot all 2>&1 | tee -a "$out/sysinfo.txt" || status=1
  # Op benchmarks at ZAYA1-base's shapes, one file for all (the device tool brings back 8 files):
  # the routing and permutation kernels' bandwidth and the fused LM head's TFLOP/s; attention
  # forward and backward (the reference kernels and cuDNN's SDPA), the CCA ops and RoPE.
  "$pack_dir/bench_ops_moe_loss_cuda" --benchmark_min_time=0.2 2>&1 | tee -a "$out/ops_bench.txt" || status=1
  "$pack_dir/bench_ops_attention_cuda" --benchmark_min_time=0.2 2>&1 | tee -a "$out/ops_bench.txt" || status=1
  # The profile is named after the card it measured ("NVIDIA H200" -> h200-cublaslt-bf16).
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
  for dtype in bf16 f32; do
    "$pack_dir/zaya" bench gemm --backend cuda --dtype "$dtype" --shapes model:configs/zaya1-base.toml \
      --ref-dim 8192 -w 3 -n 20 --experts-tokens 1,2,4,8,16,32,64,128,256 \
      --name "${gpu:-gpu}-cublaslt-$dtype" --out "$out/profile-$dtype.json" 2>&1 |
      tee -a "$out/gemm.txt" || status=1
  done
  # Last, so that a run cut by the call's limit loses only it: zaya against transformers on a
  # ZAYA1-base-shaped model of 8 layers, cut to fit this mode: few steps, torch.compile's
  # compilation (timed apart from its steps) bounded at 120 s, the whole at 4 minutes. No files
  # of its own (the device tool brings back 8): its tables and result line go into sysinfo.txt,
  # from which `benchmarks/gpu_train.py --replot sysinfo.txt --out DIR` makes the files.
  # `gpu-train` is the full benchmark.
  use_pinned_transformers >>"$out/sysinfo.txt" 2>&1 || status=1
  PYTHONUNBUFFERED=1 timeout 240 python3 benchmarks/gpu_train.py --zaya "$pack_dir/zaya" --layers 8 --micro-batch 1 \
    --steps 5 --sections-steps 1 --hf-steps 3 --hf-warmup 1 --compile-warmup 2 --hf-timeout 120 --no-plot 2>&1 |
    tee -a "$out/sysinfo.txt" || status=1
  exit $status
  ;;
gpu-train)
  layers="${2:-8}" mbs="${3:-1}" out="${4:-${OUT:-/tmp/gpu_check}}"
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu_train.txt"
  use_pinned_transformers >>"$out/gpu_train.txt" 2>&1
  PYTHONUNBUFFERED=1 python3 benchmarks/gpu_train.py --zaya "$pack_dir/zaya" --layers "$layers" --micro-batch "$mbs" \
    --hf-timeout 360 --out "$out" 2>&1 | tee -a "$out/gpu_train.txt"
  ;;
decode-calibration)
  out="${2:-${OUT:-/tmp/gpu_check}}"
  mkdir -p "$out"
  # zaya bench membw measures the host: the device's bandwidth is the datasheet's (MEMBW overrides).
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
  case "$gpu" in h100) bw=3.35e12 ;; h200) bw=4.8e12 ;; *) bw="" ;; esac
  membw="${MEMBW:-$bw}"
  [[ -n "$membw" ]] || { echo "gpu_check: no datasheet bandwidth for '$gpu': set MEMBW (bytes/s)" >&2; exit 2; }
  raw=$(mktemp -d)  # every raw output; the device tool brings back 8 files, so four are copied
  ZAYA="$pack_dir/zaya" DEVICE=cuda MEMBW="$membw" CFG=configs/zaya1-base.toml \
    benchmarks/decode_calibration.sh "$raw" "$(nproc)" "1 8 32" 2>&1 | tee "$out/decode_calibration.txt"
  cp "$raw/summary.txt" "$raw/predicted.txt" "$raw/measured.txt" "$raw/profile.json" "$out/"
  ;;
model-vs-hf)
  threads="${2:?threads}" rounds="${3:?rounds}" out="${4:-${OUT:-/tmp/gpu_check}}"
  mkdir -p "$out"
  source scripts/env.sh
  use_pinned_transformers
  CUDA_VISIBLE_DEVICES= python3 benchmarks/model_vs_hf.py --zaya "$pack_dir/zaya" --threads "$threads" \
    --rounds "$rounds" 2>&1 | tee -a "$out/model_vs_hf-t$threads.txt"
  "$pack_dir/zaya" --threads "$threads" bench step --init-config configs/demo.toml --seed 1 --steps 5 \
    --batch 8 --seq 256 --sections 2>&1 | tee -a "$out/model_vs_hf-t$threads.txt"
  ;;
*)
  echo "usage: $0 pack | run [OUTDIR] | tests [OUTDIR] | gpu-train [LAYERS [MICRO_BATCH [OUTDIR]]] | decode-calibration [OUTDIR] | model-vs-hf THREADS ROUNDS [OUTDIR]" >&2
  exit 2
  ;;
esac
