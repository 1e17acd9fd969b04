# syntax=docker/dockerfile:1
#
# sharelimit's container image: one static binary on distroless, run as a
# non-root user.
#
#   docker build -t sharelimit --build-arg VERSION=$(git describe --always) .
#   docker run --rm -v "$PWD/examples/config:/etc/sharelimit/config:ro" sharelimit
#
# It also runs where envoyproxy/ratelimit's image ran, unchanged: upstream's
# compose files and manifests run /bin/ratelimit, which is here too (a link to
# /sharelimit), and the command sets no flag, so upstream's variables
# (RUNTIME_ROOT, ...) decide where the rules are. The image's own defaults are
# SHARELIMIT_* variables below, which upstream's manifests never set. Run as
# /bin/ratelimit, or with upstream's variables, the daemon listens where
# upstream's did, 0.0.0.0:8081, :8080 and :6070, each logged at WARN; with
# none of them it listens on loopback, to share a network namespace with Envoy
# (compose's network_mode: "service:envoy", or two containers of one pod).
#
# No descriptors are baked in: mount a directory at /etc/sharelimit/config
# (or where RUNTIME_ROOT points). Until one is there, `serve` refuses to start
# and names the missing directory.

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so a source edit does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
# CGO off: a static binary, which distroless/static (no libc) needs.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
    -o /out/sharelimit ./cmd/sharelimit
# The state directory, to be owned by the image's user, and upstream's command
# as a link to the binary (distroless has no shell to make either there).
RUN mkdir -p /out/state /out/bin && ln -s /sharelimit /out/bin/ratelimit

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sharelimit /sharelimit
COPY --from=build /out/bin/ /bin/
COPY --from=build --chown=65532:65532 /out/state /var/lib/sharelimit
# The buckets, saved on shutdown and every 10s and restored on start, so a
# restart hands out no fresh burst. Mount a volume here to keep them across
# containers.
VOLUME ["/var/lib/sharelimit"]
ENV SHARELIMIT_STATE_FILE=/var/lib/sharelimit/state SHARELIMIT_STATE_INTERVAL=10s
# distroless's "nonroot" user, by number: Kubernetes' runAsNonRoot can only
# verify a numeric USER.
USER 65532:65532
# The image has no shell or curl: the binary probes itself, at the address
# serve listens on (it reads the same flags and variables).
HEALTHCHECK --interval=10s --timeout=3s CMD ["/sharelimit", "healthcheck"]
ENTRYPOINT ["/sharelimit"]
CMD ["serve"]
