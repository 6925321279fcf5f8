# syntax=docker/dockerfile:1
#
# Multi-stage build of the coordinator: a static, stripped Go binary in a
# small runtime image that runs as a non-root user.
#
#   docker build -t coordinator:dev --build-arg VERSION=$(git describe --always --dirty) .
#
# The runtime stage is Alpine rather than distroless/scratch for one reason:
# Compose healthchecks need a program inside the container to call /readyz,
# and BusyBox wget is 0 extra bytes there. The binary itself needs nothing
# from the image (CGO_ENABLED=0, no libc).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-alpine AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-mod=readonly
# Dependencies first: this layer stays cached while only our code changes.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd ./cmd
COPY internal ./internal
COPY migrations ./migrations
ARG VERSION=dev
# coordinator_build_info{revision}: the build context has no .git.
ARG REVISION=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/coordinator ./cmd/coordinator

FROM alpine:3.22 AS runtime
RUN apk add --no-cache ca-certificates tzdata \
 && addgroup -S -g 10001 coordinator \
 && adduser -S -D -H -u 10001 -G coordinator -s /sbin/nologin coordinator
COPY --from=build /out/coordinator /usr/local/bin/coordinator
USER 10001:10001
ENV COORDINATOR_HTTP_ADDR=:8080 COORDINATOR_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD wget -q -O /dev/null http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["/usr/local/bin/coordinator"]
CMD ["serve"]
