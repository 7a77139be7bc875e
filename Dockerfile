# tidegate container image: a multi-stage build, a small non-root runtime.
#   docker build -t tidegate .
#   docker run -p 8787:8787 -v $PWD/deploy/tidegate.yaml:/etc/tidegate/tidegate.yaml:ro \
#     -e TIDEGATE_CLIENT_KEY=... -e OPENAI_API_KEY=... -e TIDEGATE_ADMIN_KEY=... tidegate
# The config is a mounted file; secrets come from the environment through
# its ${VAR} references. See README "Deploying".

FROM docker.io/library/rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY gateway ./gateway
COPY simulate ./simulate
COPY examples/try.yaml ./examples/try.yaml
RUN cargo build --release --locked --bin tidegate \
 && strip target/release/tidegate

FROM docker.io/library/debian:bookworm-slim
# CA roots for https upstreams; nothing else (the health check is the
# binary itself).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/tidegate --create-home tidegate
COPY --from=build /src/target/release/tidegate /usr/local/bin/tidegate
USER 10001:10001
WORKDIR /var/lib/tidegate
EXPOSE 8787
ENV RUST_LOG=info
# SIGTERM: /healthz turns 503, in-flight requests get shutdown_grace.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["tidegate", "healthcheck", "--url", "http://127.0.0.1:8787/healthz"]
ENTRYPOINT ["tidegate", "serve", "--config", "/etc/tidegate/tidegate.yaml"]
