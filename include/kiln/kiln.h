// kiln: tensors, lazy graphs, reverse-mode autodiff and compute backends in C++20.
#pragma once
#include "kiln/alloc.h"
#include "kiln/backend.h"
#include "kiln/context.h"
#include "kiln/cpu.h"
#include "kiln/dataset.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/grad_store.h"
#include "kiln/graph.h"
#include "kiln/io.h"
#include "kiln/models.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/opt.h"
#include "kiln/registry.h"
#include "kiln/safetensors.h"
#include "kiln/sched.h"
#include "kiln/state_dict.h"
#include "kiln/tensor.h"
#include "kiln/token_dataset.h"
#if defined(KILN_HAVE_BLAS)
#include "kiln/blas.h"
#endif
#if defined(KILN_HAVE_CUDA)
#include "kiln/cuda.h"
#endif
