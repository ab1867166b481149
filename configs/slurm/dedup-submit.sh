#!/bin/bash
# Submit the four stages of `llm-prep dedup`, each after the one before succeeded:
#
#   INPUTS='crawl/*.jsonl.zst' OUT=dedup/ configs/slurm/dedup-submit.sh TASKS [sbatch options...]
#
# signatures (TASKS array tasks) -> buckets (BUCKET_TASKS tasks, default 15: the 14 bands and the exact
# pass) -> clusters (one task) -> apply (TASKS array tasks). Prints the four job ids.
set -euo pipefail
tasks=${1:?usage: dedup-submit.sh TASKS [sbatch options...]}
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bucket_tasks=${BUCKET_TASKS:-15}
submit() { local id; id=$(sbatch --parsable --export=ALL "$@"); echo "${id%%;*}"; }  # JOBID[;CLUSTER]
sig=$(STAGE=signatures submit --array="0-$((tasks - 1))" "$@" "$here/dedup-array.sbatch")
buckets=$(STAGE=buckets submit --dependency="afterok:${sig}" --array="0-$((bucket_tasks - 1))" "$@" "$here/dedup-array.sbatch")
clusters=$(submit --dependency="afterok:${buckets}" "$@" "$here/dedup-clusters.sbatch")
apply=$(STAGE=apply submit --dependency="afterok:${clusters}" --array="0-$((tasks - 1))" "$@" "$here/dedup-array.sbatch")
echo "dedup signatures: ${sig} (${tasks} tasks); buckets: ${buckets} (${bucket_tasks}); clusters: ${clusters}; apply: ${apply} (${tasks})"
