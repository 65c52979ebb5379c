#!/usr/bin/env bash
# Installs what coldstart needs on a fresh Debian machine (run as root): Debian packages, then a .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  pdns-server pdns-backend-sqlite3   # DNS steering (lab)
  prometheus                         # telemetry the gates read, promtool
  prometheus-blackbox-exporter
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

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -f "$stamp" ]]; then
  echo "bootstrap: creating .venv with $PYTHON"
  [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
