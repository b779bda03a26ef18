#!/usr/bin/env bash
# The container path, checked without a Docker engine (none runs where this
# project is built and tested):
#   1. the paths the Dockerfile's build stage copies are exactly the ones
#      .dockerignore lets into the build context;
#   2. those paths, laid out alone in an empty folder as the image's /src,
#      resolve (`cargo metadata --locked`) and build the seckill binary
#      (`cargo build --locked --bin seckill`, sharing this checkout's target
#      folder so that only the workspace's own crates compile again);
#   3. docker-compose.yml validates against the Compose Specification's
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
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" cargo build --quiet --locked --bin seckill
echo "container: the copied paths build the seckill binary (cargo build --locked)" >&2
cd "$root"

if ! python3 -c 'import jsonschema, yaml' 2>/dev/null; then
    echo "container: installing jsonschema and PyYAML" >&2
    python3 -m pip install --quiet --disable-pip-version-check jsonschema pyyaml
fi
python3 scripts/compose_check.py
