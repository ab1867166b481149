#!/usr/bin/env bash
# Run pytest under each CPU kernel level PyTorch offers on x86-64, one level after another, so that a
# tolerance tuned to one CPU's kernels shows up here rather than on a user's machine (docs/cpu-kernels.md).
#
#   tests/kernel_levels.sh                         # every level, the whole suite
#   tests/kernel_levels.sh avx2 default -- -m numerics   # the named levels, the marked tests
#   tests/kernel_levels.sh --quick default         # the quick equivalences only (what `make test` adds)
#   tests/kernel_levels.sh --list                  # the levels and their settings
#
# A level caps the three libraries that choose kernels at run time: ATen's own vectorized kernels
# (elementwise, reductions, softmax: ATEN_CPU_CAPABILITY), oneDNN (bf16 matmuls and convolutions:
# ONEDNN_MAX_CPU_ISA) and MKL (fp32 matmuls: MKL_ENABLE_INSTRUCTIONS). "native" caps nothing: on a CPU
# with AVX-512 and bf16 instructions it is what `make test` runs. A level above what the CPU has is
# skipped (torch would silently run a lower one).
set -uo pipefail

declare -A LEVEL=(
  [native]=""
  [avx512]="ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE MKL_ENABLE_INSTRUCTIONS=AVX512"
  [avx2]="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
  [default]="ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2"
)
ORDER=(native avx512 avx2 default)
# What torch.backends.cpu.get_cpu_capability() reports when the level is in force.
declare -A REPORTS=([avx512]=AVX512 [avx2]=AVX2 [default]=DEFAULT)

# The marked tests that run in a few seconds each: logits, losses and gradients against transformers,
# DPO against TRL, conversions, the optimizers' maths, and Muon's bf16 Newton-Schulz across two ranks.
QUICK=(-m numerics tests/model tests/ckpt/test_convert.py tests/train/tasks/test_dpo_loss.py
  tests/train/tasks/test_sft.py tests/train/test_optimizers.py::test_lion_is_the_papers_update
  tests/train/test_optimizers.py::test_muon_is_torch_muon_on_matrices_and_adamw_elsewhere
  tests/train/test_optimizers.py::test_two_ranks_equal_one_with_twice_the_accumulation)

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}

levels=()
quick=0
while (($#)); do
  case $1 in
    --quick) quick=1; shift ;;
    --list) for l in "${ORDER[@]}"; do printf '%-8s %s\n' "$l" "${LEVEL[$l]:-(nothing capped)}"; done; exit 0 ;;
    --) shift; break ;;
    *) [[ -v LEVEL[$1] ]] || { echo "kernel_levels.sh: unknown level '$1' (one of: ${ORDER[*]})" >&2; exit 2; }
       levels+=("$1"); shift ;;
  esac
done
((${#levels[@]})) || levels=("${ORDER[@]}")
args=("$@")
((quick)) && args=("${QUICK[@]}" "${args[@]}")
# No pytest arguments: the whole suite as `make test` runs it, the parallel part then the serial one.
runs=("${args[*]@Q}")
if ((${#args[@]} == 0)); then
  common="--timeout=1500 --durations=10 -p no:cacheprovider"
  runs=("$common -n ${JOBS:-auto} --dist loadfile -m 'not serial' tests" "$common -m serial tests")
fi

status=0
for level in "${levels[@]}"; do
  read -ra settings <<<"${LEVEL[$level]}"
  got=$(env "${settings[@]}" "$PY" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')
  if [[ -n ${REPORTS[$level]:-} && $got != "${REPORTS[$level]}" ]]; then
    echo "== $level: skipped, this CPU runs $got at most"
    continue
  fi
  echo "== $level: torch runs $got kernels; ${LEVEL[$level]:-nothing capped}"
  # torch.compile's CPU kernels are cached by what they compute, not by the instruction set they were
  # built for: a cache filled at one level gave NaN losses and out-of-bounds kernels at another (avx2
  # after native). A user's machine keeps one level; here each level gets a fresh cache of its own.
  inductor_cache=$(mktemp -d "${TMPDIR:-/tmp}/llmtools-inductor-$level.XXXXXX")
  settings+=("TORCHINDUCTOR_CACHE_DIR=$inductor_cache")
  start=$SECONDS
  for run in "${runs[@]}"; do
    eval "env \"\${settings[@]}\" \"\$PY\" -m pytest $run"
    rc=$?
    echo "== $level: pytest $run: exit $rc"
    ((rc == 0)) || status=$rc
  done
  rm -rf "$inductor_cache"
  echo "== $level: done in $((SECONDS - start)) s"
done
exit $status
