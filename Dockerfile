# syntax=docker/dockerfile:1
#
# sharelimit's container image: one static binary on distroless, run as a
# non-root user.
#
#   docker build -t sharelimit --build-arg VERSION=$(git describe --always) .
#   docker run --rm -v "$PWD/examples/config:/etc/sharelimit/config:ro" sharelimit
#
# The daemon listens on loopback by default, and that stays right inside a
# container: it is meant to share a network namespace with Envoy (compose's
# network_mode: "service:envoy", or two containers of one Kubernetes pod), not to
# be reached across a container network. So the image EXPOSEs nothing.
#
# No descriptors are baked in: mount a directory at /etc/sharelimit/config. Until
# one is there, `serve` refuses to start and names the missing directory.

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
# The state directory, to be owned by the image's user (distroless has no shell
# to make it there).
RUN mkdir -p /out/state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sharelimit /sharelimit
COPY --from=build --chown=65532:65532 /out/state /var/lib/sharelimit
# The buckets, saved on shutdown and every 10s and restored on start, so a
# restart hands out no fresh burst. Mount a volume here to keep them across
# containers.
VOLUME ["/var/lib/sharelimit"]
# distroless's "nonroot" user, by number: Kubernetes' runAsNonRoot can only
# verify a numeric USER.
USER 65532:65532
# The admin listener is loopback-only and the image has no shell or curl: the
# binary probes itself.
HEALTHCHECK --interval=10s --timeout=3s CMD ["/sharelimit", "healthcheck"]
ENTRYPOINT ["/sharelimit"]
CMD ["serve", "--config-dir", "/etc/sharelimit/config", "--state-file", "/var/lib/sharelimit/state", "--state-interval", "10s"]
