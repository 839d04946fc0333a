# The idem image for Docker: builds the static binary in the golang image,
# then the same final stage as deploy/image/Containerfile, which make image
# builds offline with buildah or podman from this machine's Go (a test
# keeps the two final stages alike). Stamp the version from the checkout:
#
#   docker build -t idem \
#     --build-arg VERSION=$(git describe --tags --match 'v*' --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ) .
ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-bookworm AS build
ARG VERSION=devel
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
WORKDIR /src
COPY . .
RUN cd cmd/idem \
 && CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${REVISION} -X main.buildDate=${CREATED}" \
      -o /out/rootfs/idem . \
 && mkdir -p /out/rootfs/etc/ssl/certs /out/datadir/data \
 && install -m 0444 /etc/ssl/certs/ca-certificates.crt /out/rootfs/etc/ssl/certs/ca-certificates.crt \
 && install -m 0444 /src/deploy/image/passwd /out/rootfs/etc/passwd \
 && install -m 0444 /src/deploy/image/group /out/rootfs/etc/group \
 && chmod 0555 /out/rootfs/idem && chmod 0755 /out/datadir/data

FROM scratch
ARG VERSION=devel
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
COPY --from=build /out/rootfs/ /
COPY --from=build --chown=65532:65532 /out/datadir/ /
LABEL org.opencontainers.image.title="idem" \
      org.opencontainers.image.description="Idempotency proxy and admin commands: each request with an Idempotency-Key runs once" \
      org.opencontainers.image.source="https://github.com/idemgo/idem" \
      org.opencontainers.image.url="https://github.com/idemgo/idem" \
      org.opencontainers.image.documentation="https://github.com/idemgo/idem/blob/main/docs/deploy.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
# In a container the proxy serves on every interface; the admin port
# (/metrics, /healthz, /readyz) is on by default; the embedded store, used
# when no other store is given, lives in the volume.
ENV IDEM_LISTEN=0.0.0.0:8080 \
    IDEM_ADMIN_LISTEN=0.0.0.0:9090 \
    IDEM_DATA=/data
EXPOSE 8080 9090
VOLUME /data
WORKDIR /data
USER 65532:65532
ENTRYPOINT ["/idem"]
CMD ["proxy"]
