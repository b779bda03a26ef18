# The seckill binary in a small image. Used by docker-compose.yml.
# scripts/container.sh (run by CI) lays out exactly the paths copied below
# and builds the binary from them with --locked, so a path missing here
# fails CI, not a user's `docker compose up`.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY migrations migrations
COPY lua lua
COPY redis-locks redis-locks
COPY lab lab
# Workspace members: cargo reads their manifests (and sources) to resolve
# the workspace, though the service's binary uses neither.
COPY loadtest loadtest
COPY testkit testkit
RUN cargo build --release --locked --bin seckill

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/seckill /usr/local/bin/seckill
ENV SECKILL_ADDR=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["seckill"]
CMD ["serve"]
