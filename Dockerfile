# The cdc pipeline as a slim, non-root image, with the compiled hot path (rust/, cdc._fastpath) inside and
# required (CDC_FAST_PATH=required: a start without it is a refusal). One definition, built two ways:
#
#   public:   docker build -t outbox-cdc .
#             both stages on the official python:3.11-slim-bookworm
#   offline:  make image   (deploy/image/build.sh, with podman)
#             BASE and BUILD_BASE are Debian bookworm root file systems that deploy/image/build.sh makes
#             here from Debian's packages with mmdebstrap and imports with `podman import`: no container
#             registry is needed, only Debian's archive, PyPI and crates.io
#
# Either way the build stage is Debian bookworm with Python 3.11, and it installs the same toolchain the same
# way: Debian's Rust (rustc-web and cargo-web, which bookworm updates for its browsers; rust/ needs 1.77+),
# gcc, the crates from crates.io and the Python dependencies from PyPI. The compiled extension is built from
# rust/ here in both builds, never passed in from the host, so that what the public build proves the offline
# one proves too. The runtime stage copies the virtual environment (its interpreter is at the same path in both
# stages of a build) and needs no compiler: the extension links only libc and libgcc_s.
#
# It runs with a read-only root file system: nothing is written at run time (the byte code is compiled here,
# PYTHONDONTWRITEBYTECODE keeps Python from trying again), and /tmp may be an empty mounted directory.
ARG BASE=docker.io/library/python:3.11-slim-bookworm
ARG BUILD_BASE=docker.io/library/python:3.11-slim-bookworm

FROM ${BUILD_BASE} AS build
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends ca-certificates gcc libc6-dev rustc-web cargo-web \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rust ./rust
COPY cdc ./cdc
# The caches (PyPI's downloads, the crates) speed up a rebuild of a changed source; they are not in the image,
# and an empty cache only costs time. A failed Rust build leaves the package without cdc._fastpath
# (pyproject.toml makes it optional for installs without cargo): the import below makes it fail the build. Behind a proxy that re-signs TLS, give its CA
# bundle as the build secret `build-ca` (`--secret id=build-ca,src=/etc/ssl/certs/ca-certificates.crt`, as
# deploy/image/image.sh does): pip and cargo trust it for this step only, and it is not in the image.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.cargo/registry \
    --mount=type=secret,id=build-ca \
    if [ -s /run/secrets/build-ca ]; then \
        export PIP_CERT=/run/secrets/build-ca CARGO_HTTP_CAINFO=/run/secrets/build-ca; \
    fi \
    && python3 -m venv /opt/cdc \
    && /opt/cdc/bin/pip install -q '.[otel]' \
    && /opt/cdc/bin/pip uninstall -q -y pip \
    && /opt/cdc/bin/python -I -c "import cdc._fastpath, cdc.tracing as t; assert t.SDK" \
    && /opt/cdc/bin/python -m compileall -q /opt/cdc/lib

FROM ${BASE}
# A fixed uid and gid (the Helm chart's runAsUser), written straight into /etc/passwd: the offline base has
# no useradd, and the result is the same on both.
RUN echo 'cdc:x:10001:10001:outbox CDC:/app:/usr/sbin/nologin' >>/etc/passwd \
    && echo 'cdc:x:10001:' >>/etc/group
COPY --from=build /opt/cdc /opt/cdc
WORKDIR /app
COPY schemas ./schemas
USER 10001:10001
ENV PATH=/opt/cdc/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CDC_SCHEMAS_DIR=/app/schemas \
    CDC_FAST_PATH=required
RUN python3 -c "import cdc._fastpath" && cdc --help >/dev/null
EXPOSE 9108
ENTRYPOINT ["cdc"]
CMD ["run"]
