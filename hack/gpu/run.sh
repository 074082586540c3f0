#!/usr/bin/env bash
# One device-machine call: install the carried wheels, then the GPU tests, the trainer smoke run
# and the benchmark. Output under $OUT (the device tool's result folder).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
if ! python3 -c "import pyarrow,sys; sys.exit(int(pyarrow.__version__.split('.')[0]) < 24)" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-extra/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/api:$PWD/operator:$PWD/trainer:$PWD/cli PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl, peft, datasets, liger_kernel, pyarrow; print(torch.__version__, transformers.__version__, trl.__version__, peft.__version__, datasets.__version__, pyarrow.__version__)" | tee -a "$OUT/gpu.txt"
for step in "$@"; do
  case "$step" in
    tests) python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -15 | tee "$OUT/tests.log" ;;
    smoke) python3 hack/gpu/smoke.py /tmp/smoke > "$OUT/smoke.log" 2>&1; tail -40 "$OUT/smoke.log" ;;
    smoke2) python3 hack/gpu/smoke.py /tmp/smoke2 --nproc 2 --preempt > "$OUT/smoke2.log" 2>&1; grep -E "preempted|resum|exit|COMPLETE|rank" "$OUT/smoke2.log" | tail -20; tail -32 "$OUT/smoke2.log" ;;
    bench) python3 -m kubetune_trainer.bench --out /tmp/bench --memory-cap-gib 80 > "$OUT/bench.log" 2>&1; grep -E "^\[bench\]|^\|" "$OUT/bench.log"; tail -5 "$OUT/bench.log"; cp /tmp/bench/bench.* "$OUT/" ;;
    bench:*) python3 -m kubetune_trainer.bench --out /tmp/bench --cases "${step#bench:}" > "$OUT/bench.log" 2>&1; grep -E "^\[bench\]|^\|" "$OUT/bench.log"; tail -5 "$OUT/bench.log"; cp /tmp/bench/bench.* "$OUT/" ;;
    compile) timeout 270 python3 -m kubetune_trainer.bench --out /tmp/compile --compile --cases qwen2-0.5b:kubetune,qwen3-4b:kubetune > "$OUT/compile.log" 2>&1; grep -E "^\[bench\]|^\|" "$OUT/compile.log"; tail -3 "$OUT/compile.log"; cp /tmp/compile/bench.json "$OUT/compile.json"; cp /tmp/compile/bench.md "$OUT/compile.md" ;;
  esac
done
