#!/usr/bin/env bash
# Creates (or refreshes) the Python venv the serve tests and load generator run in:
# .venv-serve/ with the pinned packages of tests/serve/requirements.txt (from PyPI).
# Prints the venv's python on the last line. `--plot` also installs matplotlib (bench/plot_serve.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${DHS_SERVE_VENV:-$root/.venv-serve}"
req="$root/tests/serve/requirements.txt"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c "import ensurepip" >/dev/null 2>&1; then
    # Debian's python3 has no venv/ensurepip without python3-venv.
    echo "installing python3-venv" >&2
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo_cmd apt-get update -q >&2
    $sudo_cmd apt-get install -y -q --no-install-recommends python3-venv >&2
  fi
  "$py" -m venv "$venv" >&2
fi

# Reinstall only when the pins change.
want="$(sha256sum "$req" | cut -d' ' -f1)"
[ "${1:-}" = "--plot" ] && want="$want+plot"
stamp="$venv/.dhs-requirements"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  if [ "${1:-}" = "--plot" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check matplotlib==3.10.8 >&2 \
      || echo "matplotlib not installed: bench/plot_serve.py will skip" >&2
  fi
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
