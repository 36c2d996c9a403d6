// A sharded checkpoint's meta.json (checkpoint/checkpoint.h): the model shape's JSON form, and
// the check that every field the loader reads is present, of its type and in range — so that a
// damaged or hand-edited meta.json is refused naming the field, never divides by a zero world
// size or sizes a buffer from a negative dimension.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/shape.h"

namespace ptrain {

constexpr int kCheckpointFormatVersion = 2;  // 2: units padded and sharded in multiples of kUnitAlign

nlohmann::json shape_json(const LlamaShape& s);
// The shape of a validated meta.json's "shape" (validate_checkpoint_meta).
LlamaShape shape_from_json(const nlohmann::json& j);
// Throws RuntimeError "checkpoint 'WHERE': meta.json ..." naming the first field that is missing,
// of another type or out of range.
void validate_checkpoint_meta(const nlohmann::json& meta, const std::string& where);

}  // namespace ptrain
