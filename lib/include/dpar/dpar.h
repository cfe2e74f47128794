#pragma once
// Umbrella header: everything a training program needs.
#include "dpar/autograd/engine.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/core/device.h"
#include "dpar/core/dtype.h"
#include "dpar/core/error.h"
#include "dpar/core/random.h"
#include "dpar/core/threads.h"
#include "dpar/core/version.h"
#include "dpar/tensor/allocator.h"
#include "dpar/tensor/ops.h"
#include "dpar/tensor/tensor.h"
