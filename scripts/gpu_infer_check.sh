#!/usr/bin/env bash
# On the GPU machine: build tessera with CUDA, run the inference work's CUDA tests (decode attention, topk, the
# sampler, the engine, beam search), the rest of the CUDA suite, bench topk, generate on a gpt2-124m checkpoint
# (decode ms/token from two runs), compute-sanitizer memcheck and racecheck over the new kernels, and the Hugging
# Face decode peers (bench/peers/decode.py). Usage: OUT_DIR.
set -uo pipefail
OUT=$1; mkdir -p $OUT
export OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DPython3_EXECUTABLE="$(command -v python3)" >$OUT/cmake.log 2>&1 || { tail -20 $OUT/cmake.log; exit 1; }
( timeout 300 python3 bench/peers/decode.py --size full > $OUT/peer_decode.jsonl 2>$OUT/peer_decode.err; echo "peer rc=$?" > $OUT/peer_rc.txt ) &
cmake --build build-gpu -j14 --target tessera tessera_cuda_tests >$OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -5 $OUT/build.log; }
echo "build $(( $(date +%s) - t0 )) s"
timeout 200 build-gpu/tests/tessera_cuda_tests --gtest_filter='CudaAttentionDecode*:BeamTopkCuda*:DecodeOpsCuda*:EngineCuda*:SampleRowsCuda*:BeamSearch*:CudaBeam*:*BeamSearch*Cuda*:BeamGenerateCuda*' >$OUT/new_cuda.log 2>&1
echo "new cuda rc=$?: $(grep -cE '^\[       OK' $OUT/new_cuda.log) ok"; grep -E "^\[  FAILED|Failure|Expected|Which is|actual|error" $OUT/new_cuda.log | head -40
T=build-gpu/tessera
timeout 60 $T train --preset gpt2-124m --steps 1 --batch 1 --seq 64 --out /tmp/g124 >$OUT/train.log 2>&1; echo "train rc=$?"; tail -2 $OUT/train.log
timeout 60 $T bench topk --peer >$OUT/topk.log 2>&1; echo "bench topk rc=$?"; tail -15 $OUT/topk.log
timeout 60 $T info --checkpoint /tmp/g124/checkpoint --inference --batch 16 --beams 4 >$OUT/info_inf.log 2>&1; tail -8 $OUT/info_inf.log
for d in cuda cpu; do
  /usr/bin/time -f "generate $d: %e s wall, %M KiB rss" timeout 120 $T generate --checkpoint /tmp/g124/checkpoint --device $d --greedy --max-new-tokens 128 --prompt "Hello" >$OUT/gen_$d.txt 2>$OUT/gen_$d.err; echo "rc=$?"; tail -2 $OUT/gen_$d.err
done
# Decode ms/token without the load and the prefill: the difference of two runs over their token difference.
for n in 16 272; do s=$(date +%s.%N); timeout 60 $T generate --checkpoint /tmp/g124/checkpoint --device cuda --greedy --max-new-tokens $n --prompt "Hello" >/dev/null 2>&1; e=$(date +%s.%N); echo "$n $s $e" >> $OUT/gen_diff.txt; done
python3 -c "
l=[x.split() for x in open('$OUT/gen_diff.txt')]
a=float(l[0][2])-float(l[0][1]); b=float(l[1][2])-float(l[1][1])
print(f'generate cuda bf16 gpt2-124m batch 1: 16 tokens {a:.3f} s, 272 tokens {b:.3f} s: {(b-a)/256*1e3:.3f} ms/token decode')"
cmp <(head -c 2000 $OUT/gen_cuda.txt) <(head -c 2000 $OUT/gen_cpu.txt) && echo "cpu and gpu greedy text equal" || echo "cpu and gpu greedy text differ (bf16 vs f32)"
wait; cat $OUT/peer_rc.txt; grep -v '^{' $OUT/peer_decode.jsonl | tail -3; tail -3 $OUT/peer_decode.err
python3 - $OUT/peer_decode.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if l.startswith('{'):
        r=json.loads(l); print({k:(round(v,3) if isinstance(v,float) else v) for k,v in r.items() if k not in('torch','transformers','device','precision')})
PY
# The slow checks last, each only while the call has time left (a device call is cut at 600 s).
left() { (( $(date +%s) - t0 < $1 )); }
rem() { local r=$(( 585 - ($(date +%s) - t0) )); echo $(( $1 < r ? $1 : (r > 1 ? r : 1) )); }
if left 330; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout $(rem 150) $CS --tool memcheck --error-exitcode 9 build-gpu/tests/tessera_cuda_tests --gtest_filter='CudaAttentionDecode*:BeamTopkCuda*:DecodeOpsCuda*:SampleRowsCuda*' >$OUT/memcheck.log 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^=========  *(Invalid|Address|Program hit)" $OUT/memcheck.log | sort | uniq -c | head -10
  timeout $(rem 150) $CS --tool racecheck --error-exitcode 9 build-gpu/tests/tessera_cuda_tests --gtest_filter='CudaAttentionDecode*:BeamTopkCuda*:SampleRowsCuda*' >$OUT/racecheck.log 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|hazard" $OUT/racecheck.log | sort | uniq -c | head -10
  timeout $(rem 240) build-gpu/tests/tessera_cuda_tests --gtest_filter='-CudaAttentionDecode*:BeamTopkCuda*:DecodeOpsCuda*:EngineCuda*:SampleRowsCuda*:BeamGenerateCuda*' >$OUT/cuda_all.log 2>&1; echo "rest of cuda suite rc=$?"; grep -E "^\[  (FAILED|PASSED)|tests ran" $OUT/cuda_all.log | head -20
fi
echo "elapsed $(( $(date +%s) - t0 )) s"
