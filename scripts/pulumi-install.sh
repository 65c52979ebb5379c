#!/usr/bin/env bash
# Prints the folder to put on PATH for the Pulumi engine: the user's own `pulumi` when one is on PATH,
# else ../shared/pulumi (built from source) unpacked into .cache/pulumi. Downloads nothing: with
# neither, says so on stderr and exits 1. COLDSTART_PULUMI_SHARED names another folder laid out like
# ../shared/pulumi (its README says how each binary was built from source).
set -euo pipefail
cd "$(dirname "$0")/.."
if p=$(command -v pulumi 2>/dev/null); then
  dirname "$(readlink -f "$p")"
  exit 0
fi
shared=${COLDSTART_PULUMI_SHARED:-../shared/pulumi}
if [ -x "$shared/unpack" ]; then
  exec "$shared/unpack" .cache/pulumi
fi
if [ -x .cache/pulumi/pulumi ] && .cache/pulumi/pulumi version >/dev/null 2>&1; then
  echo "$PWD/.cache/pulumi"   # unpacked earlier, the shared folder gone since
  exit 0
fi
echo "pulumi-install: no pulumi on PATH and no $shared/unpack (see infra/README.md)" >&2
exit 1
