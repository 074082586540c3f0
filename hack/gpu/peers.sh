#!/usr/bin/env bash
# Issue 35: kubetune beside its peers (TRL at its best, Unsloth) on one GPU, each phase in one call.
#
#   bash hack/gpu/peers.sh WHEELS PHASE...
#
# WHEELS: the folder `python3 hack/gpu/peer_wheels.py` wrote (carried to the device machine); its
# `kubetune` set goes into one --target folder, its `unsloth` set into another, which only the
# Unsloth cases' processes get first on PYTHONPATH (`kubetune bench --unsloth-site`). PHASE:
#   lora  Qwen2-0.5B LoRA: kubetune, TRL at its best and Unsloth (micro-batches $LORA_BATCHES and
#         $UNSLOTH_LORA_BATCHES)
#   full  Qwen3-4B full: the same ($FULL_BATCHES and $UNSLOTH_FULL_BATCHES)
#   sdpa  TRL at its best on Qwen2-0.5B with SDPA instead of flex attention (one point)
# Every phase writes into one folder; after each, the report and an archive go to $OUT. MFU is
# against the GPU's measured bf16 limit (hack/gpu/bf16_peak.py), measured first.
set -uo pipefail
W=${1:?the wheels folder}; shift
K=/tmp/kubetune-site U=/tmp/unsloth-site
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$1" "${@:2}"; }
install $K "$W"/kubetune/*.whl || exit 1
install $U "$W"/unsloth/*.whl || exit 1
export PYTHONPATH=$K:$PWD/api:$PWD/operator:$PWD/trainer:$PWD/cli:$PWD/bench PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl, peft, datasets, liger_kernel, pyarrow; print('kubetune env: torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)" 2>&1 | tail -3 | tee -a "$OUT/gpu.txt"
PEAK=$(python3 hack/gpu/bf16_peak.py)
echo "measured bf16 limit: $PEAK TFLOP/s" | tee -a "$OUT/gpu.txt"
B="python3 -m kubetune_bench --out /tmp/peers --warmup ${WARMUP:-2} --steps ${STEPS:-3} --peak-tflops $PEAK --unsloth-site $U"
snap() { $B --report-only > /dev/null 2>&1; cp /tmp/peers/bench.md /tmp/peers/bench.json "$OUT/" 2>/dev/null; tar czf "$OUT/peers.tar.gz" -C /tmp peers; }
# each phase gets at most its own limit and what is left of ${BUDGET:-585} s (the device's calls last 600 s);
# timeout stops a phase's case processes with it (one process group)
left() { local rest=$((${BUDGET:-585} - SECONDS)); echo $((rest < $1 ? rest : $1)); }
for phase in "$@"; do
  if [ "$(left 999)" -lt 45 ]; then echo "no time left for $phase"; continue; fi
  case "$phase" in
    lora) timeout "$(left "${T_LORA:-330}")" sh -c "$B --cases qwen2-0.5b:kubetune,qwen2-0.5b:trl-best --peer-batches ${LORA_BATCHES:-16,32}; $B --cases qwen2-0.5b:unsloth --peer-batches ${UNSLOTH_LORA_BATCHES:-16,32}" > /tmp/lora.log 2>&1 ;;
    full) timeout "$(left "${T_FULL:-420}")" sh -c "$B --cases qwen3-4b:kubetune,qwen3-4b:trl-best --peer-batches ${FULL_BATCHES:-4,8}; $B --cases qwen3-4b:unsloth --peer-batches ${UNSLOTH_FULL_BATCHES:-4,8}" > /tmp/full.log 2>&1 ;;
    sdpa) timeout "$(left "${T_SDPA:-90}")" $B --cases qwen2-0.5b:trl-best --peer-batches 16 --trl-attn sdpa > /tmp/sdpa.log 2>&1 ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
  grep -h "^\[bench\]" /tmp/$phase.log | cut -c1-400; snap
done
grep -h -i -B2 -A8 "Traceback" /tmp/peers/*.log 2>/dev/null | tail -40 | cut -c1-300
cat /tmp/peers/bench.md 2>/dev/null
