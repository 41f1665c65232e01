#!/usr/bin/env bash
# On the GPU machine, one call: an old tree (old_tree/, e.g. `git archive OLD | tar -x -C old_tree`, passed to the
# device with carry) against this one for `bench decode`'s greedy, batch, beams and first-token rows, alternated
# twice; the inference CUDA tests; racecheck of the decode kernels; then this tree's whole `bench decode --peer`.
# Usage: scripts/decode_old_vs_new.sh OUT_DIR
set -uo pipefail
OUT=$1; mkdir -p $OUT; t0=$(date +%s)
rem() { local r=$(( 590 - ($(date +%s) - t0) )); echo $(( $1 < r ? $1 : (r > 1 ? r : 1) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
b() { cmake -S $1 -B $1/build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DPython3_EXECUTABLE="$(command -v python3)" >$2 2>&1 && cmake --build $1/build-gpu -j8 --target $3 >>$2 2>&1; }
b old_tree $OUT/build_old.log tessera & p1=$!
b . $OUT/build_new.log "tessera tessera_cuda_tests" & p2=$!
wait $p2 || { grep -E "error" $OUT/build_new.log | head -30; exit 1; }
wait $p1 || { tail -5 $OUT/build_old.log; }
echo "builds $(( $(date +%s) - t0 )) s"
NEW='CudaAttentionDecode*:BeamTopkCuda*:DecodeOpsCuda*:EngineCuda*:SampleRowsCuda*:*BeamSearch*Cuda*:BeamGenerateCuda*:GeneratorCuda*:CudaNorm*:*NormResidual*'
timeout $(rem 100) build-gpu/tests/tessera_cuda_tests --gtest_filter="$NEW" >$OUT/new_cuda.log 2>&1
echo "new cuda rc=$?: $(grep -cE '^\[       OK' $OUT/new_cuda.log) ok"; grep -E "^\[  FAILED|Failure|relative error" $OUT/new_cuda.log | head -20
for r in 1 2; do for t in old new; do d=.; [ $t = old ] && d=old_tree
  timeout $(rem 60) $d/build-gpu/tessera bench decode --rows greedy,batch,beams,first-token --no-progress --out $OUT/rows_${t}_$r.md > $OUT/rows_${t}_$r.log 2>&1; echo "$t $r rc=$?"; grep -E "^\| (greedy|batch|beams|first)" $OUT/rows_${t}_$r.md | cut -d'|' -f2,3,4 | head -8
done; done
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout $(rem 40) $CS --tool racecheck build-gpu/tests/tessera_cuda_tests --gtest_filter='CudaAttentionDecode.GraphReplay*:DecodeOpsCuda*' 2>&1 | head -40 > $OUT/race.log; grep -E "RACECHECK SUMMARY|Race reported" $OUT/race.log | cut -c1-160 | head -5
TESSERA_PYTHON=$(command -v python3) timeout $(rem 300) build-gpu/tessera bench decode --peer --peer-timeout 200 --no-progress --out $OUT/decode.md >$OUT/decode.log 2>&1
echo "bench decode --peer rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "^\|" $OUT/decode.md | cut -d'|' -f2,3,4,6,7,8 | head -24
echo "elapsed $(( $(date +%s) - t0 )) s"
