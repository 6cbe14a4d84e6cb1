#!/usr/bin/env bash
# System packages the course uses beyond Python, installed from Debian's archive when missing:
#   bubblewrap        the sandbox every graded notebook runs in (src/dpc_runtime/sandbox.py)
#   slurm-wlm, munge  a two-node SLURM cluster on this machine (src/dpc_setup/cluster.py, `make cluster-test`)
# Run by src/dpc_setup/setup.sh (so by every make target). It installs only as root on a machine with apt
# (a CI runner, a container, a course's grading box). Elsewhere it installs nothing and prints one
# line naming what is missing: `make grade` then refuses (or runs unsandboxed with
# DPC_SANDBOX=off), and the SLURM tests skip with that reason.
# DPC_SYSTEM=0 skips this step. DPC_SYSTEM_BROWSER=1 adds chromium, the browser the tests drive: the
# students of `make classroom-test` (src/dpc_setup/hub.sh) and the instructor's report (`make test`,
# tests/test_report.py).
set -euo pipefail
[ "${DPC_SYSTEM:-1}" = 0 ] && exit 0
declare -A WANT=([bwrap]=bubblewrap [slurmctld]=slurm-wlm [munged]=munge)
[ "${DPC_SYSTEM_BROWSER:-0}" = 1 ] && WANT[chromium]=chromium
missing=()
for cmd in "${!WANT[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("${WANT[$cmd]}")
done
[ ${#missing[@]} = 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing system packages: ${missing[*]} (apt, about a minute)"
  mkdir -p build
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >build/apt.log 2>&1; then
    tail -n 20 build/apt.log >&2
    echo "setup: could not install ${missing[*]} (see build/apt.log); grading needs bubblewrap" >&2
  fi
else
  # The reader here is a student or a self-learner: say what each missing package costs them.
  why=()
  [[ " ${missing[*]} " == *" bubblewrap "* ]] && why+=("without bubblewrap \`make check\` runs your notebook outside the grader's sandbox")
  [[ " ${missing[*]} " == *" slurm-wlm "* || " ${missing[*]} " == *" munge "* ]] && why+=("\`make cluster-test\` (chapter 8's SLURM cluster) needs slurm-wlm and munge")
  [[ " ${missing[*]} " == *" chromium "* ]] && why+=("the tests' browser is chromium")
  echo "setup: optional system packages not installed: ${missing[*]} ($(IFS=';'; echo "${why[*]}" | sed 's/;/; /g'); root installs them: apt-get install ${missing[*]})"
fi
