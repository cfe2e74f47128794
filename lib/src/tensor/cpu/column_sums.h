#pragma once
// Column sums of row-major float matrices (bias gradients), accumulated in double over fixed
// blocks of 256 rows whose sums are then added in block order: the result depends neither on
// the thread count nor on who sums (sum_to, or a linear layer's backward, which sums each block
// of the output gradient while its product has the block in cache).
#include <cstdint>

namespace dpar::cpu {

constexpr int64_t kColumnSumBlockRows = 256;

// acc[j] = sum over the block's rows (at most kColumnSumBlockRows) of x[i, j], j < cols; the
// rows start ld floats apart.
void column_sum_block(const float* x, int64_t rows, int64_t cols, int64_t ld, double* acc);

// out[j] = the sum of partial[b * cols + j] over blocks b, added in block order; overwrites
// partial's first row.
void add_block_sums(double* partial, int64_t blocks, int64_t cols, float* out);

// out[j] = the sum over i of x[i, j] for a [rows, cols] x whose rows start ld floats apart (a
// bias gradient: the sum over all leading dims), by the blocks above.
void column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out);

}  // namespace dpar::cpu
