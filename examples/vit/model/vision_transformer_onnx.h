#pragma once
// ONNX export of the Vision Transformer: lowerings for its composite modules on top of dpar's
// built-in ones (LayerNorm, MultiheadAttention, GELU and the rest come with the library).
#include <string>

#include "dpar/io/onnx_export.h"
#include "model/vision_transformer.h"

namespace dpar::models {

// NamedSequential (children in order), MLPBlock (its Linears as MatMul: the input is
// [N, S, D]), EncoderBlock (the two residual branches), Encoder (pos_embedding, blocks, ln)
// and VisionTransformer: conv_proj -> Reshape/Transpose to [N, S, D] -> Pad one row in front
// -> Add a constant holding class_token in that row plus pos_embedding (the encoder's first
// step folded in), the blocks, encoder.ln, Gather of the class row, heads.
void add_vision_transformer_lowerings(io::OnnxLowerings& lowerings);

// Exports model (eval semantics: dropout removed) to <dir>/inference.onnx and inference.json,
// logits by default (softmax = false keeps them raw); the input is [batch, in_channels,
// image_size, image_size] with Fashion-MNIST's statistics for 1 channel, ImageNet's for 3.
io::OnnxExportResult export_vision_transformer(const VisionTransformer& model,
                                               const std::string& dir, bool softmax = true);

}  // namespace dpar::models
