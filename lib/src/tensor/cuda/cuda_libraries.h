#pragma once
// cuBLAS and cuDNN handles: one per device and thread (the libraries' handles are not
// thread-safe), bound to the current stream each time they are fetched.
#include <cublas_v2.h>
#include <cudnn.h>

#include "dpar/core/dtype.h"

namespace dpar::cuda {

cublasHandle_t cublas_handle();  // for the current device and stream
cudnnHandle_t cudnn_handle();    // for the current device and stream

// cuDNN's name for f32, f16 and bf16; throws dpar::Error for other dtypes.
cudnnDataType_t cudnn_data_type(DType t);

void check_cublas(cublasStatus_t status, const char* what);
void check_cudnn(cudnnStatus_t status, const char* what);

// cuBLAS/cuDNN workspace on the current stream, grown on demand and kept per device/thread.
void* workspace(size_t nbytes);
// Gives the workspace back to the pool (after an algorithm search that used a large one).
void release_workspace();

}  // namespace dpar::cuda
