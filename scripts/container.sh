#!/usr/bin/env bash
# The container path, checked without a Docker engine (none runs where this
# project is built and tested):
#   1. the paths the Dockerfile's build stage copies are exactly the ones
#      .dockerignore lets into the build context;
#   2. those paths, laid out alone in an empty folder as the image's /src,
#      resolve (`cargo metadata --locked`) and build the seckill binary
#      (`cargo build --locked --bin seckill`, sharing this checkout's target
#      folder so that only the workspace's own crates compile again);
#   3. that binary, built without features as the image builds it, holds
#      none of the lab and refuses SECKILL_LAB=1;
#   4. docker-compose.yml validates against the Compose Specification's
#      schema, names only files that exist, and pins every image
#      (scripts/compose_check.py).
# What it does not check: that the base images pull, that apt-get inside
# them works, or that the containers start and talk to each other.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

# Sources of the build stage's COPY lines (not COPY --from=...), without the
# destination: `COPY a b ./` copies a and b.
copied=()
while read -r line; do
    read -ra words <<<"$line"
    [[ "${words[1]}" == --from=* ]] && continue
    copied+=("${words[@]:1:${#words[@]}-2}")
done < <(grep -E '^COPY ' Dockerfile)
echo "container: the Dockerfile copies ${copied[*]}" >&2

allowed=()
while read -r line; do allowed+=("${line#!}"); done < <(grep -E '^![^*]' .dockerignore)
if [ "$(printf '%s\n' "${copied[@]}" | sort)" != "$(printf '%s\n' "${allowed[@]}" | sort)" ]; then
    echo "container: FAIL .dockerignore lets in ${allowed[*]}, the Dockerfile copies ${copied[*]}" >&2
    exit 1
fi

layout="$(mktemp -d)"
trap 'rm -rf "$layout"' EXIT
for path in "${copied[@]}"; do
    if [ ! -e "$path" ]; then
        echo "container: FAIL the Dockerfile copies $path, which does not exist" >&2
        exit 1
    fi
    mkdir -p "$layout/$(dirname "$path")"
    # As `docker build` would: the context without what .dockerignore drops.
    tar -C "$root" --exclude=target --exclude='*.rs.bk' -cf - "$path" | tar -C "$layout" -xf -
done
cd "$layout"
cargo metadata --locked --format-version 1 >/dev/null
echo "container: the copied paths resolve (cargo metadata --locked)" >&2
target="${CARGO_TARGET_DIR:-$root/target}"
CARGO_TARGET_DIR="$target" cargo build --quiet --locked --bin seckill
echo "container: the copied paths build the seckill binary (cargo build --locked)" >&2
cd "$root"

# The image builds with the Dockerfile's command, in release; the same
# features give a debug binary with the same code, so this checks that one
# (a release build of every dependency would cost CI minutes, not coverage).
binary="$target/debug/seckill"
if grep -q "lab_vouchers" "$binary"; then
    echo "container: FAIL the image's seckill binary contains the lab" >&2
    exit 1
fi
nolab="$(SECKILL_LAB=1 SECKILL_ADDR=127.0.0.1:0 SECKILL_ADMIN_TOKEN=ci \
    timeout 20 "$binary" serve 2>&1 || true)"
if ! grep -q "this binary has no lab" <<<"$nolab"; then
    echo "container: FAIL the image's seckill binary did not refuse SECKILL_LAB=1: $nolab" >&2
    exit 1
fi
echo "container: the image's binary has no lab and refuses SECKILL_LAB=1" >&2

if ! python3 -c 'import jsonschema, yaml' 2>/dev/null; then
    echo "container: installing jsonschema and PyYAML" >&2
    python3 -m pip install --quiet --disable-pip-version-check jsonschema pyyaml
fi
python3 scripts/compose_check.py
