# The CUDA backend (src/backends/cuda), included by the top-level CMakeLists.txt
# after the kiln target exists. On (KILN_CUDA, default ON) when nvcc and the CUDA
# toolkit are found; a machine without a GPU still builds and links it (CI).
# Defines KILN_HAVE_CUDA=1 (public) when built.
#
# nvcc is looked for on PATH, then in $CUDA_PATH/bin and /usr/local/cuda/bin, so
# the usual install is found without PATH changes. Set CMAKE_CUDA_COMPILER (or
# CUDACXX) to pick another one.
#
# Architectures (CMAKE_CUDA_ARCHITECTURES, overridable): "90-real;80-virtual" =
# SASS for sm_90 (H100/H200, the GPUs this backend is meant for, no JIT at
# start-up) plus compute_80 PTX, which the driver JIT-compiles for any newer GPU
# (Ampere A100/A10, Ada, Blackwell). Two compilations per .cu file; each extra
# real architecture would add one (the build machines have 2 cores). The kernels
# use no feature above sm_80.
set(KILN_HAVE_CUDA OFF)
set(KILN_CUDA_BUILT OFF CACHE INTERNAL "the CUDA backend is part of this build (scripts/test.sh checks it)")
if(NOT KILN_CUDA)
  return()
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(KILN_NVCC nvcc PATHS ENV CUDA_PATH /usr/local/cuda PATH_SUFFIXES bin)
  if(KILN_NVCC)
    set(CMAKE_CUDA_COMPILER "${KILN_NVCC}" CACHE FILEPATH "CUDA compiler")
  endif()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "kiln: nvcc not found, no CUDA backend")
  return()
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "90-real;80-virtual")
endif()
enable_language(CUDA)
find_package(CUDAToolkit)
if(NOT CUDAToolkit_FOUND)
  message(STATUS "kiln: CUDA toolkit not found, no CUDA backend")
  return()
endif()
# CMake 3.25 knows nvcc's dialect flags only up to C++17; nvcc >= 12 takes
# -std=c++20 (the kernels include kiln's C++20 headers). Teach it, unless a newer
# CMake already knows.
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
endif()
# The kernels (.cu) build in an object library of their own (their own flags);
# the host side (.cpp) is part of kiln like any backend.
file(GLOB KILN_CUDA_KERNELS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/backends/cuda/*.cu)
file(GLOB KILN_CUDA_HOST CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/backends/cuda/*.cpp)
add_library(kiln_cuda_kernels OBJECT ${KILN_CUDA_KERNELS})
target_include_directories(kiln_cuda_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/src)
# cuBLAS headers only: the library is opened with dlopen on first use
# (src/backends/cuda/cublas_api.h says why).
target_include_directories(kiln_cuda_kernels PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
target_compile_options(kiln_cuda_kernels PRIVATE -Xcompiler=-Wall)
set_target_properties(kiln_cuda_kernels PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                                                   CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
target_sources(kiln PRIVATE ${KILN_CUDA_HOST} $<TARGET_OBJECTS:kiln_cuda_kernels>)
target_include_directories(kiln PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(kiln PRIVATE CUDA::cudart ${CMAKE_DL_LIBS})
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/src/backends/cuda/cublas_api.cpp PROPERTIES
  COMPILE_DEFINITIONS "KILN_CUDA_LIBRARY_DIR=\"${CUDAToolkit_LIBRARY_DIR}\"")
target_compile_definitions(kiln PUBLIC KILN_HAVE_CUDA=1)
set(KILN_HAVE_CUDA ON)
set(KILN_CUDA_BUILT ON CACHE INTERNAL "the CUDA backend is part of this build (scripts/test.sh checks it)")
message(STATUS "kiln: CUDA backend with nvcc ${CMAKE_CUDA_COMPILER_VERSION}, toolkit ${CUDAToolkit_VERSION}, "
               "architectures ${CMAKE_CUDA_ARCHITECTURES}")
