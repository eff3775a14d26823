// kiln: tensors, lazy graphs, reverse-mode autodiff and compute backends in C++20.
// The user API: everything a program needs to build, train, save and run models.
// Extension points (tensor metadata, op parameters and builders, the graph
// allocator, the scheduler, registering a backend) are in kiln/ext/, for backend
// authors and tools; kiln.h includes none of them.
#pragma once
#include "kiln/backend.h"
#include "kiln/context.h"
#include "kiln/cpu.h"
#include "kiln/dataset.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/generate.h"
#include "kiln/grad_store.h"
#include "kiln/graph.h"
#include "kiln/graph_passes.h"
#include "kiln/io.h"
#include "kiln/lora.h"
#include "kiln/memory_plan.h"
#include "kiln/models.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/opt.h"
#include "kiln/registry.h"
#include "kiln/safetensors.h"
#include "kiln/state_dict.h"
#include "kiln/tensor.h"
#include "kiln/token_dataset.h"
#include "kiln/token_train.h"
#if defined(KILN_HAVE_BLAS)
#include "kiln/blas.h"
#endif
#if defined(KILN_HAVE_CUDA)
#include "kiln/cuda.h"
#endif
#if defined(KILN_HAVE_TOKENIZER)
#include "kiln/chat.h"
#include "kiln/chat_dataset.h"
#include "kiln/tokenizer.h"
#endif
