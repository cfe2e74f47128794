#pragma once
// Internals shared by checkpoint.cpp and checkpoint_manager.cpp: the TrainingState <-> JSON
// mapping and the dtype names used when a checkpoint travels between ranks.
#include <string>

#include "dpar/io/checkpoint.h"

namespace dpar::io::detail {

std::string state_to_json(const TrainingState& state);
// Throws dpar::Error naming `source` when the text is not a TrainingState.
TrainingState state_from_json(const std::string& text, const std::string& source);

// fsync of a directory, so a rename in it is durable.
void sync_directory(const std::string& dir);

DType parse_dtype_name(const std::string& name, const std::string& source);

}  // namespace dpar::io::detail
