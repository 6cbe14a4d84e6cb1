#!/bin/bash
# A student's JupyterLab as a SLURM job: the batch script batchspawner's SlurmSpawner submits (as the student,
# with sbatch) for the hub of src/dpc_instructor/hub/jupyterhub_config.py, DPC_HUB_SPAWNER=slurm. Jinja2;
# batchspawner fills in what the config sets: nprocs (DPC_HUB_CPU, whole cores), memory (DPC_HUB_MEM),
# runtime (DPC_HUB_TIME), gres (DPC_HUB_GPUS: gpu:N), partition (DPC_HUB_PARTITION), and cmd, the server.
# Everything the student's kernels and launches (torchrun, 2 ranks) do runs inside this job's allocation.
#SBATCH --job-name=jupyterhub-{{username}}
#SBATCH --output={{homedir}}/.jupyterhub-slurm-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --nodes=1
#SBATCH --no-requeue
#SBATCH --ntasks=1
#SBATCH --cpus-per-task={{nprocs}}
{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if gres %}#SBATCH --gres={{gres}}
{% endif %}{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
set -euo pipefail
trap 'echo "jupyterhub-{{username}}: SIGTERM (the hub stopped the server, or the time limit)"' TERM
# Shared storage: the home (the student's notebooks) and nbgrader's exchange must be visible on every node.
for d in "{{homedir}}" "${DPC_EXCHANGE:-/srv/nbgrader/exchange}"; do
  if [ ! -d "$d" ]; then
    echo "jupyterhub-{{username}}: node $(hostname) (SLURM ${SLURMD_NODENAME:-?}) cannot see $d: homes and the exchange must be on storage every node mounts" >&2
    exit 1
  fi
done
{{prologue}}
srun --cpus-per-task={{nprocs}} {{cmd}}
{{epilogue}}
