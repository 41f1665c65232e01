#!/usr/bin/env bash
# On the GPU machine: build tessera with CUDA, run the inference work's CUDA tests (decode attention, topk, the
# sampler, the engine, beam search, beam_generate), `tessera bench decode --peer` (every row beside Hugging Face
# generate in the same call), then, while the call has time left, compute-sanitizer memcheck and racecheck over
# the new kernels and the rest of the CUDA suite. Usage: OUT_DIR. A device call is cut at 600 s: the slow checks
# go last and are bounded by what is left.
set -uo pipefail
OUT=$1; mkdir -p $OUT
export OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
left() { (( $(date +%s) - t0 < $1 )); }
rem() { local r=$(( 585 - ($(date +%s) - t0) )); echo $(( $1 < r ? $1 : (r > 1 ? r : 1) )); }
NEW='CudaAttentionDecode*:BeamTopkCuda*:DecodeOpsCuda*:EngineCuda*:SampleRowsCuda*:*BeamSearch*Cuda*:CudaBeam*:BeamGenerateCuda*:GeneratorCuda*:*Generate*Cuda*'
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DPython3_EXECUTABLE="$(command -v python3)" >$OUT/cmake.log 2>&1 || { tail -20 $OUT/cmake.log; exit 1; }
cmake --build build-gpu -j16 --target tessera tessera_cuda_tests >$OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -5 $OUT/build.log; }
echo "build $(( $(date +%s) - t0 )) s"
timeout $(rem 120) build-gpu/tests/tessera_cuda_tests --gtest_filter="$NEW" >$OUT/new_cuda.log 2>&1
echo "new cuda rc=$?: $(grep -cE '^\[       OK' $OUT/new_cuda.log) ok"; grep -E "^\[  FAILED|Failure|Expected|Which is|actual|error" $OUT/new_cuda.log | head -40
TESSERA_PYTHON=$(command -v python3) timeout $(rem 330) build-gpu/tessera bench decode --peer --peer-timeout 240 --out $OUT/decode.md >$OUT/decode.log 2>&1
echo "bench decode rc=$? at $(( $(date +%s) - t0 )) s"; cat $OUT/decode.log | tail -40
if left 430; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # memcheck over the tests that drive whole engines and beam searches (the kernels' own tests ran clean under it);
  # racecheck over small shapes of each new kernel, its first hazards kept.
  timeout $(rem 90) $CS --tool memcheck --error-exitcode 9 build-gpu/tests/tessera_cuda_tests --gtest_filter='EngineCuda*:GeneratorCuda*:BeamGenerateCuda*:BeamSearchCuda*:DecodeOpsCuda*:SampleRowsCuda.Penalties*:SampleRowsCuda.Nan*:SampleRowsCuda.AGraph*' >$OUT/memcheck.log 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^=========  *(Invalid|Address|Program hit)|^\[  (PASSED|FAILED)" $OUT/memcheck.log | sort | uniq -c | head -10
  timeout $(rem 60) $CS --tool racecheck --error-exitcode 9 build-gpu/tests/tessera_cuda_tests --gtest_filter='CudaAttentionDecode.GraphReplay*:BeamTopkCuda.GraphReplay*:SampleRowsCuda.AGraph*:SampleRowsCuda.Nan*:DecodeOpsCuda*' 2>&1 | head -60 >$OUT/racecheck.log
  echo "racecheck:"; grep -E "RACECHECK SUMMARY|Race reported|^\[  (PASSED|FAILED)" $OUT/racecheck.log | cut -c1-200 | head -12
fi
if left 540; then
  timeout $(rem 240) build-gpu/tests/tessera_cuda_tests --gtest_filter="-$NEW" >$OUT/cuda_all.log 2>&1; echo "rest of cuda suite rc=$?"; grep -E "^\[  (FAILED|PASSED)|tests ran" $OUT/cuda_all.log | head -20
fi
echo "elapsed $(( $(date +%s) - t0 )) s"
