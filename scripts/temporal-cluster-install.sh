#!/usr/bin/env bash
# Builds Temporal's server and SQL tool from source with Go, once per machine, into a cache outside
# the repo, with the PostgreSQL schemas beside them; prints the bin dir. Nothing prebuilt is fetched.
#   COLDSTART_TEMPORAL_CACHE  cache root (default /var/cache/coldstart/temporal-server)
#   GO                        the go binary (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

# v1.32.2 needs a newer Go than this machine kind has (1.26.8); runtime/cluster.py runs this script, so this is the one pin.
VERSION=v1.32.1
CACHE=${COLDSTART_TEMPORAL_CACHE:-/var/cache/coldstart/temporal-server}
DIR=$CACHE/$VERSION
BIN=$DIR/bin

installed() {
  [[ -x $BIN/temporal-server && -x $BIN/temporal-sql-tool && -d $DIR/schema/postgresql/v12 ]] || return 1
  # Both print "... version 1.32.1"; a binary of another version (or a half-copied one) is rebuilt.
  "$BIN/temporal-server" --version 2>/dev/null | grep -qF " ${VERSION#v}" &&
    "$BIN/temporal-sql-tool" --version 2>/dev/null | grep -qF " ${VERSION#v}"
}

if installed; then
  echo "$BIN"
  exit 0
fi

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [[ ! -x $GO ]]; then
  echo "temporal-cluster-install: no Go toolchain (looked for go on PATH and /usr/local/go/bin/go)" >&2
  exit 3
fi

mkdir -p "$CACHE"
# One build at a time per machine: a second caller waits, then finds the binaries there.
exec 9>"$CACHE/.lock"
flock 9
if installed; then
  echo "$BIN"
  exit 0
fi

started=$SECONDS
work=$(mktemp -d "$CACHE/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "temporal-cluster-install: building Temporal server $VERSION with $($GO version) (once per machine)" >&2
# Go's module and build caches stay in their default places, so a rebuild after a wipe is cheap.
# GOTOOLCHAIN=local: never fetch a prebuilt Go toolchain, build with the one installed.
export GOBIN=$work/bin GOTOOLCHAIN=local GOFLAGS=
(cd "$work" && "$GO" install "go.temporal.io/server/cmd/server@$VERSION" && \
  "$GO" install "go.temporal.io/server/cmd/tools/sql@$VERSION") >&2
mv "$work/bin/server" "$work/bin/temporal-server"
mv "$work/bin/sql" "$work/bin/temporal-sql-tool"

# The versioned schema dirs ship in the module source; copied so running never needs the module cache.
src=$("$GO" env GOMODCACHE)/go.temporal.io/server@$VERSION/schema/postgresql/v12
mkdir -p "$work/schema/postgresql"
cp -r "$src" "$work/schema/postgresql/v12"
chmod -R u+w,go+rX "$work"

rm -rf "$DIR"
mv "$work" "$DIR"
trap - EXIT
installed || { echo "temporal-cluster-install: $BIN does not report version $VERSION" >&2; exit 1; }
echo "temporal-cluster-install: built in $((SECONDS - started)) s into $BIN" >&2
echo "$BIN"
