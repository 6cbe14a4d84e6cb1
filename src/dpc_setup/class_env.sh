#!/usr/bin/env bash
# The class environment: one course environment for every user of a node (a JupyterHub class),
# at PREFIX/env, readable and runnable by all, built from a Python every user can run.
#
#   make class-env [PREFIX=/opt/dp-course] [PYTHON=/usr/bin/python3]
#
# It holds the pinned packages (requirements.txt), the hub's (requirements-hub.txt: the single-user
# server and nbgitpuller), Horovod, and console scripts any user can start (jupyter, nbgrader,
# torchrun, horovodrun). It does not hold the course's own packages: each student's copy of the course
# is on PYTHONPATH (its Makefile does that; a hub sets it per user: book/guide/hub.md), so a
# student runs the helpers of the release they pulled. Students' `make lab`/`make check` use it when
# DPC_PYTHON=PREFIX/env/bin/python is set (the hub sets it) and build nothing.
# Its JupyterLab is the students' (student_lab_config below): nbgrader's instructor panels and
# JupyterLab's news pop-up are off for every user.
# Idempotent (src/dpc_setup/setup.sh's stamp) and safe to start twice at once (a lock in PREFIX).
#
#   bash src/dpc_setup/class_env.sh --student-lab-config ENV   # that step alone, on the environment ENV
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-/usr/bin/python3}
die() { echo "class-env: $*" >&2; exit 1; }

# The students' JupyterLab, set in the environment's own Jupyter config folder (ENV/etc/jupyter, the
# sys-prefix level every user's server reads; merged into what is there, so a rerun changes nothing):
# * nbgrader's instructor panels off: "Create Assignment" (the side panel that marks a notebook's
#   cells for grading) and the formgrader; the Assignments tab (assignment-list) and validation stay;
# * the "get notified about official Jupyter news?" pop-up off: the plugin that asks
#   (@jupyterlab/apputils-extension:announcements), and its settings say "never" (fetchNews "false",
#   no update check) should anything else read them.
# Both are JupyterLab 4's own mechanisms: labconfig/page_config.json's disabledExtensions (what
# `jupyter labextension disable --level=sys_prefix` writes), locked so that a student's plugin manager
# cannot turn them back on, and labconfig/default_setting_overrides.json (defaults for every user).
STUDENTS_OFF=(@jupyter/nbgrader:create-assignment @jupyter/nbgrader:formgrader
              @jupyterlab/apputils-extension:announcements)
student_lab_config() {  # $1: the environment's folder
  mkdir -p "$1/etc/jupyter/labconfig"
  "$PYTHON" - "$1/etc/jupyter/labconfig" "${STUDENTS_OFF[@]}" <<'EOF'
import json
import sys
from pathlib import Path

folder, off = Path(sys.argv[1]), sys.argv[2:]


def merge(name: str, update: dict) -> None:
    path = folder / name
    data = json.loads(path.read_text()) if path.is_file() and path.stat().st_size else {}
    for key, value in update.items():
        have = data.get(key) or {}
        data[key] = {**(dict.fromkeys(have, True) if isinstance(have, list) else have), **value}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


merge("page_config.json", {"disabledExtensions": dict.fromkeys(off, True),
                           "lockedExtensions": dict.fromkeys(off, True)})
merge("default_setting_overrides.json", {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}})
EOF
  # nbgrader's course id and exchange for every user of the environment (the Assignments tab, the
  # students' `make submit`, the instructor's nbgrader commands): read from the hub's variables
  # DPC_COURSE_ID and DPC_EXCHANGE, which the hub passes to every server (jupyterhub_config.py).
  cat >"$1/etc/jupyter/nbgrader_config.py" <<'EOF'
# Written by src/dpc_setup/class_env.sh: the class's nbgrader settings, for every user of this environment.
import os

c = get_config()  # noqa: F821 (traitlets' config loader defines it)
c.CourseDirectory.course_id = os.environ.get("DPC_COURSE_ID", "dp-course")
c.Exchange.root = os.environ.get("DPC_EXCHANGE", "/srv/nbgrader/exchange")
EOF
  chmod -R a+rX "$1/etc/jupyter"
  echo "class-env: the students' JupyterLab has these off for every user: ${STUDENTS_OFF[*]}"
}

if [ "${1:-}" = --student-lab-config ]; then
  student_lab_config "${2:?usage: class_env.sh --student-lab-config ENV}"
  exit 0
fi
PREFIX=${1:?usage: class_env.sh PREFIX}

case "$PREFIX" in /*) ;; *) die "PREFIX must be an absolute path (got $PREFIX)";; esac
command -v "$PYTHON" >/dev/null || die "$PYTHON not found: give PYTHON=<a Python 3.10-3.12 every user can run>"
PYTHON=$(command -v "$PYTHON")
# Every user must be able to run the base Python and to walk down to PREFIX.
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
  setpriv --reuid nobody --regid "$(id -g nobody)" --clear-groups "$PYTHON" -c "import venv, ensurepip" 2>/dev/null \
    || die "$PYTHON cannot be run by other users (or lacks venv/ensurepip): a Python under a private home \
(pyenv in /root) is not; use the system's (apt-get install python3-venv) with PYTHON=/usr/bin/python3"
fi
mkdir -p "$PREFIX"
chmod a+rx "$PREFIX"
dir=$PREFIX
while [ "$dir" != / ]; do
  dir=$(dirname "$dir")
  [ "$(( $(stat -c %a "$dir" | sed 's/^.*\(.\)$/\1/') & 1 ))" = 1 ] \
    || die "$dir is not open to other users (mode $(stat -c %a "$dir")): choose a PREFIX every user can reach"
done

exec 9>"$PREFIX/.lock"
flock 9
umask 022
mkdir -p build
DPC_VENV="$PREFIX/env" DPC_EXTRA_REQUIREMENTS=requirements-hub.txt DPC_SETUP_LOG=build/class-env.log \
  PYTHON="$PYTHON" bash src/dpc_setup/setup.sh
student_lab_config "$PREFIX/env"
chmod -R a+rX "$PREFIX/env"

# Proof that another user can use it: the frameworks import (after a build only: 15-30 s; the check's
# own stamp, .dpc-class-env, says it passed for this build).
if [ "$(cat "$PREFIX/env/.dpc-class-env" 2>/dev/null)" = "$(cat "$PREFIX/env/.dpc-setup")" ]; then
  echo "class-env: $PREFIX/env is ready for every user: DPC_PYTHON=$PREFIX/env/bin/python"
  exit 0
fi
MODULES="torch, tensorflow, nbgrader, jupyterhub, nbgitpuller$([ "${DPC_HOROVOD:-1}" = 0 ] || echo ", horovod.torch")"
CHECK=("$PREFIX/env/bin/python" -c "import $MODULES")
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
  CHECK=(setpriv --reuid nobody --regid "$(id -g nobody)" --clear-groups env HOME=/tmp "${CHECK[@]}")
fi
"${CHECK[@]}" >/dev/null 2>"build/class-env.check" || { cat build/class-env.check >&2; die "the environment does not import as another user"; }
cp "$PREFIX/env/.dpc-setup" "$PREFIX/env/.dpc-class-env"
echo "class-env: $PREFIX/env is ready for every user: DPC_PYTHON=$PREFIX/env/bin/python"
