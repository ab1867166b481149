#!/bin/bash
# Submit the tokenization array and its dependent merge:
#
#   INPUTS='corpus/*.jsonl.zst' OUT=data/web TOKENIZER=tok/ JSON2BIN_ARGS=--append-eod \
#       configs/slurm/json2bin-submit.sh TASKS [sbatch options for both jobs...]
#
# TASKS array tasks (one shard each), then json2bin-merge.sbatch once every task succeeded. Prints both job ids.
set -euo pipefail
tasks=${1:?usage: json2bin-submit.sh TASKS [sbatch options...]}
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
array=$(sbatch --parsable --export=ALL --array="0-$((tasks - 1))" "$@" "$here/json2bin-array.sbatch")
array=${array%%;*}  # --parsable prints JOBID[;CLUSTER]
merge=$(sbatch --parsable --export=ALL --dependency="afterok:${array}" "$@" "$here/json2bin-merge.sbatch")
echo "json2bin array: ${array} (${tasks} tasks); merge: ${merge%%;*} (after the array succeeds)"
