# The cdc pipeline as a slim, non-root image. Build: docker build -t outbox-cdc .
# The build stage compiles the hot path (rust/, cdc._fastpath) with the Rust toolchain of the official image;
# the image refuses to build without it, and runs with fast_path = required. The runtime stage needs no
# toolchain: the extension links only libc and libgcc_s. The image has the [otel] extra (OpenTelemetry's SDK
# and OTLP/HTTP exporter): tracing is then set with the OTEL_* variables (docs/operations.md, "Tracing").
FROM rust:1.95-slim-bookworm AS rust

FROM python:3.11-slim AS build
COPY --from=rust /usr/local/cargo /usr/local/cargo
COPY --from=rust /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rust ./rust
COPY cdc ./cdc
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[otel]' && \
    pip install --no-cache-dir /wheels/*.whl && python -c "import cdc._fastpath"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /app cdc
WORKDIR /app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels && python -c "import cdc._fastpath, cdc.tracing as t; assert t.SDK"
COPY schemas ./schemas
COPY slot_setup ./slot_setup
USER cdc
ENV CDC_SCHEMAS_DIR=/app/schemas CDC_FAST_PATH=required
ENTRYPOINT ["cdc"]
CMD ["run"]
