#!/usr/bin/env bash
# Prints the path of the pinned uv (requirements-tools.lock) in .cache/lock-tool, its own venv (never .venv),
# making it first when it is missing or another version; fails, saying why, when it cannot.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=.cache/lock-tool
want=$(sed -n 's/^uv==\([^ ]*\) .*/\1/p' requirements-tools.lock)
if ! { [[ -x $tool/bin/uv ]] && $tool/bin/uv --version 2>/dev/null | grep -qF " $want "; }; then
  rm -rf "$tool"
  "${PYTHON:-$(command -v python3.11 || command -v python3)}" -m venv "$tool" >&2
  grep -E '^uv==' requirements-tools.lock > "$tool/uv.txt"
  "$tool/bin/pip" install -q --require-hashes --no-deps -r "$tool/uv.txt" >&2
fi
echo "$PWD/$tool/bin/uv"
