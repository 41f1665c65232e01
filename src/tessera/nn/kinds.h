// tessera/nn/kinds.h — the choices of a layer that a model config names.
#pragma once

namespace tessera {

enum class NormKind { LayerNorm, RmsNorm };
enum class PositionKind { Learned, Rope, Sinusoidal };
// Where a cross-attention's K and V come from: its own projection of the encoder's output, or the slices of the
// one projection for every layer of the decoder (CrossKvProjection, LightSeq's layer-batched form).
enum class CrossKvSource { Own, Batched };

}  // namespace tessera
