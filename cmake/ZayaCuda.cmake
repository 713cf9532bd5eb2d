# CUDA is optional. When it is built, zaya_core defines ZAYA_HAVE_CUDA for every layer above it.
set(ZAYA_WITH_CUDA OFF)
if(NOT ZAYA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(ZAYA_WITH_CUDA ON)
  elseif(ZAYA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZAYA_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

if(ZAYA_WITH_CUDA)
  # Hopper: native sm_90a code plus compute_90 PTX so newer GPUs can JIT it.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag (nvcc 12+ has it): teach it, then ask for 20.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  find_package(CUDAToolkit REQUIRED)
  # NCCL ships with the CUDA toolkit here (lib/ beside lib64/); the NCCL communicator needs it.
  find_library(ZAYA_NCCL_LIBRARY nccl
               HINTS ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu
               REQUIRED)
  find_path(ZAYA_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include REQUIRED)
  message(STATUS "zaya: NCCL ${ZAYA_NCCL_LIBRARY}")
  # cudnn-frontend (header-only; PyPI's nvidia-cudnn-frontend, which scripts/venv.sh installs into
  # .venv, puts its headers in site-packages/include) for cuDNN's fused attention. cuDNN itself is
  # loaded at run time, so neither the build nor the binaries need libcudnn; without the headers
  # the attention fronts run the reference kernels (docs/cuda.md, "Attention").
  file(GLOB _zaya_venv_includes ${CMAKE_SOURCE_DIR}/.venv/lib/python3*/site-packages/include)
  find_path(ZAYA_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h HINTS ${_zaya_venv_includes})
  find_path(ZAYA_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include/x86_64-linux-gnu)
  if(ZAYA_CUDNN_FRONTEND_INCLUDE AND ZAYA_CUDNN_INCLUDE)
    message(STATUS "zaya: cudnn-frontend ${ZAYA_CUDNN_FRONTEND_INCLUDE} (cuDNN loaded at run time)")
  else()
    message(STATUS "zaya: no cudnn-frontend headers (pip install nvidia-cudnn-frontend into .venv): "
                   "CUDA attention runs the reference kernels")
  endif()
  message(STATUS "zaya: building CUDA sources with ${CMAKE_CUDA_COMPILER}")
else()
  message(STATUS "zaya: CPU-only build")
endif()

function(zaya_cuda_target tgt)
  if(NOT ZAYA_WITH_CUDA)
    return()
  endif()
  get_target_property(type ${tgt} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    return()
  endif()
  target_compile_options(${tgt} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90
      --expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>)
  target_compile_definitions(${tgt} PUBLIC ZAYA_HAVE_CUDA=1)
  target_link_libraries(${tgt} PUBLIC CUDA::cudart CUDA::cublasLt CUDA::cublas ${ZAYA_NCCL_LIBRARY})
  target_include_directories(${tgt} PUBLIC ${ZAYA_NCCL_INCLUDE})
  if(ZAYA_CUDNN_FRONTEND_INCLUDE AND ZAYA_CUDNN_INCLUDE)
    # SYSTEM: the frontend's own code is not held to zaya's warning flags.
    target_include_directories(${tgt} SYSTEM PUBLIC ${ZAYA_CUDNN_FRONTEND_INCLUDE} ${ZAYA_CUDNN_INCLUDE})
    target_compile_definitions(${tgt} PUBLIC ZAYA_HAVE_CUDNN_FRONTEND=1 NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING=1
                                             CUDNN_FRONTEND_SKIP_JSON_LIB=1)
    target_link_libraries(${tgt} PUBLIC ${CMAKE_DL_LIBS})
  endif()
endfunction()
