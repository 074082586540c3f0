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
# ORDER (default kubetune,trl,unsloth) is the order of a phase's cases and says which run (leave one
# out to skip it; trl:16/32 or unsloth:16 names the micro-batches of that entry alone; the
# *_BATCHES lists are slash-separated). Each case is one process with its own time limit (T_KUBETUNE, T_TRL, T_UNSLOTH
# seconds, each at most what is left of $BUDGET), so a slow case cannot take the next one's time; a
# case stopped at its limit writes its Python stacks into its log (SIGTERM, faulthandler) and every
# case logs each optimizer step's end. Every phase writes into one folder; after each, the report
# and an archive (with every case's log) go to $OUT. MFU is against the GPU's measured bf16 limit
# (hack/gpu/bf16_peak.py), measured first.
set -uo pipefail
W=${1:?the wheels folder}; shift
K=/tmp/kubetune-site U=/tmp/unsloth-site
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$1" "${@:2}"; }
install $K "$W"/kubetune/*.whl || exit 1
install $U "$W"/unsloth/*.whl || exit 1
export PYTHONPATH=$K:$PWD/api:$PWD/operator:$PWD/trainer:$PWD/cli:$PWD/bench PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl, peft, datasets, liger_kernel, pyarrow; print('kubetune env: torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)" 2>&1 | tail -3 | tee -a "$OUT/gpu.txt"
PEAK=${PEAK:-$(python3 hack/gpu/bf16_peak.py)}  # (PEAK set: the limit measured once for several calls of this script)
echo "measured bf16 limit: $PEAK TFLOP/s" | tee -a "$OUT/gpu.txt"
B="python3 -m kubetune_bench --out /tmp/peers --warmup ${WARMUP:-2} --steps ${STEPS:-3} --peak-tflops $PEAK --unsloth-site $U"
snap() { $B --report-only > /dev/null 2>&1; cp /tmp/peers/bench.md /tmp/peers/bench.json "$OUT/" 2>/dev/null; tar czf "$OUT/peers.tar.gz" -C /tmp peers; }
# a case gets at most its own limit and what is left of ${BUDGET:-585} s (the device's calls last 600 s);
# timeout stops the case's processes with it (one process group)
left() { local rest=$((${BUDGET:-585} - SECONDS)); echo $((rest < $1 ? rest : $1)); }
one() {  # one case: LIMIT PHASE kubetune-bench-arguments...
  local t; t=$(left "$1"); local phase=$2; shift 2
  if [ "$t" -lt 45 ]; then echo "no time left for $*" | tee -a "/tmp/$phase.log"; return; fi
  timeout "$t" $B "$@" >> "/tmp/$phase.log" 2>&1 || echo "[peers] exit $? after at most $t s: $*" | tee -a "/tmp/$phase.log"
}
cases() {  # a phase's cases in $ORDER: PHASE MODEL TRL_BATCHES UNSLOTH_BATCHES
  local phase=$1 model=$2 entry peer batches b
  for entry in $(echo "${ORDER:-kubetune,trl,unsloth}" | tr , ' '); do
    peer=${entry%%:*} batches=${entry#*:}  # trl:32 is TRL at its best at batch 32 alone
    case "$peer" in
      kubetune) one "${T_KUBETUNE:-150}" "$phase" --cases "$model:kubetune" ;;
      trl) [ "$batches" = trl ] && batches=$3
        for b in ${batches//\// }; do one "${T_TRL:-240}" "$phase" --cases "$model:trl-best" --peer-batches "$b"; done ;;
      unsloth) [ "$batches" = unsloth ] && batches=$4
        for b in ${batches//\// }; do one "${T_UNSLOTH:-240}" "$phase" --cases "$model:unsloth" --peer-batches "$b"; done ;;
      *) echo "unknown peer $peer in ORDER"; exit 2 ;;
    esac
  done
}
for phase in "$@"; do
  if [ "$(left 999)" -lt 45 ]; then echo "no time left for $phase"; continue; fi
  case "$phase" in
    lora) cases lora qwen2-0.5b "${LORA_BATCHES:-32}" "${UNSLOTH_LORA_BATCHES:-16/32}" ;;
    full) cases full qwen3-4b "${FULL_BATCHES:-4/8}" "${UNSLOTH_FULL_BATCHES:-4/8}" ;;
    sdpa) one "${T_SDPA:-90}" sdpa --cases qwen2-0.5b:trl-best --peer-batches 32 --trl-attn sdpa ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
  grep -h "^\[bench\]\|^\[peers\]" /tmp/$phase.log | cut -c1-400; snap
done
grep -h -i -B2 -A8 "Traceback" /tmp/peers/*.log 2>/dev/null | tail -40 | cut -c1-300
for log in /tmp/peers/*.log; do  # how far each case got, and where a stopped one was
  [ -e "$log" ] || continue
  echo "== $(basename "$log"): $(grep -c '^\[case\].*ended' "$log") steps; $(grep '^\[case\]' "$log" | tail -1)"
  # the main thread's stack (the one that ran runpy), innermost 18 frames
  awk '/most recent call first/ {if (b ~ /runpy|<module>/) print b; b=""} {b = b $0 "\n"} END {if (b ~ /runpy|<module>/) print b}' "$log" |
    grep -A18 "most recent call first" | head -19 | cut -c1-200
done
cat /tmp/peers/bench.md 2>/dev/null
