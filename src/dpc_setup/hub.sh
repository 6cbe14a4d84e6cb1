#!/usr/bin/env bash
# What `make classroom-test` (src/dpc_maintainer/classroom/) needs beyond the course, installed only
# when missing, under a cache folder (default ~/.cache/dp-course/hub; DPC_HUB_CACHE=dir for another):
#   chromium                      Debian's browser, which Playwright drives as the students (apt, as root)
#   configurable-http-proxy 5.3.0 JupyterHub's proxy (npm install --prefix <cache>/npm; nothing global)
#   <cache>/venv                  the hub's own environment, from /usr/bin/python3 with requirements-classroom.txt
#                                 (JupyterHub, nbgitpuller, Playwright; never `playwright install`)
# A second run checks a stamp and returns at once. The last line of output is the cache folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${DPC_HUB_CACHE:-$HOME/.cache/dp-course/hub}
PYTHON=${DPC_HUB_PYTHON:-/usr/bin/python3}
CHP_VERSION=5.3.0
die() { echo "hub: $*" >&2; exit 1; }
mkdir -p "$CACHE" build
exec 9>"$CACHE/.lock"
flock 9

# The browser: Debian's chromium (Playwright's own downloads are never used), installed as root by
# the course's one apt step (system.sh; its log build/apt.log).
if [ ! -x /usr/bin/chromium ]; then
  DPC_SYSTEM=1 DPC_SYSTEM_BROWSER=1 bash src/dpc_setup/system.sh
  [ -x /usr/bin/chromium ] || die "chromium is missing (as root: apt-get install chromium; see build/apt.log)"
fi

# The proxy, pinned, in the cache's own node_modules.
CHP=$CACHE/npm/node_modules/.bin/configurable-http-proxy
if [ ! -x "$CHP" ] || [ "$(cat "$CACHE/npm/.version" 2>/dev/null)" != "$CHP_VERSION" ]; then
  command -v npm >/dev/null || die "npm is missing (as root: apt-get install npm, or Node.js 18+): the proxy is an npm package"
  echo "hub: installing configurable-http-proxy@$CHP_VERSION (npm, into $CACHE/npm)"
  npm install --prefix "$CACHE/npm" --no-audit --no-fund --loglevel=error "configurable-http-proxy@$CHP_VERSION" \
    >build/hub-npm.log 2>&1 || { tail -n 20 build/hub-npm.log >&2; die "npm install configurable-http-proxy failed (see build/hub-npm.log)"; }
  echo "$CHP_VERSION" > "$CACHE/npm/.version"
fi

# The hub's environment: stamped with the pins it was built from (like src/dpc_setup/setup.sh).
VENV=$CACHE/venv
WANT=$(cat requirements-classroom.txt requirements-hub.txt src/dpc_setup/hub.sh | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.dpc-hub" 2>/dev/null)" != "$WANT" ] || [ ! -x "$VENV/bin/python" ]; then
  [ -x "$PYTHON" ] || die "$PYTHON not found: the hub's environment is built from the system's Python (apt-get install python3-venv)"
  echo "hub: building the hub's environment $VENV (requirements-classroom.txt)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >build/hub-pip.log 2>&1 \
    || { tail -n 20 build/hub-pip.log >&2; die "$PYTHON -m venv failed (apt-get install python3-venv)"; }
  "$VENV/bin/python" -m pip install -q -r requirements-classroom.txt >build/hub-pip.log 2>&1 \
    || { tail -n 20 build/hub-pip.log >&2; die "pip install -r requirements-classroom.txt failed (see build/hub-pip.log)"; }
  echo "$WANT" > "$VENV/.dpc-hub"
fi
chmod a+rx "$CACHE" "$CACHE/npm" 2>/dev/null || true
echo "hub: ready in $CACHE"
