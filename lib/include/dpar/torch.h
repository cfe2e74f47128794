#pragma once
// dpar for libtorch programs (the dpar::torch library; CMake: find_package(dpar COMPONENTS
// torch), target dpar::torch): zero-copy tensor views, collectives on libtorch tensors,
// DataParallel for any torch::nn::Module, a distributed sampler for torch::data and
// checkpoints of a module and its optimizer. docs/libtorch.md shows a program before and after.
#include "dpar/distributed/parallel_env.h"
#include "dpar/torch/checkpoint.h"
#include "dpar/torch/data_parallel.h"
#include "dpar/torch/distributed.h"
#include "dpar/torch/sampler.h"
#include "dpar/torch/tensor.h"
