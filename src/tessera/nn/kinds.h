// tessera/nn/kinds.h — the choices of a layer that a model config names.
#pragma once

namespace tessera {

enum class NormKind { LayerNorm, RmsNorm };
enum class PositionKind { Learned, Rope, Sinusoidal };

}  // namespace tessera
