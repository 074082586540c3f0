#!/usr/bin/env bash
# Issue 34's GPU results (hack/gpu/issue34.py), each phase in one device call, in the order given:
#
#   bash hack/gpu/issue34.sh WHEELS PHASE...
#
# WHEELS: the folder `python3 hack/gpu/peer_wheels.py` wrote; its `kubetune` set and its bitsandbytes
# wheel (trimmed to the CUDA 13.0 library) go into one --target folder. PHASE:
#   check  bitsandbytes' NF4 layer on this GPU, and the kernel tests (tests/gpu/test_gpu_kernels.py -k $TESTS_K: fp32)
#   qlora  Qwen3-4B QLoRA by kubetune, then TRL + bitsandbytes, both capped at $CAP_GIB (24)
#   lora   Qwen3-4B plain LoRA by kubetune, the same cap and data (the loss curve's other line)
#   moe    the small Qwen3-MoE, full fine-tuning, against the preparation's estimate (rerun uncompiled
#          if the compiled run fails)
# Each case gets at most its own limit and what is left of $BUDGET seconds; after each, the results
# and logs go to $OUT/issue34.tar.gz.
set -uo pipefail
W=${1:?the wheels folder}; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "$W"/kubetune/*.whl "$W"/unsloth/bitsandbytes-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/api:$PWD/operator:$PWD/trainer:$PWD/cli:$PWD/bench PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/issue34; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
left() { local rest=$((${BUDGET:-580} - SECONDS)); echo $((rest < $1 ? rest : $1)); }
snap() { tar czf "$OUT/issue34.tar.gz" -C /tmp issue34; }
one() {  # LIMIT NAME issue34.py-arguments...
  local t; t=$(left "$1"); local name=$2; shift 2
  if [ "$t" -lt 40 ]; then echo "[issue34] no time left for $name"; return 1; fi
  timeout "$t" python3 hack/gpu/issue34.py "$@" --out $R > "$R/$name.log" 2>&1; local rc=$?
  echo "[issue34] $name: exit $rc after $SECONDS s"; grep -h '^{"case"\|^\[issue34\]' "$R/$name.log" | cut -c1-1500
  [ $rc -ne 0 ] && grep -h -A3 "Error\|Traceback" "$R/$name.log" | tail -25 | cut -c1-400
  snap; return $rc
}
S="--warmup ${WARMUP:-3} --steps ${STEPS:-27}"
for phase in "$@"; do
  case "$phase" in
    check)
      python3 -c "import torch, transformers, trl, peft, bitsandbytes as bnb, liger_kernel; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__, 'bitsandbytes', bnb.__version__)" 2>&1 | tail -3 | tee -a "$OUT/gpu.txt"
      python3 - <<'EOF' 2>&1 | tail -5 || exit 1
import torch, bitsandbytes as bnb
lin = bnb.nn.Linear4bit(256, 128, compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=True)
lin = lin.cuda(); x = torch.randn(4, 256, device="cuda", requires_grad=True)
y = lin(x); y.sum().backward(); print("bitsandbytes NF4 forward/backward ok", tuple(y.shape), y.dtype)
EOF
      timeout $(left 90) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_kernels.py -k "${TESTS_K:-fp32}" > $R/tests.log 2>&1; tail -4 $R/tests.log; snap ;;
    qlora)
      one "${T_QLORA:-240}" kubetune-qlora qlora --runner kubetune --quant nf4 --cap-gib "${CAP_GIB:-24}" $S
      one "${T_QLORA:-240}" trl-qlora qlora --runner trl --quant nf4 --cap-gib "${CAP_GIB:-24}" $S ;;
    lora) one "${T_LORA:-150}" kubetune-lora qlora --runner kubetune --quant none --cap-gib "${CAP_GIB:-24}" $S ;;
    moe)
      M="--warmup ${MOE_WARMUP:-3} --steps ${MOE_STEPS:-8}"
      one "${T_MOE:-200}" moe moe $M || one "${T_MOE:-200}" moe-nocompile moe --no-compile $M ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
python3 hack/gpu/issue34.py report --out $R 2>&1 | tail -12
