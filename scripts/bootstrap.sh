#!/usr/bin/env bash
# Installs what coldstart needs on a fresh Debian machine (run as root): Debian packages, then a .venv.
# `scripts/bootstrap.sh 3.13` makes .venv-py313 from requirements-py313.lock instead (`make test-py313`);
# with no argument it is .venv on CPython 3.11 from requirements.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

python_version=${1:-3.11}
case "$python_version" in
  3.11) venv=.venv lock=requirements.lock ;;
  3.13) venv=.venv-py313 lock=requirements-py313.lock ;;
  *) echo "bootstrap: no lock for Python $python_version (3.11 or 3.13)" >&2; exit 2 ;;
esac

DEBIAN_PACKAGES=(
  pdns-server pdns-backend-sqlite3   # DNS steering (lab)
  prometheus                         # telemetry the gates read, promtool
  prometheus-blackbox-exporter
  prometheus-pushgateway             # readiness metrics pushed (tests/readiness)
  prometheus-alertmanager            # alert-triggered runs (lab): routes HostPreemptionNotice to coldstart triggers
  redis-server postgresql            # cache and database (lab)
  openssh-server iptables iproute2 util-linux   # lab hosts, firewalls, PID namespaces
  chromium                           # browser test of the Temporal Web UI
)

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  [[ "$pkg" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # Packaged daemons must not start system-wide instances: the lab and tests start their own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

# The interpreter: $PYTHON, else the first pythonX.Y that runs (on PATH, then pyenv's versions: a pyenv shim
# on PATH fails when that version is not the selected one), else python3 for 3.11.
find_python() {
  local candidate
  for candidate in "$(command -v "python$1" || true)" /usr/bin/python"$1" /usr/local/bin/python"$1" \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python"$1"; do
    [[ -n "$candidate" && -x "$candidate" ]] && "$candidate" -c '' 2>/dev/null && { echo "$candidate"; return; }
  done
  [[ "$1" == 3.11 ]] && command -v python3
}
if [[ -z "${PYTHON:-}" ]] && ! PYTHON=$(find_python "$python_version"); then
  echo "bootstrap: no Python $python_version found (install it, or name it: PYTHON=/path/to/python$python_version)" >&2
  exit 1
fi

# The Python packages are exactly those of the lock (pinned, hash-checked: what CI tested;
# `make lock` regenerates both locks from pyproject.toml), then the project itself, editable. The stamp
# follows these files, so a changed lock or pyproject re-installs an existing venv in place.
stamp=$venv/.installed-$(cat pyproject.toml "$lock" requirements-tools.lock | sha256sum | cut -c1-16)
if [[ ! -f "$stamp" ]]; then
  if [[ -x $venv/bin/python ]]; then
    echo "bootstrap: installing $lock into the existing $venv"
  else
    echo "bootstrap: creating $venv with $PYTHON"
    "$PYTHON" -m venv "$venv"
  fi
  # pip and setuptools from requirements-tools.lock, hash-checked like the rest; the editable install is
  # built with that setuptools (no build isolation: nothing unpinned is fetched for it). uv (pinned in
  # requirements-tools.lock; scripts/uv.sh, shared with `make lock`) installs them: it fetches
  # and unpacks the 1.2 GB in parallel, 15 to 25 s where pip took about a minute; it copies from its cache
  # (~/.cache/uv) rather than hardlinking, so a .venv's files are its own. pip is the fallback.
  grep -E '^(pip|setuptools)==' requirements-tools.lock > "$venv/.tools.txt"
  if uv=$(PYTHON=$PYTHON scripts/uv.sh); then
    [[ -n "${PIP_CERT:-}" && -z "${SSL_CERT_FILE:-}" ]] && export SSL_CERT_FILE=$PIP_CERT  # pip's CA bundle for uv too
    "$uv" pip install -q --link-mode=copy --python "$venv/bin/python" --require-hashes --no-deps -r "$venv/.tools.txt" -r "$lock"
    "$uv" pip install -q --link-mode=copy --python "$venv/bin/python" --no-deps --no-build-isolation -e .
  else
    echo "bootstrap: no uv from requirements-tools.lock; installing with pip"
    "$venv/bin/pip" install -q --require-hashes --no-deps -r "$venv/.tools.txt"
    "$venv/bin/pip" install -q --require-hashes --no-deps -r "$lock"
    "$venv/bin/pip" install -q --no-deps --no-build-isolation -e .
  fi
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
